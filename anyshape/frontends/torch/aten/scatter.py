"""Lowering rules for ATen writes into a copy: slice/select scatter, scatter, index_put.

Part of the torch frontend's lowering table (see ``lowering.py``). Backward
graphs are where these appear: the gradient of a slice or a selected row
(``slice_scatter``/``select_scatter`` into zeros), of a cross-entropy
(``scatter`` of a value at the targets) and of an embedding (``index_put``
accumulating rows). A slice scatter is a ``pad`` of the source to the input's
size and a ``select`` between the two; the others write through the IR's
``scatter`` op at linear positions, so an index out of range raises as eager's does.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.graph import Node
from ....ir.symbolic import SymExpr, as_dim, as_expr, shape_numel
from ..lowering import LowerCtx, lowering, norm_dim
from .indexing import _broadcast_shape
from .shape import _slice_bounds

aten = torch.ops.aten


def _scatter_slice(ctx: LowerCtx, x, src, dim: int, start, step: int):
    """``x`` with its slice along ``dim`` (from ``start`` by ``step``) replaced by ``src``."""
    size, n = x.shape[dim], src.shape[dim]
    if isinstance(n, int) and n == 0:
        return x
    if step != 1:
        raise UnsupportedError(f"slice_scatter with step {step}")
    st, lim = _slice_bounds(size, start, n, step)
    low = [0] * x.rank
    high = [0] * x.rank
    low[dim], high[dim] = st, as_dim(as_expr(size) - as_expr(lim))
    zero = ctx.full(0, (), src.dtype)
    placed = ctx.op("pad", ctx.cast(src, x.dtype), zero, low=tuple(low), high=tuple(high))
    pos = ctx.op("iota", shape=tuple(x.shape), dim=dim, dtype=DType.i64)
    inside = ctx.op(
        "and",
        ctx.op("ge", pos, ctx.operand(st, DType.i64, x.shape)),
        ctx.op("lt", pos, ctx.operand(lim, DType.i64, x.shape)),
    )
    return ctx.op("select", inside, placed, x)


@lowering(aten.slice_scatter.default, partial="a step other than 1")
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.rank)
    if isinstance(start, SymExpr) and not start.nonneg:
        raise UnsupportedError("slice_scatter with a symbolic start that may be negative")
    return _scatter_slice(ctx, x, src, dim, start, step)


@lowering(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    dim = norm_dim(dim, x.rank)
    if isinstance(index, int) and index < 0:
        index = as_dim(as_expr(x.shape[dim]) + index)
    shape = (*x.shape[:dim], 1, *x.shape[dim + 1 :])
    return _scatter_slice(ctx, x, ctx.reshape(src, shape), dim, index, 1)


def _wrapped(ctx: LowerCtx, i, size):
    """``i`` (any int dtype) as i64 with negative entries counted from the end (``i + size``);
    what is still out of range makes ``scatter`` raise, as eager raises."""
    i = ctx.cast(i, DType.i64)
    zero = ctx.full(0, i.shape, DType.i64)
    n = ctx.broadcast_to(ctx.shape_scalar(size), i.shape)
    return ctx.op("select", ctx.op("lt", i, zero), ctx.op("add", i, n), i)


def _linear_index(ctx: LowerCtx, parts, sizes, shape):
    """The row-major linear index, of ``shape``, of per-dim i64 indices ``parts`` into
    dims ``sizes`` (None: that dim's own position, an iota, always in range). An entry
    whose index is outside its dim is made the total, past the end, so ``scatter``
    raises instead of writing into the next row (with one dim, ``scatter``'s own check
    is that check)."""
    linear, stride, bad = None, as_expr(1), None
    for d in reversed(range(len(parts))):
        i, size = parts[d], sizes[d]
        if i is None:
            i = ctx.op("iota", shape=shape, dim=d, dtype=DType.i64)
        elif len(parts) > 1:
            n = ctx.operand(size, DType.i64, shape)
            out = ctx.op("or", ctx.op("lt", i, ctx.full(0, shape, DType.i64)), ctx.op("ge", i, n))
            bad = out if bad is None else ctx.op("or", bad, out)
        if stride != 1:
            i = ctx.op("mul", i, ctx.operand(as_dim(stride), DType.i64, shape))
        linear = i if linear is None else ctx.op("add", linear, i)
        stride = stride * as_expr(size)
    if bad is not None:
        linear = ctx.op("select", bad, ctx.operand(as_dim(stride), DType.i64, shape), linear)
    return linear


@lowering(aten.index_put.default, aten._unsafe_index_put.default, partial="boolean-mask indices")
def _index_put(ctx, x, indices, values, accumulate=False):
    """``x[i0, i1, ...] = values`` (or ``+=``), as one ``scatter`` at linear positions of the
    indexed dims moved to the front: the embedding gradient is this with ``accumulate``."""
    if any(i is not None and i.dtype in (DType.b8, DType.u8) for i in indices):
        raise UnsupportedError("index_put with boolean-mask indices")
    pos = [k for k, i in enumerate(indices) if i is not None]
    if not pos:
        raise UnsupportedError("index_put without an index tensor")
    idx_shape = _broadcast_shape([indices[k].shape for k in pos])
    rest = [k for k in range(x.rank) if k not in pos]
    sizes = [x.shape[k] for k in pos]
    parts = [_wrapped(ctx, ctx.broadcast_to(indices[k], idx_shape), x.shape[k]) for k in pos]
    linear = _linear_index(ctx, parts, sizes, idx_shape)
    # The indexed block of x[indices], as torch shapes it: in place of the indexed dims when
    # they are adjacent, in front otherwise. Moved to the front for the scatter.
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    nb = len(idx_shape)
    if adjacent and pos[0] > 0:
        shape = (*x.shape[: pos[0]], *idx_shape, *x.shape[pos[-1] + 1 :])
        v = ctx.broadcast_to(ctx.cast(values, x.dtype), shape)
        perm = (
            list(range(pos[0], pos[0] + nb))
            + list(range(pos[0]))
            + list(range(pos[0] + nb, len(shape)))
        )
        v = ctx.transpose(v, perm)
    else:
        shape = (*idx_shape, *(x.shape[k] for k in rest))
        v = ctx.broadcast_to(ctx.cast(values, x.dtype), shape)
    xt = ctx.transpose(x, pos + rest)
    xf = ctx.reshape(xt, (shape_numel(sizes), *(x.shape[k] for k in rest)))
    mode = "add" if accumulate else "set"
    y = ctx.op("scatter", xf, linear, v, axis=0, mode=mode)
    y = ctx.reshape(y, xt.shape)
    inverse = [0] * x.rank
    for j, k in enumerate(pos + rest):
        inverse[k] = j
    return ctx.transpose(y, inverse)


def _scatter_along(ctx: LowerCtx, x, dim, index, src, mode: str):
    """torch's ``scatter``: ``out[..., index[q], ...] = src[q]`` at every position q of
    ``index`` (``dim`` replaced), as one ``scatter`` on the flattened input."""
    dim = norm_dim(dim, x.rank)
    if index.rank != x.rank:
        raise UnsupportedError(f"scatter with an index of rank {index.rank} into rank {x.rank}")
    shape = tuple(index.shape)
    for d in range(x.rank):
        if d != dim:  # (eager checks the same: index.size(d) <= self.size(d))
            ctx.b.constraints.guard_le(shape[d], x.shape[d], f"scatter index dim {d}")
    parts = [_wrapped(ctx, index, x.shape[d]) if d == dim else None for d in range(x.rank)]
    linear = _linear_index(ctx, parts, x.shape, shape)
    if isinstance(src, Node):  # (eager reads src's leading block, the index's shape)
        upd = ctx.op("slice", src, start=(0,) * x.rank, limit=shape, stride=(1,) * x.rank)
        upd = ctx.cast(upd, x.dtype)
    else:
        upd = ctx.operand(src, x.dtype, shape)
    y = ctx.op("scatter", ctx.reshape(x, (shape_numel(x.shape),)), linear, upd, axis=0, mode=mode)
    return ctx.reshape(y, x.shape)


@lowering(aten.scatter.value, aten.scatter.src)
def _scatter(ctx, x, dim, index, src):
    return _scatter_along(ctx, x, dim, index, src, "set")


@lowering(aten.scatter_add.default)
def _scatter_add(ctx, x, dim, index, src):
    return _scatter_along(ctx, x, dim, index, src, "add")
