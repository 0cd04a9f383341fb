"""ONNX indexing ops: gathers, scatters, scans, triangles, one-hot, arg/top-k reductions.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). Every
rule folds with NumPy when its inputs are constants; otherwise it builds IR
that is valid for every shape:

- ``GatherElements`` is ``take_along_axis``; ``GatherND`` linearizes each index
  tuple (and the batch position) into one ``gather`` over a reshaped operand.
- Index components are normalized by ``gather(iota(n), i)``: negative indices
  wrap and an index out of range is a run-time error, never a wrong read.
- Scatters have no IR op: each output element compares its position with every
  update's target (an ``iota`` against the indices) and reduces over the updates
  (the last match for ``reduction="none"``, else sum/prod/max/min). That costs
  O(output x updates along the axis) for ``ScatterElements``/``Scatter`` and
  O(output x number of index tuples) for ``ScatterND``.
- ``CumSum``/``CumProd`` are the IR's inclusive ``cumulative``; ``exclusive``
  shifts the input by one (a ``pad`` that crops), ``reverse`` flips with a
  ``gather``. ``ArgMax``/``ArgMin`` are ``argreduce`` (flipped for
  ``select_last_index``).
- ``TopK`` ranks each element against the others on its axis (ties to the lower
  index, NaN largest: ONNX's reference order), O(n^2) per row, then picks the
  element of each rank below k: sorted output whatever ``sorted`` says.
- ``NonZero``, ``Compress`` and ``Unique`` have value-dependent output shapes:
  folded on constants (``Compress`` also with a constant condition alone),
  refused otherwise.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, shape_numel
from .context import LowerCtx, Value, norm_axis, rule_registry
from .nn_ops import acc_dtype
from .reader import ir_dtype

RULES, rule = rule_registry()
I64 = DType.i64


# --- helpers --------------------------------------------------------------------------------


def _iota(ctx: LowerCtx, shape, dim: int) -> Node:
    return ctx.op("iota", shape=tuple(as_dim(d) for d in shape), dim=dim, dtype=I64)


def _dim_full(ctx: LowerCtx, d, shape) -> Node:
    """The run-time value of dim ``d`` as an i64 tensor of ``shape``."""
    return ctx.broadcast_to(ctx.scalar(as_dim(d), I64), shape)


def _scaled(ctx: LowerCtx, x: Node, d) -> Node:
    d = as_dim(d)
    return x if isinstance(d, int) and d == 1 else ctx.op("mul", x, _dim_full(ctx, d, x.shape))


def _checked_index(ctx: LowerCtx, idx: Node, size) -> Node:
    """``idx`` (any integer type) into a dim of ``size``: negatives wrap, out of range fails."""
    return ctx.op("gather", _iota(ctx, (size,), 0), ctx.cast(idx, I64), axis=0)


def _insert_axis(ctx: LowerCtx, x: Node, shape, axis: int) -> Node:
    """``x`` broadcast to ``shape``, which is ``x.shape`` with one dim inserted at ``axis``."""
    dims = tuple(k for k in range(len(shape)) if k != axis)
    return ctx.op("broadcast_in_dim", x, shape=tuple(shape), dims=dims)


def _flip(ctx: LowerCtx, x: Node, axis: int) -> Node:
    n = as_dim(x.shape[axis])
    if isinstance(n, int) and n <= 1:
        return x
    rev = ctx.op("sub", _dim_full(ctx, as_expr(n) - 1, (n,)), _iota(ctx, (n,), 0))
    return ctx.op("gather", x, rev, axis=axis)


def _guard(ctx: LowerCtx, kind: str, a, b, what: str) -> None:
    """``a == b`` (kind "eq") or ``a <= b`` ("le"): proven, or checked on every call."""
    store = ctx.b.constraints
    try:
        (store.guard_eq if kind == "eq" else store.guard_le)(a, b, what)
    except ValueError as e:
        raise UnsupportedError(str(e)) from None


def _extreme(dtype: DType, high: bool):
    if dtype.is_float:
        return float("inf") if high else float("-inf")
    if dtype.is_bool:
        return high
    info = np.iinfo(dtype.to_numpy())
    return int(info.max if high else info.min)


def _const_ins(ins) -> list | None:
    if all(v is None or v.const is not None for v in ins):
        return [None if v is None else v.const for v in ins]
    return None


def _scalar_dim(ctx: LowerCtx, v: Value, what: str):
    """A one-element input (any numeric type) known at compile time, as a dim."""
    if v.const is not None:
        if v.const.size != 1:
            raise UnsupportedError(f"{what} must hold one element")
        return int(v.const.reshape(-1)[0])
    dims = ctx.known_of(v, what)
    if len(dims) != 1:
        raise UnsupportedError(f"{what} must hold one element")
    return as_dim(dims[0])


# --- gathers ----------------------------------------------------------------------------------


@rule("GatherElements", first=11)
def _gather_elements(ctx, node, ins):
    x, idx = ins
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, what)
    if idx.rank != x.rank:
        raise UnsupportedError(f"{what}: indices of rank {idx.rank} for data of rank {x.rank}")
    consts = _const_ins(ins)
    if consts is not None:
        data, ids = consts
        ids = np.where(ids < 0, ids + data.shape[axis], ids)
        return [Value.of_const(np.take_along_axis(data, ids, axis=axis))]
    for k in range(x.rank):
        if k != axis:
            _guard(ctx, "le", idx.shape[k], x.shape[k], f"{what}: indices dim {k} within data's")
    y = ctx.op("take_along_axis", ctx.node(x), ctx.cast(ctx.node(idx), I64), axis=axis)
    return [Value.of_node(y)]


def _component(ctx: LowerCtx, idx: Node, k: int, size) -> Node:
    """Index component ``k`` (the last dim of ``idx``), normalized for a dim of ``size``."""
    lead = tuple(idx.shape[:-1])
    start, limit = [0] * idx.rank, list(idx.shape)
    start[-1], limit[-1] = k, k + 1
    part = ctx.op("slice", idx, start=tuple(start), limit=tuple(limit), stride=(1,) * idx.rank)
    return _checked_index(ctx, ctx.reshape(part, lead), size)


def _linear_index(ctx: LowerCtx, idx: Node, dims) -> Node:
    """Row-major position of each index tuple (``idx``'s last dim) in a block of ``dims``."""
    flat, stride = None, as_expr(1)
    for k in reversed(range(len(dims))):
        term = _scaled(ctx, _component(ctx, idx, k, dims[k]), stride)
        flat = term if flat is None else ctx.op("add", flat, term)
        stride = stride * as_expr(dims[k])
    return flat if flat is not None else ctx.full(0, idx.shape[:-1], I64)


@rule("GatherND", first=11)
def _gather_nd(ctx, node, ins):
    x, idx = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    b = int(node.attr("batch_dims", 0))
    m = as_dim(idx.shape[-1]) if idx.rank else None
    if not isinstance(m, int):
        raise UnsupportedError(f"{what}: the index tuple length (indices' last dim) is symbolic")
    if b + m > x.rank or b >= idx.rank:
        raise UnsupportedError(f"{what}: batch_dims {b} and tuples of {m} for data {x.type}")
    for k in range(b):
        _guard(ctx, "eq", idx.shape[k], x.shape[k], f"{what}: batch dim {k}")
    flat = _linear_index(ctx, idx, x.shape[b : b + m])
    block, stride = shape_numel(x.shape[b : b + m]), as_expr(1)
    for k in reversed(range(b)):
        pos = _iota(ctx, flat.shape, k)
        flat = ctx.op("add", flat, _scaled(ctx, pos, stride * as_expr(block)))
        stride = stride * as_expr(x.shape[k])
    rows = ctx.reshape(x, (shape_numel(x.shape[: b + m]), *x.shape[b + m :]))
    return [Value.of_node(ctx.op("gather", rows, flat, axis=0))]


# --- scatters -----------------------------------------------------------------------------------

_SCATTER_FILL = {"add": 0, "mul": 1}


def _scatter_reduce(ctx: LowerCtx, match: Node, upd: Node, base: Node, axis: int, kind: str):
    """``base`` combined with the updates that ``match`` selects along ``axis``."""
    acc = acc_dtype(base.dtype)
    if kind in ("add", "mul"):
        if base.dtype.is_bool:
            raise UnsupportedError(f"reduction {kind!r} on bool")
        u = ctx.cast(upd, acc)
        picked = ctx.op("select", match, u, ctx.full(_SCATTER_FILL[kind], u.shape, acc))
        r = ctx.reduce(picked, "sum" if kind == "add" else "prod", (axis,))
        out = ctx.op("add" if kind == "add" else "mul", ctx.cast(base, acc), r)
        return ctx.cast(out, base.dtype)
    fill = _extreme(upd.dtype, kind == "min")
    picked = ctx.op("select", match, upd, ctx.full(fill, upd.shape, upd.dtype))
    r = ctx.reduce(_pad_axis(ctx, picked, axis, 1, fill), kind, (axis,))  # never empty
    has = ctx.reduce(match, "any", (axis,))
    return ctx.op("select", has, ctx.op(kind, base, r), base)


def _last_match(ctx: LowerCtx, match: Node, axis: int) -> Node:
    """Per position, the last index along ``axis`` where ``match`` holds, else -1."""
    t = _iota(ctx, match.shape, axis)
    picked = ctx.op("select", match, t, ctx.full(-1, t.shape, I64))
    return ctx.reduce(_pad_axis(ctx, picked, axis, 1, -1), "max", (axis,))  # never empty


def _pad_axis(ctx: LowerCtx, x: Node, axis: int, high, value) -> Node:
    hi = [0] * x.rank
    hi[axis] = high
    return ctx.op("pad", x, ctx.const(value, x.dtype), low=(0,) * x.rank, high=tuple(hi))


def _reduction(node) -> str:
    kind = node.attr("reduction", "none") or "none"
    if kind not in ("none", "add", "mul", "max", "min"):
        raise UnsupportedError(f"{node.describe()}: reduction {kind!r}")
    return kind


@rule("ScatterElements", first=11)
@rule("Scatter", first=9, last=10)
def _scatter_elements(ctx, node, ins):
    data, idx, upd = (ctx.node(v) for v in ins)
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", 0)), data.rank, what)
    kind = _reduction(node)
    if idx.rank != data.rank or upd.rank != data.rank:
        raise UnsupportedError(f"{what}: indices/updates must have data's rank {data.rank}")
    ids = _checked_index(ctx, idx, data.shape[axis])
    for k in range(data.rank):
        _guard(ctx, "eq", upd.shape[k], idx.shape[k], f"{what}: updates dim {k}")
        if k == axis or ctx.b.constraints.prove_eq(idx.shape[k], data.shape[k]):
            continue
        # Indices cover a leading block of this dim: pad to data's size with no target.
        _guard(ctx, "le", idx.shape[k], data.shape[k], f"{what}: indices dim {k}")
        gap = as_dim(as_expr(data.shape[k]) - as_expr(idx.shape[k]))
        ids, upd = _pad_axis(ctx, ids, k, gap, -1), _pad_axis(ctx, upd, k, gap, 0)
    # [.., data position along axis, update along axis, ..]
    wide = (*data.shape[:axis], data.shape[axis], ids.shape[axis], *data.shape[axis + 1 :])
    match = ctx.op("eq", _insert_axis(ctx, ids, wide, axis), _iota(ctx, wide, axis))
    if kind != "none":
        y = _scatter_reduce(ctx, match, _insert_axis(ctx, upd, wide, axis), data, axis + 1, kind)
        return [Value.of_node(y)]
    last = _last_match(ctx, match, axis + 1)
    zero = ctx.full(0, last.shape, I64)
    pool = _pad_axis(ctx, upd, axis, 1, 0)  # never empty along axis
    picked = ctx.op("take_along_axis", pool, ctx.op("max", last, zero), axis=axis)
    return [Value.of_node(ctx.op("select", ctx.op("ge", last, zero), picked, data))]


@rule("ScatterND", first=11)
def _scatter_nd(ctx, node, ins):
    data, idx, upd = (ctx.node(v) for v in ins)
    what = node.describe()
    kind = _reduction(node)
    m = as_dim(idx.shape[-1]) if idx.rank else None
    if not isinstance(m, int) or m > data.rank:
        raise UnsupportedError(f"{what}: index tuples of length {m} for data {data.type}")
    lead, rest = idx.shape[:-1], data.shape[m:]
    if upd.rank != len(lead) + len(rest):
        raise UnsupportedError(f"{what}: updates {upd.type} for indices {idx.type}")
    for k, (u, want) in enumerate(zip(upd.shape, (*lead, *rest))):
        _guard(ctx, "eq", u, want, f"{what}: updates dim {k}")
    n, p = shape_numel(lead), shape_numel(data.shape[:m])
    flat = _linear_index(ctx, ctx.reshape(idx, (n, m)), data.shape[:m])  # [n]
    upd = ctx.reshape(upd, (n, *rest))
    base = ctx.reshape(data, (p, *rest))
    grid = (p, n)
    match = ctx.op("eq", _insert_axis(ctx, flat, grid, 0), _iota(ctx, grid, 0))
    if kind != "none":
        wide = (p, n, *rest)
        m_wide = ctx.op("broadcast_in_dim", match, shape=wide, dims=(0, 1))
        u_wide = _insert_axis(ctx, upd, wide, 0)
        y = _scatter_reduce(ctx, m_wide, u_wide, base, 1, kind)
    else:
        last = _last_match(ctx, match, 1)  # [p]
        zero = ctx.full(0, last.shape, I64)
        pool = _pad_axis(ctx, upd, 0, 1, 0)
        picked = ctx.op("gather", pool, ctx.op("max", last, zero), axis=0)
        has = ctx.op("ge", last, zero)
        has = ctx.op("broadcast_in_dim", has, shape=tuple(base.shape), dims=(0,))
        y = ctx.op("select", has, picked, base)
    return [Value.of_node(ctx.reshape(y, data.shape))]


# --- triangles, eye, one-hot -----------------------------------------------------------------


def _diagonal_offset(ctx: LowerCtx, shape) -> Node:
    """``col - row`` over the last two dims of ``shape``."""
    r = len(shape)
    return ctx.op("sub", _iota(ctx, shape, r - 1), _iota(ctx, shape, r - 2))


@rule("Trilu", first=14)
def _trilu(ctx, node, ins):
    xv = ins[0]
    kv = ins[1] if len(ins) > 1 else None
    upper = bool(int(node.attr("upper", 1)))
    if xv.rank < 2:
        raise UnsupportedError(f"{node.describe()}: input of rank {xv.rank} (needs >= 2)")
    consts = _const_ins([xv, kv])
    if consts is not None:
        k = 0 if kv is None else int(consts[1].reshape(-1)[0])
        return [Value.of_const((np.triu if upper else np.tril)(consts[0], k))]
    x = ctx.node(xv)
    k = ctx.full(0, x.shape, I64)
    if kv is not None:
        k = ctx.broadcast_to(ctx.reshape(ctx.cast(ctx.node(kv), I64), ()), x.shape)
    keep = ctx.op("ge" if upper else "le", _diagonal_offset(ctx, x.shape), k)
    return [Value.of_node(ctx.op("select", keep, x, ctx.full(0, x.shape, x.dtype)))]


@rule("EyeLike", first=9)
def _eye_like(ctx, node, ins):
    (x,) = ins
    what = node.describe()
    if x.rank != 2:
        raise UnsupportedError(f"{what}: input of rank {x.rank} (needs 2)")
    dt = node.attr("dtype")
    dtype = x.dtype if dt is None else ir_dtype(dt, what)
    k = int(node.attr("k", 0))
    if all(isinstance(as_dim(d), int) for d in x.shape) and shape_numel(x.shape) <= 4096:
        return [Value.of_const(np.eye(*x.shape, k=k, dtype=dtype.to_numpy()))]
    on = ctx.op("eq", _diagonal_offset(ctx, x.shape), ctx.full(k, x.shape, I64))
    return [Value.of_node(ctx.cast(on, dtype))]


def _pair(ctx: LowerCtx, v: Value, what: str) -> tuple[Node, Node]:
    """OneHot's ``values``: (off, on) as rank-0 nodes."""
    if v.rank != 1 or as_dim(v.shape[0]) != 2:
        raise UnsupportedError(f"{what}: values must be a vector of 2 elements")
    if v.const is not None:
        return ctx.const(v.const[0].item(), v.dtype), ctx.const(v.const[1].item(), v.dtype)
    x = ctx.node(v)
    parts = [ctx.op("slice", x, start=(i,), limit=(i + 1,), stride=(1,)) for i in (0, 1)]
    return ctx.reshape(parts[0], ()), ctx.reshape(parts[1], ())


@rule("OneHot", first=9)
def _one_hot(ctx, node, ins):
    iv, dv, vv = ins
    what = node.describe()
    depth = _scalar_dim(ctx, dv, f"{what}: depth")
    axis = norm_axis(int(node.attr("axis", -1)), iv.rank + 1, what)
    off, on = _pair(ctx, vv, what)
    idx = ctx.cast(ctx.node(iv), I64)
    shape = (*iv.shape[:axis], depth, *iv.shape[axis:])
    d = _dim_full(ctx, depth, idx.shape)
    idx = ctx.op(
        "select", ctx.op("lt", idx, ctx.full(0, idx.shape, I64)), ctx.op("add", idx, d), idx
    )
    hot = ctx.op("eq", _insert_axis(ctx, idx, shape, axis), _iota(ctx, shape, axis))
    y = ctx.op("select", hot, ctx.broadcast_to(on, shape), ctx.broadcast_to(off, shape))
    return [Value.of_node(y)]


# --- scans -----------------------------------------------------------------------------------


def _numpy_scan(x, axis: int, prod: bool, exclusive: bool, reverse: bool):
    if reverse:
        x = np.flip(x, axis)
    if exclusive:
        ident = np.ones_like if prod else np.zeros_like
        x = np.concatenate([ident(np.take(x, [0], axis=axis)), x], axis=axis)
        x = np.take(x, np.arange(x.shape[axis] - 1), axis=axis)
    y = (np.cumprod if prod else np.cumsum)(x, axis=axis).astype(x.dtype)
    return np.flip(y, axis) if reverse else y


@rule("CumSum", first=11)
@rule("CumProd", first=26)
def _cumulative(ctx, node, ins):
    xv, av = ins
    what = node.describe()
    axis = norm_axis(_scalar_dim(ctx, av, f"{what}: axis"), xv.rank, what)
    prod = node.op_type == "CumProd"
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    if xv.const is not None:
        return [Value.of_const(_numpy_scan(xv.const, axis, prod, exclusive, reverse))]
    x = ctx.node(xv)
    y = ctx.cast(x, acc_dtype(x.dtype))
    if reverse:
        y = _flip(ctx, y, axis)
    if exclusive:
        lo, hi = [0] * y.rank, [0] * y.rank
        lo[axis], hi[axis] = 1, -1
        fill = ctx.const(1 if prod else 0, y.dtype)
        y = ctx.op("pad", y, fill, low=tuple(lo), high=tuple(hi))
    y = ctx.op("cumulative", y, kind="prod" if prod else "sum", axis=axis)
    if reverse:
        y = _flip(ctx, y, axis)
    return [Value.of_node(ctx.cast(y, x.dtype))]


@rule("ReverseSequence", first=10)
def _reverse_sequence(ctx, node, ins):
    x, lens = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    b = norm_axis(int(node.attr("batch_axis", 1)), x.rank, what)
    t = norm_axis(int(node.attr("time_axis", 0)), x.rank, what)
    if x.rank < 2 or {b, t} != {0, 1}:
        raise UnsupportedError(f"{what}: batch_axis/time_axis must be 0 and 1 (rank >= 2)")
    steps = _iota(ctx, x.shape, t)
    n = ctx.op("broadcast_in_dim", ctx.cast(lens, I64), shape=tuple(x.shape), dims=(b,))
    back = ctx.op("sub", ctx.op("sub", n, ctx.full(1, x.shape, I64)), steps)
    src = ctx.op("select", ctx.op("lt", steps, n), back, steps)
    return [Value.of_node(ctx.op("take_along_axis", x, src, axis=t))]


# --- arg reductions and top-k -------------------------------------------------------------------


@rule("ArgMax", "ArgMin", first=1)
def _arg_reduce(ctx, node, ins):
    xv = ins[0]
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", 0)), xv.rank, what)
    keep = bool(int(node.attr("keepdims", 1)))
    last = bool(int(node.attr("select_last_index", 0)))
    kind = "argmax" if node.op_type == "ArgMax" else "argmin"
    if xv.const is not None and xv.const.shape[axis] > 0:
        data = np.flip(xv.const, axis) if last else xv.const
        r = (np.argmax if kind == "argmax" else np.argmin)(data, axis=axis, keepdims=keep)
        if last:
            r = xv.const.shape[axis] - 1 - r
        return [Value.of_const(np.asarray(r, dtype=np.int64))]
    x = ctx.node(xv)
    r = ctx.op("argreduce", _flip(ctx, x, axis) if last else x, kind=kind, axis=axis)
    if last:
        r = ctx.op("sub", _dim_full(ctx, as_expr(x.shape[axis]) - 1, r.shape), r)
    return [Value.of_node(ctx.keep_dims(r, x.shape, (axis,)) if keep else r)]


def _before(ctx: LowerCtx, a: Node, b: Node) -> Node:
    """``a < b`` with NaN greater than every number (NumPy's sort order)."""
    lt = ctx.op("lt", a, b)
    if not a.dtype.is_float:
        return lt
    a_num = ctx.op("eq", ctx.op("isnan", a), ctx.full(False, a.shape, DType.b8))
    return ctx.op("or", lt, ctx.op("and", a_num, ctx.op("isnan", b)))


def _same(ctx: LowerCtx, a: Node, b: Node) -> Node:
    eq = ctx.op("eq", a, b)
    if not a.dtype.is_float:
        return eq
    return ctx.op("or", eq, ctx.op("and", ctx.op("isnan", a), ctx.op("isnan", b)))


def _ranks(ctx: LowerCtx, x: Node, axis: int, largest: bool) -> Node:
    """Each element's position in the order TopK returns (0 first): how many come before."""
    n = x.shape[axis]
    wide = (*x.shape[:axis], n, n, *x.shape[axis + 1 :])  # [.., i, j, ..]
    xi, xj = _insert_axis(ctx, x, wide, axis + 1), _insert_axis(ctx, x, wide, axis)
    better = _before(ctx, xi, xj) if largest else _before(ctx, xj, xi)
    earlier = ctx.op("lt", _iota(ctx, wide, axis + 1), _iota(ctx, wide, axis))
    tie = ctx.op("and", _same(ctx, xi, xj), earlier)
    first = ctx.cast(ctx.op("or", better, tie), I64)
    return ctx.reduce(first, "sum", (axis + 1,))


@rule("TopK", first=1)
def _top_k(ctx, node, ins):
    xv = ins[0]
    what = node.describe()
    if node.opset < 10:
        k = int(node.attr("k"))
    else:
        k = _scalar_dim(ctx, ins[1], f"{what}: K")
    axis = norm_axis(int(node.attr("axis", -1)), xv.rank, what)
    largest = bool(int(node.attr("largest", 1)))
    x = ctx.node(xv)
    n = x.shape[axis]
    if isinstance(k, int) and k < 0:
        raise UnsupportedError(f"{what}: K = {k} is negative")
    _guard(ctx, "le", k, n, f"{what}: K at most the axis size")
    rank = _ranks(ctx, x, axis, largest)
    wide = (*x.shape[:axis], k, n, *x.shape[axis + 1 :])  # [.., output slot, element, ..]
    slot = ctx.op("eq", _insert_axis(ctx, rank, wide, axis), _iota(ctx, wide, axis))
    pos = _iota(ctx, wide, axis + 1)
    idx = ctx.reduce(ctx.op("select", slot, pos, ctx.full(0, wide, I64)), "sum", (axis + 1,))
    values = ctx.op("take_along_axis", x, idx, axis=axis)
    return [Value.of_node(values), Value.of_node(idx)]


# --- value-dependent shapes: folded on constants only ------------------------------------------


def _value_dependent(node, what: str):
    return UnsupportedError(
        f"{node.describe()}: the output shape depends on the values of {what}, which are "
        "computed here (only constants fold)"
    )


@rule("NonZero", first=9)
def _nonzero(ctx, node, ins):
    if ins[0].const is None:
        raise _value_dependent(node, "the input")
    return [Value.of_const(np.array(np.nonzero(ins[0].const), dtype=np.int64))]


@rule("Compress", first=9)
def _compress(ctx, node, ins):
    xv, cv = ins
    if cv.const is None:
        raise _value_dependent(node, "the condition")
    axis = node.attr("axis")
    picked = np.nonzero(cv.const.reshape(-1))[0].astype(np.int64)
    if xv.const is not None:
        return [Value.of_const(np.compress(cv.const.reshape(-1), xv.const, axis=axis))]
    x = ctx.node(xv)
    if axis is None:
        x, axis = ctx.reshape(x, (shape_numel(x.shape),)), 0
    axis = norm_axis(int(axis), x.rank, node.describe())
    return [Value.of_node(ctx.op("gather", x, ctx.const_node(picked), axis=axis))]


@rule("Unique", first=11)
def _unique(ctx, node, ins):
    x = ins[0].const
    if x is None:
        raise _value_dependent(node, "the input")
    axis = node.attr("axis")
    kw = {} if axis is None else {"axis": int(axis)}
    y, first, inverse, counts = np.unique(x, True, True, True, **kw)
    if not int(node.attr("sorted", 1)):
        order = np.argsort(first, kind="stable")
        remap = np.empty_like(order)
        remap[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], remap[inverse]
        y = np.take(x if axis is not None else x.reshape(-1), first, axis=kw.get("axis", 0))
    outs = (y, first, inverse.reshape(-1), counts)
    return [
        Value.of_const(np.asarray(o) if i == 0 else np.asarray(o, np.int64))
        for i, o in enumerate(outs)
    ]
