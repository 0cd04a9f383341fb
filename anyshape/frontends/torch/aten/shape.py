"""Lowering rules for ATen view and data-movement ops: view/reshape, permute, expand,
squeeze/unsqueeze, slice/select/narrow, cat/split/unbind, pad, repeat, pixel (un)shuffle.

Part of the torch frontend's lowering table. Output shapes come from torch's
metadata (``ctx.out_type()``), which already resolved -1 and symbolic sizes, so
each rule only decides *how* to produce that shape. Views become IR view ops;
the backend makes them aliases, not copies.
"""

from __future__ import annotations

import operator

import torch

from ....errors import UnsupportedError
from ....ir.symbolic import SymExpr, as_dim, as_expr, sym_max
from ..lowering import LowerCtx, lowering, norm_dim

aten = torch.ops.aten


@lowering(operator.getitem)
def _getitem(ctx, seq, i):
    if not isinstance(seq, (tuple, list)):
        raise UnsupportedError("getitem on a non-tuple value")
    return seq[i]


@lowering(
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default
)
def _view(ctx, x, shape):
    return ctx.reshape(x, ctx.out_type().shape)


@lowering(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, x, dims):
    return ctx.transpose(x, [norm_dim(d, x.rank) for d in dims])


@lowering(aten.transpose.int, aten.transpose_copy.int)
def _transpose(ctx, x, d0, d1):
    perm = list(range(x.rank))
    if x.rank == 0:
        return x
    a, b = norm_dim(d0, x.rank), norm_dim(d1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.transpose(x, perm)


@lowering(aten.t.default)
def _t(ctx, x):
    return ctx.transpose(x, [1, 0]) if x.rank == 2 else x


@lowering(aten.expand.default, aten.expand_copy.default)
def _expand(ctx, x, sizes, implicit=False):
    return ctx.broadcast_to(x, ctx.out_type().shape)


@lowering(aten.expand_as.default)
def _expand_as(ctx, x, other):
    return ctx.broadcast_to(x, other.shape)


@lowering(
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.unsqueeze_copy.default,
    aten.squeeze_copy.dims,
    aten.flatten.using_ints,
    aten.unflatten.int,
)
def _reshape_like(ctx, x, *args):
    return ctx.reshape(x, ctx.out_type().shape)


def _slice_bounds(size, start, n, step):
    """IR (start, limit) for ``n`` elements from ``start`` with ``step`` (start normalized)."""
    if start is None:
        start = 0
    if isinstance(start, int) and start < 0:
        # Eager clamps a start below -size to 0: a symbolic max when size is symbolic.
        start = as_dim(sym_max(as_expr(size) + start, as_expr(0)))
    if isinstance(start, int) and isinstance(size, int):
        start = min(start, size)
    limit = as_dim(as_expr(start) + (as_expr(n) - 1) * step + 1)
    if isinstance(limit, int) and limit < as_expr(start).constant_term and isinstance(start, int):
        limit = start
    return start, limit


def slice_dim(ctx: LowerCtx, x, dim: int, start, n, step: int = 1):
    """Slice ``n`` elements along ``dim`` starting at ``start`` with ``step``."""
    st, lim = _slice_bounds(x.shape[dim], start, n, step)
    if st == 0 and step == 1 and as_expr(n) == as_expr(x.shape[dim]):
        return x
    starts = [0] * x.rank
    limits = list(x.shape)
    strides = [1] * x.rank
    starts[dim], limits[dim], strides[dim] = st, lim, step
    if isinstance(n, int) and n == 0:
        limits[dim] = st
    return ctx.op("slice", x, start=tuple(starts), limit=tuple(limits), stride=tuple(strides))


@lowering(
    aten.slice.Tensor, aten.slice_copy.Tensor, partial="a symbolic start that may be negative"
)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.rank)
    n = ctx.out_type().shape[dim]
    if isinstance(start, SymExpr) and not start.nonneg:
        raise UnsupportedError("slice with a symbolic start that may be negative")
    return slice_dim(ctx, x, dim, start, n, step)


@lowering(aten.narrow.default)
def _narrow(ctx, x, dim, start, length):
    dim = norm_dim(dim, x.rank)
    return slice_dim(ctx, x, dim, start, length)


