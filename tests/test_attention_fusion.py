"""Attention fusion: the scores GEMM, the softmax and the values GEMM as one kernel.

The plan fuses the chain (``anyshape/schedule/attention.py``) when nothing else
reads the scores or the probabilities; the CPU kernel computes each batch
entry's blocks of query rows in buffers of its thread's
(``codegen/cpu/attention_emit.py``). Each case compiles once, checks the plan
made the chain one kernel (or did not, and why), and matches eager over a
stream of shapes with sizes 0 and 1 in every dim, rows longer and shorter than
a block, padding masks, causal masks, position bias, cross-attention with
other key lengths, and a build whose GEMMs are OpenBLAS's alone.
"""

from __future__ import annotations

import math

import pytest
import torch

import anyshape
from anyshape.codegen.cpu.routes import plan_kernels
from anyshape.config import Options

TOL = dict(rtol=1e-4, atol=1e-5)


def _chains(opt, **options) -> int:
    """How many attention kernels the compiled model's plan has."""
    return sum(
        len(plan_kernels(c.compiled.graph, Options(**options)).attention)
        for c in opt.report.clusters
    )


def _labels(opt) -> list[str]:
    return [lbl for c in opt.report.clusters for lbl in c.compiled.native.kernel_labels]


class SelfAttention(torch.nn.Module):
    """Multi-head self-attention written out, with an additive padding mask."""

    def __init__(self, hidden: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, -1)

        def heads(t):
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads)
        scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
        context = scores.softmax(-1) @ v
        return self.out(context.transpose(1, 2).reshape(b, s, h))


def _padded(b: int, s: int, h: int = 32):
    x = torch.randn(b, s, h)
    mask = torch.ones(b, s)
    if b > 1 and s > 1:
        mask[-1, s - s // 3 :] = 0
    return x, mask


@pytest.mark.parametrize(
    "shape", [(2, 7), (1, 1), (3, 1), (1, 130), (2, 64), (3, 65), (0, 5), (2, 0), (1, 600)]
)
def test_self_attention_with_a_padding_mask(shape):
    model = SelfAttention().eval()
    opt = anyshape.optimize(model, _padded(2, 7))
    assert _chains(opt) == 1
    assert sum(lbl.startswith("attention ") for lbl in _labels(opt)) == 1
    before = anyshape.stats()["compilations"]
    args = _padded(*shape)
    with torch.no_grad():
        torch.testing.assert_close(opt(*args), model(*args), **TOL)
    assert anyshape.stats()["compilations"] == before


def test_rows_longer_than_a_block_and_many_blocks():
    """Rows of 1500 keys take blocks of 16 query rows (as_attention_rows); 1500 queries
    leave a last block of 12."""
    model = SelfAttention(hidden=16, heads=2).eval()
    opt = anyshape.optimize(model, _padded(1, 9, 16))
    args = _padded(2, 1500, 16)
    with torch.no_grad():
        torch.testing.assert_close(opt(*args), model(*args), **TOL)


class CausalAttention(torch.nn.Module):
    """GPT-2's attention as torch writes it: scaled_dot_product_attention, causal."""

    def __init__(self, hidden: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (
            t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(h, -1)
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, h)


def test_causal_attention():
    model = CausalAttention().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 9, 32),))
    assert _chains(opt) == 1
    with torch.no_grad():
        for shape in [(1, 1), (2, 9), (3, 70), (1, 0), (0, 4)]:
            x = torch.randn(*shape, 32)
            torch.testing.assert_close(opt(x), model(x), **TOL)


class BiasedAttention(torch.nn.Module):
    """T5's shape of attention: no scaling, a learned bias by relative position added to
    the scores, here on rank-3 GEMMs ([batch, s, d])."""

    def __init__(self, span: int = 16):
        super().__init__()
        self.span = span
        self.bias = torch.nn.Parameter(torch.randn(2 * span + 1))

    def forward(self, q, k, v):
        pos = torch.arange(q.shape[1])
        rel = (pos[None, :] - pos[:, None]).clamp(-self.span, self.span) + self.span
        scores = q @ k.transpose(1, 2) + self.bias[rel]
        return scores.softmax(-1) @ v


def test_position_bias_on_rank_three_gemms():
    model = BiasedAttention().eval()

    def args(b: int, s: int):
        return tuple(torch.randn(b, s, 8) for _ in range(3))

    opt = anyshape.optimize(model, args(2, 7))
    assert _chains(opt) == 1
    with torch.no_grad():
        for shape in [(1, 1), (2, 7), (1, 40), (3, 0), (0, 3)]:
            a = args(*shape)
            torch.testing.assert_close(opt(*a), model(*a), **TOL)


