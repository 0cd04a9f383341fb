"""The ONNX loss family (``anyshape/frontends/onnx/losses.py``) against onnxruntime.

NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on models with symbolic
dims, each compiled once and run at several shapes (a size-1 dim included):
every reduction, class weights, ignore_index (inside and outside the class
range, negative), the log_prob output, f16/f64 inputs with int32 targets,
constant folding, and the errors (a target out of range, mismatched dims, an
unknown reduction).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_helpers
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_helpers import ort_outputs, run_against_ort, vinfo

from anyshape.errors import InputError, UnsupportedError
from anyshape.frontends.onnx import api as onnx_api
from anyshape.ir.dtypes import DType

F16, F32, F64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE
I32, I64 = TensorProto.INT32, TensorProto.INT64
NLL, SCE = "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"


# --- helpers ------------------------------------------------------------------------------


make_model = functools.partial(onnx_helpers.make_model, opset=18)


def loss_model(op, x_dims, t_dims, *, weight=False, log_prob=False, elem=F32, t_elem=I64, **attrs):
    """One loss node: inputs x, t (and w), outputs loss (and log_prob)."""
    ins = ["x", "t"] + (["w"] if weight else [])
    outs = ["loss"] + (["log_prob"] if log_prob else [])
    node = helper.make_node(op, ins, outs, **attrs)
    inputs = [vinfo("x", x_dims, elem), vinfo("t", t_dims, t_elem)]
    if weight:
        inputs.append(vinfo("w", [x_dims[1]], elem))
    loss_dims = t_dims if attrs.get("reduction") == "none" else []
    outputs = [vinfo("loss", loss_dims, elem)]
    if log_prob:
        outputs.append(vinfo("log_prob", x_dims, elem))
    return make_model([node], inputs, outputs)


def feeds_for(
    rng, shape, classes, *, weight=False, ignore=None, dtype=np.float32, t_dtype=np.int64
):
    """x of ``shape`` (classes at dim 1), targets in range with some set to ``ignore``."""
    n, rest = shape[0], shape[2:]
    x = rng.standard_normal(shape).astype(dtype)
    t = rng.integers(0, classes, size=(n, *rest)).astype(t_dtype)
    if ignore is not None:
        t[rng.random(t.shape) < 0.3] = ignore
        t.reshape(-1)[0] = 0  # at least one element counts in a mean
    feeds = {"x": x, "t": t}
    if weight:
        feeds["w"] = rng.uniform(0.2, 2.0, classes).astype(dtype)
    return feeds


# --- NegativeLogLikelihoodLoss ------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_nll_every_reduction_with_weight_and_ignore_index(reduction):
    model = loss_model(
        NLL, ["N", 5, "D"], ["N", "D"], weight=True, reduction=reduction, ignore_index=2
    )
    rng = np.random.default_rng(0)
    shapes = [(3, 5, 4), (1, 5, 1), (6, 5, 7)]
    run_against_ort(model, [feeds_for(rng, s, 5, weight=True, ignore=2) for s in shapes])


def test_nll_2d_input_symbolic_classes_mean_without_weight():
    model = loss_model(NLL, ["N", "C"], ["N"])
    rng = np.random.default_rng(1)
    run_against_ort(model, [feeds_for(rng, (n, c), c) for n, c in [(4, 3), (1, 1), (9, 6)]])


def test_nll_mean_ignore_index_out_of_class_range_counts_only_kept_elements():
    """A negative ignore_index: ignored targets index nothing and leave the mean's count."""
    model = loss_model(NLL, ["N", 4, "H", "W"], ["N", "H", "W"], ignore_index=-100)
    rng = np.random.default_rng(2)
    shapes = [(2, 4, 3, 5), (1, 4, 1, 1), (3, 4, 2, 6)]
    module = run_against_ort(model, [feeds_for(rng, s, 4, ignore=-100) for s in shapes])
    feeds = feeds_for(rng, (2, 4, 3, 3), 4)
    feeds["t"][0] = -100
    kept = feeds["t"] != -100
    picked = np.take_along_axis(feeds["x"], np.where(kept, feeds["t"], 0)[:, None], axis=1)[:, 0]
    want = -(picked[kept]).mean()
    np.testing.assert_allclose(module(**feeds)[0], want, rtol=1e-5)


@pytest.mark.parametrize(("elem", "dtype"), [(F64, np.float64), (F16, np.float16)])
def test_nll_f64_and_f16_inputs_with_int32_targets(elem, dtype):
    model = loss_model(
        NLL, ["N", 3, "D"], ["N", "D"], weight=True, elem=elem, t_elem=I32, reduction="mean"
    )
    rng = np.random.default_rng(3)
    cases = [
        feeds_for(rng, s, 3, weight=True, dtype=dtype, t_dtype=np.int32)
        for s in [(2, 3, 5), (1, 3, 1)]
    ]
    tol = 1e-3 if dtype == np.float16 else 1e-10
    run_against_ort(model, cases, rtol=tol, atol=tol)


