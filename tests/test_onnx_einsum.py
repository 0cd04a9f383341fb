"""ONNX ``Einsum`` (``frontends/onnx/einsum.py``) against onnxruntime.

Batched matmuls, attention scores, matrix-vector, implicit outputs with ``...``,
diagonals, full sums and a three-operand chain; symbolic dims, sizes 0 and 1, one
compilation per equation.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anyshape

CASES = [
    (
        "bij,bjk->bik",
        [("b", "i", "j"), ("b", "j", "k")],
        [[(2, 3, 4), (2, 4, 5)], [(1, 1, 7), (1, 7, 2)]],
    ),
    (
        "bhqd,bhkd->bhqk",
        [("b", 2, "q", 4), ("b", 2, "k", 4)],
        [[(2, 2, 3, 4), (2, 2, 5, 4)], [(1, 2, 1, 4), (1, 2, 1, 4)]],
    ),
    ("ij,j->i", [("n", "m"), ("m",)], [[(3, 4), (4,)], [(1, 0), (0,)]]),
    (
        "...ij,...jk",
        [("b", "i", "j"), ("b", "j", "k")],
        [[(2, 3, 4), (2, 4, 5)], [(1, 2, 3), (1, 3, 1)]],
    ),
    ("ii->i", [("n", "n")], [[(3, 3)], [(1, 1)]]),
    ("ij->", [("a", "b")], [[(3, 4)], [(0, 2)]]),
    (
        "abc,cd,de->abe",
        [("a", "b", "c"), ("c", "d"), ("d", "e")],
        [[(2, 3, 4), (4, 5), (5, 6)], [(1, 1, 4), (4, 2), (2, 1)]],
    ),
]


@pytest.mark.parametrize("equation,dims,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_against_onnxruntime(equation, dims, shapes):
    names = [f"x{i}" for i in range(len(dims))]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, list(d)) for n, d in zip(names, dims)
    ]
    graph = helper.make_graph(
        [helper.make_node("Einsum", names, ["y"], equation=equation)],
        "einsum",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    before = anyshape.stats()["compilations"]
    module = anyshape.onnx.compile(model)
    session = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(0)
    for shape_set in shapes:
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shape_set)}
        (got,) = module(**feeds)
        (want,) = session.run(None, feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert anyshape.stats()["compilations"] - before == 1
