"""torch-mlir's shape computations (``shape``, ``tensor``, ``arith`` ops): a rule family.

Sits under ``lower.py`` beside the StableHLO families. torch-mlir's StableHLO
output computes the shape operands of its dynamic ops with ops of other
dialects: ``shape.shape_of``, ``shape.broadcast``, ``tensor.dim``,
``tensor.from_elements``, ``arith.index_cast``/``muli``/``addi``..., and wraps
broadcasts in ``shape.assuming`` regions guarded by ``shape.cstr_broadcastable``
witnesses. All of it folds into known dims here: the region's body is lowered
in place and the broadcastability witness becomes the shape guards that
lowering the broadcast itself records.

Comparisons of dims (``arith.cmpi``, ``stablehlo.compare`` of known scalars)
are decided by the constraint store where it can; ``arith.select`` on one it
cannot decide takes the branch typical sizes take and guards that outcome, so a
call with sizes that would take the other branch is refused, never miscomputed.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.symbolic import as_dim, as_expr, floordiv, sym_max, sym_min
from ..values import Value
from .context import LowerCtx, OpView, rule


@rule("shape.shape_of")
def _shape_of(ctx: LowerCtx, op: OpView) -> list[Value]:
    return [Value.of_known(op.operands[0].shape, DType.i64)]


@rule("shape.const_shape")
def _const_shape(ctx: LowerCtx, op: OpView) -> list[Value]:
    return [Value.of_known(op.ints("shape"), DType.i64)]


@rule("shape.broadcast")
def _shape_broadcast(ctx: LowerCtx, op: OpView) -> list[Value]:
    shapes = [ctx.known_of(v, "shape.broadcast's operand") for v in op.operands]
    return [Value.of_known(ctx.broadcast_shape(shapes, "shape.broadcast"), DType.i64)]


@rule("shape.cstr_broadcastable", "shape.cstr_eq", "shape.const_witness")
def _witness(ctx: LowerCtx, op: OpView) -> list[Value]:
    if op.name == "shape.cstr_broadcastable":
        shapes = [ctx.known_of(v, "shape.cstr_broadcastable's operand") for v in op.operands]
        ctx.broadcast_shape(shapes, "shape.cstr_broadcastable")
    return [Value.of_const(np.array(True))]


@rule("shape.assuming")
def _assuming(ctx: LowerCtx, op: OpView) -> list[Value]:
    ops, _ = op.region_body()
    return ctx.lower_region(ops)


@rule("shape.split_at")
def _split_at(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = ctx.known_of(op.operands[0], "shape.split_at's shape")
    (at,) = ctx.known_of(op.operands[1], "shape.split_at's index")
    at = at + len(dims) if at < 0 else at
    return [Value.of_known(dims[:at], DType.i64), Value.of_known(dims[at:], DType.i64)]


@rule("shape.concat")
def _shape_concat(ctx: LowerCtx, op: OpView) -> list[Value]:
    a, b = (ctx.known_of(v, "shape.concat's operand") for v in op.operands)
    return [Value.of_known(tuple(a) + tuple(b), DType.i64)]


@rule("shape.rank")
def _shape_rank(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = ctx.known_of(op.operands[0], "shape.rank's shape")
    return [Value.of_known((len(dims),), DType.i64, scalar=True)]


@rule("shape.num_elements")
def _num_elements(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = ctx.known_of(op.operands[0], "shape.num_elements' operand")
    total = as_expr(1)
    for d in dims:
        total = total * as_expr(d)
    return [Value.of_known((as_dim(total),), DType.i64, scalar=True)]


@rule("shape.get_extent")
def _get_extent(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = ctx.known_of(op.operands[0], "shape.get_extent's shape")
    (i,) = ctx.known_of(op.operands[1], "shape.get_extent's index")
    return [Value.of_known((dims[i],), DType.i64, scalar=True)]


@rule("tensor.from_elements")
def _from_elements(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = []
    for v in op.operands:
        (d,) = ctx.known_of(v, "tensor.from_elements' element")
        dims.append(d)
    dtype, shape = op.result_type()
    return [Value.of_known(dims, dtype, scalar=len(shape) == 0)]


@rule("tensor.extract")
def _extract(ctx: LowerCtx, op: OpView) -> list[Value]:
    dims = ctx.known_of(op.operands[0], "tensor.extract's tensor")
    idx = [ctx.known_of(v, "tensor.extract's index")[0] for v in op.operands[1:]]
    at = idx[0] if idx else 0
    return [Value.of_known((dims[at],), op.result_dtype(), scalar=True)]


@rule(
    "tensor.cast",
    "shape.to_extent_tensor",
    "shape.index_to_size",
    "shape.size_to_index",
    "arith.index_cast",
    "arith.index_castui",
)
def _same_contents(ctx: LowerCtx, op: OpView) -> list[Value]:
    (v,) = op.operands
    try:
        dtype, shape = op.result_type()
    except UnsupportedError:  # !shape.size, !shape.shape: the same dims
        dtype, shape = DType.i64, v.shape
    if v.known is not None or v.const is not None:
        dims = ctx.known_of(v, op.name)
        return [Value.of_known(dims, dtype, scalar=len(shape) == 0)]
    if op.name == "tensor.cast":
        return [v]
    raise UnsupportedError(f"{op.name} of a value read from tensor data")


_ARITH = {
    "arith.addi": lambda a, b: a + b,
    "arith.subi": lambda a, b: a - b,
    "arith.muli": lambda a, b: a * b,
    "arith.divsi": lambda a, b: floordiv(a, b),
    "arith.divui": lambda a, b: floordiv(a, b),
    "arith.floordivsi": lambda a, b: floordiv(a, b),
    "arith.ceildivsi": lambda a, b: -floordiv(-a, b),
    "arith.maxsi": lambda a, b: sym_max(a, b),
    "arith.minsi": lambda a, b: sym_min(a, b),
}


@rule(*_ARITH)
def _arith(ctx: LowerCtx, op: OpView) -> list[Value]:
    a, b = (ctx.known_of(v, f"{op.name}'s operand") for v in op.operands)
    if len(a) != 1 or len(b) != 1:
        raise UnsupportedError(f"{op.name} of vectors")
    x, y = as_expr(a[0]), as_expr(b[0])
    if op.name in ("arith.divsi", "arith.divui") and not (x.nonneg and y.nonneg):
        raise UnsupportedError(f"{op.name} of dims whose sign is unknown")
    out = _ARITH[op.name](x, y)
    return [Value.of_known((as_dim(out),), op.result_dtype(), scalar=True)]


_CMPI = {"0": "EQ", "1": "NE", "2": "LT", "3": "LE", "4": "GT", "5": "GE"}
_CMPI.update({"6": "LT", "7": "LE", "8": "GT", "9": "GE"})  # the unsigned predicates


@rule("arith.cmpi")
def _cmpi(ctx: LowerCtx, op: OpView) -> list[Value]:
    (a,), (b,) = (ctx.known_of(v, "arith.cmpi's operand") for v in op.operands)
    pred = str(op.attr("predicate")).split(":")[0].strip()
    direction = _CMPI.get(pred)
    if direction is None:
        raise UnsupportedError(f"arith.cmpi predicate {pred}")
    return [fact_value(ctx, direction, as_expr(a), as_expr(b))]


def fact_value(ctx: LowerCtx, direction: str, a, b) -> Value:
    """A comparison of dims: a constant when the constraint store decides it, else a fact."""
    store = ctx.b.constraints
    a, b = as_expr(a), as_expr(b)
    lo, hi = (b, a) if direction in ("GE", "GT") else (a, b)
    decided = None
    if direction in ("EQ", "NE"):
        if store.prove_eq(a, b):
            decided = direction == "EQ"
        elif store.prove_ne(a, b):
            decided = direction == "NE"
    elif direction in ("GE", "LE"):
        decided = True if store.prove_le(lo, hi) else False if store.prove_lt(hi, lo) else None
    else:
        decided = True if store.prove_lt(lo, hi) else False if store.prove_le(hi, lo) else None
    if decided is not None:
        return Value.of_const(np.array(decided))
    v = Value(DType.b8, ())
    v.fact = (direction, a, b)
    return v


@rule("arith.select")
def _arith_select(ctx: LowerCtx, op: OpView) -> list[Value]:
    pred, a, b = op.operands
    if pred.const is not None and pred.const.size == 1:
        return [a if bool(pred.const.reshape(-1)[0]) else b]
    if pred.fact is None:
        raise UnsupportedError("arith.select on a value read from tensor data")
    return [a if guard_fact(ctx, pred.fact, op.describe()) else b]


def guard_fact(ctx: LowerCtx, fact: tuple, where: str) -> bool:
    """A comparison of dims the shape facts do not decide: its outcome at typical sizes
    (every symbol 7), kept by a guard that every call checks."""
    direction, a, b = fact
    env = {s: 7 for s in a.free_symbols | b.free_symbols}
    x, y = a.evaluate(env), b.evaluate(env)
    outcome = {"EQ": x == y, "NE": x != y, "LT": x < y, "LE": x <= y, "GT": x > y, "GE": x >= y}
    store, reason = ctx.b.constraints, f"{where} branches on {a} {direction} {b}"
    if x == y:
        store.guard_eq(a, b, reason)
    elif x < y:
        store.guard_le(a + 1, b, reason)
    else:
        store.guard_le(b + 1, a, reason)
    return outcome[direction]
