"""Lowering rules for ATen neural-network ops: layer, group and batch norm (batch norm by
running statistics, or by batch statistics where that mutates nothing, as instance norm
does), convolution, max/avg/adaptive pooling, embedding and index lookups, and
eval-mode dropout. Attention is in ``attention.py``.

Part of the torch frontend's lowering table (see ``lowering.py``); reductions
and softmax come from ``reduce.py``. Normalization and pooling compute
in the accumulator dtype (f32 for f16/bf16) and cast to torch's result dtype.
Pooling windows follow torch's ``ceil_mode`` by padding high and cropping to the
shape torch recorded (read as the exact size for every input length, see
``size_rewrites.py``). Outputs torch only needs for training are produced as
torch's (empty) tensors, or, for max-pooling indices, refused with
``UnsupportedError`` when a later node reads them.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from ....errors import UnsupportedError
from ....ir.constraints import Guard
from ....ir.dtypes import DType
from ....ir.symbolic import as_dim, as_expr, floordiv, shape_numel
from ..lowering import LowerCtx, lowering, norm_dim
from .reduce import acc_dtype, expand_back, l2_norm, mean
from .shape import slice_dim

aten = torch.ops.aten


def _refuse_outputs(ctx: LowerCtx, first: int, what: str) -> None:
    """Refuse the node if a later node reads its tuple output ``first`` or beyond."""
    for u in ctx.node.users:
        if u.target is not operator.getitem or u.args[1] >= first:
            raise UnsupportedError(f"{what} is not computed")


def _finish(ctx: LowerCtx, x, i: int | None = None):
    out = ctx.out_type(i)
    return ctx.reshape(ctx.cast(x, out.dtype), out.shape)


def _per_channel(ctx: LowerCtx, v, like, dims=(1,)):
    """A per-channel vector (or the ``dims`` block of ``like``) broadcast over ``like``."""
    return ctx.op("broadcast_in_dim", ctx.cast(v, like.dtype), shape=like.shape, dims=tuple(dims))


def _affine(ctx: LowerCtx, y, weight, bias, dims=(1,)):
    if weight is not None:
        y = ctx.op("mul", y, _per_channel(ctx, weight, y, dims))
    if bias is not None:
        y = ctx.op("add", y, _per_channel(ctx, bias, y, dims))
    return y


# --- normalization -------------------------------------------------------------------


def _normalize(ctx: LowerCtx, x, axes, eps: float):
    """((x - mean) * rstd, mean, biased var, rstd) over ``axes``; statistics drop ``axes``."""
    m = mean(ctx, x, axes)
    d = ctx.op("sub", x, expand_back(ctx, m, x.shape, axes))
    var = mean(ctx, ctx.op("mul", d, d), axes)
    rstd = ctx.op("rsqrt", ctx.op("add", var, ctx.full(eps, var.shape, var.dtype)))
    return ctx.op("mul", d, expand_back(ctx, rstd, x.shape, axes)), m, var, rstd


@lowering(aten.native_layer_norm.default)
def _layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.rank - len(normalized_shape), x.rank))
    y, m, _, rstd = _normalize(ctx, ctx.cast(x, acc_dtype(x.dtype)), axes, eps)
    y = _affine(ctx, y, weight, bias, axes)
    return _finish(ctx, y, 0), _finish(ctx, m, 1), _finish(ctx, rstd, 2)


@lowering(aten.layer_norm.default)
def _layer_norm_composite(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, *_):
    """``F.layer_norm`` as exported (before decomposition): the first output only."""
    axes = tuple(range(x.rank - len(normalized_shape), x.rank))
    y, _, _, _ = _normalize(ctx, ctx.cast(x, acc_dtype(x.dtype)), axes, eps)
    return _finish(ctx, _affine(ctx, y, weight, bias, axes))


def _grouped_normalize(ctx: LowerCtx, x, group: int, eps: float):
    """``x`` normalized over each image's groups of channels, in ``x``'s shape; the mean
    and rstd per (image, group); and the count of values in each."""
    xs = ctx.cast(x, acc_dtype(x.dtype))
    per_group = as_dim(floordiv(as_expr(x.shape[1]), group) * as_expr(shape_numel(x.shape[2:])))
    y, m, _, rstd = _normalize(ctx, ctx.reshape(xs, (x.shape[0], group, per_group)), (2,), eps)
    return ctx.reshape(y, x.shape), m, rstd, per_group


@lowering(aten.native_group_norm.default)
def _group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    y, m, rstd, _ = _grouped_normalize(ctx, x, group, eps)
    return _finish(ctx, _affine(ctx, y, weight, bias), 0), _finish(ctx, m, 1), _finish(ctx, rstd, 2)


@lowering(aten.group_norm.default)
def _group_norm_composite(ctx, x, group, weight=None, bias=None, eps=1e-5, *_):
    """``F.group_norm`` as exported (before decomposition): the normalized output only.
    Eager's ``F.group_norm`` refuses one value per group and image (``N * C / G`` times
    the spatial size of 1); so does the prologue."""
    y, _, _, per_group = _grouped_normalize(ctx, x, group, eps)
    values = as_expr(x.shape[0]) * as_expr(per_group)
    store = ctx.b.constraints
    if not store.prove_ne(values, 1):
        reason = "F.group_norm: more than 1 value per channel"
        store.add_guard(Guard("ne", values, as_expr(1), reason))
    return _finish(ctx, _affine(ctx, y, weight, bias))


@lowering(aten._weight_norm.default)
def _weight_norm(ctx, v, g, dim=0):
    """Weight norm's weight (``nn.utils.parametrizations.weight_norm``): ``v * g / ||v||``,
    the norm over every dim but ``dim`` (over all of them for ``dim=-1``: torch's
    ``norm_except_dim`` reads -1 as no dim, not the last)."""
    vs = ctx.cast(v, acc_dtype(v.dtype))
    keep = () if dim == -1 else (norm_dim(dim, v.rank),)
    axes = tuple(a for a in range(v.rank) if a not in keep)
    norm = l2_norm(ctx, vs, axes)
    scale = ctx.op("div", ctx.cast(ctx.reshape(g, norm.shape), vs.dtype), norm)
    return _finish(ctx, ctx.op("mul", vs, expand_back(ctx, scale, vs.shape, axes)))


def _batch_norm_eval(ctx: LowerCtx, x, weight, bias, running_mean, running_var, eps):
    """y = x * alpha + beta with per-channel alpha = w / sqrt(var + eps), beta = b - mean * alpha."""
    acc = acc_dtype(x.dtype)
    rv = ctx.cast(running_var, acc)
    alpha = ctx.op("rsqrt", ctx.op("add", rv, ctx.full(eps, rv.shape, acc)))
    if weight is not None:
        alpha = ctx.op("mul", alpha, ctx.cast(weight, acc))
    beta = ctx.op("neg", ctx.op("mul", ctx.cast(running_mean, acc), alpha))
    if bias is not None:
        beta = ctx.op("add", beta, ctx.cast(bias, acc))
    xs = ctx.cast(x, acc)
    return ctx.op(
        "add", ctx.op("mul", xs, _per_channel(ctx, alpha, xs)), _per_channel(ctx, beta, xs)
    )


def _running(ctx: LowerCtx, old, new, momentum):
    """A running statistic's update: old * (1 - momentum) + new * momentum."""
    new = ctx.cast(new, old.dtype)
    keep = ctx.op("mul", old, ctx.full(1 - momentum, old.shape, old.dtype))
    return ctx.op("add", keep, ctx.op("mul", new, ctx.full(momentum, new.shape, new.dtype)))


