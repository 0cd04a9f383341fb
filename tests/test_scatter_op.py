"""The ``scatter`` primitive (the inverse of ``gather``): type rule, interpreter, CPU kernel.

Every case runs the reference interpreter and the CPU backend against a plain
NumPy oracle written from the op's definition (a loop over every update
position in row-major order; ``np.add.at`` for the embedding gradient), and
one compiled graph serves every run-time size, 0 and 1 included.
"""

from __future__ import annotations

import numpy as np
import pytest

from anyshape.config import Options
from anyshape.errors import InputError
from anyshape.ir import DType, GraphBuilder, SymExpr, TensorType
from anyshape.ir.constraints import ConstraintStore
from anyshape.ir.ops import IRTypeError
from anyshape.pipelines import compile_graph
from anyshape.runtime.interpreter import run_graph

F16, F32, I32, I64, B8 = DType.f16, DType.f32, DType.i32, DType.i64, DType.b8
S = [SymExpr.symbol(f"s{i}") for i in range(6)]


def _builder(name: str) -> GraphBuilder:
    store = ConstraintStore()
    for i in range(len(S)):
        store.add_symbol(f"s{i}", 0, None)
    return GraphBuilder(store, name=name)


def _oracle(base, idx, upd, axis: int, mode: str) -> np.ndarray:
    """The definition: for every update position p, in row-major order,
    out[p[:a] + (idx[p[a:a+k]],) + p[a+k:]] (op)= upd[p]."""
    out = np.array(base, copy=True)
    k = idx.ndim
    for p in np.ndindex(*upd.shape):
        j = int(idx[p[axis : axis + k]])
        at = p[:axis] + (j,) + p[axis + k :]
        if mode == "add":
            out[at] = out[at] + upd[p]
        else:
            out[at] = upd[p]
    return out


def _compile(graph):
    return compile_graph(graph, Options(backend="cpu", verify=True))


def _run_both(graph, compiled, arrays, env):
    """(interpreter result, CPU result) of the graph's one output."""
    (want,) = run_graph(graph, arrays, env)
    extra = [env[s] for s in compiled.extra_symbols]
    (got,) = compiled.executable(arrays, extra)
    return want, got


def _embedding_graph(zero_base: bool):
    """The embedding gradient: base [V, H] (an input, or zeros), indices [N], updates [N, H]."""
    b = _builder("embedding_grad")
    if zero_base:
        zero = b.constant(0.0, F32)
        base = b.op("broadcast_in_dim", zero, shape=(S[0], S[2]), dims=())
    else:
        base = b.input("base", TensorType(F32, (S[0], S[2])))
    idx = b.input("idx", TensorType(I64, (S[1],)))
    upd = b.input("upd", TensorType(F32, (S[1], S[2])))
    return b.build([b.op("scatter", base, idx, upd, axis=0, mode="add")])


# (V, N, H): empty and unit dims, duplicates (N > V), and enough work to run in parallel.
EMBEDDING_SIZES = [(7, 9, 5), (1, 1, 1), (1, 0, 3), (0, 0, 4), (4, 3, 0), (5, 1, 1), (3, 40, 17)]
EMBEDDING_SIZES += [(50, 300, 200), (30, 64, 1000)]


@pytest.mark.parametrize("zero_base", [False, True])
def test_embedding_gradient_axis0_one_graph_every_size(zero_base):
    graph = _embedding_graph(zero_base)
    compiled = _compile(graph)
    rng = np.random.default_rng(0)
    for v, n, h in EMBEDDING_SIZES:
        idx = rng.integers(0, max(v, 1), n).astype(np.int64)
        upd = rng.standard_normal((n, h)).astype(np.float32)
        base = np.zeros((v, h), np.float32) if zero_base else rng.standard_normal((v, h))
        base = base.astype(np.float32)
        kept = base.copy()
        arrays = [idx, upd] if zero_base else [base, idx, upd]
        want, got = _run_both(graph, compiled, arrays, {"s0": v, "s1": n, "s2": h})
        expected = base.copy()
        np.add.at(expected, idx, upd)  # the same order of additions: exact
        assert got.shape == (v, h) and got.dtype == np.float32
        np.testing.assert_array_equal(want, expected, err_msg=f"interpreter {v, n, h}")
        np.testing.assert_array_equal(got, expected, err_msg=f"cpu {v, n, h}")
        np.testing.assert_array_equal(base, kept)  # the base is copied, never written


