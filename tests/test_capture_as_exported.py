"""Capture without decomposition: a program whose every op anyshape lowers is lowered as
exported (``capture.lowers_as_exported``); any other is decomposed to core ATen first."""

from __future__ import annotations

import pytest
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
        y.add_(1)  # a write into a value the program made: rewritten to y2 = y + 1
        y.mul_(y)  # again, into the rewritten value
        return y.relu(), torch.min(y, x), torch.max(x, y)


class _WriteSeenThroughAView(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        first = y[:, 0]  # a view of y taken before the write: it must see the write
        y.add_(1)
        return first * 3, y


class _WriteIntoAnInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


def _matches(model, shapes, arity=1):
    example = tuple(torch.randn(shapes[0]) for _ in range(arity))
    compiled = anyshape.optimize(model, tuple(t.clone() for t in example))
    for shape in shapes[1:]:
        args = tuple(torch.randn(shape) for _ in range(arity))
        got, want = compiled(*[a.clone() for a in args]), model(*[a.clone() for a in args])
        for g, w in zip(
            got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]
        ):
            torch.testing.assert_close(g, w)


def test_writes_into_fresh_values_are_rewritten_and_lowered_as_exported():
    captured = capture_export(_InPlace(), (torch.randn(3, 4),))
    assert captured.decomposed is False
    targets = [str(n.target) for n in captured.gm.graph.nodes if n.op == "call_function"]
    assert "aten.add_.Tensor" not in targets and "aten.mul_.Tensor" not in targets
    assert "aten.min.other" in targets and "aten.max.other" in targets  # lowered as exported
    _matches(_InPlace(), [(3, 4), (0, 4), (2, 4), (5, 4)])


def test_writes_another_value_can_see_are_made_functional_by_decomposing_first():
    """A view taken before the write, or an input written to: decomposed first, as before."""
    assert capture_export(_WriteSeenThroughAView(), (torch.randn(3, 4),)).decomposed is True
    _matches(_WriteSeenThroughAView(), [(3, 4), (1, 4), (6, 4)])
    assert capture_export(_WriteIntoAnInput(), (torch.randn(3, 4),)).decomposed is True
    _matches(_WriteIntoAnInput(), [(3, 4), (0, 4), (2, 4)])


class _ConvBn(torch.nn.Module):
    """conv1d/conv2d and batch_norm as exported (eval mode), and padding='same'."""

    def __init__(self, padding=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=padding, groups=3)
        self.bn = torch.nn.BatchNorm2d(6)
        self.conv1 = torch.nn.Conv1d(6, 4, 2, stride=2, bias=False)

    def forward(self, x):
        h = self.bn(self.conv(x)).relu()
        h += x.repeat(1, 2, 1, 1)  # a residual written in place
        return self.conv1(h.flatten(2))


def test_convolutions_and_eval_batch_norm_lower_as_exported():
    torch.manual_seed(3)
    model = _ConvBn().eval()
    with torch.no_grad():  # running statistics that are not the defaults
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    captured = capture_export(model, (torch.randn(2, 3, 6, 8),))
    assert captured.decomposed is False
    targets = {str(n.target) for n in captured.gm.graph.nodes if n.op == "call_function"}
    assert {"aten.conv2d.default", "aten.conv1d.default", "aten.batch_norm.default"} <= targets
    with torch.no_grad():
        _matches(model, [(2, 3, 6, 8), (1, 3, 5, 7), (3, 3, 9, 4)])
    same = _ConvBn(padding="same").eval()
    assert capture_export(same, (torch.randn(2, 3, 6, 8),)).decomposed is True
    with torch.no_grad():
        _matches(same, [(2, 3, 6, 8), (1, 3, 5, 7)])


class _WriteThroughEvalDropout(torch.nn.Module):
    """Eval-mode dropout returns its input itself: a write into its result is a write
    into the input, which a later read must see (as in eager)."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        h = x * 1
        y = torch.nn.functional.dropout(h, 0.1, training=False)
        y.add_(1)  # h changes too
        z = self.drop(h * 3)
        z.mul_(2)  # as the usual `x = dropout(x); x += r`, with the dropout's input unused
        return h * 2, z


class _WriteBeforeEvalDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        h = x * 1
        y = self.drop(h)
        h.mul_(3)  # y sees it
        return y + 0


def test_a_write_through_an_eval_dropout_reaches_its_input():
    for model in (_WriteThroughEvalDropout(), _WriteBeforeEvalDropout()):
        model.eval()
        captured = capture_export(model, (torch.randn(3, 4),))
        assert captured.decomposed is False  # (the writes rewritten: same tensor, alias)
        _matches(model, [(3, 4), (0, 4), (1, 4), (5, 4)])


class _SpeechFront(torch.nn.Module):
    """wav2vec 2.0's front: a strided convolution under GroupNorm, then a grouped
    positional convolution whose weight is weight norm's ``g * v / ||v||`` (over every dim
    but 2, and in the old API's whole-tensor form)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 8, 10, stride=5, bias=False)
        self.norm = torch.nn.GroupNorm(8, 8)
        position = torch.nn.Conv1d(8, 8, 4, padding=2, groups=2)
        self.position = torch.nn.utils.parametrizations.weight_norm(position, "weight", dim=2)
        whole = torch.nn.Conv1d(8, 8, 3, padding=1)
        self.whole = torch.nn.utils.parametrizations.weight_norm(whole, "weight", dim=None)

    def forward(self, wave):
        h = F.gelu(self.norm(self.conv(wave[:, None])))
        return self.whole(h + self.position(h)[:, :, :-1])


def test_group_norm_and_weight_norm_lower_as_exported():
    torch.manual_seed(5)
    model = _SpeechFront().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-1, 1)
    example = torch.randn(2, 60)
    assert capture_export(model, (example,)).decomposed is False
    compiled = anyshape.optimize(model, (example,))
    assert "fallbacks: none" in str(compiled.explain())
    with torch.no_grad():
        for shape in [(2, 60), (1, 15), (3, 407), (0, 50)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_group_norm_refuses_one_value_per_channel_as_eager_does():
    model = _SpeechFront().eval()
    compiled = anyshape.optimize(model, (torch.randn(2, 60),))
    x = torch.randn(1, 10)  # one frame of one image: one value per group
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(x)
    with pytest.raises(anyshape.InputError, match="more than 1 value per channel"):
        compiled(x)
    x = torch.randn(2, 10)  # one frame of two images: eager normalizes it
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
