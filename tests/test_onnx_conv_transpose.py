"""ONNX ConvTranspose (``anyshape/frontends/onnx/conv_transpose.py``) and the AveragePool
cases ``nn_ops.py`` compiles through a counted average (ceil mode, asymmetric padding).

Each model declares symbolic dims (``dim_param``), is compiled once and run at several
shapes (a size-1 dim included); outputs are compared with onnxruntime's and each test
asserts that one compilation served every shape. Covered: ConvTranspose 1-D, 2-D and 3-D
with strides, dilations, groups, bias, asymmetric pads, output_padding, auto_pad
(SAME_UPPER, SAME_LOWER, VALID), output_shape, opset 11 and a weight given as a graph
input (compiled per value); AveragePool with ceil_mode partial windows (count_include_pad
0 and 1, dilations, 3-D), SAME_UPPER/SAME_LOWER with count_include_pad=0, and MaxPool's
ceil mode with a stride on symbolic sizes; and the refusals.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx_helpers
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anyshape
from anyshape.errors import UnsupportedError

F32 = TensorProto.FLOAT
node = helper.make_node


def make_model(nodes, inputs, initializers=(), opset=22):
    outputs = [helper.make_tensor_value_info("y", F32, None)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def vinfo(name, dims):
    return helper.make_tensor_value_info(name, F32, dims)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


run_against_ort = functools.partial(onnx_helpers.run_against_ort, atol=1e-4)


def images(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes]


def conv_t_model(cin, cout_per_group, kernel, attrs, bias=True, dims=None, opset=22, seed=1):
    """A ConvTranspose over ``x`` [n, cin, *spatial] with constant weight (and bias)."""
    rng = np.random.default_rng(seed)
    n = len(kernel)
    group = attrs.get("group", 1)
    inits = [init("w", rng.standard_normal((cin, cout_per_group, *kernel)))]
    names = ["x", "w"]
    if bias:
        inits.append(init("b", rng.standard_normal(cout_per_group * group)))
        names.append("b")
    dims = dims or ["n", cin, *(f"s{i}" for i in range(n))]
    return make_model(
        [node("ConvTranspose", names, ["y"], **attrs)], [vinfo("x", dims)], inits, opset
    )


# --- ConvTranspose ------------------------------------------------------------------------------


def test_conv_transpose_2d_stride_pads_output_padding():
    attrs = dict(strides=[2, 3], pads=[1, 0, 0, 2], output_padding=[1, 2], kernel_shape=[3, 3])
    model = conv_t_model(4, 3, (3, 3), attrs)
    run_against_ort(model, images((1, 4, 1, 1), (2, 4, 5, 3), (1, 4, 2, 7)))


def test_conv_transpose_1d_dilations_no_bias():
    attrs = dict(strides=[3], dilations=[2], pads=[2, 0])
    model = conv_t_model(2, 3, (3,), attrs, bias=False)
    run_against_ort(model, images((1, 2, 1), (3, 2, 7)))


def test_conv_transpose_3d_groups():
    attrs = dict(strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0], group=2)
    model = conv_t_model(4, 3, (2, 3, 2), attrs)
    run_against_ort(model, images((1, 4, 1, 1, 1), (2, 4, 3, 4, 2)))


def test_conv_transpose_depthwise_dilated():
    attrs = dict(strides=[2, 2], dilations=[2, 1], pads=[1, 1, 1, 1], group=3)
    model = conv_t_model(3, 1, (3, 2), attrs)
    run_against_ort(model, images((1, 3, 1, 2), (2, 3, 4, 4)))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_transpose_auto_pad(auto_pad):
    # total padding 1 + 3 - 2 = 2 per dim with output_padding 1: odd splits differ by side
    attrs = dict(strides=[2, 2], auto_pad=auto_pad, output_padding=[1, 0])
    model = conv_t_model(2, 2, (3, 3), attrs)
    run_against_ort(model, images((1, 2, 1, 1), (2, 2, 4, 3)))


@pytest.mark.parametrize(
    "attrs",
    [
        dict(strides=[2], output_shape=[8]),  # total padding 1: one cropped at the start
        dict(strides=[2], output_shape=[6]),  # 3: two at the start, one at the end
        dict(strides=[2], output_shape=[10], pads=[2, 2]),  # -1: one zero more at the end
        dict(strides=[3], output_shape=[11], output_padding=[1]),
        dict(strides=[2], output_shape=[7], auto_pad="SAME_UPPER"),
        dict(strides=[2], output_shape=[6], auto_pad="SAME_UPPER"),
        dict(strides=[2], output_shape=[6], auto_pad="SAME_LOWER"),
    ],
)
def test_conv_transpose_output_shape(attrs):
    model = conv_t_model(2, 2, (3,), attrs, dims=["n", 2, 4])
    run_against_ort(model, images((1, 2, 4), (3, 2, 4)))


def test_conv_transpose_opset11():
    model = conv_t_model(2, 2, (2, 2), dict(strides=[2, 2]), opset=11)
    run_against_ort(model, images((1, 2, 1, 1), (2, 2, 3, 5)))


def test_conv_transpose_weight_input_compiles_per_value():
    """A weight given as a graph input is compiled in as the value of the call."""
    model = make_model(
        [node("ConvTranspose", ["x", "w"], ["y"], strides=[2])],
        [vinfo("x", ["n", 2, "l"]), vinfo("w", [2, 3, 3])],
        opset=22,
    )
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 3, 3)).astype(np.float32)
    before = anyshape.stats()["compilations"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = anyshape.onnx.compile(model)
        sess = ort.InferenceSession(model.SerializeToString())
        for shape in ((1, 2, 1), (2, 2, 5)):
            x = rng.standard_normal(shape).astype(np.float32)
            (got,) = module(x, w)
            np.testing.assert_allclose(got, sess.run(None, {"x": x, "w": w})[0], atol=1e-4)
    assert anyshape.stats()["compilations"] - before == 1


def test_conv_transpose_refusals():
    computed = make_model(
        [node("Neg", ["w0"], ["w"]), node("ConvTranspose", ["x", "w"], ["y"])],
        [vinfo("x", ["n", 2, "l"]), vinfo("w0", [2, 2, 3])],
    )
    with pytest.raises(UnsupportedError, match="ConvTranspose.*must be a constant"):
        anyshape.onnx.compile(computed)
    symbolic_output_shape = conv_t_model(2, 2, (3,), dict(strides=[2], output_shape=[8]))
    with pytest.raises(UnsupportedError, match="output_shape with a symbolic input size"):
        anyshape.onnx.compile(symbolic_output_shape)
    wide_stride = conv_t_model(2, 2, (1,), dict(strides=[3], auto_pad="SAME_UPPER"))
    with pytest.raises(UnsupportedError, match="runtimes disagree"):
        anyshape.onnx.compile(wide_stride)
    too_large = conv_t_model(2, 2, (3,), dict(strides=[2], output_shape=[11]), dims=["n", 2, 4])
    with pytest.raises(UnsupportedError, match="larger than the full result"):
        anyshape.onnx.compile(too_large)
    bad_adj = conv_t_model(2, 2, (3,), dict(strides=[2], output_padding=[2]))
    with pytest.raises(UnsupportedError, match="output_padding"):
        anyshape.onnx.compile(bad_adj)


# --- AveragePool (and MaxPool) in ceil mode or with asymmetric padding ------------------------


def pool_model(op, attrs, rank=2, opset=19):
    dims = ["n", "c", *(f"s{i}" for i in range(rank))]
    return make_model([node(op, ["x"], ["y"], **attrs)], [vinfo("x", dims)], opset=opset)


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_ceil_partial_window(count_include_pad):
    attrs = dict(
        kernel_shape=[3, 2],
        strides=[2, 2],
        pads=[1, 0, 1, 1],
        ceil_mode=1,
        count_include_pad=count_include_pad,
    )
    model = pool_model("AveragePool", attrs)
    run_against_ort(model, images((1, 2, 1, 1), (2, 3, 4, 5), (1, 1, 7, 6)))


def test_average_pool_ceil_3d_dilations():
    attrs = dict(kernel_shape=[3, 2, 2], strides=[2, 3, 1], dilations=[2, 1, 2], ceil_mode=1)
    model = pool_model("AveragePool", attrs, rank=3)
    run_against_ort(model, images((1, 1, 5, 2, 3), (2, 2, 8, 7, 5)))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_average_pool_same_count_exclude_pad(auto_pad):
    attrs = dict(kernel_shape=[2, 3], auto_pad=auto_pad)
    model = pool_model("AveragePool", attrs)
    run_against_ort(model, images((1, 1, 1, 1), (2, 3, 6, 5)))


def test_max_pool_ceil_stride_symbolic():
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    model = pool_model("MaxPool", attrs)
    run_against_ort(model, images((1, 1, 1, 1), (2, 3, 6, 7), (1, 2, 5, 4)))