_FUNCTIONAL = aten._native_batch_norm_legit_functional.default


def _no_stats_update(node) -> bool:
    """A batch norm that updates no running statistics in place (eval mode, or none
    given): as exported, before the decomposition that makes the update functional."""
    args = [*node.args, *[None] * 8][:8]
    training = node.kwargs.get("training", args[5])
    stats = node.kwargs.get("running_mean", args[3]), node.kwargs.get("running_var", args[4])
    return not training or None in stats


@lowering(_FUNCTIONAL)
@lowering(
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    partial="training mode with running statistics (they would be updated in place)",
    covers_as_exported=_no_stats_update,
)
def _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    stats = None if running_mean is None or running_var is None else (running_mean, running_var)
    if training:
        return _batch_norm_train(ctx, x, weight, bias, stats, momentum, eps)
    if stats is None:
        raise UnsupportedError("eval-mode batch norm without running statistics")
    y = _batch_norm_eval(ctx, x, weight, bias, *stats, eps)
    empty = [ctx.full(0, ctx.out_type(i).shape, ctx.out_type(i).dtype) for i in (1, 2)]
    # Eval mode saves no batch statistics; the functional form passes the running ones on.
    return (_finish(ctx, y, 0), *empty, *(stats if ctx.node.target is _FUNCTIONAL else ()))


