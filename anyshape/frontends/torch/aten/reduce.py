"""Lowering rules for ATen reductions: sum/mean/prod, vector norms, max/min and their arg
forms, any/all, var/std, cumulative sums and products, logsumexp and (log-)softmax.

Part of the torch frontend's lowering table (see ``lowering.py``). The IR's
``reduce`` drops the reduced axes; each rule reduces and then reshapes to the
shape torch recorded, which is how ``keepdim`` is honoured. Inputs are first
cast to torch's result dtype (so ``dtype=`` arguments and int-to-int64
promotion behave as in torch), and f16/bf16 sums, means, products and scans
accumulate in f32 before casting back. ``reduce_axes``, ``expand_back``,
``mean``, ``l2_norm`` and ``softmax`` are shared with ``nn.py``.
"""

from __future__ import annotations

import math

import torch

from ....ir.dtypes import DType
from ....ir.symbolic import shape_numel
from ..lowering import LowerCtx, lowering, norm_dim

aten = torch.ops.aten


def acc_dtype(dt: DType) -> DType:
    """The dtype a reduction producing ``dt`` accumulates in."""
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


def axes_of(dim, rank: int, empty_means_all: bool = True) -> tuple[int, ...]:
    """The sorted axes a ``dim`` argument names; None (and usually []) means every axis."""
    if rank == 0:
        return ()
    if isinstance(dim, int):
        dim = [dim]
    if dim is None or (not dim and empty_means_all):
        return tuple(range(rank))
    return tuple(sorted({norm_dim(d, rank) for d in dim}))


def reduce_axes(ctx: LowerCtx, kind: str, x, axes):
    """``reduce`` over ``axes``; over no axes (e.g. a rank-0 operand) it is the identity."""
    return ctx.op("reduce", x, kind=kind, axes=tuple(axes)) if axes else x


def expand_back(ctx: LowerCtx, r, shape, axes):
    """Broadcast a reduction result (``axes`` dropped) back to the operand's ``shape``."""
    if not axes:
        return r
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return ctx.op("broadcast_in_dim", r, shape=tuple(shape), dims=kept)


def mean(ctx: LowerCtx, x, axes):
    """Mean of float ``x`` over ``axes``, dividing by the (possibly symbolic) element count."""
    s = reduce_axes(ctx, "sum", x, axes)
    n = shape_numel([x.shape[a] for a in axes])
    return ctx.op("div", s, ctx.operand(n, x.dtype, s.shape))


def _as_result(ctx: LowerCtx, x):
    """``x`` cast to torch's result dtype, then to that dtype's accumulator."""
    out = ctx.out_type().dtype
    return ctx.cast(ctx.cast(x, out), acc_dtype(out))


def _finish(ctx: LowerCtx, r, i: int | None = None):
    out = ctx.out_type(i)
    return ctx.reshape(ctx.cast(r, out.dtype), out.shape)


# --- sum, mean, prod ---------------------------------------------------------------


