"""Lowering rules for random ops: training-mode dropout (``anyshape::dropout``).

Part of the torch frontend's lowering table (see ``lowering.py``). The keep mask
is a hash of (seed, stream, element index) in u32 arithmetic, the same rounds as
``random_ops.keep_mask_torch``; it fuses into the loop that applies it. Other
random ops (``rand``, ``randn``, ``bernoulli``) and the per-call seed itself
run in PyTorch, from its generator.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.symbolic import shape_numel
from .. import random_ops
from ..lowering import LowerCtx, lowering

aten = torch.ops.aten
U32 = DType.u32


def _hash32(ctx: LowerCtx, x):
    def c(v):
        return ctx.full(v, x.shape, U32)

    for shift, mult in random_ops.HASH_ROUNDS:
        x = ctx.op("mul", ctx.op("xor", x, ctx.op("shr", x, c(shift))), c(mult))
    return ctx.op("xor", x, ctx.op("shr", x, c(random_ops.HASH_LAST_SHIFT)))


def keep_mask(ctx: LowerCtx, shape, p: float, seed, stream: int):
    """b8 of ``shape``: element kept (probability 1 - p) by the hash of its index."""
    shape = tuple(shape)
    n = shape_numel(shape)
    index = ctx.reshape(ctx.op("iota", shape=(n,), dim=0, dtype=DType.i64), shape)
    s = ctx.cast(ctx.reshape(seed, ()), DType.i64)
    s = ctx.op("add", s, ctx.full(stream * random_ops.GOLDEN, (), DType.i64))
    key = _hash32(ctx, ctx.cast(ctx.op("and", s, ctx.full(0xFFFFFFFF, (), DType.i64)), U32))
    key = ctx.broadcast_to(key, shape)
    hi = ctx.cast(ctx.op("shr", index, ctx.full(32, shape, DType.i64)), U32)
    h = _hash32(ctx, ctx.op("xor", hi, key))
    lo = ctx.cast(ctx.op("and", index, ctx.full(0xFFFFFFFF, shape, DType.i64)), U32)
    h = _hash32(ctx, ctx.op("xor", lo, h))
    u = ctx.op("mul", ctx.cast(ctx.op("shr", h, ctx.full(8, shape, U32)), DType.f32),
               ctx.full(1.0 / (1 << 24), shape, DType.f32))  # fmt: skip
    return ctx.op("ge", u, ctx.full(p, shape, DType.f32))


@lowering(torch.ops.anyshape.dropout.default)
def _dropout(ctx, x, p, seed, stream):
    keep = keep_mask(ctx, x.shape, p, seed, stream)
    kept = ctx.op("mul", x, ctx.cast(keep, x.dtype))  # as eager: x * mask * scale
    return ctx.op("mul", kept, ctx.full(1.0 / (1.0 - p), x.shape, x.dtype)), keep


@lowering(aten.randint.low, partial="all: it draws from torch's generator, in PyTorch")
def _randint(ctx, *args, **kwargs):
    raise UnsupportedError("draws from torch's generator (the per-call seed of dropout)")
