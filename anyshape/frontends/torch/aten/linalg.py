"""Lowering rules for ATen matrix products: mm, bmm, matmul (every rank combination),
linear, the scaled-accumulate forms addmm/baddbmm/addbmm/addmv, and dot/vdot/mv.

Part of the torch frontend's lowering table (see ``lowering.py``). Everything
becomes the IR's ``dot`` (batched [..., M, K] x [..., K, N] with equal batch
dims): vectors are reshaped to 1-row/1-column matrices, broadcast batch dims are
made explicit with ``broadcast_in_dim``, and the result is reshaped to the shape
torch recorded. f16/bf16 products accumulate in f32, like the reductions.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.symbolic import shape_numel
from ..lowering import LowerCtx, lowering
from .reduce import acc_dtype

aten = torch.ops.aten


def _dot(ctx: LowerCtx, a, b):
    """``dot`` of equal-rank operands, accumulating f16/bf16 in f32 (result in that dtype)."""
    acc = acc_dtype(a.dtype)
    return ctx.op("dot", ctx.cast(a, acc), ctx.cast(b, acc))


def matmul(ctx: LowerCtx, a, b, out_shape):
    """torch.matmul of ``a`` and ``b`` reshaped to ``out_shape`` (torch's recorded shape)."""
    if a.rank == 0 or b.rank == 0:
        raise UnsupportedError("matmul of a rank-0 tensor")
    if b.rank <= 2 and a.rank >= 2:
        # No batch on b: fold a's batch into its rows, one plain matrix product.
        a2 = ctx.reshape(a, (shape_numel(a.shape[:-1]), a.shape[-1]))
        b2 = b if b.rank == 2 else ctx.reshape(b, (b.shape[0], 1))
        return ctx.reshape(_dot(ctx, a2, b2), out_shape)
    a2 = a if a.rank >= 2 else ctx.reshape(a, (1, a.shape[0]))
    b2 = b if b.rank >= 2 else ctx.reshape(b, (b.shape[0], 1))
    # The broadcast batch dims are out_shape minus its matrix dims (one per 2-D operand).
    batch = tuple(out_shape[: len(out_shape) - (a.rank >= 2) - (b.rank >= 2)])
    a2 = ctx.broadcast_to(a2, batch + a2.shape[-2:])
    b2 = ctx.broadcast_to(b2, batch + b2.shape[-2:])
    return ctx.reshape(_dot(ctx, a2, b2), out_shape)


def _finish(ctx: LowerCtx, x):
    return ctx.cast(x, ctx.out_type().dtype)


@lowering(
    aten.mm.default,
    aten.bmm.default,
    aten.matmul.default,
    aten.dot.default,
    aten.vdot.default,
    aten.mv.default,
)
def _matmul(ctx, a, b):
    return _finish(ctx, matmul(ctx, a, b, ctx.out_type().shape))


@lowering(aten.linear.default)
def _linear(ctx, x, weight, bias=None):
    out = ctx.out_type()
    w = ctx.transpose(weight, (1, 0)) if weight.rank == 2 else weight
    y = matmul(ctx, x, w, out.shape)
    return _finish(ctx, _scaled_add(ctx, y, bias, 1, 1))


def _scaled_add(ctx: LowerCtx, product, self, beta, alpha):
    """beta * self + alpha * product, where beta == 0 ignores self (even its NaNs)."""
    if alpha != 1:
        product = ctx.op("mul", product, ctx.full(alpha, product.shape, product.dtype))
    if self is None or beta == 0:
        return product
    s = ctx.broadcast_to(ctx.cast(self, product.dtype), product.shape)
    if beta != 1:
        s = ctx.op("mul", s, ctx.full(beta, s.shape, s.dtype))
    return ctx.op("add", s, product)


@lowering(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(ctx, self, a, b, *, beta=1, alpha=1):
    y = matmul(ctx, a, b, ctx.out_type().shape)
    return _finish(ctx, _scaled_add(ctx, y, self, beta, alpha))


@lowering(aten.addbmm.default)
def _addbmm(ctx, self, a, b, *, beta=1, alpha=1):
    y = ctx.op("reduce", _dot(ctx, a, b), kind="sum", axes=(0,))
    return _finish(ctx, _scaled_add(ctx, y, self, beta, alpha))
