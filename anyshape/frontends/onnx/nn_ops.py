"""ONNX neural-network ops: MatMul, Gemm, Softmax, normalizations, reductions, Conv, pools.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). The
IR patterns are the torch frontend's (``frontends/torch/aten/linalg.py``,
``nn.py``, ``reduce.py``), rebuilt here because that package imports torch:

- ``MatMul`` follows NumPy's matmul: a batch-free right operand folds the left
  operand's batch into rows (one plain ``dot``, the form the CPU backend sends to
  oneDNN/BLAS); otherwise batch dims broadcast and one batched ``dot`` runs.
  f16 operands accumulate in f32.
- Softmax is the stable ``exp(x - max) / sum``; LayerNormalization and
  BatchNormalization (inference) compute in f32 for f16 inputs.
- ``Conv``/``MaxPool``/``AveragePool`` map to ``convolution``/``pool`` with
  symmetric padding; asymmetric or ``SAME_*`` padding becomes an explicit
  ``pad`` first. ``ceil_mode`` pads the high end further (symbolic sizes
  included: ``_ceil_extra``). An average whose count the IR's ``pool`` cannot
  give (``count_include_pad=0`` with asymmetric padding, or a ceil-mode partial
  window, whose overhang ONNX never counts) is a pool of the zero-padded input
  over a pool of a padded ``[1, *spatial]`` mask of the elements that count.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, shape_numel
from .context import LowerCtx, Value, norm_axis, rule_registry

RULES, rule = rule_registry()


def acc_dtype(dt: DType) -> DType:
    return DType.f32 if dt in (DType.f16, DType.bf16) else dt


# --- matrix products -----------------------------------------------------------------------


def _dot(ctx: LowerCtx, a: Node, b: Node) -> Node:
    acc = acc_dtype(a.dtype)
    return ctx.cast(ctx.op("dot", ctx.cast(a, acc), ctx.cast(b, acc)), a.dtype)


def matmul(ctx: LowerCtx, a: Node, b: Node, what: str) -> Node:
    """NumPy matmul of ``a`` and ``b`` (any ranks >= 1)."""
    if a.rank == 0 or b.rank == 0:
        raise UnsupportedError(f"{what}: matmul of a rank-0 tensor")
    if a.dtype != b.dtype:
        raise UnsupportedError(f"{what}: operand dtypes differ ({a.dtype} and {b.dtype})")
    if b.rank <= 2 and a.rank >= 2:
        a2 = ctx.reshape(a, (shape_numel(a.shape[:-1]), a.shape[-1]))
        b2 = b if b.rank == 2 else ctx.reshape(b, (b.shape[0], 1))
        out = tuple(a.shape[:-1]) + ((b.shape[-1],) if b.rank == 2 else ())
        return ctx.reshape(_dot(ctx, a2, b2), out)
    a2 = a if a.rank >= 2 else ctx.reshape(a, (1, a.shape[0]))
    b2 = b if b.rank >= 2 else ctx.reshape(b, (b.shape[0], 1))
    batch = ctx.broadcast_shape([a2.shape[:-2], b2.shape[:-2]], what)
    a2 = ctx.broadcast_to(a2, batch + tuple(a2.shape[-2:]))
    b2 = ctx.broadcast_to(b2, batch + tuple(b2.shape[-2:]))
    y = _dot(ctx, a2, b2)
    out = batch + ((a.shape[-2],) if a.rank >= 2 else ()) + ((b.shape[-1],) if b.rank >= 2 else ())
    return ctx.reshape(y, out)


@rule("MatMul", first=1)
def _matmul(ctx, node, ins):
    a, b = ins
    return [Value.of_node(matmul(ctx, ctx.node(a), ctx.node(b), node.describe()))]


@rule("Gemm", first=1)
def _gemm(ctx, node, ins):
    a, b = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    if a.rank != 2 or b.rank != 2:
        raise UnsupportedError(f"{what}: Gemm needs 2-D operands, got {a.type} and {b.type}")
    if int(node.attr("transA", 0)):
        a = ctx.transpose(a, (1, 0))
    if int(node.attr("transB", 0)):
        b = ctx.transpose(b, (1, 0))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    y = _dot(ctx, a, b)
    if alpha != 1.0:
        y = ctx.op("mul", y, ctx.full(alpha, y.shape, y.dtype))
    c = ins[2] if len(ins) > 2 else None
    if c is not None and beta != 0.0:
        cn = ctx.node(c)
        shape = ctx.broadcast_shape([y.shape, cn.shape], what)
        cn = ctx.broadcast_to(cn, shape)
        if beta != 1.0:
            cn = ctx.op("mul", cn, ctx.full(beta, cn.shape, cn.dtype))
        y = ctx.op("add", ctx.broadcast_to(y, shape), cn)
    return [Value.of_node(y)]


# --- softmax ----------------------------------------------------------------------------------


def softmax(ctx: LowerCtx, x: Node, axis: int, log: bool) -> Node:
    axes = (axis,)
    z = ctx.op("sub", x, ctx.expand_back(ctx.reduce(x, "max", axes), x.shape, axes))
    e = ctx.op("exp", z)
    s = ctx.expand_back(ctx.reduce(e, "sum", axes), x.shape, axes)
    return ctx.op("sub", z, ctx.op("log", s)) if log else ctx.op("div", e, s)


@rule("Softmax", "LogSoftmax", first=13)
def _softmax(ctx, node, ins):
    x = ctx.node(ins[0])
    if x.rank == 0:
        raise UnsupportedError(f"{node.describe()}: softmax of a scalar")
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node.describe())
    acc = acc_dtype(x.dtype)
    y = softmax(ctx, ctx.cast(x, acc), axis, node.op_type == "LogSoftmax")
    return [Value.of_node(ctx.cast(y, x.dtype))]


@rule("Softmax", "LogSoftmax", first=1, last=12)
def _softmax_v1(ctx, node, ins):
    """Before opset 13 the input is coerced to 2-D at ``axis`` and normalized per row."""
    x = ctx.node(ins[0])
    axis = norm_axis(int(node.attr("axis", 1)), x.rank, node.describe())
    flat = ctx.reshape(x, (shape_numel(x.shape[:axis]), shape_numel(x.shape[axis:])))
    y = softmax(ctx, ctx.cast(flat, acc_dtype(x.dtype)), 1, node.op_type == "LogSoftmax")
    return [Value.of_node(ctx.reshape(ctx.cast(y, x.dtype), x.shape))]


# --- normalization ------------------------------------------------------------------------------


def _per_channel(ctx: LowerCtx, v: Node, like: Node, dims) -> Node:
    v = ctx.cast(v, like.dtype)
    return ctx.op("broadcast_in_dim", v, shape=tuple(like.shape), dims=tuple(dims))


@rule("LayerNormalization", first=17)
def _layer_norm(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, what)
    eps = float(node.attr("epsilon", 1e-5))
    axes = tuple(range(axis, x.rank))
    xs = ctx.cast(x, acc_dtype(x.dtype) if int(node.attr("stash_type", 1)) == 1 else x.dtype)
    m = ctx.mean(xs, axes)
    d = ctx.op("sub", xs, ctx.expand_back(m, xs.shape, axes))
    var = ctx.mean(ctx.op("mul", d, d), axes)
    rstd = ctx.op("rsqrt", ctx.op("add", var, ctx.full(eps, var.shape, var.dtype)))
    y = ctx.op("mul", d, ctx.expand_back(rstd, xs.shape, axes))
    norm_shape = xs.shape[axis:]
    for v, op in ((ins[1], "mul"), (ins[2] if len(ins) > 2 else None, "add")):
        if v is None:
            continue
        p = ctx.cast(ctx.node(v), y.dtype)
        p = ctx.broadcast_to(p, ctx.broadcast_shape([norm_shape, p.shape], what))
        y = ctx.op(op, y, ctx.broadcast_to(p, y.shape))
    outs = [Value.of_node(ctx.cast(y, x.dtype))]
    outs.append(Value.of_node(ctx.keep_dims(m, x.shape, axes)))
    outs.append(Value.of_node(ctx.keep_dims(rstd, x.shape, axes)))
    return outs


@rule("BatchNormalization", first=6)
def _batch_norm(ctx, node, ins):
    x, scale, bias, mean, var = (ctx.node(v) for v in ins[:5])
    what = node.describe()
    if int(node.attr("training_mode", 0)) or (node.opset < 7 and not int(node.attr("is_test", 0))):
        raise UnsupportedError(f"{what}: training mode is not compiled (inference only)")
    if not int(node.attr("spatial", 1)):
        raise UnsupportedError(f"{what}: spatial=0 (statistics per element) is not compiled")
    if x.rank < 2:
        raise UnsupportedError(f"{what}: input of rank {x.rank}")
    eps = float(node.attr("epsilon", 1e-5))
    acc = acc_dtype(x.dtype)
    rv = ctx.cast(var, acc)
    alpha = ctx.op("rsqrt", ctx.op("add", rv, ctx.full(eps, rv.shape, acc)))
    alpha = ctx.op("mul", alpha, ctx.cast(scale, acc))
    beta = ctx.op("sub", ctx.cast(bias, acc), ctx.op("mul", ctx.cast(mean, acc), alpha))
    xs = ctx.cast(x, acc)
    y = ctx.op("mul", xs, _per_channel(ctx, alpha, xs, (1,)))
    y = ctx.op("add", y, _per_channel(ctx, beta, xs, (1,)))
    return [Value.of_node(ctx.cast(y, x.dtype))]


# --- reductions ----------------------------------------------------------------------------------

# op type -> (how it reduces, first opset taking axes as an input); besides the IR's
# reduce kinds: "mean", and the composites in _COMPOSITE (a map before, one after).
_REDUCE = {
    "ReduceSum": ("sum", 13),
    "ReduceMean": ("mean", 18),
    "ReduceMax": ("max", 18),
    "ReduceMin": ("min", 18),
    "ReduceProd": ("prod", 18),
    "ReduceL1": ("l1", 18),
    "ReduceL2": ("l2", 18),
    "ReduceSumSquare": ("sum_square", 18),
    "ReduceLogSum": ("log_sum", 18),
    "ReduceLogSumExp": ("log_sum_exp", 18),
}

_NUMPY_REDUCE = {
    "sum": np.sum,
    "mean": np.mean,
    "max": np.max,
    "min": np.min,
    "prod": np.prod,
    "l1": lambda x, **k: np.sum(np.abs(x), **k),
    "l2": lambda x, **k: np.sqrt(np.sum(x * x, **k)),
    "sum_square": lambda x, **k: np.sum(x * x, **k),
    "log_sum": lambda x, **k: np.log(np.sum(x, **k)),
    "log_sum_exp": lambda x, **k: np.log(np.sum(np.exp(x), **k)),
}


@rule(*_REDUCE, first=1)
def _reduce(ctx, node, ins):
    kind, axes_input_from = _REDUCE[node.op_type]
    what = node.describe()
    xv = ins[0]
    if node.opset >= axes_input_from:
        av = ins[1] if len(ins) > 1 else None
        axes = None if av is None else list(ctx.const_of(av, f"{what}: axes").reshape(-1))
    else:
        axes = node.attr("axes")
    keep = bool(int(node.attr("keepdims", 1)))
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return [xv]
        axes = range(xv.rank)
    axes = sorted({norm_axis(int(a), xv.rank, what) for a in axes})
    if xv.const is not None:
        with np.errstate(all="ignore"):
            out = _NUMPY_REDUCE[kind](xv.const, axis=tuple(axes), keepdims=keep)
        return [Value.of_const(np.asarray(out).astype(xv.const.dtype))]
    x = ctx.node(xv)
    empty = any(as_dim(x.shape[a]) == 0 for a in axes)
    if empty and kind in ("max", "min", "log_sum_exp"):  # log(sum(exp(nothing))) = -inf
        r = _empty_extreme(ctx, x, "max" if kind == "log_sum_exp" else kind, axes)
    elif kind in ("mean", "l2", "log_sum", "log_sum_exp") or (
        x.dtype.is_float and kind not in ("max", "min")
    ):
        acc = acc_dtype(x.dtype)
        if not acc.is_float and kind in ("mean", "l2", "log_sum", "log_sum_exp"):
            raise UnsupportedError(f"{what}: {node.op_type} of integers")
        r = ctx.cast(_reduce_composite(ctx, ctx.cast(x, acc), kind, axes), x.dtype)
    else:
        r = _reduce_composite(ctx, x, kind, axes)
    return [Value.of_node(ctx.keep_dims(r, x.shape, axes) if keep else r)]


def _reduce_composite(ctx: LowerCtx, x: Node, kind: str, axes) -> Node:
    if kind == "mean":
        return ctx.mean(x, axes)
    if kind == "l1":
        return ctx.reduce(ctx.op("abs", x), "sum", axes)
    if kind in ("l2", "sum_square"):
        r = ctx.reduce(ctx.op("mul", x, x), "sum", axes)
        return ctx.op("sqrt", r) if kind == "l2" else r
    if kind == "log_sum":
        return ctx.op("log", ctx.reduce(x, "sum", axes))
    if kind == "log_sum_exp":  # max-shifted; an all -inf slice gives -inf, not NaN
        m = ctx.reduce(x, "max", axes)
        finite = ctx.op("select", ctx.op("isinf", m), ctx.full(0, m.shape, m.dtype), m)
        z = ctx.op("sub", x, ctx.expand_back(finite, x.shape, axes))
        s = ctx.op("log", ctx.reduce(ctx.op("exp", z), "sum", axes))
        return ctx.op("add", s, finite)
    return ctx.reduce(x, kind, axes)


def _empty_extreme(ctx: LowerCtx, x: Node, kind: str, axes) -> Node:
    """Max (min) over no elements: the dtype's lowest (highest) value, -inf (inf) for floats."""
    dt = x.dtype.to_numpy()
    if x.dtype.is_float:
        value = -math.inf if kind == "max" else math.inf
    elif x.dtype.is_bool:
        value = kind == "min"
    else:
        info = np.iinfo(dt)
        value = int(info.min if kind == "max" else info.max)
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return ctx.full(value, shape, x.dtype)


