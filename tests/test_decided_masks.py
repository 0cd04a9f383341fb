"""Comparisons their value ranges decide fold to constants (``passes/simplify.py``).

transformers builds a bidirectional attention mask as ``kv_idx >= 0`` from an iota: true
at every size. Simplify folds such a comparison, any view of the splat it becomes, and a
select on it, so the softmax loads no mask and selects nothing per score. Comparisons
the ranges do not decide (a symbolic size on either side, an offset that can reach the
other side) stay; compiled models agree with eager at sizes 0 and 1.
"""

from __future__ import annotations

import pytest
import torch

import anyshape
from anyshape.config import Options
from anyshape.ir.dtypes import DType
from anyshape.ir.graph import GraphBuilder
from anyshape.ir.symbolic import SymExpr
from anyshape.ir.types import TensorType
from anyshape.passes import simplify

S = SymExpr.symbol("s")


def _fold(op: str, offset: int, bound: int, size=S, dtype=DType.i64):
    """simplify's result for ``op(iota(size) + offset, bound)`` selecting between two
    inputs; the output node."""
    b = GraphBuilder(name="mask")
    x, y = (b.input(n, TensorType(DType.f32, (size,))) for n in "xy")
    iota = b.op("iota", shape=(size,), dim=0, dtype=dtype)
    shifted = b.op(
        "add", iota, b.op("broadcast_in_dim", b.constant(offset, dtype), dims=(), shape=(size,))
    )
    limit = b.op("broadcast_in_dim", b.constant(bound, dtype), dims=(), shape=(size,))
    mask = b.op("reshape", b.op(op, shifted, limit), shape=(1, size))
    pred = b.op("reshape", mask, shape=(size,))
    graph = b.build([b.op("select", pred, x, y)])
    return simplify.run(graph, Options()).outputs[0]


@pytest.mark.parametrize(
    "op, offset, bound, chosen",
    [
        ("ge", 0, 0, "x"),  # transformers' kv_idx >= 0
        ("gt", 0, -1, "x"),
        ("lt", 0, 0, "y"),
        ("le", 3, 2, "y"),
        ("ne", 0, -1, "x"),
        ("eq", 2, 1, "y"),
        ("ge", -5, -5, "x"),
    ],
)
def test_comparisons_an_iota_decides_select_one_side(op, offset, bound, chosen):
    out = _fold(op, offset, bound)
    assert out.op == "input" and out.attr("name") == chosen, out


@pytest.mark.parametrize(
    "op, offset, bound, size",
    [
        ("ge", 0, 1, S),  # index 0 is below 1, the others are not
        ("lt", 0, 5, S),  # the upper end of an iota of symbolic size is unknown
        ("ge", -1, 0, S),
        ("eq", 0, 0, S),
        ("lt", 0, 3, 4),  # a static size: 0..3, so 3 < 3 is false and 0 < 3 true
        ("ge", 0, 2**40, S),  # beyond the ranges folded (no reasoning near wrap-around)
    ],
)
def test_undecided_comparisons_stay(op, offset, bound, size):
    out = _fold(op, offset, bound, size=size)
    assert out.op == "select", out


def test_a_static_iota_is_bounded_above():
    assert _fold("lt", 0, 4, size=4).attr("name") == "x"
    assert _fold("le", 0, 2, size=4).op == "select"


class MaskedScores(torch.nn.Module):
    """Scores masked with transformers' bidirectional mask (``kv_idx >= 0``) and a padding
    mask from the input: only the first folds."""

    def forward(self, q, k, keep):
        s = q.shape[1]
        idx = torch.arange(s)
        everything = (idx[None, :] >= 0)[:, None, :]  # [1, 1, s]
        scores = q @ k.transpose(1, 2)
        scores = scores.masked_fill(~everything, float("-inf"))
        scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1)


def test_a_mask_that_masks_nothing_costs_nothing():
    model = MaskedScores()
    q, k = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    keep = torch.ones(2, 7, dtype=torch.bool)
    opt = anyshape.optimize(model, (q, k, keep), model_cache=False)
    cluster = opt.report.clusters[0].compiled
    compares = [n for n in cluster.graph.nodes() if n.op in ("ge", "lt", "le", "gt")]
    assert not compares, compares  # (the padding mask arrives as booleans: no compare)
    selects = [n for n in cluster.graph.nodes() if n.op == "select"]
    assert selects  # the padding mask's own select stays
    for b, s in [(2, 7), (1, 1), (3, 20), (0, 4), (2, 0)]:
        q, k = torch.randn(b, s, 8), torch.randn(b, s, 8)
        keep = torch.rand(b, s) > 0.3
        keep[:, :1] = True  # (a row of -inf everywhere is NaN in eager's softmax too)
        torch.testing.assert_close(opt(q, k, keep), model(q, k, keep), equal_nan=True)


@pytest.mark.parametrize("dtype", [DType.i8, DType.i16, DType.i32, DType.u8, DType.u32])
def test_narrower_integers_are_not_folded(dtype):
    """An i8 iota over 200 elements is negative from 128 on, a u8 ``iota - 1`` is 255 at
    0: only int64 (what torch's ``arange`` gives) is folded."""
    assert _fold("ge", 0, 0, size=200, dtype=dtype).op == "select"
    assert _fold("ge", 0, 0, size=200, dtype=DType.i64).op == "input"
