"""Capture without decomposition: a program whose every op anyshape lowers is lowered as
exported (``capture.lowers_as_exported``); any other is decomposed to core ATen first."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tiny_models import tiny_bert

import anyshape
from anyshape.frontends.torch.capture import capture_export


def _ids(b, s):
    g = torch.Generator().manual_seed(b * 1000 + s)
    ids = torch.randint(0, 50, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[-1, s // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_bert_is_lowered_as_exported_whole_and_matches_eager():
    torch.manual_seed(0)
    model = tiny_bert(add_pooling_layer=False)
    example = _ids(2, 8)
    assert capture_export(model, (), example).decomposed is False
    before = anyshape.stats()["compilations"]
    compiled = anyshape.optimize(model, example)
    report = str(compiled.explain())
    assert "0 run in PyTorch" in report and "fallbacks: none" in report, report
    for b, s in [(1, 1), (3, 17), (2, 64)]:
        x = _ids(b, s)
        with torch.no_grad():
            want = model(**x).last_hidden_state
            got = compiled(**x)["last_hidden_state"]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert anyshape.stats()["compilations"] - before == 1


class _Norms(torch.nn.Module):
    """layer_norm as exported: over one and two dims, with and without an affine part."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.ln2 = torch.nn.LayerNorm((4, 8), elementwise_affine=False, eps=1e-3)

    def forward(self, x, m):
        return self.ln(x) * 2, self.ln2(x), (m > 0) & (x.sum(-1) > 0)


def test_layer_norm_and_mask_and_as_exported_match_eager():
    model = _Norms().eval()
    x, m = torch.randn(3, 4, 8), torch.randn(3, 4)
    assert capture_export(model, (x, m)).decomposed is False
    compiled = anyshape.optimize(model, (x, m))
    for shape in [(1, 4, 8), (5, 4, 8), (0, 4, 8)]:
        x = torch.randn(shape)
        m = torch.randn(shape[:2])
        for got, want in zip(compiled(x, m), model(x, m)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _Glu(torch.nn.Module):
    def forward(self, x):
        return F.glu(x, dim=-1) + 1


def test_an_op_without_a_lowering_is_decomposed_first():
    model = _Glu()
    x = torch.randn(2, 6)
    captured = capture_export(model, (x,))
    assert captured.decomposed is True  # glu has no lowering of its own: core ATen first
    targets = {str(n.target) for n in captured.gm.graph.nodes if n.op == "call_function"}
    assert "aten.glu.default" not in targets
    compiled = anyshape.optimize(model, (x,))
    for shape in [(1, 2), (3, 10)]:
        y = torch.randn(shape)
        torch.testing.assert_close(compiled(y), model(y))


class _InPlace(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        return y.relu()


def test_writes_to_operands_are_made_functional_by_decomposing_first():
    model = _InPlace()
    x = torch.randn(3, 4)
    assert capture_export(model, (x,)).decomposed is True  # add_ writes to y
    compiled = anyshape.optimize(model, (x,))
    for n in (0, 2, 5):
        y = torch.randn(n, 4)
        torch.testing.assert_close(compiled(y), model(y))