def test_nll_target_out_of_range_raises_instead_of_wrapping():
    model = loss_model(NLL, ["N", 3], ["N"], reduction="none", ignore_index=-1)
    module = onnx_api.compile(model)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(module(x=x, t=np.array([0, -1, 2, 1]))[0], [-0.0, 0, -8, -10])
    for bad in (3, -2):
        with pytest.raises(IndexError):
            module(x=x, t=np.array([0, bad, 2, 1]))


def test_nll_target_dims_must_match_input_dims():
    model = loss_model(NLL, ["N", 3, "D"], ["M", "E"], reduction="none")
    module = onnx_api.compile(model)
    rng = np.random.default_rng(4)
    good = feeds_for(rng, (2, 3, 4), 3)
    assert module(**good)[0].shape == (2, 4)
    with pytest.raises(InputError):
        module(x=good["x"], t=good["t"][:, :3])


def test_nll_all_constant_inputs_fold():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    t = np.array([[0, 3], [1, 1], [2, 0]], dtype=np.int64)
    w = np.array([1.0, 0.5, 2.0, 0.25], dtype=np.float32)
    node = helper.make_node(NLL, ["x", "t", "w"], ["loss"], reduction="mean", ignore_index=1)
    inits = [numpy_helper.from_array(a, n) for a, n in ((x, "x"), (t, "t"), (w, "w"))]
    model = make_model([node], [], [vinfo("loss", [])], inits)
    module = onnx_api.compile(model)
    assert not any(n.op in ("take_along_axis", "gather") for n in module.graph.nodes())
    np.testing.assert_allclose(module()[0], ort_outputs(model, {})[0], rtol=1e-6)


def test_nll_mean_with_every_element_ignored_or_empty_is_nan_as_onnxruntime():
    model = loss_model(NLL, ["N", 3], ["N"], weight=True, ignore_index=1)
    w = np.ones(3, np.float32)
    x = np.ones((2, 3), np.float32)
    cases = [
        {"x": x, "t": np.array([1, 1]), "w": w},
        {"x": x[:0], "t": np.zeros(0, np.int64), "w": w},
        {"x": x[:1], "t": np.array([0]), "w": w},
    ]
    module = run_against_ort(model, cases)
    assert np.isnan(module(**cases[0])[0])


def test_unknown_reduction_is_refused_clearly():
    model = loss_model(NLL, ["N", 3], ["N"], reduction="max")
    with pytest.raises(UnsupportedError, match="reduction 'max'"):
        onnx_api.compile(model)


# --- SoftmaxCrossEntropyLoss --------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_sce_with_log_prob_every_reduction(reduction):
    model = loss_model(
        SCE, ["N", 6, "D"], ["N", "D"], weight=True, log_prob=True, reduction=reduction
    )
    rng = np.random.default_rng(6)
    shapes = [(2, 6, 3), (1, 6, 1), (5, 6, 4)]
    run_against_ort(model, [feeds_for(rng, s, 6, weight=True) for s in shapes])


def test_sce_mean_weight_ignore_index_in_class_range_4d():
    model = loss_model(
        SCE, ["N", 3, "H", "W"], ["N", "H", "W"], weight=True, ignore_index=1, log_prob=True
    )
    rng = np.random.default_rng(7)
    shapes = [(2, 3, 4, 2), (1, 3, 1, 1), (3, 3, 2, 5)]
    run_against_ort(model, [feeds_for(rng, s, 3, weight=True, ignore=1) for s in shapes])


def test_sce_2d_symbolic_classes_no_weight_ignore_index():
    model = loss_model(SCE, ["N", "C"], ["N"], ignore_index=-5)
    rng = np.random.default_rng(8)
    cases = [feeds_for(rng, (n, c), c, ignore=-5) for n, c in [(6, 4), (1, 1), (3, 9)]]
    run_against_ort(model, cases)


def test_sce_f64_with_int32_targets():
    model = loss_model(SCE, ["N", 4], ["N"], log_prob=True, elem=F64, t_elem=I32, reduction="sum")
    rng = np.random.default_rng(9)
    cases = [feeds_for(rng, (n, 4), 4, dtype=np.float64, t_dtype=np.int32) for n in (5, 1)]
    run_against_ort(model, cases, rtol=1e-10, atol=1e-10)


def test_sce_f16_with_weight_ignore_index_and_log_prob():
    model = loss_model(
        SCE, ["N", 5, "D"], ["N", "D"], weight=True, elem=F16, log_prob=True, ignore_index=4
    )
    rng = np.random.default_rng(10)
    cases = [
        feeds_for(rng, s, 5, weight=True, ignore=4, dtype=np.float16)
        for s in [(3, 5, 2), (1, 5, 1)]
    ]
    module = run_against_ort(model, cases, rtol=2e-3, atol=2e-3)
    assert [n.dtype for n in module.graph.outputs] == [DType.f16, DType.f16]


def test_sce_ignore_index_beyond_int32_targets_ignores_nothing():
    model = loss_model(SCE, ["N", 3], ["N"], t_elem=I32, ignore_index=-(2**40), reduction="sum")
    rng = np.random.default_rng(11)
    cases = [feeds_for(rng, (n, 3), 3, t_dtype=np.int32) for n in (4, 1)]
    run_against_ort(model, cases)