class HeadsByView(torch.nn.Module):
    """Scores of ``[batch * heads, s, s]`` viewed as ``[batch, heads, s, s]`` for a bias per
    head: the view's guard (Dynamo records it) is the reshape's own, not a second one."""

    def __init__(self, heads: int = 3, span: int = 16):
        super().__init__()
        self.heads, self.span = heads, span
        self.bias = torch.nn.Parameter(torch.randn(heads, 2 * span + 1))

    def forward(self, q, k, v):
        s = q.shape[1]
        pos = torch.arange(s)
        rel = (pos[None, :] - pos[:, None]).clamp(-self.span, self.span) + self.span
        scores = (q @ k.transpose(1, 2)).view(-1, self.heads, s, s) + self.bias[:, rel]
        return scores.softmax(-1).view(-1, s, s) @ v


def test_a_bias_per_head_through_a_view_compiles_whole():
    model = HeadsByView().eval()

    def args(bh: int, s: int):
        return tuple(torch.randn(bh, s, 8) for _ in range(3))

    opt = anyshape.optimize(model, args(6, 7))
    assert not opt.report.fallbacks, opt.report.fallbacks
    before = anyshape.stats()["compilations"]
    with torch.no_grad():
        for shape in [(6, 7), (3, 1), (9, 40)]:
            a = args(*shape)
            torch.testing.assert_close(opt(*a), model(*a), **TOL)
        assert anyshape.stats()["compilations"] == before
        # An empty batch is right too, but compiles a second graph: the capture's guard
        # for the second view, floordiv(n, floordiv(n, 3)) == 3, divides by 0 there.
        a = args(0, 4)
        torch.testing.assert_close(opt(*a), model(*a), **TOL)


class CrossAttention(torch.nn.Module):
    """Queries from one sequence, keys and values from another of its own length."""

    def forward(self, q, kv):
        scores = q @ kv.transpose(-1, -2) * 0.125
        return scores.softmax(-1) @ kv


@pytest.mark.parametrize("m,n", [(5, 9), (1, 1), (70, 3), (4, 0), (0, 4), (1, 513)])
def test_cross_attention_other_key_lengths(m, n):
    model = CrossAttention().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 4, 5, 16), torch.randn(2, 4, 9, 16)))
    assert _chains(opt) == 1
    q, kv = torch.randn(2, 4, m, 16), torch.randn(2, 4, n, 16)
    with torch.no_grad():
        torch.testing.assert_close(opt(q, kv), model(q, kv), **TOL)


def test_the_openblas_only_build_runs_the_kernel_too():
    """Without oneDNN (``small_gemm="openblas"``), each block's GEMMs are OpenBLAS's, called
    inside the parallel region."""
    model = SelfAttention().eval()
    opt = anyshape.optimize(model, _padded(2, 7), small_gemm="openblas")
    assert _chains(opt, small_gemm="openblas") == 1
    with torch.no_grad():
        for shape in [(4, 200), (1, 1), (2, 0)]:
            args = _padded(*shape)
            torch.testing.assert_close(opt(*args), model(*args), **TOL)


def test_the_option_off_keeps_three_kernels():
    model = SelfAttention().eval()
    opt = anyshape.optimize(model, _padded(2, 7), attention_fusion=False)
    assert _chains(opt, attention_fusion=False) == 0
    assert not any(lbl.startswith("attention ") for lbl in _labels(opt))
    args = _padded(3, 33)
    with torch.no_grad():
        torch.testing.assert_close(opt(*args), model(*args), **TOL)


class ReturnsProbabilities(torch.nn.Module):
    def forward(self, q, k, v):
        p = (q @ k.transpose(-1, -2)).softmax(-1)
        return p @ v, p


class ReadsScoresTwice(torch.nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2)
        return scores.softmax(-1) @ v + scores.mean(-1, keepdim=True)


class FlipsScores(torch.nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2)
        return (scores + scores.flip(-1)).softmax(-1) @ v


@pytest.mark.parametrize("cls", [ReturnsProbabilities, ReadsScoresTwice, FlipsScores])
def test_chains_something_else_reads_stay_unfused(cls):
    """Probabilities a caller gets back (``output_attentions``), scores another kernel reads,
    or scores read at another column: the chain keeps its buffers, and results match."""
    model = cls().eval()
    shape = (2, 3, 6, 8)
    opt = anyshape.optimize(model, tuple(torch.randn(shape) for _ in range(3)))
    assert _chains(opt) == 0
    args = tuple(torch.randn(1, 3, 11, 8) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(opt(*args), model(*args), **TOL)


def test_nan_scores_propagate():
    model = CrossAttention().eval()
    opt = anyshape.optimize(model, (torch.randn(1, 2, 3, 16), torch.randn(1, 2, 4, 16)))
    q, kv = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 4, 16)
    q[0, 1, 2, 0] = float("nan")
    with torch.no_grad():
        torch.testing.assert_close(opt(q, kv), model(q, kv), equal_nan=True, **TOL)


def test_explain_names_the_attention_kernel():
    text = str(anyshape.explain(SelfAttention().eval(), _padded(2, 7)))
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("attention:")]
    assert "exp x1" in line and "dot x1" in line
