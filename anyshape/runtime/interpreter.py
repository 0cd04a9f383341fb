"""The NumPy reference interpreter: runs any IR graph, one table entry per op.

Sits at the end of the pipeline as the oracle for every backend (and as the
execution engine of the ``interpreter`` backend). It favours obvious
correctness over speed: each op is a few lines of NumPy computing exactly the
op table's semantics, with the result cast to the node's recorded dtype.
Symbolic attributes are evaluated against the bound symbol environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.symbolic import SymExpr

Impl = Callable[[Node, list, Mapping[str, int], Graph], np.ndarray]
INTERPRETER: dict[str, Impl] = {}


def _impl(*names: str):
    def register(fn: Impl) -> Impl:
        for n in names:
            INTERPRETER[n] = fn
        return fn

    return register


def _ev(v, env):
    """Evaluate an attribute (int, SymExpr or a tuple of them) under ``env``."""
    if isinstance(v, SymExpr):
        return v.evaluate(env)
    if isinstance(v, tuple):
        return tuple(_ev(x, env) for x in v)
    return v


def _erf(x: np.ndarray) -> np.ndarray:
    # W. J. Cody's rational approximations via erfc; |relative error| < 1.2e-7 in float64.
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (
        -z * z
        - 1.26551223
        + t
        * (
            1.00002368
            + t
            * (
                0.37409196
                + t
                * (
                    0.09678418
                    + t
                    * (
                        -0.18628806
                        + t
                        * (
                            0.27886807
                            + t
                            * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                        )
                    )
                )
            )
        )
    )
    r = 1.0 - t * np.exp(poly)
    return np.where(x >= 0, r, -r)


_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erf": _erf,
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "trunc": np.trunc,
    "sign": np.sign,
    "bitwise_not": np.invert,
    "isnan": np.isnan,
    "isinf": np.isinf,
}


def _int_div(a, b):
    # C semantics (truncate toward zero), like the generated code.
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix


def _int_rem(a, b):
    return np.fmod(a, b)


def _pow(a, b):
    if not np.issubdtype(a.dtype, np.integer):
        return np.power(a, b)
    # Integer powers as torch: a negative exponent gives 1 for base 1, +-1 for base -1, else 0.
    neg = b < 0
    out = np.power(a, np.where(neg, 0, b))
    if np.any(neg):
        minus_one = np.where(b % 2 == 0, 1, -1).astype(out.dtype)
        tiny = np.where(a == 1, 1, np.where(a == -1, minus_one, 0)).astype(out.dtype)
        out = np.where(neg, tiny, out)
    return out


_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "pow": _pow,
    "max": np.maximum,
    "min": np.minimum,
    "atan2": np.arctan2,
    "and": lambda a, b: np.logical_and(a, b) if a.dtype == bool else np.bitwise_and(a, b),
    "or": lambda a, b: np.logical_or(a, b) if a.dtype == bool else np.bitwise_or(a, b),
    "xor": lambda a, b: np.logical_xor(a, b) if a.dtype == bool else np.bitwise_xor(a, b),
    "shl": np.left_shift,
    "shr": np.right_shift,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


@_impl(*_UNARY)
def _run_unary(node, args, env, graph):
    with np.errstate(all="ignore"):
        return _UNARY[node.op](args[0])


@_impl(*_BINARY)
def _run_binary(node, args, env, graph):
    with np.errstate(all="ignore"):
        return _BINARY[node.op](args[0], args[1])


@_impl("max", "min")
def _run_minmax(node, args, env, graph):
    # NaN propagates, as in torch.maximum / torch.minimum.
    fn = np.maximum if node.op == "max" else np.minimum
    return fn(args[0], args[1])


@_impl("div")
def _run_div(node, args, env, graph):
    a, b = args
    with np.errstate(all="ignore"):
        if node.dtype.is_float:
            return np.true_divide(a, b)
        return _int_div(a, b)


@_impl("rem")
def _run_rem(node, args, env, graph):
    with np.errstate(all="ignore"):
        return np.fmod(args[0], args[1])


@_impl("select")
def _run_select(node, args, env, graph):
    return np.where(args[0], args[1], args[2])


@_impl("convert")
def _run_convert(node, args, env, graph):
    x = args[0]
    target = node.dtype.to_numpy()
    if np.issubdtype(target, np.integer) and x.dtype.kind == "f":
        with np.errstate(all="ignore"):
            x = np.trunc(x)
    return x.astype(target)


@_impl("param")
def _run_param(node, args, env, graph):
    return graph.params[node.attr("name")]


@_impl("constant")
def _run_constant(node, args, env, graph):
    return np.array(node.attr("value"), dtype=node.dtype.to_numpy())


@_impl("shape_scalar")
def _run_shape_scalar(node, args, env, graph):
    return np.array(
        node.attr("expr").evaluate(env)
        if isinstance(node.attr("expr"), SymExpr)
        else node.attr("expr"),
        dtype=node.dtype.to_numpy(),
    )


@_impl("iota")
def _run_iota(node, args, env, graph):
    shape = _ev(node.attr("shape"), env)
    d = node.attr("dim")
    r = np.arange(shape[d], dtype=node.dtype.to_numpy())
    view = [1] * len(shape)
    view[d] = shape[d]
    return np.broadcast_to(r.reshape(view), shape)


@_impl("broadcast_in_dim")
def _run_broadcast(node, args, env, graph):
    x = args[0]
    shape = _ev(node.attr("shape"), env)
    dims = node.attr("dims")
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = x.shape[i]
    return np.broadcast_to(x.reshape(view), shape)


@_impl("reshape")
def _run_reshape(node, args, env, graph):
    return np.reshape(args[0], _ev(node.attr("shape"), env))


@_impl("transpose")
def _run_transpose(node, args, env, graph):
    return np.transpose(args[0], node.attr("perm"))


@_impl("slice")
def _run_slice(node, args, env, graph):
    start = _ev(node.attr("start"), env)
    limit = _ev(node.attr("limit"), env)
    stride = node.attr("stride")
    return args[0][tuple(slice(s, e, k) for s, e, k in zip(start, limit, stride))]


@_impl("concatenate")
def _run_concatenate(node, args, env, graph):
    return np.concatenate(args, axis=node.attr("axis"))


@_impl("pad")
def _run_pad(node, args, env, graph):
    x, v = args
    low, high = _ev(node.attr("low"), env), _ev(node.attr("high"), env)
    crop = tuple(
        slice(max(-lo, 0), x.shape[i] - max(-hi, 0)) for i, (lo, hi) in enumerate(zip(low, high))
    )
    x = x[crop]
    widths = [(max(lo, 0), max(hi, 0)) for lo, hi in zip(low, high)]
    return np.pad(x, widths, constant_values=v.item())


@_impl("gather")
def _run_gather(node, args, env, graph):
    x, idx = args
    axis = node.attr("axis")
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"gather index out of range for dim of size {n}")
    return np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)


@_impl("take_along_axis")
def _run_take_along(node, args, env, graph):
    x, idx = args
    axis = node.attr("axis")
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"take_along_axis index out of range for dim of size {n}")
    idx = np.where(idx < 0, idx + n, idx)
    # torch.gather allows idx smaller than x in non-gather dims: crop x first.
    crop = tuple(slice(0, idx.shape[i]) if i != axis else slice(None) for i in range(x.ndim))
    return np.take_along_axis(x[crop], idx, axis=axis)


@_impl("scatter")
def _run_scatter(node, args, env, graph):
    base, idx, upd = args
    axis, mode = node.attr("axis"), node.attr("mode")
    n = base.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"scatter index out of range for dim of size {n}")
    out = np.array(base, copy=True)
    flat = idx.reshape(-1).astype(np.int64)
    lead, tail = base.shape[:axis], base.shape[axis + 1 :]
    # The indexed dim first, in out (a view) and in updates: [K, *lead, *tail].
    rows = np.moveaxis(out, axis, 0)
    ups = np.moveaxis(upd.reshape(lead + (flat.size,) + tail), axis, 0)
    if mode == "add":
        # Unbuffered, in row-major order over the updates, in the base's own dtype.
        np.add.at(rows, flat, ups)
    else:
        # Of duplicate indices the last (in row-major order) wins: only those are written.
        _, first_of_reversed = np.unique(flat[::-1], return_index=True)
        last = flat.size - 1 - first_of_reversed
        rows[flat[last]] = ups[last]
    return out


_REDUCE = {
    "sum": np.sum,
    "prod": np.prod,
    "max": np.max,
    "min": np.min,
    "any": np.any,
    "all": np.all,
}


@_impl("reduce")
def _run_reduce(node, args, env, graph):
    x = args[0]
    kind, axes = node.attr("kind"), tuple(node.attr("axes"))
    if kind in ("max", "min") and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"reduce {kind} over an empty dim")
    if kind in ("sum", "prod") and x.dtype.kind == "f":
        # Accumulate in float64 so the oracle is at least as accurate as any backend.
        return _REDUCE[kind](x.astype(np.float64), axis=axes)
    return _REDUCE[kind](x, axis=axes)


@_impl("argreduce")
def _run_argreduce(node, args, env, graph):
    x = args[0]
    axis = node.attr("axis")
    if x.shape[axis] == 0:
        raise ValueError("argmax/argmin over an empty dim")
    if x.dtype.kind == "f":
        # NaN wins, as in torch.
        nan = np.isnan(x)
        if nan.any():
            fill = np.where(nan, 1, 0)
            res = np.argmax(fill, axis=axis)
            plain = (
                np.argmax(x, axis=axis)
                if node.attr("kind") == "argmax"
                else np.argmin(x, axis=axis)
            )
            return np.where(nan.any(axis=axis), res, plain)
    return np.argmax(x, axis=axis) if node.attr("kind") == "argmax" else np.argmin(x, axis=axis)


@_impl("cumulative")
def _run_cumulative(node, args, env, graph):
    fn = np.cumsum if node.attr("kind") == "sum" else np.cumprod
    return fn(args[0], axis=node.attr("axis"))


@_impl("dot")
def _run_dot(node, args, env, graph):
    a, b = args
    if a.dtype.kind in "iub":
        return np.matmul(a.astype(np.int64), b.astype(np.int64))
    return np.matmul(a, b)


def _window_view(x, kernel, stride, dilation):
    """A strided view [..., *out_spatial, *kernel] over the last len(kernel) dims."""
    nsp = len(kernel)
    lead = x.shape[: x.ndim - nsp]
    sp = x.shape[x.ndim - nsp :]
    out = [(sp[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    st = x.strides
    lead_st = st[: x.ndim - nsp]
    sp_st = st[x.ndim - nsp :]
    shape = (*lead, *[max(o, 0) for o in out], *kernel)
    strides = (
        *lead_st,
        *[sp_st[i] * stride[i] for i in range(nsp)],
        *[sp_st[i] * dilation[i] for i in range(nsp)],
    )
    return np.lib.stride_tricks.as_strided(x, shape, strides, writeable=False)


@_impl("convolution")
def _run_convolution(node, args, env, graph):
    x, w = args
    if node.attr("channels_last", False):  # [N, *spatial, C]: the same sums, channels moved
        y = _convolve(node, np.moveaxis(x, -1, 1), w)
        return np.ascontiguousarray(np.moveaxis(y, 1, -1))
    return _convolve(node, x, w)


def _convolve(node, x, w):
    """A channels-first convolution: x [N, C, *spatial], w [O, C / groups, *kernel]."""
    stride, pad, dil, g = (node.attr(k) for k in ("stride", "padding", "dilation", "groups"))
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    win = _window_view(np.ascontiguousarray(xp), w.shape[2:], stride, dil)  # N C *O *K
    n, c = x.shape[:2]
    o = w.shape[0]
    cg, og = c // g, o // g
    outs = []
    letters = "defghijk"[:nsp]
    ks = "pqrstuvw"[:nsp]
    for gi in range(g):
        xs = win[:, gi * cg : (gi + 1) * cg]
        ws = w[gi * og : (gi + 1) * og]
        spec = f"nc{letters}{ks},oc{ks}->no{letters}"
        outs.append(np.einsum(spec, xs, ws, optimize=True))
    return np.concatenate(outs, axis=1) if g > 1 else outs[0]


@_impl("pool")
def _run_pool(node, args, env, graph):
    x = args[0]
    if node.attr("channels_last", False):  # [..., *spatial, C]: the channels moved first
        first = x.ndim - len(node.attr("kernel")) - 1
        y = _pool(node, np.moveaxis(x, -1, first))
        return np.ascontiguousarray(np.moveaxis(y, first, -1))
    return _pool(node, x)


def _pool(node, x):
    """Windows over the trailing dims of ``x``."""
    kind = node.attr("kind")
    k, s, p, d = (node.attr(a) for a in ("kernel", "stride", "padding", "dilation"))
    nsp = len(k)
    fill = -np.inf if kind == "max" else 0.0
    if kind == "max" and x.dtype.kind != "f":
        fill = np.iinfo(x.dtype).min
    widths = [(0, 0)] * (x.ndim - nsp) + [(pi, pi) for pi in p]
    xp = np.pad(x, widths, constant_values=fill)
    win = _window_view(np.ascontiguousarray(xp), k, s, d)
    axes = tuple(range(win.ndim - nsp, win.ndim))
    if kind == "max":
        return win.max(axis=axes) if win.size else np.zeros(win.shape[: win.ndim - nsp], x.dtype)
    total = win.sum(axis=axes, dtype=np.float64)
    if node.attr("count_include_pad"):
        count = float(np.prod(k))
        return total / count
    ones = np.pad(np.ones(x.shape[x.ndim - nsp :]), [(pi, pi) for pi in p])
    cnt = _window_view(ones, k, s, d).sum(axis=tuple(range(nsp, 2 * nsp)))
    return total / cnt


def run_graph(graph: Graph, inputs: list[np.ndarray], env: Mapping[str, int]) -> list[np.ndarray]:
    """Evaluate ``graph`` on arrays whose symbols are already bound in ``env``."""
    values: dict[int, np.ndarray] = {}
    for node, arr in zip(graph.inputs, inputs):
        values[id(node)] = arr
    for node in graph.nodes():
        if node.op == "input":
            continue
        args = [values[id(i)] for i in node.inputs]
        out = INTERPRETER[node.op](node, args, env, graph)
        out = np.asarray(out)
        if node.dtype.to_numpy() != out.dtype:
            out = out.astype(node.dtype.to_numpy())
        values[id(node)] = out
    return [values[id(o)] for o in graph.outputs]
