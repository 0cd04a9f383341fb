"""StableHLO's contractions, reductions, windows and indexing: a rule family of the frontend.

Sits under ``lower.py`` beside ``elementwise.py`` and ``shape_ops.py``:

- ``dot_general``/``dot``: operands transposed to ``[batch, free, contracted]``,
  free dims merged (views), one IR ``dot``, the result reshaped back.
- ``convolution``: any dimension numbers, as a channels-first or channels-last
  IR ``convolution`` (constant kernels transposed at compile time).
- ``reduce``: the body's one op picks the kind (add, multiply, maximum, minimum,
  and, or); a two-operand reduce of values and their iota is an argmax/argmin.
- ``reduce_window``: pooling over the spatial dims, and the window covering a
  whole axis with its length minus one padded low, which is a cumulative scan.
- ``gather``/``dynamic_gather`` and ``scatter``: the form that indexes one
  axis with whole slices of the others (embedding lookups, ``x[idx]``,
  ``x.at[idx].add``); indices are clamped as StableHLO clamps them.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, shape_numel
from ..values import Value
from .context import LowerCtx, OpView, rule
from .reader import import_bindings

_BODY_KINDS = {
    "stablehlo.add": "sum",
    "stablehlo.multiply": "prod",
    "stablehlo.maximum": "max",
    "stablehlo.minimum": "min",
    "stablehlo.and": "all",
    "stablehlo.or": "any",
    "mhlo.add": "sum",
    "mhlo.multiply": "prod",
    "mhlo.maximum": "max",
    "mhlo.minimum": "min",
}
_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "all": "and", "any": "or"}
_IDENTITY = {"sum": 0, "prod": 1, "max": -np.inf, "min": np.inf, "all": True, "any": False}


# --- dot ----------------------------------------------------------------------------


@rule("stablehlo.dot_general", "stablehlo.dot")
def _dot_general(ctx: LowerCtx, op: OpView) -> list[Value]:
    lhs, rhs = (ctx.node(v) for v in op.operands[:2])
    if op.name == "stablehlo.dot":
        lb, rb, lc, rc = (), (), (lhs.rank - 1,), (0,)
    else:
        stablehlo = import_bindings()[1]
        dn = stablehlo.DotDimensionNumbers(op.attr("dot_dimension_numbers"))
        lb, rb = tuple(dn.lhs_batching_dimensions), tuple(dn.rhs_batching_dimensions)
        lc, rc = tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)
    dtype = op.result_dtype()
    lhs, rhs = ctx.cast(lhs, dtype), ctx.cast(rhs, dtype)
    return [Value.of_node(dot_general(ctx, lhs, rhs, lb, rb, lc, rc))]


def dot_general(ctx: LowerCtx, lhs: Node, rhs: Node, lb, rb, lc, rc) -> Node:
    """``[batch..., lhs free..., rhs free...]`` from one batched IR matmul."""
    lf = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    batch = [lhs.shape[d] for d in lb]
    for a, b in zip(lb, rb):
        ctx.b.constraints.guard_eq(as_expr(lhs.shape[a]), as_expr(rhs.shape[b]), "dot batch dim")
    lfree, rfree = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    k = shape_numel([lhs.shape[d] for d in lc])
    a = ctx.transpose(lhs, [*lb, *lf, *lc])
    b = ctx.transpose(rhs, [*rb, *rc, *rf])
    a = ctx.reshape(a, [*batch, as_dim(shape_numel(lfree)), as_dim(k)])
    b = ctx.reshape(
        b, [*batch, as_dim(shape_numel([rhs.shape[d] for d in rc])), as_dim(shape_numel(rfree))]
    )
    out = ctx.op("dot", a, b)
    return ctx.reshape(out, [*batch, *lfree, *rfree])


# --- reduce -------------------------------------------------------------------------


def body_kind(op: OpView, region: int = 0) -> str:
    """The reduction a one-op body computes (``add`` -> sum, ...)."""
    ops, _ = op.region_body(region)
    work = [o.operation.name for o in ops if not o.operation.name.endswith("return")]
    if len(work) != 1 or work[0] not in _BODY_KINDS:
        raise UnsupportedError(f"a reduction body of {work} (one of add, multiply, max, min)")
    return _BODY_KINDS[work[0]]


@rule("stablehlo.reduce")
def _reduce(ctx: LowerCtx, op: OpView) -> list[Value]:
    n = len(op.operands) // 2
    axes = tuple(sorted(op.ints("dimensions")))
    if n == 2:
        return _arg_reduce(ctx, op, axes)
    if n != 1:
        raise UnsupportedError(f"a reduce of {n} operands")
    x, init = ctx.node(op.operands[0]), op.operands[1]
    kind = body_kind(op)
    if kind in ("all", "any") and x.dtype is not DType.b8:
        raise UnsupportedError(f"a bitwise {kind} reduction of {x.dtype}")
    out = ctx.reduce(x, kind, axes) if axes else x
    return [Value.of_node(_with_init(ctx, out, init, kind))]


def _with_init(ctx: LowerCtx, out: Node, init: Value, kind: str) -> Node:
    """Combine with the init value unless it is the kind's identity."""
    if _is_identity(init, kind, out.dtype):
        return out
    return ctx.op(_COMBINE[kind], out, ctx.broadcast_to(ctx.node(init), out.shape))


