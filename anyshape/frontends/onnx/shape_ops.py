"""ONNX shape and data-movement ops: Shape, Reshape, Gather, Concat, Slice, Expand...

One family of the ONNX frontend's rule table (``rules.py`` gathers it). Shape
computations fold at lowering time: ``Shape`` yields a ``known`` vector of
symbolic dims, and ``Gather``, ``Concat``, ``Slice``, ``Unsqueeze``,
``Squeeze``, ``ConstantOfShape``, ``Range`` (constant bounds) and the shape
operands of ``Reshape`` and ``Expand`` read and produce such vectors, so the IR
never holds tensor code for sizes. On tensors these ops become IR views
(``reshape``, ``transpose``, ``slice``, ``broadcast_in_dim``), ``concatenate``
and ``gather``. Axes come from attributes before opset 13 (Squeeze, Unsqueeze)
and from inputs from 13 on; ``Slice`` takes inputs from opset 10.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.symbolic import as_dim, as_expr, floordiv, shape_numel, sym_max, sym_min
from .context import LowerCtx, Value, clamp_nonneg, norm_axis, rule_registry

RULES, rule = rule_registry()
_BIG = 2**62  # Slice bounds at or beyond this mean "to the end"


# --- sources ------------------------------------------------------------------------------


@rule("Constant", first=1)
def _constant(ctx, node, ins):
    a = node.attrs
    if "value" in a:
        from onnx import numpy_helper

        return [Value.of_const(np.asarray(numpy_helper.to_array(a["value"])))]
    if "value_float" in a:
        return [Value.of_const(np.array(a["value_float"], dtype=np.float32))]
    if "value_floats" in a:
        return [Value.of_const(np.array(list(a["value_floats"]), dtype=np.float32))]
    if "value_int" in a:
        return [Value.of_const(np.array(a["value_int"], dtype=np.int64))]
    if "value_ints" in a:
        return [Value.of_const(np.array(list(a["value_ints"]), dtype=np.int64))]
    raise UnsupportedError(f"{node.describe()}: constant attributes {sorted(a)} not supported")


@rule("Shape", first=1)
def _shape(ctx, node, ins):
    (x,) = ins
    dims = list(x.shape)
    if node.opset >= 15:
        r = len(dims)
        start = int(node.attr("start", 0))
        end = node.attr("end")
        start = min(max(start + r if start < 0 else start, 0), r)
        end = r if end is None else min(max(int(end) + r if int(end) < 0 else int(end), 0), r)
        dims = dims[start:end]
    return [Value.of_known(dims, DType.i64)]


@rule("Size", first=1)
def _size(ctx, node, ins):
    return [Value.of_known([shape_numel(ins[0].shape)], DType.i64, scalar=True)]


@rule("ConstantOfShape", first=9)
def _constant_of_shape(ctx, node, ins):
    shape = ctx.known_of(ins[0], f"{node.describe()}: the shape")
    fill = node.attrs.get("value")
    if fill is not None:
        from onnx import numpy_helper

        value = np.asarray(numpy_helper.to_array(fill)).reshape(-1)
        if value.size != 1:
            raise UnsupportedError(f"{node.describe()}: value must hold one element")
        value = value[0]
    else:
        value = np.float32(0)
    dtype = DType.from_numpy(np.asarray(value).dtype)
    shape = tuple(as_dim(d) for d in shape)
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape, dtype=np.int64)) <= 4096:
        return [Value.of_const(np.full(shape, value, dtype=dtype.to_numpy()))]
    return [Value.of_node(ctx.full(value.item(), shape, dtype))]


@rule("Range", first=11)
def _range(ctx, node, ins):
    start, limit, delta = ins
    what = f"{node.describe()}: "
    if _all_const(ins) or not start.dtype.is_int:  # a float range's length needs its values
        s, lim, d = (
            ctx.const_of(v, what + k).reshape(()).item()
            for v, k in zip(ins, ("start", "limit", "delta"))
        )
        dtype = start.dtype.to_numpy()
        if int(node.attr("stash_type", 0)) == 1 and start.dtype is DType.f16:
            s, lim, d = (np.float32(v) for v in (s, lim, d))
        return [Value.of_const(np.arange(s, lim, d).astype(dtype))]
    s = _known_scalar(ctx, start, what + "start")
    lim = _known_scalar(ctx, limit, what + "limit")
    d = _known_scalar(ctx, delta, what + "delta")
    if not isinstance(d, int) or d == 0 or not start.dtype.is_int:
        raise UnsupportedError(what + "a symbolic or float delta")
    span = as_expr(lim) - as_expr(s)
    n = clamp_nonneg(floordiv(span + (d - 1), d) if d > 0 else floordiv(-span + (-d - 1), -d))
    iota = ctx.op("iota", shape=(n,), dim=0, dtype=start.dtype)
    y = ctx.op("mul", iota, ctx.full(d, (n,), start.dtype))
    y = ctx.op("add", y, ctx.broadcast_to(ctx.scalar(s, start.dtype), (n,)))
    return [Value.of_node(y)]


def _all_const(ins) -> bool:
    return all(v is not None and v.const is not None for v in ins)


def _known_scalar(ctx, v: Value, what: str):
    k = ctx.known_of(v, what)
    if len(k) != 1:
        raise UnsupportedError(f"{what} must hold one element")
    return as_dim(k[0])


# --- reshapes -------------------------------------------------------------------------------


def reshape_target(x_shape, spec, allowzero: bool, what: str) -> tuple:
    """ONNX Reshape's output shape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = []
    infer = None
    for i, d in enumerate(spec):
        d = as_dim(d)
        if isinstance(d, int) and d == -1:
            if infer is not None:
                raise UnsupportedError(f"{what}: more than one -1 in the shape")
            infer = i
            out.append(1)
        elif isinstance(d, int) and d == 0 and not allowzero:
            if i >= len(x_shape):
                raise UnsupportedError(f"{what}: 0 at position {i} beyond the input's rank")
            out.append(as_dim(x_shape[i]))
        elif isinstance(d, int) and d < 0:
            raise UnsupportedError(f"{what}: negative size {d} in the shape")
        else:
            out.append(d)
    if infer is not None:
        rest = as_expr(shape_numel(out))
        total = as_expr(shape_numel(x_shape))
        if rest.is_constant and rest.constant_value == 0:
            raise UnsupportedError(f"{what}: -1 with a zero-size remainder is ambiguous")
        out[infer] = as_dim(floordiv(total, rest))
    return tuple(out)


