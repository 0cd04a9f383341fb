"""The ONNX activations family (``anyshape/frontends/onnx/activations.py``).

Hand-built models with symbolic dims (``dim_param``), each compiled once and run
at several shapes (a size-1 dim included); outputs are compared with onnxruntime,
or with ONNX's reference evaluator where onnxruntime lacks the op or the opset
(SwiGLU, signed BitShift and float floor-Mod are opset 28). Each test asserts the
shapes it ran needed exactly one compilation.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx_helpers import make_model, ort_outputs, run_against_ort, vinfo

from anyshape.errors import InputError, UnsupportedError
from anyshape.frontends.onnx import api as onnx_api
from anyshape.frontends.onnx.lower import lower_model
from anyshape.frontends.onnx.reader import read_model

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
F64 = TensorProto.DOUBLE
I8 = TensorProto.INT8
I16 = TensorProto.INT16
I32 = TensorProto.INT32
I64 = TensorProto.INT64
U8 = TensorProto.UINT8


# --- helpers ------------------------------------------------------------------------------


def reference_outputs(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


def run_against(model, cases, oracle=ort_outputs, rtol=1e-4, atol=1e-5):
    return run_against_ort(model, cases, rtol, atol, oracle=oracle)


def spread(rng, *shape, dtype=np.float32):
    """Values over a wide range, with exact zeros and some large magnitudes."""
    x = rng.standard_normal(shape) * 3
    x.reshape(-1)[::7] = 0.0
    x.reshape(-1)[3::11] *= 15
    return x.astype(dtype)


def lowered_ops(model) -> set[str]:
    return {n.op for n in lower_model(read_model(model)).graph.nodes()}


# --- pointwise activations -------------------------------------------------------------------

_UNARY_NODES = [
    ("Elu", {"alpha": 0.7}),
    ("Selu", {}),
    ("Celu", {"alpha": 1.5}),
    ("Softplus", {}),
    ("Softsign", {}),
    ("ThresholdedRelu", {"alpha": 0.3}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", {}),
    ("Mish", {}),
    ("Shrink", {"lambd": 0.5, "bias": 0.2}),
    ("Swish", {"alpha": 0.8}),
]


def _unary_model(elem, opset=24):
    nodes = [helper.make_node(op, ["x"], [f"y{i}"], **a) for i, (op, a) in enumerate(_UNARY_NODES)]
    outs = [vinfo(f"y{i}", ["n", "c"], elem) for i in range(len(nodes))]
    return make_model(nodes, [vinfo("x", ["n", "c"], elem)], outs, opset=opset)


def test_pointwise_activations_at_several_shapes():
    rng = np.random.default_rng(0)
    cases = [{"x": spread(rng, *s)} for s in [(1, 5), (3, 7), (4, 1)]]
    run_against(_unary_model(F32), cases)


def test_half_precision_activations_compute_in_float32():
    rng = np.random.default_rng(1)
    cases = [{"x": spread(rng, *s, dtype=np.float16)} for s in [(2, 9), (1, 1)]]
    # Celu takes f16 from opset 28, which onnxruntime does not run yet
    model = _unary_model(F16, opset=28)
    run_against(model, cases, oracle=reference_outputs, rtol=2e-3, atol=2e-3)


def test_softplus_and_mish_do_not_overflow():
    model = make_model(
        [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Mish", ["x"], ["m"])],
        [vinfo("x", ["n"])],
        [vinfo("s", ["n"]), vinfo("m", ["n"])],
        opset=18,
    )
    x = np.array([-200.0, -90.0, -1.0, 0.0, 1.0, 90.0, 200.0], np.float32)
    s, m = onnx_api.compile(model)(x)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(m))
    np.testing.assert_allclose(s[-2:], x[-2:])
    np.testing.assert_allclose(m[-2:], x[-2:])
    np.testing.assert_allclose(s[:2], 0.0, atol=1e-30)


def test_integer_shrink_truncates_like_onnxruntime():
    model = make_model(
        [helper.make_node("Shrink", ["x"], ["y"], lambd=1.5, bias=1.5)],
        [vinfo("x", ["n"], I32)],
        [vinfo("y", ["n"], I32)],
        opset=9,
    )
    cases = [{"x": np.arange(-4, 5, dtype=np.int32)}, {"x": np.array([7], np.int32)}]
    run_against(model, cases)


def test_activation_of_a_constant_folds_with_numpy():
    w = np.linspace(-3, 3, 6, dtype=np.float32)
    model = make_model(
        [
            helper.make_node("Elu", ["w"], ["e"], alpha=0.5),
            helper.make_node("Mish", ["e"], ["m"]),
            helper.make_node("Add", ["x", "m"], ["y"]),
        ],
        [vinfo("x", ["n", 6])],
        [vinfo("y", ["n", 6])],
        [numpy_helper.from_array(w, "w")],
        opset=18,
    )
    assert not {"expm1", "tanh", "log1p"} & lowered_ops(model)
    rng = np.random.default_rng(2)
    run_against(model, [{"x": spread(rng, 1, 6)}, {"x": spread(rng, 3, 6)}])


def test_prelu_slope_broadcasts_to_x_only():
    rng = np.random.default_rng(3)
    model = make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [vinfo("x", ["n", "c", "l"]), vinfo("slope", ["c", 1])],
        [vinfo("y", ["n", "c", "l"])],
        opset=16,
    )
    cases = [
        {"x": spread(rng, 2, 3, 5), "slope": rng.random((3, 1), np.float32)},
        {"x": spread(rng, 1, 1, 4), "slope": rng.random((1, 1), np.float32)},
    ]
    module = run_against(model, cases)
    with pytest.raises(InputError):  # the slope's channels must be X's
        module(spread(rng, 2, 3, 5), rng.random((4, 1), np.float32))
    fixed = make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [vinfo("x", ["n", 1]), vinfo("slope", [4])],
        [vinfo("y", ["n", 4])],
        opset=16,
    )
    with pytest.raises(UnsupportedError, match="PRelu"):
        onnx_api.compile(fixed)


def test_integer_prelu():
    model = make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [vinfo("x", ["n", 3], I64)],
        [vinfo("y", ["n", 3], I64)],
        [numpy_helper.from_array(np.array([2, 3, -1], np.int64), "slope")],
        opset=16,
    )
    x = np.array([[-4, 5, -6], [0, -1, 7]], np.int64)
    run_against(model, [{"x": x}, {"x": x[:1]}])


def test_swiglu_gates_with_swish_and_guards_equal_shapes():
    rng = np.random.default_rng(4)
    model = make_model(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=0.7)],
        [vinfo("a", ["n", "d"]), vinfo("b", ["m", "d"])],
        [vinfo("y", ["n", "d"])],
        opset=28,
    )
    cases = [{"a": spread(rng, *s), "b": spread(rng, *s)} for s in [(2, 8), (1, 3)]]
    module = run_against(model, cases, oracle=reference_outputs)
    with pytest.raises(InputError):  # no broadcasting: B's rows must be A's
        module(spread(rng, 2, 8), spread(rng, 1, 8))


# --- Hardmax ---------------------------------------------------------------------------------


def _ties(rng, *shape):
    return rng.integers(0, 3, shape).astype(np.float32)  # many ties: the first max wins


def test_hardmax_axis_form_from_opset_13():
    rng = np.random.default_rng(5)
    model = make_model(
        [
            helper.make_node("Hardmax", ["x"], ["y1"], axis=1),
            helper.make_node("Hardmax", ["x"], ["y2"]),
        ],
        [vinfo("x", ["n", "c", "l"])],
        [vinfo("y1", ["n", "c", "l"]), vinfo("y2", ["n", "c", "l"])],
        opset=13,
    )
    run_against(model, [{"x": _ties(rng, 2, 4, 3)}, {"x": _ties(rng, 1, 1, 5)}])


def test_hardmax_coerces_to_2d_before_opset_13():
    rng = np.random.default_rng(6)
    model = make_model(
        [
            helper.make_node("Hardmax", ["x"], ["y1"]),
            helper.make_node("Hardmax", ["x"], ["y0"], axis=0),
        ],
        [vinfo("x", ["n", "c", "l"])],
        [vinfo("y1", ["n", "c", "l"]), vinfo("y0", ["n", "c", "l"])],
        opset=11,
    )
    cases = [{"x": _ties(rng, 2, 3, 4)}, {"x": _ties(rng, 3, 1, 2)}]
    module = run_against(model, cases)
    y1, y0 = module(cases[0]["x"])
    assert y1.reshape(2, -1).sum(axis=1).tolist() == [1, 1]  # one 1 per batch row
    assert y0.sum() == 1


# --- normalizations ----------------------------------------------------------------------------


def test_lp_normalization_p1_p2_and_zero_rows():
    rng = np.random.default_rng(7)
    model = make_model(
        [
            helper.make_node("LpNormalization", ["x"], ["y2"], axis=1),
            helper.make_node("LpNormalization", ["x"], ["y1"], axis=-1, p=1),
        ],
        [vinfo("x", ["n", "c", "l"])],
        [vinfo("y2", ["n", "c", "l"]), vinfo("y1", ["n", "c", "l"])],
        opset=22,
    )
    x = spread(rng, 2, 3, 4)
    x[1, :, 2] = 0.0  # a zero column (axis 1)
    x[0, 1, :] = 0.0  # a zero row (last axis)
    module = run_against(model, [{"x": x}, {"x": spread(rng, 1, 1, 1)}])
    y2, y1 = module(x)
    assert np.all(y2[1, :, 2] == 0) and np.all(y1[0, 1, :] == 0)


def test_mean_variance_normalization_default_and_given_axes():
    rng = np.random.default_rng(8)
    model = make_model(
        [
            helper.make_node("MeanVarianceNormalization", ["x"], ["y"]),
            helper.make_node("MeanVarianceNormalization", ["x"], ["z"], axes=[-1]),
        ],
        [vinfo("x", ["n", "c", "h", "w"])],
        [vinfo("y", ["n", "c", "h", "w"]), vinfo("z", ["n", "c", "h", "w"])],
        opset=13,
    )
    cases = [{"x": spread(rng, 2, 3, 4, 5)}, {"x": spread(rng, 1, 2, 1, 3)}]
    run_against(model, cases, rtol=1e-3, atol=1e-4)


# --- Mod ---------------------------------------------------------------------------------------


def _mod_model(elem, fmod, opset=13):
    return make_model(
        [helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
        [vinfo("a", ["n", "c"], elem), vinfo("b", ["c"], elem)],
        [vinfo("y", ["n", "c"], elem)],
        opset=opset,
    )


def _signed_pairs(rng, dtype, n, c):
    a = rng.integers(-50, 50, (n, c)).astype(dtype)
    b = rng.integers(1, 9, (c,)).astype(dtype) * rng.choice([-1, 1], (c,)).astype(dtype)
    return {"a": a, "b": b}


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_integer_mod_takes_the_sign_of_the_divisor_or_dividend(dtype, fmod):
    rng = np.random.default_rng(9)
    elem = {np.int32: I32, np.int8: I8}[dtype]
    cases = [_signed_pairs(rng, dtype, 3, 6), _signed_pairs(rng, dtype, 1, 1)]
    run_against(_mod_model(elem, fmod), cases)


def test_unsigned_mod():
    rng = np.random.default_rng(10)
    cases = [
        {"a": rng.integers(0, 256, (2, 5)).astype(np.uint8), "b": np.arange(1, 6, dtype=np.uint8)},
        {"a": np.array([[200]], np.uint8), "b": np.array([7], np.uint8)},
    ]
    run_against(_mod_model(U8, 0), cases)


def test_float_fmod_matches_onnxruntime():
    rng = np.random.default_rng(11)
    cases = [
        {"a": spread(rng, 2, 4), "b": np.array([1.5, -2.0, 0.7, -0.3], np.float32)},
        {"a": spread(rng, 1, 1), "b": np.array([-4.0], np.float32)},
    ]
    run_against(_mod_model(F32, 1), cases)


@pytest.mark.parametrize("elem,dtype", [(F64, np.float64), (F16, np.float16)])
def test_float_floor_mod_with_edge_cases(elem, dtype):
    inf, nan = np.inf, np.nan
    a = np.array([[5.5, -5.5, 5.5, -5.5, 0.0, -0.0, inf, 3.0, -3.0, 3.0, nan, 4.0]], dtype)
    b = np.array([2.0, 2.0, -2.0, -2.0, -3.0, 3.0, 2.0, inf, inf, 0.0, 1.0, -2.0], dtype)
    module = run_against(
        _mod_model(elem, 0, opset=28),
        [{"a": a, "b": b}, {"a": np.repeat(a, 3, axis=0), "b": b}],
        oracle=reference_outputs,
    )
    (y,) = module(a, b)
    assert np.signbit(y[0, 4]) and not np.signbit(y[0, 5])  # a zero takes b's sign
    assert np.signbit(y[0, 11])  # 4 mod -2 is -0


def test_mod_of_a_shape_folds_to_a_symbolic_dim():
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Mod", ["s", "k"], ["r"]),
            helper.make_node("ConstantOfShape", ["r"], ["y"]),
        ],
        [vinfo("x", ["n"])],
        [vinfo("y", None)],
        [numpy_helper.from_array(np.array([4], np.int64), "k")],
        opset=13,
    )
    cases = [{"x": np.zeros(n, np.float32)} for n in (1, 6, 8)]
    module = run_against(model, cases)
    assert module(np.zeros(7, np.float32))[0].shape == (3,)


# --- bit ops ---------------------------------------------------------------------------------------


def _shift_model(elem, direction, opset):
    return make_model(
        [helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)],
        [vinfo("x", ["n", "c"], elem), vinfo("s", ["c"], elem)],
        [vinfo("y", ["n", "c"], elem)],
        opset=opset,
    )


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_unsigned_bitshift_with_amounts_past_the_width(direction):
    rng = np.random.default_rng(12)
    shifts = np.array([0, 1, 3, 7, 8, 9, 200], np.uint8)
    cases = [
        {"x": rng.integers(0, 256, (2, 7)).astype(np.uint8), "s": shifts},
        {"x": np.array([[255]], np.uint8), "s": np.array([8], np.uint8)},
    ]
    run_against(_shift_model(U8, direction, 11), cases)


@pytest.mark.parametrize("elem,dtype", [(I8, np.int8), (I32, np.int32), (I64, np.int64)])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_signed_bitshift_is_arithmetic_and_defined_everywhere(elem, dtype, direction):
    bits = 8 * np.dtype(dtype).itemsize
    x = np.array([[-128, -5, -1, 1, 5, 100, 127, -100]], dtype)
    s = np.array([1, 2, bits - 1, bits - 1, bits, bits + 3, -1, -3], dtype)
    run_against(
        _shift_model(elem, direction, 28),
        [{"x": x, "s": s}, {"x": np.repeat(x, 2, axis=0), "s": s}],
        oracle=reference_outputs,
    )


@pytest.mark.parametrize("elem,dtype", [(I32, np.int32), (I16, np.int16), (U8, np.uint8)])
def test_bitwise_and_or_xor_not(elem, dtype):
    rng = np.random.default_rng(13)
    info = np.iinfo(dtype)
    model = make_model(
        [
            helper.make_node("BitwiseAnd", ["a", "b"], ["y_and"]),
            helper.make_node("BitwiseOr", ["a", "b"], ["y_or"]),
            helper.make_node("BitwiseXor", ["a", "b"], ["y_xor"]),
            helper.make_node("BitwiseNot", ["a"], ["y_not"]),
        ],
        [vinfo("a", ["n", "c"], elem), vinfo("b", ["c"], elem)],
        [vinfo(f"y_{k}", ["n", "c"], elem) for k in ("and", "or", "xor", "not")],
        opset=18,
    )

    def ints(*shape):
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)

    run_against(model, [{"a": ints(3, 5), "b": ints(5)}, {"a": ints(1, 1), "b": ints(1)}])


# --- refusals ---------------------------------------------------------------------------------------


def test_unsupported_attributes_are_named():
    lp3 = make_model(
        [helper.make_node("LpNormalization", ["x"], ["y"], name="norm3", p=3)],
        [vinfo("x", ["n", 4])],
        [vinfo("y", ["n", 4])],
    )
    with pytest.raises(UnsupportedError, match=r"'norm3' \(LpNormalization.*p=3"):
        onnx_api.compile(lp3)
    fmod2 = make_model(
        [helper.make_node("Mod", ["a", "a"], ["y"], name="m2", fmod=2)],
        [vinfo("a", ["n"], I32)],
        [vinfo("y", ["n"], I32)],
    )
    with pytest.raises(UnsupportedError, match=r"'m2' \(Mod.*fmod=2"):
        onnx_api.compile(fmod2)