def _arg_reduce(ctx: LowerCtx, op: OpView, axes: tuple) -> list[Value]:
    """values and their iota reduced together: argmax (a GT compare) or argmin (LT)."""
    x, idx = ctx.node(op.operands[0]), ctx.node(op.operands[1])
    ops, _ = op.region_body()
    directions = {
        str(o.operation.attributes["comparison_direction"]).split()[-1].rstrip(">")
        for o in ops
        if o.operation.name.endswith("compare")
    }
    kind = "argmax" if "GT" in directions else "argmin" if "LT" in directions else None
    if (
        kind is None
        or len(axes) != 1
        or idx.op != "iota"
        or idx.attr("dim") != axes[0]
        or not idx.dtype.is_int
    ):
        raise UnsupportedError(
            "a reduce of two operands other than an argmax/argmin of values and their iota"
        )
    (axis,) = axes
    best = ctx.op("reduce", x, kind="max" if kind == "argmax" else "min", axes=axes)
    at = ctx.op("argreduce", x, kind=kind, axis=axis)
    return [Value.of_node(best), Value.of_node(ctx.cast(at, idx.dtype))]


# --- reduce_window ----------------------------------------------------------------


def _padding_pairs(op: OpView, name: str, rank: int) -> list[tuple[int, int]]:
    if not op.has(name):
        return [(0, 0)] * rank
    flat = op.ints(name)
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(rank)]


@rule("stablehlo.reduce_window")
def _reduce_window(ctx: LowerCtx, op: OpView) -> list[Value]:
    if len(op.operands) != 2:
        raise UnsupportedError("a reduce_window of several operands")
    x, init = ctx.node(op.operands[0]), op.operands[1]
    kind = body_kind(op)
    r = x.rank
    window = op.ints("window_dimensions")
    stride = op.ints("window_strides", (1,) * r)
    dil = op.ints("window_dilations", (1,) * r)
    if any(d != 1 for d in op.ints("base_dilations", (1,) * r)):
        raise UnsupportedError("reduce_window with base dilations")
    pad = _padding_pairs(op, "padding", r)
    active = [i for i in range(r) if window[i] != 1 or stride[i] != 1 or pad[i] != (0, 0)]
    if not active:
        return [Value.of_node(_with_init(ctx, x, init, kind))]
    if len(active) == 1 and kind in ("sum", "prod"):
        (a,) = active
        n = x.shape[a]
        if (
            isinstance(as_dim(n), int)
            and window[a] == n
            and pad[a] == (n - 1, 0)
            and stride[a] == 1
            and dil[a] == 1
        ):
            out = ctx.op("cumulative", x, kind=kind, axis=a)
            return [Value.of_node(_with_init(ctx, out, init, kind))]
    return [Value.of_node(_window_reduce(ctx, x, init, kind, active, window, stride, dil, pad))]


def _window_reduce(ctx, x: Node, init: Value, kind: str, active, window, stride, dil, pad):
    """A pool, once windows from the first dim get a leading unit dim and a float min
    becomes -max(-x)."""
    if min(active) == 0:
        x1 = ctx.reshape(x, (1, *x.shape))
        shift = [i + 1 for i in active]
        widen = [(1, *window), (1, *stride), (1, *dil), [(0, 0), *pad]]
        out = _window_reduce(ctx, x1, init, kind, shift, *widen)
        return ctx.reshape(out, out.shape[1:])
    if kind == "min" and x.dtype.is_float:
        neg_init = Value.of_node(ctx.op("neg", ctx.node(init)))
        out = _pool(ctx, ctx.op("neg", x), neg_init, "max", active, window, stride, dil, pad)
        return ctx.op("neg", out)
    return _pool(ctx, x, init, kind, active, window, stride, dil, pad)