@rule("Reshape", first=5)
def _reshape(ctx, node, ins):
    x, spec = ins
    what = node.describe()
    shape = reshape_target(
        x.shape,
        ctx.known_of(spec, f"{what}: the shape"),
        bool(node.attr("allowzero", 0)),
        what,
    )
    return [_reshape_value(ctx, x, shape)]


def _reshape_value(ctx: LowerCtx, x: Value, shape) -> Value:
    if x.const is not None and all(isinstance(d, int) for d in shape):
        return Value.of_const(x.const.reshape(shape))
    if x.known is not None and len(shape) <= 1:
        return Value.of_known(x.known, x.dtype, scalar=len(shape) == 0)
    return Value.of_node(ctx.reshape(ctx.node(x), shape))


@rule("Flatten", first=1)
def _flatten(ctx, node, ins):
    (x,) = ins
    axis = int(node.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise UnsupportedError(f"{node.describe()}: axis {axis} out of range")
    shape = (shape_numel(x.shape[:axis]), shape_numel(x.shape[axis:]))
    return [_reshape_value(ctx, x, shape)]


def _axes(ctx, node, ins, what: str) -> list[int] | None:
    """Axes from the input (opset 13+) or the attribute (before); None when absent."""
    if node.opset >= 13 and len(ins) > 1:
        if ins[1] is None:
            return None
        return [int(a) for a in ctx.const_of(ins[1], f"{what}: axes").reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@rule("Squeeze", first=1)
def _squeeze(ctx, node, ins):
    x = ins[0]
    what = node.describe()
    axes = _axes(ctx, node, ins, what)
    store = ctx.b.constraints
    if axes is None:
        if not all(isinstance(d, int) for d in x.shape):
            raise UnsupportedError(f"{what}: no axes on a symbolic shape (which dims are 1?)")
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {norm_axis(a, x.rank, what) for a in axes}
    for a in axes:
        try:
            store.guard_eq(x.shape[a], 1, f"{what}: squeezed dim {a}")
        except ValueError:
            raise UnsupportedError(f"{what}: dim {a} is {x.shape[a]}, not 1") from None
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [_reshape_value(ctx, x, shape)]


@rule("Unsqueeze", first=1)
def _unsqueeze(ctx, node, ins):
    x = ins[0]
    what = node.describe()
    axes = _axes(ctx, node, ins, what) or []
    rank = x.rank + len(axes)
    axes = sorted({norm_axis(a, rank, what) for a in axes})
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [_reshape_value(ctx, x, tuple(shape))]


@rule("Transpose", first=1)
def _transpose(ctx, node, ins):
    (x,) = ins
    perm = node.attr("perm")
    perm = list(range(x.rank))[::-1] if perm is None else [int(p) for p in perm]
    if x.const is not None:
        return [Value.of_const(np.transpose(x.const, perm))]
    return [Value.of_node(ctx.transpose(ctx.node(x), perm))]


@rule("Expand", first=8)
def _expand(ctx, node, ins):
    x, spec = ins
    what = node.describe()
    shape = ctx.known_of(spec, f"{what}: the shape")
    out = ctx.broadcast_shape([x.shape, shape], what)
    if x.known is not None and len(out) == 1 and x.rank <= 1:
        n = as_dim(out[0])
        if isinstance(n, int) and (len(x.known) == n or len(x.known) == 1):
            return [Value.of_known(x.known * (n // len(x.known)), x.dtype)]
    return [Value.of_node(ctx.broadcast_to(ctx.node(x), out))]


# --- concatenation, slicing, gathering ---------------------------------------------------------


@rule("Concat", first=4)
def _concat(ctx, node, ins):
    parts = [v for v in ins if v is not None]
    what = node.describe()
    rank = parts[0].rank
    axis = norm_axis(int(node.attr("axis", 0)), rank, what)
    if rank == 1 and all(p.known is not None for p in parts):
        dims = [d for p in parts for d in p.known]
        return [Value.of_known(dims, parts[0].dtype)]
    if all(p.const is not None for p in parts):
        return [Value.of_const(np.concatenate([p.const for p in parts], axis=axis))]
    nodes = [ctx.node(p) for p in parts if not (p.rank == 1 and p.shape[0] == 0 and rank != 1)]
    if len(nodes) == 1:
        return [Value.of_node(nodes[0])]
    return [Value.of_node(ctx.op("concatenate", *nodes, axis=axis))]


def _bound(b, size):
    """One Slice start or end (positive step), normalized for a dim of ``size``."""
    b = as_dim(b)
    if isinstance(b, int):
        if b >= _BIG:
            return as_dim(size)
        if b <= -_BIG:
            return 0
        if b < 0:
            return clamp_nonneg(as_expr(size) + b)
    return b


def slice_dim(ctx: LowerCtx, x, axis: int, start, end, step: int = 1):
    """``x[start:end:step]`` along ``axis`` (start/end normalized, step > 0) as an IR slice."""
    store = ctx.b.constraints
    size = x.shape[axis]
    if not (isinstance(start, int) and isinstance(size, int)) and not store.prove_le(start, size):
        start = as_dim(sym_min(as_expr(start), as_expr(size)))
    elif isinstance(start, int) and isinstance(size, int):
        start = min(start, size)
    if not store.prove_le(end, size):
        if isinstance(end, int) and isinstance(size, int):
            end = min(end, size)
        else:
            end = as_dim(sym_min(as_expr(end), as_expr(size)))
    if as_expr(end) != as_expr(size) and not store.prove_le(start, end):
        if isinstance(start, int) and isinstance(end, int):
            end = start
        else:
            end = as_dim(sym_max(as_expr(start), as_expr(end)))
    if start == 0 and step == 1 and as_expr(end) == as_expr(size):
        return x
    starts, limits, strides = [0] * x.rank, list(x.shape), [1] * x.rank
    starts[axis], limits[axis], strides[axis] = start, end, step
    return ctx.op("slice", x, start=tuple(starts), limit=tuple(limits), stride=tuple(strides))


@rule("Slice", first=10)
def _slice(ctx, node, ins):
    x = ins[0]
    what = node.describe()
    starts = ctx.known_of(ins[1], f"{what}: starts")
    ends = ctx.known_of(ins[2], f"{what}: ends")
    n = len(starts)
    axes = ctx.known_of(ins[3], f"{what}: axes") if len(ins) > 3 and ins[3] else range(n)
    steps = ctx.known_of(ins[4], f"{what}: steps") if len(ins) > 4 and ins[4] else (1,) * n
    return [_slice_value(ctx, x, starts, ends, axes, steps, what)]


@rule("Slice", first=1, last=9)
def _slice_v1(ctx, node, ins):
    starts, ends = node.attr("starts"), node.attr("ends")
    axes = node.attr("axes") or range(len(starts))
    return [_slice_value(ctx, ins[0], starts, ends, axes, (1,) * len(starts), node.describe())]


def _slice_value(ctx, x: Value, starts, ends, axes, steps, what: str) -> Value:
    spec = []
    for s, e, a, k in zip(starts, ends, axes, steps):
        if not isinstance(as_dim(a), int) or not isinstance(as_dim(k), int):
            raise UnsupportedError(f"{what}: symbolic axes or steps")
        a, k = norm_axis(int(a), x.rank, what), int(k)
        if k == 0:
            raise UnsupportedError(f"{what}: step 0")
        if k < 0:
            spec.append((a, *_bounds_backward(s, e, x.shape[a]), k))
        else:
            spec.append((a, _bound(s, x.shape[a]), _bound(e, x.shape[a]), k))
    if (
        x.known is not None
        and x.rank == 1
        and all(isinstance(s, int) and isinstance(e, int) for _, s, e, _ in spec)
    ):
        ((_, s, e, k),) = spec
        return Value.of_known([x.known[i] for i in range(s, e, k)], x.dtype)
    if x.const is not None and all(
        isinstance(s, int) and isinstance(e, int) for _, s, e, _ in spec
    ):
        out = x.const
        for a, s, e, k in spec:  # explicit indices: a backward end of -1 means "before 0"
            out = np.take(out, np.arange(s, e, k, dtype=np.int64), axis=a)
        return Value.of_const(np.ascontiguousarray(out))
    y = ctx.node(x)
    for a, s, e, k in spec:
        y = slice_dim(ctx, y, a, s, e, k) if k > 0 else _slice_backward(ctx, y, a, s, e, k)
    return Value.of_node(y)


def _bounds_backward(start, end, size) -> tuple:
    """A negative-step Slice's start and end: start in [0, size-1], end in [-1, size-1]."""
    size = as_expr(size)

    def clamp(b, low):
        b = as_dim(b)
        if isinstance(b, int) and b >= _BIG:
            return size - 1
        if isinstance(b, int) and b <= -_BIG:
            return as_expr(low)
        b = as_expr(b) + size if isinstance(b, int) and b < 0 else as_expr(b)
        return sym_min(sym_max(b, as_expr(low)), size - 1)

    return as_dim(clamp(start, 0)), as_dim(clamp(end, -1))


def _slice_backward(ctx: LowerCtx, x, axis: int, start, end, step: int):
    """``x[start:end:step]`` along ``axis`` for a negative step: a gather of computed indices."""
    n = clamp_nonneg(floordiv(as_expr(start) - as_expr(end) + (-step - 1), -step))
    idx = ctx.op("iota", shape=(n,), dim=0, dtype=DType.i64)
    idx = ctx.op("mul", idx, ctx.full(step, (n,), DType.i64))
    idx = ctx.op("add", idx, ctx.broadcast_to(ctx.scalar(start, DType.i64), (n,)))
    return ctx.op("gather", x, idx, axis=axis)


@rule("Gather", first=1)
def _gather(ctx, node, ins):
    x, idx = ins
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, what)
    if idx.const is not None:
        ids = idx.const.astype(np.int64)
        size = x.shape[axis]
        if x.known is not None and x.rank == 1 and ids.ndim <= 1:
            n = len(x.known)
            picked = [x.known[int(i) + n if i < 0 else int(i)] for i in ids.reshape(-1)]
            return [Value.of_known(picked, x.dtype, scalar=ids.ndim == 0)]
        if x.const is not None:
            return [Value.of_const(np.take(x.const, ids, axis=axis))]
        if ids.ndim == 0:
            i = int(ids)
            if i < 0:
                start = as_dim(as_expr(size) + i)
            else:
                start = i
            y = slice_dim(ctx, ctx.node(x), axis, start, as_dim(as_expr(start) + 1))
            shape = x.shape[:axis] + x.shape[axis + 1 :]
            return [Value.of_node(ctx.reshape(y, shape))]
        if (ids < 0).any():
            if not isinstance(size, int):
                return [_gather_tensor(ctx, x, idx, axis)]
            ids = np.where(ids < 0, ids + size, ids)
        return [Value.of_node(ctx.op("gather", ctx.node(x), ctx.const_node(ids), axis=axis))]
    return [_gather_tensor(ctx, x, idx, axis)]


def _gather_tensor(ctx: LowerCtx, x: Value, idx: Value, axis: int) -> Value:
    """Gather by a computed index tensor; negative indices count from the end."""
    i = ctx.cast(ctx.node(idx), DType.i64)
    n = ctx.broadcast_to(ctx.scalar(x.shape[axis], DType.i64), i.shape)
    zero = ctx.full(0, i.shape, DType.i64)
    i = ctx.op("select", ctx.op("lt", i, zero), ctx.op("add", i, n), i)
    return Value.of_node(ctx.op("gather", ctx.node(x), i, axis=axis))


@rule("Split", first=1)
def _split(ctx, node, ins):
    x = ins[0]
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, what)
    size = x.shape[axis]
    count = len(node.outputs)
    if node.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = list(ctx.known_of(ins[1], f"{what}: split"))
    elif node.opset < 13 and node.attr("split") is not None:
        sizes = [int(s) for s in node.attr("split")]
    else:
        n_out = int(node.attr("num_outputs", count))
        if isinstance(size, int):
            chunk = -(-size // n_out)
            sizes = [min(chunk, max(size - chunk * k, 0)) for k in range(n_out)]
        else:
            if not ctx.b.constraints.prove_divisible(size, n_out):
                ctx.b.constraints.guard_eq(
                    as_expr(size), floordiv(as_expr(size), n_out) * n_out, f"{what}: even split"
                )
            sizes = [as_dim(floordiv(as_expr(size), n_out))] * n_out
    y = ctx.node(x)
    outs, offset = [], as_expr(0)
    for s in sizes:
        end = offset + as_expr(s)
        outs.append(Value.of_node(slice_dim(ctx, y, axis, as_dim(offset), as_dim(end))))
        offset = end
    return outs


@rule("Tile", first=6)
def _tile(ctx, node, ins):
    x, reps = ins
    repeats = ctx.known_of(reps, f"{node.describe()}: repeats")
    y = ctx.node(x)
    inter, dims = [], []
    for i, (r, d) in enumerate(zip(repeats, y.shape)):
        inter += [r, d]
        dims.append(2 * i + 1)
    b = ctx.op("broadcast_in_dim", y, shape=tuple(inter), dims=tuple(dims))
    out = [as_dim(as_expr(r) * as_expr(d)) for r, d in zip(repeats, y.shape)]
    return [Value.of_node(ctx.reshape(b, out))]
