"""Lowering rules for ATen tensor factories: full/zeros/ones/empty, *_like, scalar_tensor,
arange, triu/tril, fill and copy.

Part of the torch frontend's lowering table. Factories have no tensor operands;
their sizes may be symbolic (``arange(seq_len)``), which becomes an ``iota``
over a symbolic extent.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.symbolic import SymExpr
from ..lowering import LowerCtx, lowering

aten = torch.ops.aten


def _check_device(kwargs):
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise UnsupportedError(f"tensor created on device {dev}")


@lowering(aten.full.default, aten.new_full.default)
def _full(ctx, *args, **kwargs):
    _check_device(kwargs)
    value = args[-1] if ctx.node.target is aten.full.default else args[2]
    out = ctx.out_type()
    return ctx.operand(value, out.dtype, out.shape)


@lowering(
    aten.zeros.default,
    aten.new_zeros.default,
    aten.empty.memory_format,
    aten.new_empty.default,
    aten.empty_strided.default,
)
def _zeros(ctx, *args, **kwargs):
    _check_device(kwargs)
    out = ctx.out_type()
    return ctx.full(0, out.shape, out.dtype)


@lowering(aten.ones.default, aten.new_ones.default)
def _ones(ctx, *args, **kwargs):
    _check_device(kwargs)
    out = ctx.out_type()
    return ctx.full(1, out.shape, out.dtype)


@lowering(
    aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default
)
def _like(ctx, x, *args, **kwargs):
    _check_device(kwargs)
    out = ctx.out_type()
    t = ctx.node.target
    value = args[0] if t is aten.full_like.default else (1 if t is aten.ones_like.default else 0)
    return ctx.operand(value, out.dtype, out.shape)


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(ctx, value, **kwargs):
    _check_device(kwargs)
    out = ctx.out_type()
    return ctx.operand(value, out.dtype, out.shape)


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx, x, value):
    out = ctx.out_type()
    return ctx.operand(value, out.dtype, out.shape)


@lowering(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    out = ctx.out_type()
    return ctx.broadcast_to(ctx.cast(src, out.dtype), out.shape)


@lowering(
    aten.arange.start_step,
    aten.arange.default,
    aten.arange.start,
    partial="a float arange with a symbolic step",
)
def _arange(ctx, *args, **kwargs):
    _check_device(kwargs)
    out = ctx.out_type()
    target = ctx.node.target
    start, step = 0, 1
    if target is aten.arange.start_step:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    elif target is aten.arange.start:
        start = args[0]
    comp = (
        out.dtype
        if not out.dtype.is_float
        else (DType.f64 if out.dtype is DType.f64 else DType.f32)
    )
    if out.dtype.is_float and not isinstance(step, (int, float)):
        raise UnsupportedError("float arange with a symbolic step")
    idx = ctx.op("iota", shape=out.shape, dim=0, dtype=DType.i64 if not comp.is_float else comp)
    if step != 1:
        idx = ctx.op("mul", idx, ctx.operand(step, idx.dtype, out.shape))
    if not (isinstance(start, (int, float)) and start == 0):
        idx = ctx.op("add", idx, ctx.operand(start, idx.dtype, out.shape))
    return ctx.cast(idx, out.dtype)


def _triangle(ctx: LowerCtx, x, diagonal, keep_upper: bool):
    if x.rank < 2:
        raise UnsupportedError("triu/tril need rank >= 2")
    rows, cols = x.shape[-2], x.shape[-1]
    shape = (rows, cols)
    r = ctx.op("iota", shape=shape, dim=0, dtype=DType.i64)
    c = ctx.op("iota", shape=shape, dim=1, dtype=DType.i64)
    diff = ctx.op("sub", c, r)  # col - row
    k = (
        ctx.operand(diagonal, DType.i64, shape)
        if not isinstance(diagonal, SymExpr)
        else ctx.broadcast_to(ctx.shape_scalar(diagonal), shape)
    )
    keep = ctx.op("ge" if keep_upper else "le", diff, k)
    keep = ctx.broadcast_to(keep, x.shape)
    return ctx.op("select", keep, x, ctx.full(0, x.shape, x.dtype))


@lowering(aten.triu.default)
def _triu(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, True)


@lowering(aten.tril.default)
def _tril(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, False)