def _pool(ctx, x: Node, init: Value, kind: str, active, window, stride, dil, pad) -> Node:
    r = x.rank
    first, last = min(active), max(active)
    channels_last = last == r - 2 and first >= 1
    if not (last == r - 1 or channels_last) or active != list(range(first, last + 1)):
        raise UnsupportedError(
            f"a reduce_window over dims {active} of a rank-{r} tensor (pooling windows cover "
            "the trailing dims, or those before the last one)"
        )
    if kind not in ("max", "sum"):
        raise UnsupportedError(f"a {kind} reduce_window (max and sum pool)")
    if any(as_dim(x.shape[i]) == 0 for i in active):
        raise UnsupportedError("a reduce_window over an empty dim")
    # From the first windowed dim to the last: a window of 1 there is a pool of 1.
    dims = list(range(first, last + 1))
    symmetric = all(pad[i][0] == pad[i][1] for i in dims)
    if not symmetric:
        # padded with the identity, as XLA does (the init value joins each window once)
        fill = ctx.const(_IDENTITY[kind], x.dtype)
        x = ctx.op(
            "pad",
            x,
            fill,
            low=tuple(pad[i][0] for i in range(r)),
            high=tuple(pad[i][1] for i in range(r)),
        )
        pad = [(0, 0)] * r
    dtype = x.dtype
    if kind == "sum" and dtype not in (DType.f32, DType.f64):
        # a sum pool is an average times the window: exact in f64 for integers (and in f32
        # for half floats), rounded back to the operand's type
        x = ctx.cast(x, DType.f64 if not dtype.is_float else DType.f32)
    out = ctx.op(
        "pool",
        x,
        kind="max" if kind == "max" else "avg",
        kernel=tuple(window[i] for i in dims),
        stride=tuple(stride[i] for i in dims),
        padding=tuple(pad[i][0] for i in dims),
        dilation=tuple(dil[i] for i in dims),
        count_include_pad=True,
        channels_last=channels_last,
    )
    if kind == "sum":
        size = int(np.prod([window[i] for i in dims]))
        out = ctx.op("mul", out, ctx.full(float(size), out.shape, out.dtype))
        if not dtype.is_float:
            out = ctx.op("round", out)
        out = ctx.cast(out, dtype)
    return _with_init(ctx, out, init, kind)


def _is_identity(init: Value, kind: str, dtype: DType) -> bool:
    if init.const is None or init.const.size != 1:
        return False
    v = init.const.reshape(-1)[0]
    if v == _IDENTITY[kind]:
        return True
    if dtype.is_int and kind in ("max", "min"):
        info = np.iinfo(dtype.to_numpy())
        return v <= info.min if kind == "max" else v >= info.max
    return False


# --- convolution ------------------------------------------------------------------


@rule("stablehlo.convolution")
def _convolution(ctx: LowerCtx, op: OpView) -> list[Value]:
    stablehlo = import_bindings()[1]
    x, w = ctx.node(op.operands[0]), op.operands[1]
    dn = stablehlo.ConvDimensionNumbers(op.attr("dimension_numbers"))
    nsp = len(dn.input_spatial_dimensions)
    if any(d != 1 for d in op.ints("lhs_dilation", (1,) * nsp)):
        raise UnsupportedError("convolution with lhs_dilation (a transposed convolution)")
    if op.int_attr("batch_group_count", 1) != 1:
        raise UnsupportedError("convolution with batch_group_count > 1")
    groups = op.int_attr("feature_group_count", 1)
    stride = op.ints("window_strides", (1,) * nsp)
    dil = op.ints("rhs_dilation", (1,) * nsp)
    pad = _padding_pairs(op, "padding", nsp)
    ib, i_f, isp = (
        dn.input_batch_dimension,
        dn.input_feature_dimension,
        list(dn.input_spatial_dimensions),
    )
    kperm = [dn.kernel_output_feature_dimension, dn.kernel_input_feature_dimension]
    kperm += list(dn.kernel_spatial_dimensions)
    if w.const is not None:
        kernel = ctx.node(Value.of_const(np.ascontiguousarray(np.transpose(w.const, kperm))))
    else:
        kernel = ctx.transpose(ctx.node(w), kperm)
    # channels last only where the CPU backend has that kernel (2-D, no groups)
    last = [ib, *isp, i_f] == list(range(nsp + 2)) and groups == 1 and nsp == 2
    x = ctx.transpose(x, [ib, *isp, i_f] if last else [ib, i_f, *isp])
    first = 1 if last else 2
    if any(lo != hi for lo, hi in pad):
        zero = ctx.const(0, x.dtype)
        low = [0] * x.rank
        high = [0] * x.rank
        for i, (lo, hi) in enumerate(pad):
            low[first + i], high[first + i] = lo, hi
        x = ctx.op("pad", x, zero, low=tuple(low), high=tuple(high))
        pad = [(0, 0)] * nsp
    out = ctx.op(
        "convolution",
        x,
        ctx.cast(kernel, x.dtype),
        stride=tuple(stride),
        padding=tuple(p[0] for p in pad),
        dilation=tuple(dil),
        groups=groups,
        channels_last=last,
    )
    ob, of, osp = (
        dn.output_batch_dimension,
        dn.output_feature_dimension,
        list(dn.output_spatial_dimensions),
    )
    where = {ob: 0, of: nsp + 1 if last else 1}
    for i, d in enumerate(osp):
        where[d] = first + i
    return [Value.of_node(ctx.transpose(out, [where[p] for p in range(nsp + 2)]))]


