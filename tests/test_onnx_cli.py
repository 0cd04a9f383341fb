"""ONNX models to standalone artifacts and reports: ``anyshape.onnx.export``/``explain`` and
the ``anyshape compile|explain|run`` commands, down to examples/run_artifact.c.

A small model with a symbolic batch dim, exported through the same three commands the
README gives a newcomer (``anyshape compile model.onnx``, build the C example, run it),
matches onnxruntime at several batch sizes; ``explain`` names unsupported op types and
inputs that set shapes; exporting a model whose shapes depend on an input's value is an
error naming that input.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anyshape
from anyshape.cli import main as cli_main
from anyshape.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[1]
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(path: Path | None = None):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Softmax", ["r"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", F32, ["batch", 8])],
        [helper.make_tensor_value_info("probs", F32, ["batch", 5])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    if path is not None:
        path.write_bytes(model.SerializeToString())
    return model


def _want(model, x):
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def test_export_to_artifact_runs_any_batch(tmp_path):
    model = _model()
    art = anyshape.onnx.export(model)
    assert "x: f32[batch, 8]" in art.signature()
    loaded = anyshape.load(art.save(tmp_path / "m.anyshape"))
    for n in (1, 4, 0):
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        (got,) = loaded(x=x)
        np.testing.assert_allclose(got, _want(model, x), rtol=1e-5, atol=1e-6)


def test_three_commands_from_onnx_to_c(tmp_path, capsys):
    """README: anyshape compile model.onnx; build examples/run_artifact.c; run it."""
    if not shutil.which("gcc"):
        pytest.fail("gcc is needed (the README's C path)")
    model = _model(tmp_path / "model.onnx")
    out = tmp_path / "model.anyshape"
    assert cli_main(["compile", str(tmp_path / "model.onnx"), "-o", str(out)]) == 0
    assert "probs: f32[batch, 5]" in capsys.readouterr().out
    exe = tmp_path / "run_artifact"
    include = anyshape.include_dir()
    build = ["gcc", "-O2", "-std=c99", f"-I{include}", str(ROOT / "examples" / "run_artifact.c")]
    subprocess.run([*build, "-o", str(exe), "-ldl"], check=True)
    for n in (3, 1):
        case = tmp_path / f"case{n}"
        case.mkdir()
        x = np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32)
        (case / "input0.bin").write_bytes(x.tobytes())
        (case / "input0.shape").write_text(f"{n} 8")
        subprocess.run([str(exe), str(out), str(case)], check=True, capture_output=True)
        shape = tuple(int(d) for d in (case / "output0.shape").read_text().split())
        got = np.frombuffer((case / "output0.bin").read_bytes(), np.float32).reshape(shape)
        np.testing.assert_allclose(got, _want(model, x), rtol=1e-5, atol=1e-6)


def test_explain_reports_kernels_and_unsupported_ops(tmp_path, capsys):
    _model(tmp_path / "ok.onnx")
    assert cli_main(["explain", str(tmp_path / "ok.onnx")]) == 0
    text = capsys.readouterr().out
    assert "x: f32[batch, 8]" in text and "MatMul x1" in text
    assert "library GEMM" in text and "kernels: " in text

    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Det", ["a"], ["d"]),
        helper.make_node("Det", ["a"], ["e"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info("x", F32, ["n", 3, 3])],
        [helper.make_tensor_value_info(o, F32, None) for o in "de"],
    )
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = anyshape.onnx.explain(bad)
    assert not report.compiles
    assert report.unsupported_ops == {"Det": ["#1", "#2"]}
    assert "unsupported: Det at opset 17: #1, #2" in str(report)


def test_model_whose_shape_depends_on_an_input_value(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", F32, ["a", "b"]),
            helper.make_tensor_value_info("shape", I64, [2]),
        ],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = anyshape.onnx.explain(model)
    assert report.value_inputs == ["shape"]
    assert "compiled once per distinct value" in str(report)
    with pytest.raises(UnsupportedError, match="graph input 'shape'"):
        anyshape.onnx.export(model)
    (tmp_path / "r.onnx").write_bytes(model.SerializeToString())
    assert cli_main(["compile", str(tmp_path / "r.onnx"), "-o", str(tmp_path / "r.as")]) == 1
    assert "'shape'" in capsys.readouterr().err