@rule("GlobalAveragePool", "GlobalMaxPool", first=1)
def _global_pool(ctx, node, ins):
    x = ctx.node(ins[0])
    axes = tuple(range(2, x.rank))
    if node.op_type == "GlobalMaxPool":
        r = ctx.reduce(x, "max", axes)
    else:
        r = ctx.cast(ctx.mean(ctx.cast(x, acc_dtype(x.dtype)), axes), x.dtype)
    return [Value.of_node(ctx.keep_dims(r, x.shape, axes))]


# --- convolution and pooling -------------------------------------------------------------------


def _ints(v, n: int, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    return tuple(int(i) for i in v)


def _padding(node, sizes, k, s, d, what: str) -> tuple[list[int], list[int]]:
    """(low, high) padding per spatial dim, from ``pads`` or ``auto_pad``."""
    n = len(k)
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = _ints(node.attr("pads"), 2 * n, 0)
        return list(pads[:n]), list(pads[n:])
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedError(f"{what}: auto_pad {auto!r}")
    low, high = [], []
    for size, ki, si, di in zip(sizes, k, s, d):
        if si == 1:
            total = di * (ki - 1)
        elif isinstance(size, int):
            out = -(-size // si)
            total = max((out - 1) * si + (ki - 1) * di + 1 - size, 0)
        else:
            raise UnsupportedError(f"{what}: {auto} with stride {si} on a symbolic size")
        small = total // 2
        low.append(small if auto == "SAME_UPPER" else total - small)
        high.append(total - low[-1])
    return low, high


def _pad_explicit(ctx: LowerCtx, x: Node, low, high, value) -> Node:
    if not any(low) and not any(high):
        return x
    lead = (0,) * (x.rank - len(low))
    fill = ctx.const(value, x.dtype)
    return ctx.op("pad", x, fill, low=lead + tuple(low), high=lead + tuple(high))


@rule("Conv", first=1)
def _conv(ctx, node, ins):
    x, w = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    n = w.rank - 2
    if n < 1 or x.rank != w.rank:
        raise UnsupportedError(f"{what}: input {x.type} and weight {w.type}")
    if not all(isinstance(i, int) for i in w.shape):
        raise UnsupportedError(f"{what}: a weight of symbolic shape")
    k = tuple(w.shape[2:])
    s, d = _ints(node.attr("strides"), n, 1), _ints(node.attr("dilations"), n, 1)
    low, high = _padding(node, x.shape[2:], k, s, d, what)
    if low != high:
        x = _pad_explicit(ctx, x, low, high, 0)
        low = [0] * n
    attrs = {"stride": s, "padding": tuple(low), "dilation": d}
    y = ctx.op("convolution", x, w, groups=int(node.attr("group", 1)), **attrs)
    if len(ins) > 2 and ins[2] is not None:
        y = ctx.op("add", y, _per_channel(ctx, ctx.node(ins[2]), y, (1,)))
    return [Value.of_node(y)]


def _pool_size(size, k, s, d, lo, hi, ceil: bool):
    span = as_expr(size) + lo + hi - d * (k - 1) - 1
    if not ceil:
        return None
    if s == 1:
        return as_dim(span + 1)
    if not isinstance(as_dim(size), int):
        return None
    span = as_dim(span)
    out = -(-span // s) + 1
    if (out - 1) * s >= size + lo:
        out -= 1
    return out


def _ceil_extra(size, k: int, s: int, d: int, lo: int, hi: int):
    """The high padding ``ceil_mode`` adds (negative: crops) for a floor-mode window op.

    ONNX's ceil-mode size is ``ceil((size + lo + hi - span) / s) + 1``, less one when that
    last window would start at or past ``size + lo`` (in the high padding). Exact for a
    static size; for a symbolic one an amount that gives the floor-mode op that size for
    every size: ``s - 1`` when no window can start in the high padding (``hi <= span - s``),
    else the padding that makes ``size + lo - 1`` the last start (``hi < span``), else one
    window less. The extra elements are padding no window reads or counts.
    """
    span = d * (k - 1) + 1
    size = as_dim(size)
    if isinstance(size, int):
        want = -(-(size + lo + hi - span) // s) + 1
        if (want - 1) * s >= size + lo:
            want -= 1
        if want == (size + lo + hi - span) // s + 1:
            return 0
        return (want - 1) * s + span - (size + lo + hi)
    if hi <= span - s:  # no window can start in the high padding
        return s - 1
    return span - 1 - hi if hi < span else -1  # windows start before size + lo (or one less)


@rule("MaxPool", "AveragePool", first=1)
def _pool(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    k = tuple(int(i) for i in node.attr("kernel_shape"))
    n = len(k)
    s = _ints(node.attr("strides"), n, 1)
    d = _ints(node.attr("dilations"), n, 1)
    sizes = x.shape[x.rank - n :]
    low, high = _padding(node, sizes, k, s, d, what)
    extra = [0] * n  # the ceil mode's padding after `high`: never counted by an average
    if int(node.attr("ceil_mode", 0)):
        extra = [_ceil_extra(sizes[i], k[i], s[i], d[i], low[i], high[i]) for i in range(n)]
    attrs = {"kernel": k, "stride": s, "dilation": d}
    if node.op_type == "MaxPool":
        high = [h + e for h, e in zip(high, extra)]
        if low != high:
            lowest = -math.inf if x.dtype.is_float else int(np.iinfo(x.dtype.to_numpy()).min)
            x = _pad_explicit(ctx, x, low, high, lowest)
            low = [0] * n
        y = ctx.op("pool", x, kind="max", count_include_pad=False, padding=tuple(low), **attrs)
        return [Value.of_node(y), None]
    include_pad = bool(int(node.attr("count_include_pad", 0)))
    if not any(extra) and (low == high or include_pad):  # the IR's pool counts as ONNX does
        if low != high:
            x = _pad_explicit(ctx, x, low, high, 0)
            low = [0] * n
        y = ctx.op(
            "pool", x, kind="avg", count_include_pad=include_pad, padding=tuple(low), **attrs
        )
        return [Value.of_node(y), None]
    return [Value.of_node(_avg_counted(ctx, x, low, high, extra, include_pad, attrs)), None]


def _avg_counted(ctx: LowerCtx, x: Node, low, high, extra, include_pad: bool, attrs) -> Node:
    """An average pool as window sums over a count of the elements that count: the input's,
    plus the explicit padding's when ``include_pad`` (never the ceil mode's ``extra``).
    Both are average pools of zero-padded tensors (the kernel size cancels); the count is
    pooled from a ``[1, *spatial]`` mask.
    """
    n = len(low)
    acc = acc_dtype(x.dtype)
    full_high = [h + e for h, e in zip(high, extra)]
    windows = {"padding": (0,) * n, "count_include_pad": True, **attrs}
    xs = _pad_explicit(ctx, ctx.cast(x, acc), low, full_high, 0)
    total = ctx.op("pool", xs, kind="avg", **windows)
    mask = ctx.full(1, (1, *x.shape[x.rank - n :]), acc)
    if include_pad:
        mask = _pad_explicit(ctx, _pad_explicit(ctx, mask, low, high, 1), [0] * n, extra, 0)
    else:
        mask = _pad_explicit(ctx, mask, low, full_high, 0)
    count = ctx.op("pool", mask, kind="avg", **windows)
    # a window of padding only: 0 (as onnxruntime and the IR's pool give), not 0 / 0
    count = ctx.op("max", count, ctx.full(1 / math.prod(attrs["kernel"]), count.shape, acc))
    y = ctx.op("div", total, ctx.broadcast_to(count, total.shape))
    return ctx.cast(y, x.dtype)
