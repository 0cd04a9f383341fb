"""Training: forward and backward compiled, one compilation each for every shape.

Both entry points: ``anyshape.optimize(model, examples, training=True)`` and
``torch.compile(model, backend="anyshape")``. Eager PyTorch is the oracle for
losses, gradients and optimizer steps; dropout is checked against its own mask
(compiled dropout has eager's distribution, not eager's random stream).
"""

import copy

import pytest
import torch
import torch.nn.functional as F

import anyshape
from anyshape.errors import InputError
from anyshape.frontends.torch.random_ops import keep_mask_torch

RTOL = 1e-4


def _bert(layers=2, hidden=64, vocab=200, dropout=0.0):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        attn_implementation="sdpa",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        problem_type="single_label_classification",
    )
    return BertForSequenceClassification(cfg).train()


def _batch(b, s, vocab=200, padded=True):
    ids = torch.randint(0, vocab, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    if padded and s > 1:
        mask[0, s // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 2, (b,))}


def _assert_grads_close(model, ref):
    """Every gradient within RTOL of eager's, measured against the largest gradient (a
    gradient that is zero in exact arithmetic, as a key bias's, is rounding noise)."""
    scale = max(q.grad.abs().max().item() for q in ref.parameters() if q.grad is not None)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(
                p.grad, q.grad, rtol=RTOL, atol=RTOL * scale, msg=lambda m, n=name: f"{n}: {m}"
            )


def _stream(steps=50, seed=0):
    """Batch 1-16 and sequence 8-256 drawn per step (sizes 1 included), as users train."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, 1), (1, 8)]
    while len(shapes) < steps:
        b, s = torch.randint(1, 17, (1,), generator=g), torch.randint(8, 257, (1,), generator=g)
        shapes.append((int(b), int(s)))
    return shapes


def test_optimize_training_matches_eager_adamw_over_a_stream_with_one_compilation_each():
    torch.manual_seed(0)
    model = _bert()
    ref = copy.deepcopy(model)
    anyshape.reset_stats()
    compiled = anyshape.optimize(model, _batch(4, 16), training=True)
    assert set(compiled.parameters()) == set(model.parameters())  # the live parameters
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    for b, s in _stream():
        batch = _batch(b, s)
        loss = compiled(**batch).loss
        want = ref(**batch).loss
        torch.testing.assert_close(loss, want, rtol=RTOL, atol=0)
        loss.backward()
        want.backward()
        _assert_grads_close(model, ref)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=1e-5)
    stats = anyshape.stats()
    assert (stats["compilations"], stats["backward_compilations"]) == (1, 1)
    assert stats["fallback_ops"] == 0  # embedding gradients, cross-entropy: all compiled


def test_optimize_training_eval_mode_runs_an_inference_compilation():
    torch.manual_seed(0)
    model = _bert(layers=1, dropout=0.1)
    compiled = anyshape.optimize(model, _batch(2, 8), training=True)
    compiled.eval()
    batch = _batch(3, 11)
    with torch.no_grad():
        got = compiled(**batch).logits
        want = model.eval()(**batch).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    compiled.train()
    assert model.training
    compiled(**_batch(2, 5)).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_optimize_training_rejects_inputs_structured_unlike_the_example():
    model = torch.nn.Linear(4, 3)
    compiled = anyshape.optimize(model, (torch.randn(5, 4),), training=True)
    compiled(torch.randn(2, 4)).sum().backward()
    with pytest.raises(InputError, match="expects 1 inputs"):
        compiled(torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(InputError, match="dim"):
        compiled(torch.randn(2, 5))
    with pytest.raises(InputError, match="requires grad"):
        compiled(torch.randn(2, 4, requires_grad=True))


def test_optimize_training_input_gradients_and_batch_norm_statistics_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    ).train()
    ref = copy.deepcopy(model)
    example = torch.randn(2, 3, 8, 8, requires_grad=True)
    compiled = anyshape.optimize(model, (example,), training=True)
    for shape in [(4, 3, 8, 8), (2, 3, 13, 7), (3, 3, 5, 5)]:
        x = torch.randn(*shape, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        (compiled(x) * torch.linspace(-1, 1, shape[-1])).sum().backward()
        (ref(xr) * torch.linspace(-1, 1, shape[-1])).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=RTOL, atol=1e-5)
        _assert_grads_close(model, ref)
    bn, bn_ref = model[1], ref[1]
    torch.testing.assert_close(bn.running_mean, bn_ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, bn_ref.running_var, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked) == 3


def test_dynamo_backend_compiles_the_backward_once_for_a_stream():
    torch.manual_seed(0)
    model = _bert(layers=1)
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    anyshape.reset_stats()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    for b, s in [(3, 9), (2, 17), (4, 33)]:  # (Dynamo specializes batch 1: a second graph)
        model.zero_grad()
        ref.zero_grad()
        batch = _batch(b, s)
        compiled(**batch).loss.backward()
        ref(**batch).loss.backward()
        _assert_grads_close(model, ref)
    stats = anyshape.stats()
    assert (stats["compilations"], stats["backward_compilations"]) == (1, 1)


# --- dropout ---------------------------------------------------------------------------------


class DropoutBlock(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        return self.drop(torch.tanh(self.lin(x)))


@pytest.mark.parametrize("entry", ["optimize", "dynamo"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_compiled_dropout_has_eagers_distribution_and_its_gradient(entry, p):
    torch.manual_seed(0)
    model = DropoutBlock(p).train()
    if entry == "optimize":
        example = torch.randn(4, 16, requires_grad=True)
        compiled = anyshape.optimize(model, (example,), training=True)
    else:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="anyshape", dynamic=True)
    x = torch.randn(512, 16, requires_grad=True)
    torch.manual_seed(7)
    y = compiled(x)
    dense = torch.tanh(model.lin(x)).detach()
    kept = y.detach() != 0
    # kept elements are scaled by 1 / (1 - p); the keep rate is 1 - p within 5 sigma
    torch.testing.assert_close(y.detach()[kept], dense[kept] / (1 - p), rtol=1e-5, atol=1e-6)
    n = kept.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * sigma
    # the mask is the hash of a seed drawn from torch's generator: torch.manual_seed repeats it
    torch.manual_seed(7)
    seed = torch.randint(0, 1 << 31, [], dtype=torch.int64)
    assert torch.equal(kept, keep_mask_torch(x.shape, p, seed, 0))
    torch.manual_seed(7)
    assert torch.equal(compiled(x), y)
    assert not torch.equal(compiled(x), y)  # the next call draws a new mask
    # neighbouring rows and columns are not correlated (a weak hash would show here)
    k = kept.float()
    corr = torch.corrcoef(torch.stack([k[:-1].flatten(), k[1:].flatten()]))[0, 1]
    assert abs(corr.item()) < 0.05
    (y * torch.linspace(-1, 1, 16)).sum().backward()
    want = torch.autograd.grad(
        (torch.tanh(model.lin(x)) * kept / (1 - p) * torch.linspace(-1, 1, 16)).sum(), x
    )[0]
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-6)


class Attention(torch.nn.Module):
    def __init__(self, dim=16, heads=2, dropout_p=0.0):
        super().__init__()
        self.heads, self.dropout_p = heads, dropout_p
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (
            t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        p = self.dropout_p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)


def test_attention_dropout_in_training_is_compiled_with_its_own_mask():
    torch.manual_seed(0)
    model = Attention(dropout_p=0.5).train()
    compiled = anyshape.optimize(model, (torch.randn(2, 5, 16),), training=True)
    assert not compiled.reports["forward"].fallbacks[1:]  # only the seed's draw
    x = torch.randn(2, 7, 16)
    torch.manual_seed(3)
    y = compiled(x)
    (y * torch.linspace(-1, 1, 8)).sum().backward()
    got = model.qkv.weight.grad.clone()
    model.zero_grad()
    torch.manual_seed(3)
    seed = torch.randint(0, 1 << 31, [], dtype=torch.int64)
    keep = keep_mask_torch((2, 2, 7, 7), 0.5, seed, 0)  # the attention weights' mask
    q, k, v = (t.reshape(2, 7, 2, 8).transpose(1, 2) for t in model.qkv(x).chunk(3, dim=-1))
    weights = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
    want = (weights * keep / 0.5) @ v
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    (want * torch.linspace(-1, 1, 8)).sum().backward()
    torch.testing.assert_close(got, model.qkv.weight.grad, rtol=1e-4, atol=1e-6)


# --- ops that backward graphs need ---------------------------------------------------------


def _grad_check(fn, *shapes, index=None):
    """fn's input gradients through optimize(training=True) against eager, with no fallback."""
    inputs = [torch.randn(*s, requires_grad=True) for s in shapes]

    class M(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs, index) if index is not None else fn(*xs)

    compiled = anyshape.optimize(M(), tuple(inputs), training=True)
    w = torch.randn_like(fn(*inputs, index) if index is not None else fn(*inputs))
    got = torch.autograd.grad((compiled(*inputs) * w).sum(), inputs)
    assert set(compiled.reports) == {"forward", "backward"}
    for graph, report in compiled.reports.items():
        assert not report.fallbacks, (graph, [f.reason for f in report.fallbacks])
    want = torch.autograd.grad(((M()(*inputs)) * w).sum(), inputs)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_slice_and_select_gradients_are_compiled():
    _grad_check(lambda x: x[:, 1:4].exp() + x[:, 0:1] * x[:, -1:], (3, 6))
    _grad_check(lambda x: x[:, 0] * 2 + x[-1], (4, 4))


def test_embedding_and_gather_gradients_accumulate_repeated_indices():
    index = torch.tensor([[0, 2, 2], [5, 0, 2]])
    _grad_check(lambda w, i: F.embedding(i, w).tanh(), (6, 4), index=index)
    _grad_check(lambda x, i: torch.gather(x, 1, i).square(), (2, 6), index=index)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_is_compiled_and_matches_eager(causal):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    _grad_check(attend, (2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8))


def test_cross_entropy_gradient_is_compiled_and_checks_its_targets():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 5)
    x, t = torch.randn(6, 8), torch.randint(0, 5, (6,))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model

        def forward(self, x, t):
            return F.cross_entropy(self.lin(x), t)

    compiled = anyshape.optimize(Loss(), (x, t), training=True)
    compiled(x, t).backward()  # (the backward compiles on its first call)
    assert not compiled.reports["backward"].fallbacks
    got = model.weight.grad.clone()
    model.zero_grad()
    F.cross_entropy(model(x), t).backward()
    torch.testing.assert_close(got, model.weight.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="out of|bounds|range"):
        compiled(x, torch.tensor([0, 1, 2, 3, 4, 5])).backward()
