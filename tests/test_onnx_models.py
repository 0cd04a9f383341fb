"""Real models from ONNX files: BERT, GPT-2 and ResNet exported by both of torch's exporters.

Each model (the benchmark's small ``--quick`` configs, random weights) is exported by
``torch.onnx.export(dynamo=True, dynamic_shapes=...)`` and by the legacy exporter with
``dynamic_axes``, compiled once by ``anyshape.onnx.compile`` and run over a stream of
request shapes (batch and sequence, or batch and image size, sizes 1 included), matching
ONNX Runtime on the same file to 1e-4 and eager to 1e-4, with one compilation per file.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import anyshape
from anyshape import cli

_, _, _, W = cli._import_benchmarks()

STREAMS = {
    "text": [(2, 16), (1, 1), (3, 37), (1, 64)],
    "image": [(2, 32), (1, 40), (3, 33)],
}


def _first(out):
    if isinstance(out, (tuple, list)):
        return out[0]
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if hidden is not None else out.logits


class _Text(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return _first(self.model(input_ids=input_ids, attention_mask=attention_mask))


class _Image(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return _first(self.model(pixel_values=pixel_values))


def _export(name: str, exporter: str, path) -> tuple[torch.nn.Module, callable]:
    built = W.build(name, True, 0)
    kind = W.WORKLOADS[name].kind
    model = (_Text if kind == "text" else _Image)(built.model).eval()
    example = built.inputs(built.example)
    names = list(example)
    args = tuple(example[n] for n in names)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", max=64)
            if kind == "text":
                seq = torch.export.Dim("seq", max=512)
                dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
            else:
                size = torch.export.Dim("size", min=32, max=1024)
                dims = {"pixel_values": {0: batch, 2: size, 3: size}}
            torch.onnx.export(
                model, args, str(path), dynamo=True, dynamic_shapes=dims, input_names=names
            )
        else:
            axes = {0: "batch", 1: "seq"} if kind == "text" else {0: "batch", 2: "h", 3: "w"}
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=False,
                input_names=names,
                output_names=["out"],
                dynamic_axes={n: axes for n in names},
                opset_version=17,
            )
    return model, built.inputs


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet"])
def test_exported_model_over_a_stream_of_shapes(name, exporter, tmp_path):
    path = tmp_path / f"{name}.onnx"
    model, make_inputs = _export(name, exporter, path)
    before = anyshape.stats()["compilations"]
    module = anyshape.onnx.compile(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in STREAMS[W.WORKLOADS[name].kind]:
        inputs = make_inputs(shape)
        feeds = {k: v.numpy() for k, v in inputs.items() if k in module.input_names}
        (got, *_) = module(**feeds)
        want = session.run(None, feeds)[0]
        with torch.no_grad():
            eager = model(**inputs).numpy()
        assert got.shape == want.shape == eager.shape, shape
        scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=str(shape))
        np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4 * scale, err_msg=str(shape))
    assert anyshape.stats()["compilations"] - before == 1
