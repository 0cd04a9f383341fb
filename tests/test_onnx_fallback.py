"""The ONNX Runtime fallback (``anyshape/frontends/onnx/fallback.py``): plugin mode for ONNX.

Models mixing supported ops with ops anyshape lacks (``Det``,
``NonMaxSuppression``, an ``If`` on tensor data) compile once with
``fallback="onnxruntime"`` and run at several shapes (size 1 included); each
output is compared with onnxruntime on the whole model. Also: the segment plan
and ``explain()``, a fully supported model (the plain module), the error
without fallback, torch tensors, and a node that lowers alone but fails to
compile in its segment.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_helpers import init, make_model, vinfo

import anyshape
from anyshape.errors import InputError, UnsupportedError
from anyshape.frontends.onnx import fallback as fb
from anyshape.frontends.onnx.compile import OnnxModule

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def check_against_ort(module, model, cases, rtol=1e-4, atol=1e-5):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in cases:
        got = module(**feeds)
        want = sess.run(None, feeds)
        assert len(got) == len(want) == len(module.output_names)
        for name, g, w in zip(module.output_names, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


def det_model():
    """MatMul -> Reshape (b, 3, 3) -> Det (unsupported) -> Reshape to (b, 1) -> Tanh,
    the target shape computed from x's shape (Shape -> Gather -> Unsqueeze -> Concat)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Reshape", ["h", "sq"], ["m"], name="to_square"),
        helper.make_node("Det", ["m"], ["d"], name="det"),
        helper.make_node("Shape", ["x"], ["xs"], name="shape_x"),
        helper.make_node("Gather", ["xs", "zero"], ["b0"], axis=0, name="batch"),
        helper.make_node("Unsqueeze", ["b0", "ax0"], ["b1"], name="unsq"),
        helper.make_node("Concat", ["b1", "one"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["d", "target"], ["d2"], name="to_column"),
        helper.make_node("Tanh", ["d2"], ["y"], name="tanh"),
        helper.make_node("Relu", ["h"], ["z"], name="relu"),
    ]
    rng = np.random.default_rng(0)
    return make_model(
        nodes,
        [vinfo("x", ["b", 4])],
        [vinfo("y", ["b", 1]), vinfo("z", ["b", 9])],
        [
            init("w", rng.standard_normal((4, 9)).astype(np.float32)),
            init("sq", np.array([-1, 3, 3], np.int64)),
            init("zero", np.array(0, np.int64)),
            init("ax0", np.array([0], np.int64)),
            init("one", np.array([1], np.int64)),
        ],
    )


def x_cases(*batches, width=4, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((b, width)).astype(np.float32)} for b in batches]


def test_unsupported_ops_are_ones_anyshape_lacks():
    ops = anyshape.onnx.supported_ops()
    assert "Det" not in ops and "NonMaxSuppression" not in ops and "If" not in ops


def test_det_runs_in_onnxruntime_between_two_compiled_segments():
    model = det_model()
    before = anyshape.stats()["compilations"]
    module = anyshape.onnx.compile(model, fallback="onnxruntime")
    assert isinstance(module, fb.FallbackModule)
    assert [s.kind for s in module.segments] == ["anyshape", "onnxruntime", "anyshape"]
    assert module.compiled_segments == 2 and module.compilations == 2
    assert module.input_names == ["x"] and module.output_names == ["y", "z"]
    # The shape chain is copied into the segment reading it, so it folds there: the
    # last segment takes x (for its shape) and d, never the target shape as a value.
    assert module.segments[2].inputs == ["x", "d"]
    assert not any(hasattr(s.runner, "value_inputs") for s in module.segments)
    check_against_ort(module, model, x_cases(1, 5, 3, 1))
    assert anyshape.stats()["compilations"] - before == 2  # nothing recompiled per shape
    out = module.run({"x": x_cases(2)[0]["x"]})
    assert list(out) == ["y", "z"] and out["y"].shape == (2, 1)
    text = str(module.explain())
    assert "'det' (Det)" in text and "ONNX Runtime" in text
    assert "op Det (opset 20) is not supported" in text
    assert "compiled by anyshape" in text and "MatMul x1" in text


def test_without_fallback_the_same_model_is_refused():
    with pytest.raises(UnsupportedError, match="node 'det'.*Det"):
        anyshape.onnx.compile(det_model())


def test_fully_supported_model_gives_the_plain_module():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", 4])],
        [vinfo("y", ["b", 3])],
        [init("w", np.ones((4, 3), np.float32))],
    )
    module = anyshape.onnx.compile(model, fallback="onnxruntime")
    assert isinstance(module, OnnxModule)
    check_against_ort(module, model, x_cases(1, 6))