# --- gather / scatter ---------------------------------------------------------------


def _indices_as_batch(ctx: LowerCtx, idx: Node, index_vector_dim: int) -> Node:
    """Indices of one axis: the index-vector dim (of size 1) dropped."""
    if index_vector_dim < idx.rank:
        if as_dim(idx.shape[index_vector_dim]) != 1:
            raise UnsupportedError("indices into more than one axis")
        shape = [d for i, d in enumerate(idx.shape) if i != index_vector_dim]
        idx = ctx.reshape(idx, shape)
    return idx


@rule("stablehlo.gather", "stablehlo.dynamic_gather")
def _gather(ctx: LowerCtx, op: OpView) -> list[Value]:
    stablehlo = import_bindings()[1]
    x, idx = ctx.node(op.operands[0]), ctx.node(op.operands[1])
    dn = stablehlo.GatherDimensionNumbers(op.attr("dimension_numbers"))
    if op.name == "stablehlo.dynamic_gather":
        sizes = ctx.known_of(op.operands[2], "dynamic_gather's slice sizes")
    else:
        sizes = op.ints("slice_sizes")
    start_map, collapsed = list(dn.start_index_map), list(dn.collapsed_slice_dims)
    offset_dims = list(dn.offset_dims)
    every = list(range(x.rank))
    if (
        not offset_dims
        and not list(dn.operand_batching_dims)
        and sorted(collapsed) == every == sorted(start_map)
        and len(start_map) > 1
    ):
        return [Value.of_node(_point_gather(ctx, x, idx, start_map, dn.index_vector_dim))]
    if list(dn.operand_batching_dims) or len(start_map) != 1 or collapsed != start_map:
        raise UnsupportedError(
            "a gather other than whole slices along one indexed axis "
            f"(start_index_map {start_map}, collapsed_slice_dims {collapsed})"
        )
    (a,) = start_map
    for d in range(x.rank):
        if d != a and as_expr(sizes[d]) != as_expr(x.shape[d]):
            if not ctx.b.constraints.prove_eq(sizes[d], x.shape[d]):
                raise UnsupportedError(f"a gather taking part of dim {d} (slice size {sizes[d]})")
    idx = _indices_as_batch(ctx, idx, dn.index_vector_dim)
    out = ctx.op("gather", x, ctx.clamp_index(idx, as_dim(as_expr(x.shape[a]) - 1)), axis=a)
    # IR order: x[:a], idx dims, x[a+1:]; StableHLO: offset dims at offset_dims, batch elsewhere
    ir_offsets = [*range(a), *range(a + idx.rank, out.rank)]
    ir_batch = list(range(a, a + idx.rank))
    perm, oi, bi = [], iter(ir_offsets), iter(ir_batch)
    for p in range(out.rank):
        perm.append(next(oi) if p in offset_dims else next(bi))
    return [Value.of_node(ctx.transpose(out, perm))]


def _point_gather(ctx: LowerCtx, x: Node, idx: Node, start_map, ivd: int) -> Node:
    """One element per index vector (every operand dim indexed): a gather from the
    flattened operand at the linear index of the clamped components."""
    if ivd == idx.rank:
        raise UnsupportedError("a gather of every dim with scalar indices")
    perm = [d for d in range(idx.rank) if d != ivd] + [ivd]
    idx = ctx.transpose(idx, perm)
    batch = idx.shape[:-1]
    lin = None
    for k, a in enumerate(start_map):
        comp = ctx.op(
            "slice",
            idx,
            start=(0,) * (idx.rank - 1) + (k,),
            limit=tuple(idx.shape[:-1]) + (k + 1,),
            stride=(1,) * idx.rank,
        )
        comp = ctx.clamp_index(ctx.reshape(comp, batch), as_dim(as_expr(x.shape[a]) - 1))
        stride = shape_numel(x.shape[a + 1 :])
        if as_dim(stride) != 1:
            comp = ctx.op(
                "mul", comp, ctx.broadcast_to(ctx.scalar(as_dim(stride), DType.i64), batch)
            )
        lin = comp if lin is None else ctx.op("add", lin, comp)
    flat = ctx.reshape(x, (as_dim(shape_numel(x.shape)),))
    return ctx.op("gather", flat, lin, axis=0)