def _rounded(ctx: LowerCtx, stat, x, axes):
    """A batch statistic rounded to ``x``'s dtype and back, broadcast back over ``axes``."""
    back = ctx.cast(ctx.cast(stat, x.dtype), stat.dtype)
    return expand_back(ctx, back, x.shape, axes)


def _batch_norm_train(ctx: LowerCtx, x, weight, bias, stats, momentum, eps):
    """Normalization by the batch's own statistics (returned as mean and invstd); the
    functional form also returns the updated running statistics, which the other forms
    would update in place."""
    functional = ctx.node.target is _FUNCTIONAL
    if stats is not None and not functional:
        raise UnsupportedError("training-mode batch norm updating running statistics in place")
    xs, axes = ctx.cast(x, acc_dtype(x.dtype)), (0, *range(2, x.rank))
    y, m, var, rstd = _normalize(ctx, xs, axes, eps)
    if xs is not x:  # f16/bf16: eager normalizes with its statistics rounded to x's dtype
        y = ctx.op(
            "mul", ctx.op("sub", xs, _rounded(ctx, m, x, axes)), _rounded(ctx, rstd, x, axes)
        )
    y = _affine(ctx, y, weight, bias)
    outs = (_finish(ctx, y, 0), _finish(ctx, m, 1), _finish(ctx, rstd, 2))
    if not functional:
        return outs
    n = shape_numel([d for i, d in enumerate(x.shape) if i != 1])
    bessel = ctx.op(
        "div",
        ctx.operand(n, var.dtype, var.shape),
        ctx.operand(as_dim(as_expr(n) - 1), var.dtype, var.shape),
    )
    unbiased = ctx.op("mul", var, bessel)
    return (
        *outs,
        _running(ctx, stats[0], m, momentum),
        _running(ctx, stats[1], unbiased, momentum),
    )


def _eval_mode(node) -> bool:
    args = [*node.args, *[None] * 9][:9]
    return not node.kwargs.get("training", args[5])


@lowering(aten.batch_norm.default, partial="training mode", covers_as_exported=_eval_mode)
def _batch_norm_as_exported(
    ctx, x, weight, bias, running_mean, running_var, training, momentum=0.1, eps=1e-5, *_
):
    """``F.batch_norm`` as exported, in eval mode (training mode is decomposed first)."""
    if training or running_mean is None or running_var is None:
        raise UnsupportedError("batch_norm as exported in training mode or without statistics")
    return _finish(ctx, _batch_norm_eval(ctx, x, weight, bias, running_mean, running_var, eps))


@lowering(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, False, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(ctx, x, weight, bias, training, momentum, eps):
    return _batch_norm(ctx, x, weight, bias, None, None, training, momentum, eps)


# --- convolution ------------------------------------------------------------------------


def _expand(v, n: int) -> tuple:
    """A pooling/conv size argument (int, 1-list or n-list) as an n-tuple."""
    v = (v,) if isinstance(v, int) else tuple(v)
    v = v * n if len(v) == 1 else v
    if len(v) != n or not all(isinstance(i, int) for i in v):
        raise UnsupportedError(f"window argument {v} for {n} spatial dims")
    return v


@lowering(aten.convolution.default, partial="transposed convolution; a weight of symbolic shape")
def _convolution(
    ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    if transposed:
        raise UnsupportedError("transposed convolution")
    if weight.shape[1] == 0:  # (no input channels: eager's output has no channels either)
        out = ctx.out_type()
        return ctx.full(0, out.shape, out.dtype)
    n = weight.rank - 2
    attrs = {"stride": _expand(stride, n), "padding": _expand(padding, n)}
    y = ctx.op("convolution", x, weight, dilation=_expand(dilation, n), groups=groups, **attrs)
    if bias is not None:
        y = ctx.op("add", y, _per_channel(ctx, bias, y))
    return _finish(ctx, y)


def _batched_numeric_padding(node) -> bool:
    """A batched input and numeric padding (else decomposed first)."""
    padding = node.kwargs.get("padding", node.args[4] if len(node.args) > 4 else 0)
    x, w = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:2])
    batched = isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == w.dim()
    return batched and not isinstance(padding, str)