def nms_model():
    """Scores from Sigmoid, NonMaxSuppression (unsupported), then the kept boxes gathered
    and scaled: a data-dependent count crosses into the compiled segment after it."""
    nodes = [
        helper.make_node("Sigmoid", ["logits"], ["scores"], name="sig"),
        helper.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "max_out", "iou", "thr"],
            ["sel"],
            name="nms",
        ),
        helper.make_node("Gather", ["sel", "two"], ["idx"], axis=1, name="box_index"),
        helper.make_node("Squeeze", ["boxes", "ax0"], ["flat"], name="flat"),
        helper.make_node("Gather", ["flat", "idx"], ["kept"], axis=0, name="kept"),
        helper.make_node("Mul", ["kept", "scale"], ["out"], name="scale"),
    ]
    return make_model(
        nodes,
        [vinfo("boxes", [1, "n", 4]), vinfo("logits", [1, 1, "n"])],
        [vinfo("out", ["k", 4]), vinfo("sel", ["k", 3], I64)],
        [
            init("max_out", np.array([5], np.int64)),
            init("iou", np.array([0.5], np.float32)),
            init("thr", np.array([0.2], np.float32)),
            init("two", np.array(2, np.int64)),
            init("ax0", np.array([0], np.int64)),
            init("scale", np.array(2.0, np.float32)),
        ],
    )


def nms_cases(*ns):
    rng = np.random.default_rng(3)
    cases = []
    for n in ns:
        lo = rng.uniform(0, 10, (1, n, 2)).astype(np.float32)
        boxes = np.concatenate([lo, lo + rng.uniform(1, 4, (1, n, 2)).astype(np.float32)], 2)
        cases.append({"boxes": boxes, "logits": rng.standard_normal((1, 1, n)).astype(np.float32)})
    return cases


def test_nms_data_dependent_count_crosses_into_a_compiled_segment():
    model = nms_model()
    module = anyshape.onnx.compile(model, fallback="onnxruntime")
    assert [s.kind for s in module.segments] == ["anyshape", "onnxruntime", "anyshape"]
    assert module.compilations == 2
    check_against_ort(module, model, nms_cases(1, 7, 12, 1))
    assert module.compilations == 2
    text = str(module.explain())
    assert "'nms' (NonMaxSuppression)" in text and "is not supported" in text


def test_data_dependent_if_and_the_reshape_it_shapes_run_in_onnxruntime():
    # If on tensor data (anyshape only takes conditions known at compile time) picks
    # the Reshape target: that Reshape runs in ORT too (a target from tensor data is
    # not compiled per value), the Exp after it compiles once for every shape.
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], value=init("tv", np.array([-1, 2], np.int64)))],
        "then",
        [],
        [vinfo("t", [2], I64)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=init("ev", np.array([2, -1], np.int64)))],
        "else",
        [],
        [vinfo("e", [2], I64)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="positive"),
        helper.make_node(
            "If", ["cond"], ["shape"], then_branch=then_g, else_branch=else_g, name="pick"
        ),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Exp", ["r"], ["y"], name="exp"),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", 4])],
        [vinfo("y", [None, None])],
        [init("zero", np.array(0.0, np.float32))],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = anyshape.onnx.compile(model, fallback="onnxruntime")
        kinds = [s.kind for s in module.segments]
        assert kinds == ["anyshape", "onnxruntime", "anyshape"]
        pos, neg = np.ones((3, 4), np.float32), -np.ones((3, 4), np.float32)
        check_against_ort(module, model, [{"x": pos}, {"x": neg}, {"x": pos[:1]}, {"x": pos}])
    assert module.compilations == 2
    assert [name for name, _ in module.explain().segments[1].nodes] == ["pick", "reshape"]
    text = str(module.explain())
    assert "'pick' (If)" in text and "depends on tensor data" in text


def test_torch_tensors_in_give_torch_tensors_out():
    torch = pytest.importorskip("torch")
    module = anyshape.onnx.compile(det_model(), fallback="onnxruntime")
    x = torch.randn(4, 4)
    got = module(x)
    want = module(x.numpy())
    assert all(isinstance(g, torch.Tensor) for g in got)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)
    with pytest.raises(InputError, match="dtype"):
        module(np.ones((2, 4), np.float64))
    with pytest.raises(InputError, match="rank"):
        module(np.ones((2, 4, 1), np.float32))


def test_a_node_that_fails_to_compile_in_its_segment_moves_to_onnxruntime(monkeypatch):
    # The trial lowering accepts Tanh (lowered as Sigmoid here) but the real compile
    # refuses it: the segment compile's error names the node, which moves to ORT.
    from anyshape.frontends.onnx import rules

    def refuse(ctx, node, ins):
        raise UnsupportedError("Tanh refused for this test")

    entries = [rules.RuleEntry("Tanh", 1, 99, refuse)]
    monkeypatch.setitem(rules.RULE_TABLE, "Tanh", entries)
    real = fb.lower_node

    def trial_lower(ctx, proto, model, env):
        if proto.op_type == "Tanh":
            proto = helper.make_node(
                "Sigmoid", list(proto.input), list(proto.output), name=proto.name
            )
        return real(ctx, proto, model, env)

    monkeypatch.setattr(fb, "lower_node", trial_lower)
    model = det_model()
    module = anyshape.onnx.compile(model, fallback="onnxruntime")
    kinds = [s.kind for s in module.segments]
    assert kinds == ["anyshape", "onnxruntime", "anyshape", "onnxruntime"]
    assert module.compiled_segments == 2
    check_against_ort(module, model, x_cases(1, 4))
    assert "Tanh refused for this test" in str(module.explain())


def test_without_onnxruntime_fallback_says_it_needs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UnsupportedError, match="needs the onnxruntime package"):
        anyshape.onnx.compile(det_model(), fallback="onnxruntime")
