"""Lowering rules for scaled-dot-product attention: forward and backward.

Part of the torch frontend's lowering table (see ``lowering.py``). The forward
(``scaled_dot_product_attention`` and the CPU flash op it becomes under
AOTAutograd) is softmax(q @ k^T * scale + mask) @ v in the accumulator dtype,
with the logsumexp torch's flash kernel returns. The flash op's backward, which
training graphs call with the forward's saved output and logsumexp, is the
attention gradient written out (recomputing the probabilities from the saved
logsumexp instead of saving them):

    P  = exp(S - lse)            dV = P^T @ dO
    dP = dO @ V^T                dS = P * (dP - rowsum(dO * O))
    dQ = dS @ K * scale          dK = dS^T @ Q * scale

Dropout inside attention is random and stays in PyTorch.
"""

from __future__ import annotations

import math

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.symbolic import as_expr
from ..lowering import LowerCtx, lowering
from .nn import _finish
from .reduce import acc_dtype, expand_back, reduce_axes

aten = torch.ops.aten


def _swap_last(ctx: LowerCtx, t):
    return ctx.transpose(t, (*range(t.rank - 2), t.rank - 1, t.rank - 2))


def _scores(ctx: LowerCtx, q, k, mask, is_causal, scale):
    """q @ k^T * scale, with the causal and explicit masks applied (-inf where masked)."""
    acc = q.dtype
    s = ctx.op("dot", q, _swap_last(ctx, k))
    s = ctx.op("mul", s, _scale(ctx, q.shape[-1], scale, s))
    ninf = ctx.full(-math.inf, s.shape, acc)
    if is_causal:  # query i sees keys 0..i (top-left aligned, as torch's tril)
        row, col = (
            ctx.op("iota", shape=s.shape, dim=d, dtype=DType.i64) for d in (s.rank - 2, s.rank - 1)
        )
        s = ctx.op("select", ctx.op("ge", row, col), s, ninf)
    if mask is not None and mask.dtype is DType.b8:
        s = ctx.op("select", ctx.broadcast_to(mask, s.shape), s, ninf)
    elif mask is not None:
        s = ctx.op("add", s, ctx.broadcast_to(ctx.cast(mask, acc), s.shape))
    return s


def _attention(ctx: LowerCtx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa=False):
    """(output, logsumexp) of softmax(q @ k^T * scale + mask) @ v in the accumulator dtype."""
    if dropout_p:
        raise UnsupportedError("attention dropout is random")
    out = ctx.out_type(0 if isinstance(ctx.out_val(), tuple) else None)
    acc = acc_dtype(q.dtype)
    if enable_gqa:
        k, v = _repeat_heads(ctx, k, q.shape[-3]), _repeat_heads(ctx, v, q.shape[-3])
    batch = tuple(out.shape[:-2])
    q, k, v = (ctx.broadcast_to(ctx.cast(t, acc), batch + t.shape[-2:]) for t in (q, k, v))
    p, lse = _softmax_lse(ctx, _scores(ctx, q, k, mask, is_causal, scale))
    return ctx.op("dot", p, v), lse


def _softmax_lse(ctx: LowerCtx, s):
    """Softmax over the last axis and its logsumexp, as torch's CPU flash kernel computes
    them: a fully masked row (all -inf) gets probabilities 0 and a logsumexp of 0."""
    axes = (s.rank - 1,)
    m = _replace(ctx, reduce_axes(ctx, "max", s, axes), -math.inf, 0)
    e = ctx.op("exp", ctx.op("sub", s, expand_back(ctx, m, s.shape, axes)))
    total = _replace(ctx, reduce_axes(ctx, "sum", e, axes), 0, 1)
    p = ctx.op("div", e, expand_back(ctx, total, s.shape, axes))
    return p, ctx.op("add", m, ctx.op("log", total))


def _replace(ctx: LowerCtx, x, old, new):
    hit = ctx.op("eq", x, ctx.full(old, x.shape, x.dtype))
    return ctx.op("select", hit, ctx.full(new, x.shape, x.dtype), x)


def _scale(ctx: LowerCtx, head_dim, scale, like):
    if scale is not None:
        return ctx.full(scale, like.shape, like.dtype)
    if isinstance(head_dim, int):
        return ctx.full(1.0 / math.sqrt(head_dim), like.shape, like.dtype)
    return ctx.op("rsqrt", ctx.operand(head_dim, like.dtype, like.shape))


def _repeat_heads(ctx: LowerCtx, t, heads):
    """Grouped-query attention: repeat each of ``t``'s heads (dim -3) to make ``heads``."""
    h = t.shape[-3]
    if as_expr(h) == as_expr(heads):
        return t
    if not (isinstance(h, int) and isinstance(heads, int) and heads % h == 0):
        raise UnsupportedError(f"grouped-query attention from {h} to {heads} heads")
    lead, tail = t.shape[:-3], t.shape[-2:]
    r = ctx.op(
        "broadcast_in_dim",
        t,
        shape=(*lead, h, heads // h, *tail),
        dims=(*range(len(lead)), len(lead), len(lead) + 2, len(lead) + 3),
    )
    return ctx.reshape(r, (*lead, heads, *tail))


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default, partial="dropout_p > 0")
def _sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    o, lse = _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale)
    return _finish(ctx, o, 0), _finish(ctx, lse, 1)


@lowering(
    aten.scaled_dot_product_attention.default,
    partial="dropout_p > 0; grouped-query heads that are symbolic or do not divide",
)
def _sdpa(
    ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    return _finish(
        ctx, _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]
    )


@lowering(
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    partial="dropout_p > 0; query, key and value with different batch or head dims",
)
def _sdpa_flash_cpu_backward(
    ctx, grad_out, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    """(dq, dk, dv) of the CPU flash op, from its saved output and logsumexp."""
    if dropout_p:
        raise UnsupportedError("attention dropout is random")
    lead = [as_expr(d) for d in q.shape[:-2]]
    if any([as_expr(d) for d in t.shape[:-2]] != lead for t in (k, v)):
        raise UnsupportedError("the backward of attention over broadcast batch or head dims")
    acc = acc_dtype(q.dtype)
    q, k, v, o, do = (ctx.cast(t, acc) for t in (q, k, v, out, grad_out))
    s = _scores(ctx, q, k, attn_mask, is_causal, scale)
    axes = (s.rank - 1,)
    lse = ctx.reshape(ctx.cast(lse, acc), s.shape[:-1])
    p = ctx.op("exp", ctx.op("sub", s, expand_back(ctx, lse, s.shape, axes)))
    dv = ctx.op("dot", _swap_last(ctx, p), do)
    dp = ctx.op("dot", do, _swap_last(ctx, v))
    row = reduce_axes(ctx, "sum", ctx.op("mul", do, o), (o.rank - 1,))
    ds = ctx.op("mul", p, ctx.op("sub", dp, expand_back(ctx, row, s.shape, axes)))
    ds = ctx.op("mul", ds, _scale(ctx, q.shape[-1], scale, ds))
    dq = ctx.op("dot", ds, k)
    dk = ctx.op("dot", _swap_last(ctx, ds), q)
    return _finish(ctx, dq, 0), _finish(ctx, dk, 1), _finish(ctx, dv, 2)