@rule("stablehlo.scatter")
def _scatter(ctx: LowerCtx, op: OpView) -> list[Value]:
    stablehlo = import_bindings()[1]
    if len(op.operands) != 3:
        raise UnsupportedError("a scatter of several operands")
    base, idx, upd = (ctx.node(v) for v in op.operands)
    dn = stablehlo.ScatterDimensionNumbers(op.attr("scatter_dimension_numbers"))
    inserted, to_operand = list(dn.inserted_window_dims), list(dn.scattered_dims_to_operand_dims)
    window = list(dn.update_window_dims)
    if list(dn.input_batching_dims) or len(to_operand) != 1 or inserted != to_operand:
        raise UnsupportedError("a scatter other than whole slices along one indexed axis")
    (a,) = to_operand
    mode = _scatter_mode(op, upd)
    idx = ctx.cast(_indices_as_batch(ctx, idx, dn.index_vector_dim), DType.i64)
    # StableHLO updates: window dims at update_window_dims, index dims elsewhere, in order.
    index_pos = [p for p in range(upd.rank) if p not in window]
    want = [*window[:a], *index_pos, *window[a:]]
    upd = ctx.transpose(upd, want)
    # StableHLO drops an update whose index is out of range: it goes to a spare row past
    # the end, cut off after the scatter.
    n = base.shape[a]
    last = ctx.broadcast_to(ctx.scalar(n, DType.i64), idx.shape)
    outside = ctx.op(
        "or",
        ctx.op("lt", idx, ctx.full(0, idx.shape, DType.i64)),
        ctx.op("ge", idx, last),
    )
    idx = ctx.op("select", outside, last, idx)
    high = [0] * base.rank
    high[a] = 1
    spare = ctx.op("pad", base, ctx.const(0, base.dtype), low=(0,) * base.rank, high=tuple(high))
    out = ctx.op("scatter", spare, idx, upd, axis=a, mode=mode)
    limit = tuple(base.shape)
    out = ctx.op("slice", out, start=(0,) * base.rank, limit=limit, stride=(1,) * base.rank)
    return [Value.of_node(out)]


def _scatter_mode(op: OpView, upd: Node) -> str:
    """``set`` (the body returns the update: of duplicates, the last in row-major order
    wins, one of the orders StableHLO allows), ``add``, or ``max`` of a 1-D iota (each
    position's last writer: the same as ``set``, as the iota increases in that order)."""
    ops, args = op.region_body()
    work = [o for o in ops if not o.operation.name.endswith("return")]
    ret = [o for o in ops if o.operation.name.endswith("return")][0]
    if not work and len(args) == 2 and ret.operation.operands[0] == args[1]:
        return "set"
    if len(work) == 1 and work[0].operation.name.endswith(".add"):
        return "add"
    if len(work) == 1 and work[0].operation.name.endswith(".or") and upd.dtype is DType.b8:
        return "add"  # the IR's add of booleans is or
    if len(work) == 1 and work[0].operation.name.endswith(".maximum"):
        if upd.op == "iota" and upd.rank == 1:
            return "set"
    raise UnsupportedError("a scatter whose update is neither add nor set")


@rule("stablehlo.batch_norm_inference")
def _batch_norm(ctx: LowerCtx, op: OpView) -> list[Value]:
    x, scale, offset, mean, var = (ctx.node(v) for v in op.operands)
    axis = op.int_attr("feature_index")
    eps = float(str(op.attr("epsilon")).split(":")[0])

    def along(v: Node) -> Node:
        return ctx.op("broadcast_in_dim", v, shape=tuple(x.shape), dims=(axis,))

    inv = ctx.op("rsqrt", ctx.op("add", var, ctx.full(eps, var.shape, var.dtype)))
    y = ctx.op("mul", ctx.op("sub", x, along(mean)), along(ctx.op("mul", inv, scale)))
    return [Value.of_node(ctx.op("add", y, along(offset)))]