@lowering(
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    partial="padding='same' or 'valid', an unbatched input (decomposed first)",
    covers_as_exported=_batched_numeric_padding,
)
def _conv_nd(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``F.conv1d/2d/3d`` as exported, with numeric padding."""
    if isinstance(padding, str):
        raise UnsupportedError(f"convolution padding {padding!r} as exported")
    if weight.rank != x.rank:
        raise UnsupportedError("an unbatched convolution input as exported")
    return _convolution(ctx, x, weight, bias, stride, padding, dilation, False, None, groups)


# --- pooling ------------------------------------------------------------------------------

_NSP = {
    aten.max_pool1d.default: 1,
    aten.max_pool2d.default: 2,
    aten.max_pool3d.default: 3,
    aten.max_pool2d_with_indices.default: 2,
    aten.max_pool3d_with_indices.default: 3,
    aten.avg_pool1d.default: 1,
    aten.avg_pool2d.default: 2,
    aten.avg_pool3d.default: 3,
}


def _window(ctx: LowerCtx, kernel, stride, padding, dilation=1):
    n = _NSP[ctx.node.target]
    k = _expand(kernel, n)
    return k, (_expand(stride, n) if stride else k), _expand(padding, n), _expand(dilation, n)


def _ceil_extra(s, ceil_mode: bool) -> tuple[int, ...]:
    """High padding that lets floor-mode windows reach ceil_mode's last partial window
    (``_crop`` then drops a window torch does not make)."""
    return tuple(v - 1 for v in s) if ceil_mode else (0,) * len(s)


def _crop(ctx: LowerCtx, y, i: int | None = None):
    """``y`` sliced down to torch's recorded output shape."""
    for axis, want in enumerate(ctx.out_type(i).shape):
        if as_expr(y.shape[axis]) != as_expr(want):
            y = slice_dim(ctx, y, axis, 0, want)
    return y


def _pad_high(ctx: LowerCtx, x, extra, value):
    if not any(extra):
        return x
    lead = (0,) * (x.rank - len(extra))
    return ctx.op(
        "pad", x, ctx.const(value, x.dtype), low=lead + (0,) * len(extra), high=lead + tuple(extra)
    )


def _pool(ctx: LowerCtx, x, kind, k, s, p, d, include_pad=True):
    attrs = {"kernel": k, "stride": s, "padding": p, "dilation": d}
    return ctx.op("pool", x, kind=kind, count_include_pad=include_pad, **attrs)


def _max_pool(ctx: LowerCtx, x, kernel, stride, padding, dilation, ceil_mode):
    k, s, p, d = _window(ctx, kernel, stride, padding, dilation)
    lowest = -math.inf if x.dtype.is_float else np.iinfo(x.dtype.to_numpy()).min
    return _pool(ctx, _pad_high(ctx, x, _ceil_extra(s, ceil_mode), lowest), "max", k, s, p, d)


_WITH_INDICES = (aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)


@lowering(
    *_WITH_INDICES,
    aten.max_pool1d.default,
    aten.max_pool2d.default,
    aten.max_pool3d.default,
    partial="the indices output, when a later op reads it",
)
def _max_pool_rule(ctx, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    y = _max_pool(ctx, x, kernel, stride, padding, dilation, ceil_mode)
    if ctx.node.target not in _WITH_INDICES:
        return _finish(ctx, _crop(ctx, y))
    _refuse_outputs(ctx, 1, "the indices output of max pooling")
    return _finish(ctx, _crop(ctx, y, 0), 0), None


@lowering(aten.avg_pool1d.default, aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(
    ctx,
    x,
    kernel,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    k, s, p, d = _window(ctx, kernel, stride, padding)
    # Integers average in f64; the cast back truncates, as torch's integer division does.
    exact = not x.dtype.is_float
    x = ctx.cast(x, DType.f64 if exact else acc_dtype(x.dtype))
    extra = _ceil_extra(s, ceil_mode)
    if not any(extra) and divisor_override is None:
        return _finish(ctx, _crop(ctx, _pool(ctx, x, "avg", k, s, p, d, count_include_pad)))
    # Window sums divided by torch's divisor (which ignores the ceil_mode overhang).
    y = _pool(ctx, _pad_high(ctx, x, extra, 0), "avg", k, s, p, d)
    y = ctx.op("mul", y, ctx.full(math.prod(k), y.shape, y.dtype))
    if exact:
        y = ctx.op("round", y)
    if divisor_override is not None:
        div = ctx.full(divisor_override, y.shape, y.dtype)
    else:
        div = _window_counts(ctx, x.shape[x.rank - len(k) :], y, k, s, p, count_include_pad)
    return _finish(ctx, _crop(ctx, ctx.op("div", y, div)))


def _window_counts(ctx: LowerCtx, sizes, like, k, s, p, include_pad: bool):
    """Per output position, the elements torch's avg_pool divides by, shaped like ``like``."""
    count = None
    for i, size in enumerate(sizes):
        iota = ctx.op("iota", shape=like.shape, dim=like.rank - len(sizes) + i, dtype=DType.i64)
        start = ctx.op("sub", ctx.op("mul", iota, _i64(ctx, s[i], like)), _i64(ctx, p[i], like))
        limit = as_dim(as_expr(size) + (p[i] if include_pad else 0))
        end = ctx.op("min", ctx.op("add", start, _i64(ctx, k[i], like)), _i64(ctx, limit, like))
        if not include_pad:
            start = ctx.op("max", start, _i64(ctx, 0, like))
        n = ctx.op("sub", end, start)
        count = n if count is None else ctx.op("mul", count, n)
    return ctx.cast(count, like.dtype)


def _i64(ctx: LowerCtx, v, like):
    return ctx.operand(v, DType.i64, like.shape)


@lowering(
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    partial="a symbolic output size other than the input's",
)
def _adaptive_avg_pool(ctx, x, output_size):
    x = ctx.cast(x, acc_dtype(x.dtype))
    for i, o in enumerate(output_size):
        x = _adaptive_axis(ctx, x, x.rank - len(output_size) + i, o)
    return _finish(ctx, x)


def _adaptive_axis(ctx: LowerCtx, x, axis: int, o):
    """Adaptive averaging along ``axis``: output i averages [floor(i*L/o), ceil((i+1)*L/o))."""
    size = x.shape[axis]
    if as_expr(size) == as_expr(o):
        return x
    if o == 1 or (isinstance(size, int) and isinstance(o, int) and size % o == 0):
        windows = (*x.shape[:axis], o, size if o == 1 else size // o, *x.shape[axis + 1 :])
        return mean(ctx, ctx.reshape(x, windows), (axis + 1,))
    if not isinstance(o, int):
        raise UnsupportedError(f"adaptive pooling to a symbolic size {o}")
    one = tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    parts = []
    for i in range(o):
        start = floordiv(as_expr(size) * i, o)
        end = floordiv(as_expr(size) * (i + 1) + o - 1, o)
        window = slice_dim(ctx, x, axis, as_dim(start), as_dim(end - start))
        parts.append(ctx.reshape(mean(ctx, window, (axis,)), one))
    return ctx.op("concatenate", *parts, axis=axis)


# --- lookups --------------------------------------------------------------------------------


def _no_negative(ctx: LowerCtx, index):
    """``index`` with every negative entry made too large for any dim: embedding,
    index_select and gather raise on a negative index where eager does, instead of
    wrapping it as the IR's gather does (for advanced indexing)."""
    too_large = int(np.iinfo(index.dtype.to_numpy()).max)
    negative = ctx.op("lt", index, ctx.full(0, index.shape, index.dtype))
    return ctx.op("select", negative, ctx.full(too_large, index.shape, index.dtype), index)


@lowering(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ctx.op("gather", weight, _no_negative(ctx, indices), axis=0)


def _at_least_1d(ctx: LowerCtx, x):
    return ctx.reshape(x, (1,)) if x.rank == 0 else x


@lowering(aten.index_select.default)
def _index_select(ctx, x, dim, index):
    x = _at_least_1d(ctx, x)
    index = _no_negative(ctx, ctx.reshape(index, (index.type.numel,)))
    return _finish(ctx, ctx.op("gather", x, index, axis=norm_dim(dim, x.rank)))


@lowering(aten.gather.default)
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    x, index = _at_least_1d(ctx, x), _no_negative(ctx, _at_least_1d(ctx, index))
    return _finish(ctx, ctx.op("take_along_axis", x, index, axis=norm_dim(dim, x.rank)))


# --- dropout --------------------------------------------------------------------------------------


@lowering(aten.native_dropout.default, aten.dropout.default, partial="training mode with p > 0")
def _dropout(ctx, x, p, train):
    if train and p != 0:
        raise UnsupportedError("dropout in training mode is random")
    if ctx.node.target is aten.dropout.default:
        return x
    return x, ctx.full(True, x.shape, DType.b8)  # (output, keep-mask)