def test_duplicate_indices_accumulate():
    graph = _embedding_graph(zero_base=True)
    compiled = _compile(graph)
    idx = np.array([2, 2, 0, 2, 2], np.int64)
    upd = np.ones((5, 3), np.float32) * np.arange(1, 6, dtype=np.float32)[:, None]
    for got in _run_both(graph, compiled, [idx, upd], {"s0": 4, "s1": 5, "s2": 3}):
        np.testing.assert_array_equal(got[2], [12.0, 12.0, 12.0])  # 1 + 2 + 4 + 5
        np.testing.assert_array_equal(got[0], [3.0, 3.0, 3.0])
        assert not got[[1, 3]].any()


@pytest.mark.parametrize("mode", ["add", "set"])
def test_axis1_with_two_dim_indices(mode):
    """base [s0, s1, 3], indices [s2, s3] (i32), updates [s0, s2, s3, 3]."""
    b = _builder("axis1")
    base = b.input("base", TensorType(F32, (S[0], S[1], 3)))
    idx = b.input("idx", TensorType(I32, (S[2], S[3])))
    upd = b.input("upd", TensorType(F32, (S[0], S[2], S[3], 3)))
    graph = b.build([b.op("scatter", base, idx, upd, axis=1, mode=mode)])
    compiled = _compile(graph)
    rng = np.random.default_rng(1)
    for s0, s1, s2, s3 in [(2, 5, 3, 4), (1, 1, 1, 1), (0, 3, 2, 2), (3, 4, 0, 5), (2, 2, 6, 1)]:
        x = rng.standard_normal((s0, s1, 3)).astype(np.float32)
        i = rng.integers(0, s1, (s2, s3)).astype(np.int32)
        u = rng.standard_normal((s0, s2, s3, 3)).astype(np.float32)
        want, got = _run_both(graph, compiled, [x, i, u], dict(s0=s0, s1=s1, s2=s2, s3=s3))
        expected = _oracle(x, i, u, 1, mode)
        np.testing.assert_array_equal(want, expected)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [F32, B8, I64])
def test_set_keeps_the_last_duplicate_on_the_last_axis(dtype):
    """The indexed dim last (no trailing dims): base [s0, s1], indices [s2]."""
    b = _builder("set_last_axis")
    base = b.input("base", TensorType(dtype, (S[0], S[1])))
    idx = b.input("idx", TensorType(I64, (S[2],)))
    upd = b.input("upd", TensorType(dtype, (S[0], S[2])))
    graph = b.build([b.op("scatter", base, idx, upd, axis=1, mode="set")])
    compiled = _compile(graph)
    rng = np.random.default_rng(2)
    np_dtype = dtype.to_numpy()
    for s0, s1, s2 in [(3, 4, 9), (1, 1, 3), (2, 5, 0), (0, 2, 2), (40, 6, 2000)]:
        x = rng.integers(-50, 50, (s0, s1)).astype(np_dtype)
        i = rng.integers(0, s1, s2).astype(np.int64)
        u = rng.integers(-50, 50, (s0, s2)).astype(np_dtype)
        want, got = _run_both(graph, compiled, [x, i, u], dict(s0=s0, s1=s1, s2=s2))
        expected = _oracle(x, i, u, 1, "set")
        assert got.dtype == np_dtype
        np.testing.assert_array_equal(want, expected)
        np.testing.assert_array_equal(got, expected)
    # Explicitly: of three writes to column 1, the last one wins.
    x = np.zeros((1, 3), np_dtype)
    u = np.array([[1, 0, 1]], np_dtype) if dtype is B8 else np.array([[7, 8, 9]], np_dtype)
    i = np.array([1, 1, 1], np.int64)
    for got in _run_both(graph, compiled, [x, i, u], dict(s0=1, s1=3, s2=3)):
        assert got[0, 1] == u[0, 2] and got[0, 0] == 0 and got[0, 2] == 0


