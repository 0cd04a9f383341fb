"""The ONNX frontend's resize family (``anyshape/frontends/onnx/resize.py``).

Each model declares symbolic dims (``dim_param``), is compiled once and run at
several shapes (a size-1 dim included); outputs are compared with onnxruntime's
and each test asserts that one compilation served every shape. Covered: Resize
(nearest modes, linear, cubic with exclude_outside, antialias, align_corners,
axes, scales and symbolic sizes, opset 10), Upsample, Pad in every mode (runtime
fill value, negative pads, axes), CenterCropPad (static and run-time decided),
DepthToSpace / SpaceToDepth, Col2Im, AffineGrid, GridSample (every mode and
padding) and LpPool; and the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_helpers import init, make_model, run_against_ort, vinfo

import anyshape
from anyshape.errors import UnsupportedError

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
U8 = TensorProto.UINT8
node = helper.make_node


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def images(rng, *shapes, name="x"):
    return [{name: rand(rng, *s)} for s in shapes]


NCHW = ["n", "c", "h", "w"]


# --- Resize and Upsample -----------------------------------------------------------------------


def _resize_model(attrs, scales=None, sizes=None, roi=None, opset=19, out=None):
    inits, names = [], ["x", "", "", ""]
    for k, (key, value) in enumerate((("roi", roi), ("scales", scales), ("sizes", sizes))):
        if value is not None:
            dtype = np.int64 if key == "sizes" else np.float32
            inits.append(init(key, np.array(value, dtype=dtype)))
            names[k + 1] = key
    while names[-1] == "":
        names.pop()
    nodes = [node("Resize", names, ["y"], **attrs)]
    return make_model(nodes, [vinfo("x", NCHW)], [vinfo("y", out or NCHW)], inits, opset)


@pytest.mark.parametrize(
    "attrs, scales",
    [
        ({"mode": "nearest"}, [1, 1, 2, 3]),
        ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 0.5, 1.5]),
        (
            {
                "mode": "nearest",
                "nearest_mode": "floor",
                "coordinate_transformation_mode": "asymmetric",
            },
            [1, 1, 2, 0.5],
        ),
        ({"mode": "linear"}, [1, 1, 2, 0.5]),
        ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 4]),
        ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.25]),
        ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, [1, 1, 2, 0.5]),
        ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 2, 2]),
    ],
)
def test_resize_by_scales_keeps_dims_symbolic(attrs, scales):
    rng = np.random.default_rng(0)
    module = run_against_ort(
        _resize_model(attrs, scales=scales), images(rng, (1, 2, 4, 8), (2, 1, 1, 4), (1, 3, 6, 12))
    )
    # floor(h * scale) stays a symbolic dim: the output shape follows every input shape.
    assert module(x=rand(rng, 1, 1, 10, 16))[0].shape == (
        1,
        1,
        int(10 * scales[2]),
        int(16 * scales[3]),
    )


def test_resize_to_symbolic_sizes_of_another_input():
    """sizes = (n, c) of x and (h, w) of ref: the output dims are ref's symbols."""
    nodes = [
        node("Shape", ["x"], ["sx"], end=2),
        node("Shape", ["ref"], ["sr"], start=2),
        node("Concat", ["sx", "sr"], ["sizes"], axis=0),
        node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
        node(
            "Resize",
            ["x", "", "", "sizes"],
            ["z"],
            mode="nearest",
            coordinate_transformation_mode="half_pixel_symmetric",
        ),
    ]
    inputs = [vinfo("x", NCHW), vinfo("ref", ["m", "k", "H", "W"])]
    model = make_model(
        nodes, inputs, [vinfo("y", ["n", "c", "H", "W"]), vinfo("z", ["n", "c", "H", "W"])]
    )
    rng = np.random.default_rng(1)
    cases = [
        {"x": rand(rng, 1, 2, 4, 5), "ref": rand(rng, 1, 1, 7, 3)},
        {"x": rand(rng, 2, 1, 1, 6), "ref": rand(rng, 3, 2, 3, 1)},
        {"x": rand(rng, 1, 1, 9, 2), "ref": rand(rng, 1, 1, 9, 2)},
    ]
    run_against_ort(model, cases)


def test_resize_axes_tf_crop_and_uint8():
    rng = np.random.default_rng(2)
    crop = _resize_model(
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "axes": [3, 2],
            "extrapolation_value": 9.0,
        },
        roi=[0.2, 0.1, 1.2, 0.8],
        scales=[1.5, 2.0],
    )
    # Where scale * size is fractional, onnxruntime divides by the floored output size and
    # ONNX's reference (which anyshape follows) by the fractional one: whole sizes here.
    run_against_ort(crop, images(rng, (1, 2, 4, 6), (2, 1, 1, 2)))
    pixels = [{"x": rng.integers(0, 256, s, dtype=np.uint8)} for s in ((1, 3, 4, 5), (1, 1, 1, 7))]
    nearest = _resize_model({"mode": "nearest"}, scales=[1, 1, 2.5, 0.5])
    nearest.graph.input[0].type.tensor_type.elem_type = U8
    nearest.graph.output[0].type.tensor_type.elem_type = U8
    run_against_ort(nearest, pixels, rtol=0, atol=0)


