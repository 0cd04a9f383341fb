"""Model building and the onnxruntime oracle shared by the ONNX frontend's test files."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import anyshape

F32 = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), opset=20):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset > 9 else 7
    return model


def vinfo(name, dims, elem=F32):
    return helper.make_tensor_value_info(name, elem, dims)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def ort_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def run_against_ort(model, cases, rtol=1e-4, atol=1e-5, oracle=None):
    """Compile ``model`` once, run every feed dict in ``cases``, compare with onnxruntime
    (or ``oracle(model, feeds)``), and check that it compiled exactly once."""
    before = anyshape.stats()["compilations"]
    module = anyshape.onnx.compile(model)
    if oracle is None:
        sess = ort.InferenceSession(model.SerializeToString())
        oracle = lambda _model, feeds: sess.run(None, feeds)  # noqa: E731
    for feeds in cases:
        got = module(**feeds)
        want = oracle(model, feeds)
        assert len(got) == len(want)
        for name, g, w in zip(module.output_names, got, want):
            assert g.shape == w.shape, (name, g.shape, w.shape)
            assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    assert anyshape.stats()["compilations"] - before == 1
    return module