def test_int64_base_adds_exactly():
    b = _builder("int_base")
    base = b.input("base", TensorType(I64, (S[0], 4)))
    idx = b.input("idx", TensorType(I32, (S[1],)))
    upd = b.input("upd", TensorType(I64, (S[1], 4)))
    graph = b.build([b.op("scatter", base, idx, upd, axis=0, mode="add")])
    compiled = _compile(graph)
    rng = np.random.default_rng(3)
    for v, n in [(5, 12), (1, 1), (3, 0), (0, 0)]:
        x = rng.integers(-(2**40), 2**40, (v, 4)).astype(np.int64)
        i = rng.integers(0, max(v, 1), n).astype(np.int32)
        u = rng.integers(-(2**40), 2**40, (n, 4)).astype(np.int64)
        want, got = _run_both(graph, compiled, [x, i, u], {"s0": v, "s1": n})
        expected = x.copy()
        np.add.at(expected, i, u)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(want, expected)
        np.testing.assert_array_equal(got, expected)


def test_scalar_index_in_the_middle_axis():
    """indices of rank 0: updates drop the indexed dim (base [2, s0, 3], updates [2, 3])."""
    b = _builder("scalar_index")
    base = b.input("base", TensorType(F32, (2, S[0], 3)))
    idx = b.input("idx", TensorType(I64, ()))
    upd = b.input("upd", TensorType(F32, (2, 3)))
    graph = b.build([b.op("scatter", base, idx, upd, axis=1, mode="add")])
    compiled = _compile(graph)
    rng = np.random.default_rng(4)
    for s0, j in [(4, 3), (1, 0)]:
        x = rng.standard_normal((2, s0, 3)).astype(np.float32)
        u = rng.standard_normal((2, 3)).astype(np.float32)
        i = np.array(j, np.int64)
        want, got = _run_both(graph, compiled, [x, i, u], {"s0": s0})
        expected = x.copy()
        expected[:, j] += u
        np.testing.assert_array_equal(want, expected)
        np.testing.assert_array_equal(got, expected)


def test_f16_accumulates_in_f16_like_the_interpreter():
    b = _builder("half")
    base = b.input("base", TensorType(F16, (S[0], 8)))
    idx = b.input("idx", TensorType(I64, (S[1],)))
    upd = b.input("upd", TensorType(F16, (S[1], 8)))
    graph = b.build([b.op("scatter", base, idx, upd, axis=0, mode="add")])
    compiled = _compile(graph)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 8)) * 100).astype(np.float16)
    i = rng.integers(0, 3, 50).astype(np.int64)
    u = rng.standard_normal((50, 8)).astype(np.float16)
    want, got = _run_both(graph, compiled, [x, i, u], {"s0": 3, "s1": 50})
    expected = x.copy()
    np.add.at(expected, i, u)  # each add rounded to f16, in order
    assert got.dtype == np.float16
    np.testing.assert_array_equal(want, expected)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("bad", [5, -1, 1 << 40])
def test_index_out_of_range_raises_from_compiled_code(bad):
    graph = _embedding_graph(zero_base=False)
    compiled = _compile(graph)
    base = np.ones((5, 3), np.float32)
    upd = np.ones((2, 3), np.float32)
    env = {"s0": 5, "s1": 2, "s2": 3}
    idx = np.array([1, bad], np.int64)
    with pytest.raises(IndexError, match="scatter index out of range"):
        run_graph(graph, [base, idx, upd], env)
    with pytest.raises(IndexError, match=r"index is out of range.* in scatter"):
        compiled.executable([base, idx, upd], [])
    # Even with nothing to write (an empty trailing dim), an index is checked.
    empty = np.ones((5, 0), np.float32)
    with pytest.raises(IndexError, match="in scatter"):
        compiled.executable([empty, idx, np.ones((2, 0), np.float32)], [])
    # The same library goes on serving good calls.
    good = np.array([1, 4], np.int64)
    (got,) = compiled.executable([base, good, upd], [])
    np.testing.assert_array_equal(got, _oracle(base, good, upd, 0, "add"))