def test_resize_opset10_and_upsample():
    rng = np.random.default_rng(3)
    cases = images(rng, (1, 2, 3, 4), (2, 1, 1, 1))
    for opset, mode, scales in ((10, "nearest", [1, 1, 2, 3]), (10, "linear", [1, 1, 2, 2])):
        model = make_model(
            [node("Resize", ["x", "scales"], ["y"], mode=mode)],
            [vinfo("x", NCHW)],
            [vinfo("y", NCHW)],
            [init("scales", np.array(scales, np.float32))],
            opset,
        )
        run_against_ort(model, cases)
    up9 = make_model(
        [node("Upsample", ["x", "scales"], ["y"], mode="nearest")],
        [vinfo("x", NCHW)],
        [vinfo("y", NCHW)],
        [init("scales", np.array([1, 1, 2, 3], np.float32))],
        9,
    )
    run_against_ort(up9, cases)
    up7 = make_model(
        [node("Upsample", ["x"], ["y"], mode="linear", scales=[1.0, 1.0, 2.0, 2.0])],
        [vinfo("x", NCHW)],
        [vinfo("y", NCHW)],
        opset=7,
    )
    run_against_ort(up7, cases)


def test_resize_refusals_name_the_node():
    aa = _resize_model({"mode": "linear", "antialias": 1}, sizes=[1, 1, 3, 3])
    aa.graph.node[0].input[3] = "sizes"
    aa.graph.initializer.pop()
    aa.graph.node.insert(0, node("Shape", ["ref"], ["sizes"]))
    aa.graph.input.append(vinfo("ref", ["a", "b", "c", "d"]))
    with pytest.raises(UnsupportedError, match="antialias with a symbolic scale"):
        anyshape.onnx.compile(aa)
    keep = _resize_model(
        {"mode": "nearest", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]}, sizes=[4, 4]
    )
    with pytest.raises(UnsupportedError, match="keep_aspect_ratio_policy"):
        anyshape.onnx.compile(keep)


# --- Pad and CenterCropPad ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes_on_symbolic_dims(mode):
    pads = [0, 1, 2, 3, 0, 0, 1, 2] if mode != "constant" else [0, 1, -1, 3, 0, 0, 2, -2]
    ins = ["x", "pads", "v"] if mode == "constant" else ["x", "pads"]
    inputs = [vinfo("x", NCHW)] + ([vinfo("v", [])] if mode == "constant" else [])
    model = make_model(
        [node("Pad", ins, ["y"], mode=mode)],
        inputs,
        [vinfo("y", NCHW)],
        [init("pads", np.array(pads, np.int64))],
    )
    rng = np.random.default_rng(4)
    cases = images(rng, (1, 2, 4, 5), (2, 3, 3, 4), (1, 2, 5, 8))
    if mode == "constant":
        for k, case in enumerate(cases):
            case["v"] = np.array(1.5 + k, np.float32)
    run_against_ort(model, cases)


