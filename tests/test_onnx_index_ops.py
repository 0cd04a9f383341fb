"""The ONNX frontend's index family (``anyshape/frontends/onnx/index_ops.py``).

Each model declares symbolic dims (``dim_param``), is compiled once and run at
several shapes (a size-1 dim included); outputs are compared with onnxruntime's
and each test asserts that one compilation served every shape. Covered:
GatherElements, GatherND (batch_dims), ScatterElements / ScatterND / Scatter
with every reduction, Trilu, EyeLike, OneHot, CumSum / CumProd, ReverseSequence,
ArgMax / ArgMin, TopK, and the value-dependent ops (folded or refused).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_helpers
import pytest
from onnx import TensorProto, helper
from onnx_helpers import init, make_model, vinfo

import anyshape
from anyshape.errors import UnsupportedError

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32
node = helper.make_node


run_against_ort = functools.partial(onnx_helpers.run_against_ort, atol=1e-06, rtol=1e-05)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def ints(rng, lo, hi, *shape):
    return rng.integers(lo, hi, size=shape).astype(np.int64)


# --- gathers ----------------------------------------------------------------------------------


def test_gather_elements_negative_indices_and_smaller_index_dims():
    model = make_model(
        [node("GatherElements", ["x", "i"], ["y"], axis=1)],
        [vinfo("x", ["n", "m"]), vinfo("i", ["p", "k"], I64)],
        [vinfo("y", ["p", "k"])],
    )
    rng = np.random.default_rng(0)
    cases = [
        {"x": rand(rng, n, m), "i": ints(rng, -m, m, p, k)}
        for n, m, p, k in [(4, 5, 3, 7), (1, 1, 1, 3), (3, 2, 3, 1)]
    ]
    module = run_against_ort(model, cases)
    with pytest.raises(Exception, match="out of range"):
        module(rand(rng, 2, 3), np.array([[0], [3]], np.int64))


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    if batch_dims:
        ins = [vinfo("x", ["b", "n", 3]), vinfo("i", ["b", "q", 1], I64)]
        shapes = [((2, 5, 3), (2, 4, 1)), ((1, 1, 3), (1, 2, 1))]
        out = vinfo("y", ["b", "q", 3])
    else:
        ins = [vinfo("x", ["n", "m", 2]), vinfo("i", ["q", 2], I64)]
        shapes = [((3, 4, 2), (5, 2)), ((1, 1, 2), (1, 2))]
        out = vinfo("y", ["q", 2])
    model = make_model([node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)], ins, [out])
    rng = np.random.default_rng(1)
    cases = []
    for xs, ishape in shapes:
        dims = xs[batch_dims : batch_dims + ishape[-1]]
        cols = [ints(rng, -d, d, *ishape[:-1], 1) for d in dims]
        cases.append({"x": rand(rng, *xs), "i": np.concatenate(cols, axis=-1)})
    run_against_ort(model, cases)


# --- scatters ---------------------------------------------------------------------------------


def _distinct_rows(rng, rows, k, m):
    """Per row, ``k`` distinct column indices of ``m`` (half of them negative)."""
    out = np.stack([rng.permutation(m)[:k] for _ in range(rows)]).astype(np.int64)
    return np.where(rng.random(out.shape) < 0.5, out - m, out)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    # indices/updates [p, k] into data [n, m] along axis 1, p <= n and k <= m.
    model = make_model(
        [node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction=reduction)],
        [vinfo("d", ["n", "m"]), vinfo("i", ["p", "k"], I64), vinfo("u", ["p", "k"])],
        [vinfo("y", ["n", "m"])],
    )
    rng = np.random.default_rng(2)
    cases = []
    for n, m, p, k in [(4, 6, 3, 4), (1, 1, 1, 1), (3, 5, 3, 5), (2, 3, 1, 0)]:
        if reduction == "none":
            i = _distinct_rows(rng, p, k, m)
        else:
            i = ints(rng, -m, m, p, k)  # duplicates combine
        cases.append({"d": rand(rng, n, m), "i": i, "u": rand(rng, p, k)})
    run_against_ort(model, cases)


def test_scatter_elements_axis0_and_legacy_scatter():
    rng = np.random.default_rng(3)
    for op, opset in (("ScatterElements", 18), ("Scatter", 10)):
        model = make_model(
            [node(op, ["d", "i", "u"], ["y"], axis=0)],
            [vinfo("d", ["n", 3]), vinfo("i", ["k", 3], I64), vinfo("u", ["k", 3])],
            [vinfo("y", ["n", 3])],
            opset=opset,
        )
        cases = [
            {"d": rand(rng, n, 3), "i": _distinct_rows(rng, 3, k, n).T.copy(), "u": rand(rng, k, 3)}
            for n, k in [(5, 2), (1, 1)]
        ]
        run_against_ort(model, cases)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    model = make_model(
        [node("ScatterND", ["d", "i", "u"], ["y"], reduction=reduction)],
        [vinfo("d", ["n", 4]), vinfo("i", ["q", 1], I64), vinfo("u", ["q", 4])],
        [vinfo("y", ["n", 4])],
    )
    rng = np.random.default_rng(4)
    cases = []
    for n, q in [(6, 3), (1, 1), (3, 5)]:
        if reduction == "none":
            i = rng.permutation(n)[: min(q, n)].reshape(-1, 1).astype(np.int64) - n
            q = i.shape[0]
        else:
            i = ints(rng, -n, n, q, 1)
        cases.append({"d": rand(rng, n, 4), "i": i, "u": rand(rng, q, 4)})
    run_against_ort(model, cases)


def test_scatter_nd_element_tuples_int():
    model = make_model(
        [node("ScatterND", ["d", "i", "u"], ["y"], reduction="add")],
        [vinfo("d", ["n", "m"], I64), vinfo("i", ["q", 2], I64), vinfo("u", ["q"], I64)],
        [vinfo("y", ["n", "m"], I64)],
    )
    rng = np.random.default_rng(5)
    cases = []
    for n, m, q in [(3, 4, 7), (1, 1, 2)]:
        i = np.concatenate([ints(rng, 0, n, q, 1), ints(rng, -m, m, q, 1)], axis=1)
        cases.append({"d": ints(rng, -5, 5, n, m), "i": i, "u": ints(rng, -5, 5, q)})
    run_against_ort(model, cases)


# --- triangles, eye, one-hot ---------------------------------------------------------------------


def test_trilu_with_constant_and_computed_k():
    # k of the second node is computed: the number of rows minus 2 (a symbolic value).
    nodes = [
        node("Trilu", ["x", "k"], ["up"], upper=1),
        node("Shape", ["x"], ["shp"], start=1, end=2),
        node("Sub", ["shp", "two"], ["rows_minus_2"]),
        node("Squeeze", ["rows_minus_2"], ["k2"]),
        node("Trilu", ["x", "k2"], ["low"], upper=0),
        node("Trilu", ["x"], ["up0"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", "r", "c"])],
        [
            vinfo("up", ["b", "r", "c"]),
            vinfo("low", ["b", "r", "c"]),
            vinfo("up0", ["b", "r", "c"]),
        ],
        [init("k", np.array(-1, np.int64)), init("two", np.array([2], np.int64))],
    )
    rng = np.random.default_rng(6)
    cases = [{"x": rand(rng, *s)} for s in [(2, 4, 5), (1, 1, 3), (3, 6, 2)]]
    run_against_ort(model, cases)


def test_eye_like_off_diagonal_with_dtype():
    model = make_model(
        [node("EyeLike", ["x"], ["e"], k=1, dtype=I32), node("EyeLike", ["x"], ["f"], k=-2)],
        [vinfo("x", ["n", "m"])],
        [vinfo("e", ["n", "m"], I32), vinfo("f", ["n", "m"])],
    )
    rng = np.random.default_rng(7)
    run_against_ort(model, [{"x": rand(rng, *s)} for s in [(3, 5), (1, 1), (6, 2)]])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_negative_and_out_of_range_indices(axis):
    out_dims = {-1: ["n", "m", 5], 0: [5, "n", "m"], 1: ["n", 5, "m"]}[axis]
    model = make_model(
        [node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)],
        [vinfo("i", ["n", "m"], I64)],
        [vinfo("y", out_dims)],
        [
            init("depth", np.array(5.0, np.float32)),
            init("values", np.array([-2.0, 3.0], np.float32)),
        ],
    )
    rng = np.random.default_rng(8)
    run_against_ort(model, [{"i": ints(rng, -7, 7, *s)} for s in [(3, 4), (1, 1), (2, 1)]])


# --- scans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    model = make_model(
        [node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        [vinfo("x", ["n", "m"])],
        [vinfo("y", ["n", "m"])],
        [init("axis", np.array(-1, np.int32))],
    )
    rng = np.random.default_rng(9)
    run_against_ort(model, [{"x": rand(rng, *s)} for s in [(3, 6), (1, 1), (2, 1)]], atol=1e-5)


def test_cumprod_matches_numpy():
    # onnxruntime has no CumProd kernel yet: compare with NumPy, compiled once.
    model = make_model(
        [
            node("CumProd", ["x", "axis"], ["y"]),
            node("CumProd", ["x", "axis"], ["z"], exclusive=1, reverse=1),
        ],
        [vinfo("x", ["n", "m"], I64)],
        [vinfo("y", ["n", "m"], I64), vinfo("z", ["n", "m"], I64)],
        [init("axis", np.array(0, np.int64))],
        opset=26,
    )
    before = anyshape.stats()["compilations"]
    module = anyshape.onnx.compile(model)
    rng = np.random.default_rng(10)
    for s in [(4, 3), (1, 1), (5, 1)]:
        x = ints(rng, -3, 4, *s)
        y, z = module(x)
        np.testing.assert_array_equal(y, np.cumprod(x, axis=0))
        shifted = np.concatenate([x[1:], np.ones_like(x[:1])], axis=0)
        np.testing.assert_array_equal(z, np.flip(np.cumprod(np.flip(shifted, 0), axis=0), 0))
    assert anyshape.stats()["compilations"] - before == 1


def test_reverse_sequence():
    model = make_model(
        [node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=1, time_axis=0)],
        [vinfo("x", ["t", "b", 2]), vinfo("lens", ["b"], I64)],
        [vinfo("y", ["t", "b", 2])],
    )
    rng = np.random.default_rng(11)
    cases = [
        {"x": rand(rng, t, b, 2), "lens": ints(rng, 1, t + 1, b)}
        for t, b in [(5, 3), (1, 1), (4, 1)]
    ]
    run_against_ort(model, cases)


# --- arg reductions and top-k ------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions_with_ties(op):
    nodes = [
        node(op, ["x"], ["first"], axis=1, keepdims=1),
        node(op, ["x"], ["last"], axis=-1, keepdims=0, select_last_index=1),
        node(op, ["x"], ["rows"], axis=0, keepdims=0),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["n", "m"], I64)],
        [vinfo("first", ["n", 1], I64), vinfo("last", ["n"], I64), vinfo("rows", ["m"], I64)],
    )
    rng = np.random.default_rng(12)
    run_against_ort(model, [{"x": ints(rng, 0, 3, *s)} for s in [(4, 7), (1, 1), (3, 1)]])


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_constant_k_with_ties(largest):
    model = make_model(
        [node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)],
        [vinfo("x", ["n", "m", 2])],
        [vinfo("v", ["n", 3, 2]), vinfo("i", ["n", 3, 2], I64)],
        [init("k", np.array([3], np.int64))],
    )
    rng = np.random.default_rng(13)
    cases = [{"x": rng.integers(0, 3, size=s).astype(np.float32)} for s in [(2, 6, 2), (1, 3, 2)]]
    module = run_against_ort(model, cases)
    with pytest.raises(Exception, match="K at most the axis size"):
        module(rand(rng, 1, 2, 2))


def test_top_k_symbolic_k_is_a_full_sort():
    # K = the size of the sorted axis (Shape -> Slice): a symbolic K, sorted descending.
    model = make_model(
        [
            node("Shape", ["x"], ["k"], start=-1),
            node("TopK", ["x", "k"], ["v", "i"]),
        ],
        [vinfo("x", ["n", "m"])],
        [vinfo("v", ["n", "m"]), vinfo("i", ["n", "m"], I64)],
    )
    rng = np.random.default_rng(14)
    run_against_ort(model, [{"x": rand(rng, *s)} for s in [(3, 7), (1, 1), (2, 1)]])


# --- value-dependent output shapes ---------------------------------------------------------------


def test_value_dependent_ops_fold_on_constants():
    c = np.array([[0, 3, 0], [2, 0, 2]], np.int64)
    nodes = [
        node("NonZero", ["c"], ["nz"]),
        node("Unique", ["c"], ["u", "ui", "uinv", "ucount"], sorted=0),
        node("Compress", ["x", "cond"], ["picked"], axis=1),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["n", 4])],
        [
            vinfo("nz", [2, 3], I64),
            vinfo("u", [3], I64),
            vinfo("ui", [3], I64),
            vinfo("uinv", [6], I64),
            vinfo("ucount", [3], I64),
            vinfo("picked", ["n", 2]),
        ],
        [init("c", c), init("cond", np.array([True, False, True]))],
    )
    rng = np.random.default_rng(15)
    run_against_ort(model, [{"x": rand(rng, n, 4)} for n in (3, 1)])


@pytest.mark.parametrize(
    "op,inputs,outs",
    [
        ("NonZero", ["x"], 1),
        ("Unique", ["x"], 4),
        ("Compress", ["x", "cond"], 1),
    ],
)
def test_value_dependent_ops_refuse_computed_inputs(op, inputs, outs):
    ins = [vinfo("x", ["n"])]
    if len(inputs) > 1:
        ins.append(vinfo("cond", ["n"], TensorProto.BOOL))
    names = [f"o{k}" for k in range(outs)]
    model = make_model([node(op, inputs, names)], ins, [vinfo(n, None) for n in names], opset=13)
    with pytest.raises(UnsupportedError, match=f"{op}.*depends on the values"):
        anyshape.onnx.compile(model)
