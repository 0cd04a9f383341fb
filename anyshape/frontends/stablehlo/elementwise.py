"""StableHLO and CHLO elementwise ops: one rule family of the StableHLO frontend.

Sits under ``lower.py`` beside ``shape_ops.py`` and ``compute_ops.py``. Each op
maps onto the IR op of the same meaning (integer ``divide`` truncates and
``remainder`` takes the dividend's sign in both). Operands of the same shape
but different symbols are guarded equal (``values.ValueLowering.broadcast_all``);
CHLO's ``broadcast_*`` ops (TensorFlow's lowering) broadcast NumPy-style.

Integer scalars whose contents are dims (``known``) fold instead of becoming
tensor code: ``b * s`` of two ``get_dimension_size`` results is the dim ``b*s``,
and a ``compare`` of dims is a ``fact`` a ``shape_assertion`` turns into a guard.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.symbolic import as_dim, as_expr, floordiv, mod, sym_max, sym_min
from ..values import Value
from .context import LowerCtx, OpView, rule
from .dialect_ops import fact_value

UNARY = {
    "exponential": "exp",
    "log": "log",
    "log_plus_one": "log1p",
    "exponential_minus_one": "expm1",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "sine": "sin",
    "cosine": "cos",
    "tan": "tan",
    "tanh": "tanh",
    "logistic": "sigmoid",
    "negate": "neg",
    "abs": "abs",
    "floor": "floor",
    "ceil": "ceil",
    "round_nearest_even": "round",
    "sign": "sign",
    "not": "bitwise_not",
}
CHLO_UNARY = {
    "erf": "erf",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
}
BINARY = {
    "add": "add",
    "subtract": "sub",
    "multiply": "mul",
    "divide": "div",
    "remainder": "rem",
    "power": "pow",
    "maximum": "max",
    "minimum": "min",
    "and": "and",
    "or": "or",
    "xor": "xor",
    "shift_left": "shl",
    "shift_right_arithmetic": "shr",
    "atan2": "atan2",
}
DIRECTIONS = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}


def _fold(op: OpView, fn) -> list[Value] | None:
    """``fn`` over the elements of known integer operands, or None if any is not known."""
    dims = [v.dims() for v in op.operands]
    if any(d is None for d in dims) or not op.operands:
        return None
    v0 = op.operands[0]
    if any(v.shape != v0.shape for v in op.operands):
        return None
    out = tuple(as_dim(fn(*(as_expr(x) for x in xs))) for xs in zip(*dims))
    return [Value.of_known(out, op.result_dtype(), scalar=v0.rank == 0)]


def _floordiv_dims(a, b):
    if as_expr(a).nonneg and as_expr(b).nonneg:
        return floordiv(a, b)
    raise _NotFoldable


def _mod_dims(a, b):
    if as_expr(a).nonneg and as_expr(b).nonneg:
        return mod(a, b)
    raise _NotFoldable


class _NotFoldable(Exception):
    """Integer arithmetic on dims whose sign is unknown: left as tensor code."""


_FOLDS = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": _floordiv_dims,
    "remainder": _mod_dims,
    "maximum": lambda a, b: sym_max(a, b),
    "minimum": lambda a, b: sym_min(a, b),
}


@rule(*("stablehlo." + n for n in UNARY), *("chlo." + n for n in CHLO_UNARY))
def _unary(ctx: LowerCtx, op: OpView) -> list[Value]:
    short = op.name.split(".", 1)[1]
    if op.name == "stablehlo.negate":
        folded = _fold(op, lambda a: -a)
        if folded:
            return folded
    ir_op = (CHLO_UNARY if op.name.startswith("chlo.") else UNARY)[short]
    x = ctx.node(op.operands[0])
    if ir_op == "bitwise_not" and x.dtype is DType.b8:
        return [Value.of_node(ctx.op("xor", x, ctx.full(True, x.shape, DType.b8)))]
    return [Value.of_node(ctx.op(ir_op, x))]


@rule(*("stablehlo." + n for n in BINARY))
def _binary(ctx: LowerCtx, op: OpView) -> list[Value]:
    short = op.name.split(".", 1)[1]
    if short in _FOLDS:
        try:
            folded = _fold(op, _FOLDS[short])
        except _NotFoldable:
            folded = None
        if folded:
            return folded
    a, b = ctx.broadcast_all([ctx.node(v) for v in op.operands], op.name)
    if short in ("shift_left", "shift_right_arithmetic"):
        return [Value.of_node(_shift(ctx, short, a, b))]
    return [Value.of_node(ctx.op(BINARY[short], a, b))]


_UNSIGNED = {DType.i8: DType.u8, DType.i16: DType.u16, DType.i32: DType.u32, DType.i64: DType.u64}


def _shift(ctx: LowerCtx, kind: str, a, b):
    """StableHLO's shifts: a count outside [0, bits) gives 0 (left, logical) or the sign
    fill (arithmetic), where C++'s shift would be undefined."""
    bits = 8 * a.dtype.itemsize
    wide = ctx.op(
        "or",
        ctx.op("lt", b, ctx.full(0, b.shape, b.dtype)),
        ctx.op("ge", b, ctx.full(bits, b.shape, b.dtype)),
    )
    safe = ctx.op("select", wide, ctx.full(0, b.shape, b.dtype), b)
    zero = ctx.full(0, a.shape, a.dtype)
    if kind == "shift_left":
        return ctx.op("select", wide, zero, ctx.op("shl", a, safe))
    if kind == "shift_right_arithmetic":
        fill = ctx.op("shr", a, ctx.full(bits - 1, b.shape, b.dtype))
        return ctx.op("select", wide, fill, ctx.op("shr", a, safe))
    u = _UNSIGNED.get(a.dtype, a.dtype)  # logical: the bits as unsigned
    out = ctx.cast(ctx.op("shr", ctx.cast(a, u), ctx.cast(safe, u)), a.dtype)
    return ctx.op("select", wide, zero, out)