def test_pad_with_axes_and_attribute_form():
    rng = np.random.default_rng(5)
    model = make_model(
        [node("Pad", ["x", "pads", "", "axes"], ["y"], mode="reflect")],
        [vinfo("x", NCHW)],
        [vinfo("y", NCHW)],
        [init("pads", np.array([1, 2, 1, 0], np.int64)), init("axes", np.array([-1, 2], np.int64))],
    )
    run_against_ort(model, images(rng, (1, 2, 3, 4), (2, 1, 3, 2)))
    old = make_model(
        [node("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], value=-3.0)],
        [vinfo("x", NCHW)],
        [vinfo("y", NCHW)],
        opset=10,
    )
    run_against_ort(old, images(rng, (1, 2, 3, 4), (1, 1, 1, 1)))


def test_center_crop_pad_decided_at_run_time():
    """h is cropped or padded to 6 depending on the call; w is static."""
    model = make_model(
        [node("CenterCropPad", ["x", "shape"], ["y"], axes=[1, 2])],
        [vinfo("x", ["n", "h", 5])],
        [vinfo("y", ["n", 6, 4])],
        [init("shape", np.array([6, 4], np.int64))],
        opset=18,
    )
    rng = np.random.default_rng(6)
    run_against_ort(
        model, [{"x": rand(rng, *s)} for s in ((2, 9, 5), (1, 3, 5), (1, 6, 5), (1, 1, 5))]
    )


# --- space rearrangement and Col2Im --------------------------------------------------------------


def test_depth_to_space_and_back():
    nodes = [
        node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
        node("DepthToSpace", ["x"], ["e"], blocksize=2),
        node("SpaceToDepth", ["e"], ["s"], blocksize=2),
    ]
    outs = [
        vinfo("d", ["n", "c2", "h2", "w2"]),
        vinfo("e", ["n", "c2", "h2", "w2"]),
        vinfo("s", NCHW),
    ]
    model = make_model(nodes, [vinfo("x", ["n", 8, "h", "w"])], outs)
    rng = np.random.default_rng(7)
    module = run_against_ort(model, images(rng, (1, 8, 2, 3), (2, 8, 1, 1)))
    x = rand(rng, 1, 8, 3, 2)
    np.testing.assert_array_equal(module(x=x)[2], x)


def test_col2im_with_image_shape_from_shapes():
    """image_shape comes from another input's shape: symbolic, known at compile time."""
    nodes = [
        node("Shape", ["ref"], ["img"]),
        node(
            "Col2Im",
            ["x", "img", "block"],
            ["y"],
            strides=[1, 2],
            pads=[1, 0, 1, 1],
            dilations=[2, 1],
        ),
    ]
    inputs = [vinfo("x", ["n", 12, "L"]), vinfo("ref", ["H", "W"])]
    model = make_model(
        nodes,
        inputs,
        [vinfo("y", ["n", 2, "H", "W"])],
        [init("block", np.array([2, 3], np.int64))],
        18,
    )
    rng = np.random.default_rng(8)
    cases = []
    for n, h, w in ((1, 4, 5), (2, 3, 7), (1, 1, 3)):
        blocks = ((h + 2 - 2 - 1) // 1 + 1) * ((w + 1 - 2 - 1) // 2 + 1)
        cases.append({"x": rand(rng, n, 12, blocks), "ref": rand(rng, h, w)})
    run_against_ort(model, cases)


# --- sampling grids and LpPool --------------------------------------------------------------------


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_feeds_grid_sample(align):
    nodes = [
        node("Shape", ["x"], ["size"]),
        node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align),
        node("GridSample", ["x", "grid"], ["y"], align_corners=align),
    ]
    inputs = [vinfo("x", NCHW), vinfo("theta", ["n", 2, 3])]
    model = make_model(nodes, inputs, [vinfo("grid", ["n", "h", "w", 2]), vinfo("y", NCHW)])
    rng = np.random.default_rng(9)
    # A spatial size of 1 with align_corners: torch puts the position at 0 (anyshape too),
    # onnxruntime at 1 and ONNX's reference at -1; so h = 1 only without align_corners.
    shapes = ((1, 4, 5), (2, 2 if align else 1, 3))
    cases = [{"x": rand(rng, n, 2, h, w), "theta": rand(rng, n, 2, 3)} for n, h, w in shapes]
    run_against_ort(model, cases)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_modes(mode, padding):
    model = make_model(
        [
            node(
                "GridSample",
                ["x", "grid"],
                ["y"],
                mode=mode,
                padding_mode=padding,
                align_corners=int(mode == "bicubic"),
            )
        ],
        [vinfo("x", NCHW), vinfo("grid", ["n", "p", "q", 2])],
        [vinfo("y", ["n", "c", "p", "q"])],
        opset=16,
    )
    rng = np.random.default_rng(10)
    # Bicubic with border padding: ONNX's reference (followed here) clamps an outside
    # coordinate before taking its 4 taps, onnxruntime clamps each tap: compare inside.
    reach = 1.0 if (mode, padding) == ("bicubic", "border") else 1.6
    cases = []
    for n, c, h, w, p, q in ((1, 2, 4, 5, 3, 6), (2, 1, 3, 1, 1, 2)):
        grid = rng.uniform(-reach, reach, (n, p, q, 2)).astype(np.float32)
        cases.append({"x": rand(rng, n, c, h, w), "grid": grid})
    run_against_ort(model, cases)


def test_lp_pool_with_pads_strides_and_same():
    nodes = [
        node("LpPool", ["x"], ["a"], kernel_shape=[2, 3], p=3, pads=[1, 0, 1, 2], strides=[1, 2]),
        node("LpPool", ["x"], ["b"], kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
    ]
    model = make_model(
        nodes, [vinfo("x", NCHW)], [vinfo("a", ["n", "c", "p", "q"]), vinfo("b", NCHW)], opset=18
    )
    rng = np.random.default_rng(11)
    run_against_ort(model, images(rng, (1, 2, 4, 6), (2, 1, 1, 3)))