def test_fused_producer_and_consumer_are_computed_around_the_scatter_kernel():
    """updates = g * scale (fused into the scatter kernel), base = zeros, and an
    elementwise consumer of the scatter reading its finished result."""
    b = _builder("fused_neighbours")
    g = b.input("g", TensorType(F32, (S[1], 6)))
    idx = b.input("idx", TensorType(I64, (S[1],)))
    scale = b.input("scale", TensorType(F32, (6,)))
    other = b.input("other", TensorType(F32, (S[0], 6)))
    upd = b.op("mul", g, b.op("broadcast_in_dim", scale, shape=(S[1], 6), dims=(1,)))
    base = b.op("broadcast_in_dim", b.constant(0.5, F32), shape=(S[0], 6), dims=())
    s = b.op("scatter", base, idx, upd, axis=0, mode="add")
    out = b.op("add", b.op("mul", s, s), other)
    graph = b.build([out, s])
    compiled = _compile(graph)
    labels = compiled.executable.kernel_labels
    assert sum(lbl.startswith("scatter") for lbl in labels) == 1
    assert len(labels) == 2, labels  # the mul and zeros run inside the scatter kernel
    descriptions = " ".join(compiled.executable.kernel_descriptions)
    assert "scatter: scatter" in descriptions and "mul x1" in descriptions
    rng = np.random.default_rng(6)
    for v, n in [(4, 10), (1, 1), (3, 0), (20, 500)]:
        gv = rng.standard_normal((n, 6)).astype(np.float32)
        i = rng.integers(0, v, n).astype(np.int64)
        sc = rng.standard_normal(6).astype(np.float32)
        ot = rng.standard_normal((v, 6)).astype(np.float32)
        arrays = [gv, i, sc, ot]
        env = {"s0": v, "s1": n}
        want = run_graph(graph, arrays, env)
        got = compiled.executable(arrays, [])
        expected_s = _oracle(np.full((v, 6), 0.5, np.float32), i, gv * sc, 0, "add")
        for w, r, e in zip(want, got, [expected_s * expected_s + ot, expected_s]):
            np.testing.assert_allclose(w, e, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)


def test_kernel_checks_indices_first_then_runs_them_in_order_on_each_thread():
    source = _compile(_embedding_graph(zero_base=True)).executable.source
    kernel = source[source.index("return 1;") :]  # after the check of every index
    parallel = kernel.index("#pragma omp parallel for collapse(1)")  # over column blocks
    rows = kernel.index("for (int64_t k0 = 0;", parallel)  # every index, in order
    assert kernel.index("for (int64_t q0 = qb * sb;", rows) > rows  # the block's columns
    assert "as_index(" not in kernel[: kernel.index("return err_flag;")]


def test_type_rule():
    b = _builder("rule")
    x = b.input("x", TensorType(F32, (S[0], 4)))
    i = b.input("i", TensorType(I64, (S[1],)))
    u = b.input("u", TensorType(F32, (S[1], 4)))
    half = b.input("h", TensorType(F16, (S[1], 4)))
    flat = b.input("r", TensorType(F32, (S[1],)))
    out = b.op("scatter", x, i, u, axis=0, mode="add")
    assert out.type == x.type and b.constraints.guards == []
    cases = [
        ((x, i, u), dict(axis=0, mode="mul"), "unknown scatter mode 'mul'"),
        ((x, i, u), dict(axis=2, mode="add"), "axis 2 out of range"),
        ((x, i, half), dict(axis=0, mode="add"), "updates must be f32"),
        ((x, i, flat), dict(axis=0, mode="set"), "must have rank 2"),
        ((x, u, u), dict(axis=0, mode="add"), "indices must be integers"),
    ]
    for args, attrs, pattern in cases:
        with pytest.raises(IRTypeError, match=pattern):
            b.op("scatter", *args, **attrs)
    with pytest.raises(IRTypeError, match="missing attributes"):
        b.op("scatter", x, i, u, axis=0)
    # A static mismatch can never hold: a ValueError, and no guard left behind (its
    # dim 0 alone would have been one).
    w = b.input("w", TensorType(F32, (S[2], 5)))
    with pytest.raises(ValueError, match="scatter updates dim 1: 5 == 4 can never hold"):
        b.op("scatter", x, i, w, axis=0, mode="add")
    assert b.constraints.guards == []


def test_symbolic_mismatch_is_a_guard_checked_on_every_call():
    b = _builder("guarded")
    x = b.input("x", TensorType(F32, (S[0], 4)))
    i = b.input("i", TensorType(I64, (S[1],)))
    w = b.input("w", TensorType(F32, (S[3], 4)))
    graph = b.build([b.op("scatter", x, i, w, axis=0, mode="add")])
    assert [str(g) for g in graph.constraints.guards] == ["s3 == s1"]
    compiled = _compile(graph)
    x, i = np.zeros((2, 4), np.float32), np.zeros(3, np.int64)
    (got,) = compiled.executable([x, i, np.ones((3, 4), np.float32)], [])
    np.testing.assert_array_equal(got, [[3.0] * 4, [0.0] * 4])
    with pytest.raises(InputError, match="scatter updates dim 0"):
        compiled.executable([x, i, np.ones((2, 4), np.float32)], [])