@rule("stablehlo.shift_right_logical")
def _shift_right_logical(ctx: LowerCtx, op: OpView) -> list[Value]:
    a, b = ctx.broadcast_all([ctx.node(v) for v in op.operands], op.name)
    return [Value.of_node(_shift(ctx, "shift_right_logical", a, b))]


@rule(*("chlo.broadcast_" + n for n in BINARY), "chlo.broadcast_compare")
def _chlo_broadcast(ctx: LowerCtx, op: OpView) -> list[Value]:
    short = op.name[len("chlo.broadcast_") :]
    a, b = (ctx.node(v) for v in op.operands)
    if op.has("broadcast_dimensions"):
        dims = op.ints("broadcast_dimensions")
        lo, hi = (a, b) if a.rank <= b.rank else (b, a)
        if tuple(dims) != tuple(range(hi.rank - lo.rank, hi.rank)):
            raise UnsupportedError(f"broadcast_dimensions {list(dims)} (only trailing ones)")
    a, b = ctx.broadcast_all([a, b], op.name)
    if short == "compare":
        direction = DIRECTIONS[op.enum("comparison_direction")]
        return [Value.of_node(ctx.op(direction, a, b))]
    return [Value.of_node(ctx.op(BINARY[short], a, b))]


@rule("stablehlo.compare")
def _compare(ctx: LowerCtx, op: OpView) -> list[Value]:
    direction = op.enum("comparison_direction")
    if direction not in DIRECTIONS:
        raise UnsupportedError(f"comparison direction {direction}")
    a, b = op.operands
    da, db = a.dims(), b.dims()
    if da is not None and db is not None and a.rank == 0 and b.rank == 0:
        x, y = as_dim(da[0]), as_dim(db[0])
        if isinstance(x, int) and isinstance(y, int):
            value = {"EQ": x == y, "NE": x != y, "LT": x < y, "LE": x <= y}.get(direction)
            value = {"GT": x > y, "GE": x >= y}.get(direction, value)
            return [Value.of_const(np.array(value))]
        return [fact_value(ctx, direction, x, y)]
    if op.has("compare_type") and op.enum("compare_type") == "TOTALORDER":
        raise UnsupportedError("compare with TOTALORDER (NaN ordering) is not supported")
    x, y = ctx.broadcast_all([ctx.node(a), ctx.node(b)], op.name)
    return [Value.of_node(ctx.op(DIRECTIONS[direction], x, y))]


@rule("stablehlo.select")
def _select(ctx: LowerCtx, op: OpView) -> list[Value]:
    pred, a, b = op.operands
    if pred.const is not None and pred.const.size == 1 and pred.rank == 0:
        return [a if bool(pred.const) else b]
    x, y = ctx.broadcast_all([ctx.node(a), ctx.node(b)], op.name)
    p = ctx.node(pred)
    p = ctx.broadcast_to(p, x.shape) if p.rank == 0 else ctx.broadcast_all([p, x], op.name)[0]
    return [Value.of_node(ctx.op("select", p, x, y))]


@rule("stablehlo.clamp")
def _clamp(ctx: LowerCtx, op: OpView) -> list[Value]:
    lo, x, hi = (ctx.node(v) for v in op.operands)
    lo = ctx.broadcast_to(lo, x.shape) if lo.rank == 0 else lo
    hi = ctx.broadcast_to(hi, x.shape) if hi.rank == 0 else hi
    return [Value.of_node(ctx.op("min", ctx.op("max", x, lo), hi))]


@rule("stablehlo.convert")
def _convert(ctx: LowerCtx, op: OpView) -> list[Value]:
    (x,) = op.operands
    dtype = op.result_dtype()
    dims = x.dims()
    if dims is not None and dtype.is_int and not dtype.is_bool:
        return [Value.of_known(dims, dtype, scalar=x.rank == 0)]
    if x.const is not None and x.const.size <= 64:
        return [Value.of_const(x.const.astype(dtype.to_numpy()))]
    return [Value.of_node(ctx.cast(ctx.node(x), dtype))]


@rule("stablehlo.is_finite")
def _is_finite(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    bad = ctx.op("or", ctx.op("isnan", x), ctx.op("isinf", x))
    return [Value.of_node(ctx.op("xor", bad, ctx.full(True, x.shape, DType.b8)))]


@rule("stablehlo.round_nearest_afz")
def _round_afz(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    t = ctx.op("trunc", x)
    away = ctx.op("ge", ctx.op("abs", ctx.op("sub", x, t)), ctx.full(0.5, x.shape, x.dtype))
    return [Value.of_node(ctx.op("select", away, ctx.op("add", t, ctx.op("sign", x)), t))]


@rule("stablehlo.cbrt")
def _cbrt(ctx: LowerCtx, op: OpView) -> list[Value]:
    x = ctx.node(op.operands[0])
    third = ctx.full(1.0 / 3.0, x.shape, x.dtype)
    mag = ctx.op("pow", ctx.op("abs", x), third)
    return [Value.of_node(ctx.op("mul", ctx.op("sign", x), mag))]
