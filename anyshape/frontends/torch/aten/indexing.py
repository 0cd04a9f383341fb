"""Lowering rules for ATen advanced indexing: index.Tensor and masked_fill.

Part of the torch frontend's lowering table. ``x[i0, i1]`` with integer index
tensors becomes one ``gather`` on a flattened view: the indexed dims move to
the front, the index tensors combine into one linear index, and the gathered
block moves back to where torch puts it (in place when the indexed dims are
adjacent, in front otherwise). Boolean-mask indexing has a data-dependent
shape and stays in PyTorch.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.symbolic import as_dim, as_expr
from ..lowering import lowering

aten = torch.ops.aten
_INT64_MAX = 2**63 - 1


def _broadcast_shape(shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        non_one = [d for d in dims if d != 1]
        out.append(non_one[0] if non_one else 1)
    return tuple(out)


@lowering(
    aten.index.Tensor,
    aten._unsafe_index.Tensor,
    partial="boolean-mask indices (their output shape depends on the data)",
)
def _index(ctx, x, indices):
    out = ctx.out_type()
    if any(i is not None and i.dtype in (DType.b8, DType.u8) for i in indices):
        raise UnsupportedError("boolean-mask indexing has a data-dependent output shape")
    pos = [k for k, i in enumerate(indices) if i is not None]
    if not pos:
        return x
    idx_shape = _broadcast_shape([indices[k].shape for k in pos])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    rest = [k for k in range(x.rank) if k not in pos]
    xt = ctx.transpose(x, pos + rest)
    lead = [x.shape[k] for k in pos]
    flat = as_dim(_prod(lead))
    xf = ctx.reshape(xt, [flat] + [x.shape[k] for k in rest])
    linear = outside = None
    stride = as_expr(1)
    zero = ctx.full(0, idx_shape, DType.i64)
    for k in reversed(pos):
        size = x.shape[k]
        i = ctx.broadcast_to(ctx.cast(indices[k], DType.i64), idx_shape)
        n = ctx.broadcast_to(ctx.shape_scalar(size), idx_shape)
        i = ctx.op("select", ctx.op("lt", i, zero), ctx.op("add", i, n), i)
        # Wrapped once: what is still outside [0, size) is out of range, as in eager.
        bad = ctx.op("or", ctx.op("lt", i, zero), ctx.op("ge", i, n))
        outside = bad if outside is None else ctx.op("or", outside, bad)
        i = ctx.op("select", bad, zero, i)
        term = (
            i
            if stride == 1
            else ctx.op("mul", i, ctx.broadcast_to(ctx.shape_scalar(as_dim(stride)), idx_shape))
        )
        linear = term if linear is None else ctx.op("add", linear, term)
        stride = stride * as_expr(size)
    # An index out of range in any dim makes the linear index too large: gather raises.
    too_large = ctx.full(_INT64_MAX, idx_shape, DType.i64)
    linear = ctx.op("select", outside, too_large, linear)
    g = ctx.op("gather", xf, linear, axis=0)  # idx_shape + rest
    nb = len(idx_shape)
    if adjacent and pos[0] > 0:
        # Move the gathered block back between the leading and trailing dims.
        before = list(range(nb, nb + pos[0]))
        perm = before + list(range(nb)) + list(range(nb + pos[0], g.rank))
        g = ctx.transpose(g, perm)
    return ctx.reshape(g, out.shape)


def _prod(dims):
    p = as_expr(1)
    for d in dims:
        p = p * as_expr(d)
    return p


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, x, mask, value):
    out = ctx.out_type()
    m = ctx.broadcast_to(
        mask if mask.dtype is DType.b8 else ctx.op("ne", mask, ctx.full(0, mask.shape, mask.dtype)),
        out.shape,
    )
    v = ctx.operand(value, out.dtype, out.shape)
    return ctx.op("select", m, v, ctx.broadcast_to(ctx.cast(x, out.dtype), out.shape))