@lowering(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return _finish(ctx, reduce_axes(ctx, "sum", _as_result(ctx, x), axes_of(dim, x.rank)))


@lowering(aten.mean.dim, aten.mean.default)
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return _finish(ctx, mean(ctx, _as_result(ctx, x), axes_of(dim, x.rank)))


@lowering(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return _finish(ctx, reduce_axes(ctx, "prod", _as_result(ctx, x), axes_of(dim, x.rank)))


# --- vector norms ----------------------------------------------------------------


def l2_norm(ctx: LowerCtx, x, axes):
    """``sqrt(sum(x * x))`` over ``axes`` (shared with weight norm in ``nn.py``)."""
    return ctx.op("sqrt", reduce_axes(ctx, "sum", ctx.op("mul", x, x), axes))


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``torch.linalg.vector_norm`` (``F.normalize``, weight norm): ``sum(|x|^ord)^(1/ord)``
    with ord 2 as ``sqrt(sum(x * x))``, 1 as ``sum(|x|)``, +-inf as the max (min) of
    ``|x|``, 0 as the count of nonzeros; f16/bf16 accumulate in f32."""
    x = _as_result(ctx, x)
    axes = axes_of(dim, x.rank)
    ord = float(ord)
    a = ctx.op("abs", x)
    if ord < 0 or math.isinf(ord):  # (eager refuses an empty dim: no max, min or 0 ** -p)
        _nonempty(ctx, x, axes)
    if math.isinf(ord):
        return _finish(ctx, reduce_axes(ctx, "max" if ord > 0 else "min", a, axes))
    if ord == 0:
        nonzero = ctx.cast(ctx.op("ne", x, ctx.full(0, x.shape, x.dtype)), x.dtype)
        return _finish(ctx, reduce_axes(ctx, "sum", nonzero, axes))
    if ord == 1:
        return _finish(ctx, reduce_axes(ctx, "sum", a, axes))
    if ord == 2:
        return _finish(ctx, l2_norm(ctx, x, axes))
    powered = ctx.op("pow", a, ctx.full(ord, x.shape, x.dtype))
    total = reduce_axes(ctx, "sum", powered, axes)
    return _finish(ctx, ctx.op("pow", total, ctx.full(1.0 / ord, total.shape, x.dtype)))


# --- max, min, argmax, argmin, any, all ---------------------------------------------


_MAX = (aten.amax.default, aten.max.default, aten.max.dim)


def _nonempty(ctx, x, axes) -> None:
    """Eager refuses max/min over an empty dim (no identity): checked before each call."""
    for a in axes:
        ctx.b.constraints.guard_le(1, x.shape[a], f"{ctx.node.target}: reduced dim {a} non-empty")


@lowering(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _extreme(ctx, x, dim=(), keepdim=False):
    kind = "max" if ctx.node.target in _MAX else "min"
    _nonempty(ctx, x, axes_of(dim, x.rank))
    return _finish(ctx, reduce_axes(ctx, kind, x, axes_of(dim, x.rank)))


@lowering(aten.max.dim, aten.min.dim)
def _extreme_dim(ctx, x, dim, keepdim=False):
    kind = "max" if ctx.node.target in _MAX else "min"
    _nonempty(ctx, x, axes_of(dim, x.rank))
    values = reduce_axes(ctx, kind, x, axes_of(dim, x.rank))
    return _finish(ctx, values, 0), _finish(ctx, _argreduce(ctx, "arg" + kind, x, dim), 1)


def _argreduce(ctx: LowerCtx, kind: str, x, dim):
    if dim is None or x.rank == 0:
        x, dim = ctx.reshape(x, (x.type.numel,)), 0
    return ctx.op("argreduce", x, kind=kind, axis=norm_dim(dim, x.rank))


@lowering(aten.argmax.default, aten.argmin.default)
def _arg(ctx, x, dim=None, keepdim=False):
    kind = "argmax" if ctx.node.target is aten.argmax.default else "argmin"
    return _finish(ctx, _argreduce(ctx, kind, x, dim))


_ANY = (aten.any.dim, aten.any.dims, aten.any.default)


@lowering(*_ANY, aten.all.dim, aten.all.dims, aten.all.default)
def _any_all(ctx, x, dim=None, keepdim=False):
    pred = x if x.dtype is DType.b8 else ctx.op("ne", x, ctx.full(0, x.shape, x.dtype))
    # Unlike sum, any/all over an empty dim list reduce nothing.
    axes = axes_of(dim, x.rank, empty_means_all=False)
    return _finish(ctx, reduce_axes(ctx, "any" if ctx.node.target in _ANY else "all", pred, axes))


# --- var, std ------------------------------------------------------------------------


def _var_mean(ctx: LowerCtx, x, dim, correction):
    """(variance, mean) of ``x`` over ``dim`` with torch's ``max(0, N - correction)`` divisor."""
    x = ctx.cast(x, acc_dtype(x.dtype))
    axes = axes_of(dim, x.rank)
    m = mean(ctx, x, axes)
    d = ctx.op("sub", x, expand_back(ctx, m, x.shape, axes))
    ss = reduce_axes(ctx, "sum", ctx.op("mul", d, d), axes)
    n = shape_numel([x.shape[a] for a in axes])
    if isinstance(n, int):
        dof = ctx.full(max(n - correction, 0), ss.shape, x.dtype)
    else:
        dof = ctx.op(
            "max",
            ctx.op(
                "sub", ctx.operand(n, x.dtype, ss.shape), ctx.full(correction, ss.shape, x.dtype)
            ),
            ctx.full(0, ss.shape, x.dtype),
        )
    return ctx.op("div", ss, dof), m


def _correction(correction, unbiased) -> float:
    return correction if correction is not None else (1 if unbiased else 0)


_STD = (aten.std.correction, aten.std.dim, aten.std.default, aten.std_mean.correction)


@lowering(aten.var.correction, aten.var.dim, *_STD[:2])
def _var(ctx, x, dim=None, unbiased=True, keepdim=False, *, correction=None):
    v, _ = _var_mean(ctx, x, dim, _correction(correction, unbiased))
    return _finish(ctx, ctx.op("sqrt", v) if ctx.node.target in _STD else v)


@lowering(aten.var.default, aten.std.default)
def _var_all(ctx, x, unbiased=True):
    return _var(ctx, x, None, unbiased)


@lowering(aten.var_mean.correction, aten.std_mean.correction)
def _var_mean_rule(ctx, x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(ctx, x, dim, _correction(correction, True))
    return _finish(ctx, ctx.op("sqrt", v) if ctx.node.target in _STD else v, 0), _finish(ctx, m, 1)


# --- scans, logsumexp, softmax --------------------------------------------------------


@lowering(aten.cumsum.default, aten.cumprod.default)
def _cumulative(ctx, x, dim, *, dtype=None):
    kind = "sum" if ctx.node.target is aten.cumsum.default else "prod"
    x = _as_result(ctx, x)
    if x.rank:
        x = ctx.op("cumulative", x, kind=kind, axis=norm_dim(dim, x.rank))
    return _finish(ctx, x)


@lowering(aten.logsumexp.default)
def _logsumexp(ctx, x, dim, keepdim=False):
    x = _as_result(ctx, x)
    axes = axes_of(dim, x.rank)
    m = reduce_axes(ctx, "max", x, axes)
    # An infinite max would give inf - inf; shift by 0 instead, as torch does.
    inf = ctx.op("eq", ctx.op("abs", m), ctx.full(math.inf, m.shape, m.dtype))
    m = ctx.op("select", inf, ctx.full(0, m.shape, m.dtype), m)
    e = ctx.op("exp", ctx.op("sub", x, expand_back(ctx, m, x.shape, axes)))
    return _finish(ctx, ctx.op("add", ctx.op("log", reduce_axes(ctx, "sum", e, axes)), m))


def softmax(ctx: LowerCtx, x, dim: int, log: bool = False):
    """Numerically stable (log-)softmax of float ``x`` along ``dim``."""
    axes = (norm_dim(dim, x.rank),) if x.rank else ()
    z = ctx.op("sub", x, expand_back(ctx, reduce_axes(ctx, "max", x, axes), x.shape, axes))
    e = ctx.op("exp", z)
    s = expand_back(ctx, reduce_axes(ctx, "sum", e, axes), x.shape, axes)
    return ctx.op("sub", z, ctx.op("log", s)) if log else ctx.op("div", e, s)


_LOG = (aten._log_softmax.default, aten.log_softmax.int)


@lowering(aten._softmax.default, aten.softmax.int, *_LOG)
def _softmax(ctx, x, dim, half_to_float_or_dtype=None):
    return _finish(ctx, softmax(ctx, _as_result(ctx, x), dim, ctx.node.target in _LOG))


@lowering(aten._safe_softmax.default)
def _safe_softmax(ctx, x, dim, dtype=None):
    """Softmax whose rows of all -inf give 0 instead of NaN."""
    x = _as_result(ctx, x)
    y = softmax(ctx, x, dim)
    axes = (norm_dim(dim, x.rank),) if x.rank else ()
    dead = ctx.op("eq", x, ctx.full(-math.inf, x.shape, x.dtype))
    dead = expand_back(ctx, reduce_axes(ctx, "all", dead, axes), x.shape, axes)
    return _finish(ctx, ctx.op("select", dead, ctx.full(0, y.shape, y.dtype), y))
