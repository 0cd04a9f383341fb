"""StableHLO's data-movement and shape ops: one rule family of the StableHLO frontend.

Sits under ``lower.py`` beside ``elementwise.py`` and ``compute_ops.py``:
constants, ``get_dimension_size``, reshapes, broadcasts, iotas, concatenation,
slices, pads, transposes, reverses, and ``custom_call @shape_assertion``. The
dynamic forms (``dynamic_reshape``, ``dynamic_broadcast_in_dim``,
``dynamic_iota``, ``real_dynamic_slice``, ``dynamic_pad``) read their shape
operands as known dims. ``dynamic_slice`` and ``dynamic_update_slice`` take
start indices computed from dims as slice bounds, and start indices read from
tensor data as a gather (or a scatter) of the clamped window, as StableHLO
clamps them.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, sym_max, sym_min
from ..values import Value
from .context import LowerCtx, OpView, dense_array, rule


@rule("stablehlo.constant", "arith.constant")
def _constant(ctx: LowerCtx, op: OpView) -> list[Value]:
    array = dense_array(op.attr("value"), op.program) if op.name != "arith.constant" else None
    if array is None:
        a = op.attr("value")
        dtype, dims = op.result_type()
        array = _arith_constant(a, dtype, dims, op)
    return [Value.of_const(array)]


def _arith_constant(a, dtype: DType, dims: tuple, op: OpView) -> np.ndarray:
    text = str(a)
    if text.startswith("dense"):
        return dense_array(a, op.program)
    value = text.split(":")[0].strip()
    if dtype.is_bool:
        return np.array(value == "true")
    number = float(value) if dtype.is_float else int(value)
    return np.full(dims, number, dtype=dtype.to_numpy())


@rule("stablehlo.get_dimension_size", "tensor.dim")
def _dimension_size(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = op.operands[0]
    if op.name == "tensor.dim":
        (dim,) = ctx.known_of(op.operands[1], "tensor.dim's index")
    else:
        dim = op.int_attr("dimension")
    if not isinstance(as_dim(dim), int) or not 0 <= dim < x.rank:
        raise UnsupportedError(f"dimension {dim} of a rank-{x.rank} tensor")
    return [Value.of_known((x.shape[dim],), op.result_dtype(), scalar=True)]


@rule("stablehlo.custom_call")
def _custom_call(ctx: LowerCtx, op: OpView) -> list[Value]:
    target = op.string("call_target_name")
    if target == "shape_assertion":
        _assert_shapes(ctx, op)
        return []
    if target == "Sharding" and len(op.operands) == 1:
        return [op.operands[0]]
    raise UnsupportedError(f"custom_call @{target} is not supported")


def _assert_shapes(ctx: LowerCtx, op: OpView) -> None:
    pred = op.operands[0]
    message = op.string("error_message", "shape assertion")
    message = message.split(" Using the following")[0].split(" Please see")[0]
    if pred.const is not None:
        if not bool(np.all(pred.const)):
            raise UnsupportedError(f"a shape assertion that always fails: {message}")
        return
    if pred.fact is None:
        raise UnsupportedError(
            "a shape_assertion whose predicate depends on tensor data (only comparisons of "
            "dims are checked in the prologue)"
        )
    direction, a, b = pred.fact
    store = ctx.b.constraints
    if direction == "EQ":
        store.guard_eq(a, b, message)
    elif direction in ("GE", "GT", "LE", "LT"):
        lo, hi = (b, a) if direction in ("GE", "GT") else (a, b)
        if direction in ("GT", "LT"):
            lo = lo + 1
        if hi.is_symbol and lo.is_constant:
            store.add_symbol(hi.symbol_name, lo=lo.constant_value)
        store.guard_le(lo, hi, message)
    else:
        raise UnsupportedError(f"a shape assertion of {direction} is not supported")


@rule("stablehlo.reshape", "stablehlo.dynamic_reshape")
def _reshape(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = op.operands[0]
    shape = ctx.result_shape(op, 1)
    if x.const is not None and x.const.dtype.kind not in "iu" and x.const.size <= 64:
        return [Value.of_const(x.const.reshape(shape))]
    dims = x.dims() if x.const is None or x.const.size <= 64 else None
    if dims is not None and len(shape) <= 1:
        return [Value.of_known(dims, x.dtype, scalar=len(shape) == 0)]
    return [Value.of_node(ctx.reshape(ctx.node(x), shape))]


@rule("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim")
def _broadcast_in_dim(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = op.operands[0]
    shape = ctx.result_shape(op, 1)
    dims = op.ints("broadcast_dimensions")
    if x.known is not None and len(shape) == 1 and x.rank <= 1 and isinstance(shape[0], int):
        if len(x.known) == shape[0]:
            return [Value.of_known(x.known, x.dtype)]
        if len(x.known) == 1:
            return [Value.of_known(x.known * shape[0], x.dtype)]
    return [Value.of_node(broadcast_in_dim(ctx, ctx.node(x), shape, dims))]


def broadcast_in_dim(ctx: LowerCtx, x: Node, shape, dims) -> Node:
    """StableHLO's broadcast_in_dim: ``dims`` may be in any order (a transpose first)."""
    dims = tuple(dims)
    if len(dims) != x.rank:
        raise UnsupportedError(f"broadcast_dimensions {list(dims)} for a rank-{x.rank} operand")
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    x = ctx.transpose(x, order)
    dims = tuple(dims[i] for i in order)
    shape = tuple(as_dim(d) for d in shape)
    if tuple(x.shape) == shape and dims == tuple(range(len(shape))):
        return x
    return ctx.op("broadcast_in_dim", x, shape=shape, dims=dims)


