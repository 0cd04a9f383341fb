"""ONNX frontend: the ``onnx.backend`` interface, inputs compiled by value, backward slices,
the composite reductions.

(a) ``AnyshapeBackend`` as ONNX's backend API defines it (prepare once, run any shape,
outputs as a namedtuple); (b) a graph input that sets a shape (Reshape's shape, Reduce's
axes) compiles once per distinct value, warns, and checks the value's dtype and rank;
(c) Slice with negative steps, every bound kind, sizes 0 and 1, against onnxruntime;
(d) ReduceL1/L2/SumSquare/LogSum/LogSumExp over symbolic dims, rows of -inf and empty
reductions, against onnxruntime.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_helpers
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import vinfo

import anyshape
from anyshape.errors import InputError
from anyshape.frontends.onnx.backend import AnyshapeBackend
from anyshape.frontends.onnx.specialize import ValueSpecializedModule

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


make_model = functools.partial(onnx_helpers.make_model, opset=18)


def ort_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def compilations() -> int:
    return anyshape.stats()["compilations"]


# --- (a) the backend API ----------------------------------------------------------------


def test_backend_prepares_once_and_runs_any_shape():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
        [vinfo("x", ["n", 3])],
        [vinfo("y", ["n", 3]), vinfo("z", ["n", 3])],
    )
    assert AnyshapeBackend.supports_device("CPU") and not AnyshapeBackend.supports_device("CUDA")
    before = compilations()
    rep = AnyshapeBackend.prepare(model, "CPU")
    for n in (1, 0, 7):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        out = rep.run([x])
        assert out._fields == ("y", "z")
        np.testing.assert_array_equal(out.y, np.maximum(x, 0))
        np.testing.assert_array_equal(out[1], -np.maximum(x, 0))
        np.testing.assert_array_equal(rep.run({"x": x}).z, out.z)
    assert compilations() - before == 1
    with pytest.raises(ValueError, match="CPU"):
        AnyshapeBackend.prepare(model, "CUDA")


# --- (b) inputs that set shapes ------------------------------------------------------------


def _reshape_by_input():
    return make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [vinfo("x", ["a", "b"]), vinfo("shape", [2], I64)],
        [vinfo("y", None)],
    )


def test_input_that_sets_a_shape_compiles_once_per_value():
    model = _reshape_by_input()
    before = compilations()
    with pytest.warns(UserWarning, match="'shape' sets a shape"):
        module = anyshape.onnx.compile(model)
    assert isinstance(module, ValueSpecializedModule)
    assert compilations() == before  # nothing compiled until a value is seen
    rng = np.random.default_rng(0)
    for a, b in ((2, 6), (4, 3), (1, 12), (3, 4)):  # one value of `shape`, four data shapes
        x = rng.standard_normal((a, b)).astype(np.float32)
        shape = np.array([-1, 2], np.int64)
        (got,) = module(x, shape)
        np.testing.assert_array_equal(got, ort_run(model, {"x": x, "shape": shape})[0])
    assert module.compilations == 1 and compilations() - before == 1
    x = rng.standard_normal((2, 6)).astype(np.float32)
    (got,) = module(shape=np.array([3, 4], np.int64), x=x)  # by name, a second value
    np.testing.assert_array_equal(got, x.reshape(3, 4))
    assert module.compilations == 2 and compilations() - before == 2


def test_value_input_is_checked_before_compiling():
    with pytest.warns(UserWarning):
        module = anyshape.onnx.compile(_reshape_by_input())
    x = np.zeros((2, 6), np.float32)
    with pytest.raises(InputError, match="'shape' has dtype i32, expected i64"):
        module(x, np.array([3, 4], np.int32))
    with pytest.raises(InputError, match="'shape' dim 0 is 3, expected 2"):
        module(x, np.array([3, 4, 1], np.int64))
    assert module.compilations == 0


def test_axes_input_of_a_reduction_and_symbolic_data():
    model = make_model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [vinfo("x", ["a", "b", 3]), vinfo("axes", [1], I64)],
        [vinfo("y", None)],
    )
    with pytest.warns(UserWarning):
        module = anyshape.onnx.compile(model)
    rng = np.random.default_rng(1)
    for shape, axes in (((2, 5, 3), [1]), ((1, 1, 3), [1]), ((4, 2, 3), [-1]), ((3, 0, 3), [1])):
        x = rng.standard_normal(shape).astype(np.float32)
        feeds = {"x": x, "axes": np.array(axes, np.int64)}
        np.testing.assert_allclose(module(**feeds)[0], ort_run(model, feeds)[0], rtol=1e-5)
    assert module.compilations == 2  # axes [1] and [-1]


# --- (c) backward slices ------------------------------------------------------------------


@pytest.mark.parametrize(
    "start,end,step",
    [(-1, -(2**63), -1), (10, 0, -2), (3, -1, -1), (-2, -10, -3), (2**63 - 1, -(2**63), -1)],
)
def test_slice_with_negative_step(start, end, step):
    consts = {"s": [start], "e": [end], "a": [0], "k": [step]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in consts.items()]
    model = make_model(
        [helper.make_node("Slice", ["x", "s", "e", "a", "k"], ["y"])],
        [vinfo("x", ["n", 3])],
        [vinfo("y", None)],
        inits,
    )
    before = compilations()
    module = anyshape.onnx.compile(model)
    for n in (0, 1, 5, 12):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        (got,) = module(x)
        want = ort_run(model, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert compilations() - before == 1


# --- (d) composite reductions -------------------------------------------------------------


@pytest.mark.parametrize(
    "op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
)
def test_composite_reductions(op):
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    model = make_model(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
        [vinfo("x", ["a", "b"])],
        [vinfo("y", None)],
        [axes],
    )
    before = compilations()
    module = anyshape.onnx.compile(model)
    rng = np.random.default_rng(2)
    for shape in ((3, 5), (1, 1), (2, 0), (4, 40)):
        x = rng.uniform(0.1, 2.0, shape).astype(np.float32)
        if op == "ReduceLogSumExp" and shape[1]:
            x[0, :] = -np.inf  # a row of -inf: -inf, not NaN
            x[-1, 0] = 80.0  # exp overflows without the max shift
        (got,) = module(x)
        want = ort_run(model, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{op} {shape}")
    assert compilations() - before == 1


# --- (e) integer edges and the unsigned types ----------------------------------------------


@pytest.mark.parametrize(
    "elem,np_dtype", [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64)]
)
def test_lowest_integer_divided_by_minus_one_does_not_trap(elem, np_dtype):
    """x86 traps on INT_MIN / -1 (SIGFPE, the process dies); ONNX's Div wraps, Mod gives 0."""
    model = make_model(
        [
            helper.make_node("Div", ["a", "b"], ["q"]),
            helper.make_node("Mod", ["a", "b"], ["r"], fmod=1),
        ],
        [vinfo("a", ["n"], elem), vinfo("b", ["n"], elem)],
        [vinfo("q", None, elem), vinfo("r", None, elem)],
    )
    lo = np.iinfo(np_dtype).min
    a = np.array([lo, lo, 7, -7, lo], np_dtype)
    b = np.array([-1, 1, -1, -1, 2], np_dtype)
    q, r = anyshape.onnx.compile(model)(a, b)
    np.testing.assert_array_equal(q, np.array([lo, lo, -7, 7, lo // 2], np_dtype))
    np.testing.assert_array_equal(r, np.array([0, 0, 0, 0, 0], np_dtype))


@pytest.mark.parametrize(
    "elem,np_dtype",
    [
        (TensorProto.UINT16, np.uint16),
        (TensorProto.UINT32, np.uint32),
        (TensorProto.UINT64, np.uint64),
    ],
)
def test_unsigned_types_keep_their_range(elem, np_dtype):
    model = make_model(
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Max", ["a", "b"], ["m"]),
            helper.make_node("Cast", ["a"], ["f"], to=TensorProto.DOUBLE),
            helper.make_node("Greater", ["a", "b"], ["g"]),
        ],
        [vinfo("a", ["n"], elem), vinfo("b", ["n"], elem)],
        [
            vinfo("s", None, elem),
            vinfo("m", None, elem),
            vinfo("f", None, TensorProto.DOUBLE),
            vinfo("g", None, TensorProto.BOOL),
        ],
    )
    module = anyshape.onnx.compile(model)
    hi = np.iinfo(np_dtype).max
    for a, b in (([hi, 1, 0], [1, 2, 0]), ([hi - 5], [hi]), ([], [])):
        feeds = {"a": np.array(a, np_dtype), "b": np.array(b, np_dtype)}
        got = module(**feeds)
        x, y = feeds["a"], feeds["b"]
        want = [x + y, np.maximum(x, y), x.astype(np.float64), x > y]  # wrapping add
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_strided_slice_read_through_a_reshape():
    """A strided slice's index is a product: its operand must be parenthesized when it is
    itself a sum (here the index a reshape adding a unit dim computes)."""
    consts = {"s": [0], "e": [8], "a": [3], "k": [2], "u": [-1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in consts.items()]
    model = make_model(
        [
            helper.make_node("Slice", ["x", "s", "e", "a", "k"], ["y"]),
            helper.make_node("Unsqueeze", ["y", "u"], ["z"]),
        ],
        [vinfo("x", ["b", 4, 3, 8])],
        [vinfo("z", None)],
        inits,
    )
    module = anyshape.onnx.compile(model)
    for b in (1, 2):
        x = np.random.default_rng(b).standard_normal((b, 4, 3, 8)).astype(np.float32)
        np.testing.assert_array_equal(module(x)[0], ort_run(model, {"x": x})[0])


def test_if_with_a_condition_known_from_shapes_inlines_the_taken_branch():
    rank_is_2 = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Shape", ["shape"], ["rank"]),
        helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2]))),
        helper.make_node("Equal", ["rank", "two"], ["eq"]),
        helper.make_node("Squeeze", ["eq"], ["cond"]),
    ]
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [], [vinfo("t", None)]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [vinfo("e", None)]
    )
    model = make_model(
        [
            *rank_is_2,
            helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [vinfo("x", ["n", "m"])],
        [vinfo("y", None)],
    )
    module = anyshape.onnx.compile(model)
    for shape in ((3, 4), (1, 0)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(module(x)[0], np.maximum(x, 0))
    assert "Neg" not in str(anyshape.onnx.explain(model).ir_ops)  # one branch compiled


def test_if_on_tensor_data_is_refused_with_the_reason():
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "t", [], [vinfo("t", None)]
    )
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "e", [], [vinfo("e", None)])
    model = make_model(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Constant", [], ["z"], value=numpy_helper.from_array(np.float32(0))),
            helper.make_node("Greater", ["s", "z"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [vinfo("x", ["n"])],
        [vinfo("y", None)],
    )
    with pytest.raises(anyshape.errors.UnsupportedError, match="If.*condition must be known"):
        anyshape.onnx.compile(model)


def test_weights_are_packed_once_not_per_call(monkeypatch):
    """An ONNX module's weights never change: it lets the library keep packed copies
    (oneDNN), as plugin mode does; unwatched weights are packed again on every call."""
    from anyshape.codegen.cpu.executable import CpuExecutable

    watched = []
    real = CpuExecutable.watch_weights
    monkeypatch.setattr(
        CpuExecutable, "watch_weights", lambda self: (watched.append(self), real(self))
    )
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32), "w"
    )
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vinfo("x", ["n", 32])],
        [vinfo("y", None)],
        [w],
    )
    module = anyshape.onnx.compile(model)
    if not module.compiled.executable.packed_params:
        pytest.fail(
            "expected the weight on oneDNN's packed matmul route (onednn-cpu-gomp installed)"
        )
    assert watched == [module.compiled.executable]
    x = np.ones((3, 32), np.float32)
    np.testing.assert_allclose(module(x)[0], x @ numpy_helper.to_array(w), rtol=1e-5, atol=1e-5)


def test_dlpack_inputs_are_read_without_a_copy():
    class Producer:  # a DLPack producer that is neither NumPy nor torch
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", ["n"])], [vinfo("y", None)]
    )
    module = anyshape.onnx.compile(model)
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    np.testing.assert_array_equal(module(Producer(x))[0], np.maximum(x, 0))
    with pytest.raises(InputError, match="NumPy array, a torch tensor or a DLPack tensor"):
        module(object())