@lowering(aten.select.int, aten.select_copy.int)
def _select(ctx, x, dim, index):
    dim = norm_dim(dim, x.rank)
    if isinstance(index, int):  # (eager's IndexError: the prologue checks it per call)
        need = index + 1 if index >= 0 else -index
        why = f"{ctx.node.target}: index {index} within dim {dim}"
        ctx.b.constraints.guard_le(need, x.shape[dim], why)
        if index < 0:
            index = as_dim(as_expr(x.shape[dim]) + index)
    s = slice_dim(ctx, x, dim, index, 1)
    return ctx.reshape(s, ctx.out_type().shape)


@lowering(aten.cat.default, aten.concat.default)
def _cat(ctx, tensors, dim=0):
    out = ctx.out_type()
    # Legacy behaviour: 1-D empty tensors are skipped whatever the other ranks are.
    parts = [t for t in tensors if not (t.rank == 1 and t.shape[0] == 0 and out.rank != 1)]
    if not parts:
        return ctx.full(0, out.shape, out.dtype)
    dim = norm_dim(dim, out.rank)
    parts = [ctx.cast(t, out.dtype) for t in parts]
    if len(parts) == 1:
        return parts[0]
    return ctx.op("concatenate", *parts, axis=dim)


@lowering(
    aten.split_with_sizes.default,
    aten.split.Tensor,
    aten.split.sizes,
    aten.split_with_sizes_copy.default,
    aten.split_copy.Tensor,
)
def _split(ctx, x, sizes, dim=0):
    dim = norm_dim(dim, x.rank)
    outs = []
    offset = as_expr(0)
    for i in range(len(ctx.out_val())):
        n = ctx.out_type(i).shape[dim]
        outs.append(slice_dim(ctx, x, dim, as_dim(offset), n))
        offset = offset + as_expr(n)
    return tuple(outs)


@lowering(
    aten.unbind.int,
    aten.unbind_copy.int,
    partial="a symbolic dim (the number of outputs would vary)",
)
def _unbind(ctx, x, dim=0):
    dim = norm_dim(dim, x.rank)
    n = x.shape[dim]
    if not isinstance(n, int):
        raise UnsupportedError("unbind over a symbolic dim has a dynamic number of outputs")
    return tuple(ctx.reshape(slice_dim(ctx, x, dim, i, 1), ctx.out_type(i).shape) for i in range(n))


@lowering(aten.constant_pad_nd.default, partial="symbolic pad amounts")
def _constant_pad(ctx, x, pad, value=0):
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise UnsupportedError(f"pad list {pad} does not fit rank {x.rank}")
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        low[d], high[d] = pad[2 * i], pad[2 * i + 1]
    if any(not isinstance(p, int) for p in low + high):
        raise UnsupportedError("symbolic pad amounts")
    return ctx.op("pad", x, ctx.const(value, x.dtype), low=tuple(low), high=tuple(high))


@lowering(aten.repeat.default)
def _repeat(ctx, x, repeats):
    out = ctx.out_type()
    k = len(repeats)
    shape = [1] * (k - x.rank) + list(x.shape)
    x = ctx.reshape(x, shape)
    inter, dims = [], []
    for i, (r, d) in enumerate(zip(repeats, shape)):
        inter += [r, d]
        dims.append(2 * i + 1)
    y = ctx.op("broadcast_in_dim", x, shape=tuple(inter), dims=tuple(dims))
    return ctx.reshape(y, out.shape)


@lowering(aten.pixel_shuffle.default, aten.pixel_unshuffle.default)
def _pixel_shuffle(ctx, x, factor):
    """``[..., c*r*r, h, w] <-> [..., c, h*r, w*r]``: each factor-sized block of rows and
    columns to or from channels, as a reshape, a transpose and a reshape (torch's own
    decomposition, with the sizes of the node's metadata)."""
    out = ctx.out_type()
    k, r = x.rank - 3, factor
    batch = list(x.shape[:k])
    if ctx.node.target == aten.pixel_unshuffle.default:
        c, (h, w) = x.shape[k], out.shape[-2:]
        split = ctx.reshape(x, batch + [c, h, r, w, r])
        perm = [k, k + 2, k + 4, k + 1, k + 3]
    else:
        c, (h, w) = out.shape[k], x.shape[-2:]
        split = ctx.reshape(x, batch + [c, r, r, h, w])
        perm = [k, k + 3, k + 1, k + 4, k + 2]
    moved = ctx.transpose(split, list(range(k)) + perm)
    return ctx.reshape(moved, out.shape)