@rule("stablehlo.broadcast")
def _broadcast(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    sizes = op.ints("broadcast_sizes")
    shape = tuple(sizes) + tuple(x.shape)
    return [Value.of_node(broadcast_in_dim(ctx, x, shape, range(len(sizes), len(shape))))]


@rule("stablehlo.iota", "stablehlo.dynamic_iota")
def _iota(ctx: LowerCtx, op: OpView) -> list[Value]:
    shape = ctx.result_shape(op, 0)
    dim = op.int_attr("iota_dimension")
    return [Value.of_node(ctx.op("iota", shape=tuple(shape), dim=dim, dtype=op.result_dtype()))]


@rule("stablehlo.concatenate")
def _concatenate(ctx: LowerCtx, op: OpView) -> list[Value]:
    axis = op.int_attr("dimension")
    parts = op.operands
    if axis == 0 and all(v.rank == 1 for v in parts):
        known = [v.dims() for v in parts]
        if all(k is not None for k in known):
            return [Value.of_known(sum(known, ()), op.result_dtype())]
    nodes = [ctx.node(v) for v in parts]
    return [
        Value.of_node(nodes[0] if len(nodes) == 1 else ctx.op("concatenate", *nodes, axis=axis))
    ]


@rule("stablehlo.slice")
def _slice(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = op.operands[0]
    start, limit = op.ints("start_indices"), op.ints("limit_indices")
    stride = op.ints("strides", (1,) * x.rank)
    known = x.dims()
    if known is not None and x.rank == 1:
        return [Value.of_known(known[start[0] : limit[0] : stride[0]], x.dtype)]
    return [Value.of_node(_static_slice(ctx, ctx.node(x), start, limit, stride))]


def _static_slice(ctx: LowerCtx, node: Node, start, limit, stride) -> Node:
    if tuple(as_dim(s) for s in start) == (0,) * node.rank and tuple(stride) == (1,) * node.rank:
        if all(as_expr(e) == as_expr(d) for e, d in zip(limit, node.shape)):
            return node
    return ctx.op("slice", node, start=tuple(start), limit=tuple(limit), stride=tuple(stride))


@rule("stablehlo.real_dynamic_slice")
def _real_dynamic_slice(ctx: LowerCtx, op: OpView) -> list[Value]:
    """Bounds known as dims: a slice. A start read from tensor data (jax's dynamic_slice
    with symbolic shapes clamps it in tensor code) along a dim of declared static size:
    a gather of that window."""
    x = ctx.node(op.operands[0])
    starts, limits, strides = (vector_elements(ctx, v, x.rank) for v in op.operands[1:])
    _, declared = op.result_type()
    start, limit, stride, moving = [], [], [], []
    for d in range(x.rank):
        s, e, k = starts[d], limits[d], strides[d]
        if isinstance(s, Node) or isinstance(e, Node):
            if declared[d] is None or k != 1:
                raise UnsupportedError(
                    f"dim {d}: bounds read from tensor data and a result size that is not static"
                )
            moving.append((d, s, declared[d]))
            start.append(0)
            limit.append(x.shape[d])
            stride.append(1)
        elif isinstance(k, Node) or not isinstance(as_dim(k), int):
            raise UnsupportedError(f"dim {d}: a stride that is not a constant")
        else:
            start.append(s)
            limit.append(e)
            stride.append(k)
    out = _static_slice(ctx, x, start, limit, stride)
    for d, s, n in moving:
        at = s if isinstance(s, Node) else ctx.scalar(s, DType.i64)
        at = ctx.clamp_index(at, as_dim(as_expr(x.shape[d]) - n))
        out = ctx.op("gather", out, ctx.window(at, n), axis=d)
    return [Value.of_node(out)]


def vector_elements(ctx: LowerCtx, v: Value, n: int) -> list:
    """The elements of a rank-1 integer vector: dims where they are known, else scalar nodes.

    A vector built from scalars, constants and elementwise arithmetic on such vectors
    (jax clamps a slice's start vector so) keeps its known elements.
    """
    known = v.dims()
    if known is not None:
        return list(known)
    node = ctx.node(v)
    out = _elements_of(ctx, node)
    return out if out is not None else [_element(ctx, node, i) for i in range(n)]


def _element(ctx: LowerCtx, node: Node, i: int) -> Node:
    return ctx.reshape(ctx.op("slice", node, start=(i,), limit=(i + 1,), stride=(1,)), ())


_ELEMENT_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "max": lambda a, b: sym_max(a, b),
    "min": lambda a, b: sym_min(a, b),
}


def _elements_of(ctx: LowerCtx, node: Node) -> list | None:
    if node.rank != 1 or not isinstance(as_dim(node.shape[0]), int) or node.shape[0] > 16:
        return None
    if node.op == "concatenate":
        out = []
        for part in node.inputs:
            got = _elements_of(ctx, part)
            if got is None:
                return None
            out.extend(got)
        return out
    if node.op in ("reshape", "broadcast_in_dim") and node.inputs[0].rank == 0:
        return [_scalar_dim(node.inputs[0])] * node.shape[0]
    if node.op == "param" and node.attr("name") in ctx.b.params:
        return [int(x) for x in ctx.b.params[node.attr("name")].reshape(-1)]
    if node.op in _ELEMENT_OPS and node.dtype.is_int:
        a, b = (_elements_of(ctx, x) for x in node.inputs)
        if a is None or b is None:
            return None
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            if isinstance(x, Node) or isinstance(y, Node):
                out.append(_element(ctx, node, i))
            else:
                out.append(as_dim(_ELEMENT_OPS[node.op](as_expr(x), as_expr(y))))
        return out
    return None


def _scalar_dim(x: Node):
    while x.op == "convert" and x.dtype.is_int:
        x = x.inputs[0]
    if x.op == "shape_scalar":
        return x.attr("expr")
    if x.op == "constant" and isinstance(x.attr("value"), int):
        return x.attr("value")
    return x


@rule("stablehlo.transpose")
def _transpose(ctx: LowerCtx, op: OpView) -> list[Value]:
    perm = op.ints("permutation")
    return [Value.of_node(ctx.transpose(ctx.node(op.operands[0]), perm))]


@rule("stablehlo.pad", "stablehlo.dynamic_pad")
def _pad(ctx: LowerCtx, op: OpView) -> list[Value]:
    x, value = op.operands[:2]
    if op.name == "stablehlo.dynamic_pad":
        low, high, interior = (
            ctx.known_of(v, f"dynamic_pad's {what}")
            for v, what in zip(op.operands[2:], ("low", "high", "interior"))
        )
    else:
        low, high = op.ints("edge_padding_low"), op.ints("edge_padding_high")
        interior = op.ints("interior_padding", (0,) * len(low))
    if any(as_dim(i) != 0 for i in interior):
        raise UnsupportedError("interior padding is not supported")
    node, v = ctx.node(x), ctx.node(value)
    if all(as_dim(lo) == 0 for lo in low) and all(as_dim(hi) == 0 for hi in high):
        return [Value.of_node(node)]
    return [Value.of_node(ctx.op("pad", node, v, low=tuple(low), high=tuple(high)))]


@rule("stablehlo.reverse")
def _reverse(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    for axis in op.ints("dimensions"):
        n = x.shape[axis]
        last = ctx.scalar(as_dim(as_expr(n) - 1), DType.i64)
        idx = ctx.op("iota", shape=(n,), dim=0, dtype=DType.i64)
        idx = ctx.op("sub", ctx.broadcast_to(last, (n,)), idx)
        x = ctx.op("gather", x, idx, axis=axis)
    return [Value.of_node(x)]


@rule("stablehlo.optimization_barrier")
def _barrier(ctx: LowerCtx, op: OpView) -> list[Value]:
    return list(op.operands)


def _clamped_start(ctx: LowerCtx, start: Value, dim, size) -> tuple:
    """A start index clamped to ``[0, dim - size]``: a dim when known, else an i64 node."""
    k = start.dims() if start.rank == 0 else None
    hi = as_expr(dim) - as_expr(size)
    if k is not None:
        s = as_expr(k[0])
        if s.is_constant and s.constant_value <= 0:
            return as_dim(0), None
        return as_dim(sym_max(sym_min(s, hi), as_expr(0))), None
    return None, ctx.clamp_index(ctx.node(start), as_dim(hi))


@rule("stablehlo.dynamic_slice")
def _dynamic_slice(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    sizes = op.ints("slice_sizes")
    starts = [_clamped_start(ctx, s, d, n) for s, d, n in zip(op.operands[1:], x.shape, sizes)]
    start = [s if s is not None else 0 for s, _ in starts]
    limit = [
        as_dim(as_expr(s) + n) if s is not None else d
        for (s, _), n, d in zip(starts, sizes, x.shape)
    ]
    if any(as_dim(a) != 0 or as_expr(b) != as_expr(d) for a, b, d in zip(start, limit, x.shape)):
        x = ctx.op("slice", x, start=tuple(start), limit=tuple(limit), stride=(1,) * x.rank)
    for axis, ((_, node), n) in enumerate(zip(starts, sizes)):
        if node is None:
            continue
        x = ctx.op("gather", x, ctx.window(node, n), axis=axis)
    return [Value.of_node(x)]


@rule("stablehlo.dynamic_update_slice")
def _dynamic_update_slice(ctx: LowerCtx, op: OpView) -> list[Value]:
    base, update = ctx.node(op.operands[0]), ctx.node(op.operands[1])
    starts = [
        _clamped_start(ctx, s, d, n) for s, d, n in zip(op.operands[2:], base.shape, update.shape)
    ]
    if all(node is None for _, node in starts):
        low = tuple(s for s, _ in starts)
        high = tuple(
            as_dim(as_expr(d) - as_expr(s) - as_expr(n))
            for (s, _), d, n in zip(starts, base.shape, update.shape)
        )
        padded = ctx.op("pad", update, ctx.const(0, update.dtype), low=low, high=high)
        ones = ctx.full(True, update.shape, DType.b8)
        mask = ctx.op("pad", ones, ctx.const(False, DType.b8), low=low, high=high)
        return [Value.of_node(ctx.op("select", mask, padded, base))]
    moving = [i for i, (_, node) in enumerate(starts) if node is not None]
    full = [
        i
        for i in range(base.rank)
        if i not in moving and as_expr(update.shape[i]) == as_expr(base.shape[i])
    ]
    if len(moving) != 1 or len(full) != base.rank - 1:
        raise UnsupportedError(
            "a dynamic_update_slice with start indices read from tensor data along more than "
            "one dim, or not covering the other dims whole"
        )
    (axis,) = moving
    idx = ctx.window(starts[axis][1], update.shape[axis])
    return [Value.of_node(ctx.op("scatter", base, idx, update, axis=axis, mode="set"))]
