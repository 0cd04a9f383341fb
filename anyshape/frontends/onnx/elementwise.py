"""ONNX elementwise ops: arithmetic, math, activations, comparisons, Where, Cast.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). Each
rule first tries to fold: on constants with NumPy (a weight's preprocessing, a
scale computed from a static head size), and on ``known`` integer vectors
(shape arithmetic such as ``Shape -> Mul -> Concat``) with symbolic dims.
Otherwise it builds IR: operands broadcast by ``LowerCtx.broadcast_all`` (the
policy is in ``context.py``), composite activations decomposed into
primitives. ONNX binary ops take operands of one dtype, so there is no type
promotion; integer ``Div`` truncates, as the IR's ``div`` does.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.symbolic import SymExpr, as_dim, as_expr, floordiv, sym_max, sym_min
from .context import LowerCtx, Value, rule_registry
from .reader import ir_dtype

RULES, rule = rule_registry()


# --- folding ------------------------------------------------------------------------


def _all_const(ins) -> bool:
    return all(v is None or v.const is not None for v in ins)


def _fold_const(fn, ins) -> list[Value] | None:
    if not _all_const(ins):
        return None
    with np.errstate(all="ignore"):
        out = fn(*[None if v is None else v.const for v in ins])
    return [Value.of_const(np.asarray(out))]


def _known_pair(ins) -> tuple[tuple, tuple, bool] | None:
    """Both operands' elements as dims, when both are known (rank <= 1 integers)."""
    a, b = ins
    if a.known is None or b.known is None or a.rank > 1 or b.rank > 1:
        return None
    ka, kb = a.known, b.known
    if len(ka) != len(kb):
        if len(ka) == 1:
            ka = ka * len(kb)
        elif len(kb) == 1:
            kb = kb * len(ka)
        else:
            return None
    return ka, kb, a.rank == 0 and b.rank == 0


def _fold_known(op, ins, dtype: DType) -> list[Value] | None:
    pair = _known_pair(ins)
    if pair is None:
        return None
    ka, kb, scalar = pair
    try:
        dims = [op(as_expr(x), as_expr(y)) for x, y in zip(ka, kb)]
    except (ZeroDivisionError, ValueError):
        return None
    if any(d is None for d in dims):
        return None
    return [Value.of_known(dims, dtype, scalar=scalar)]


def _trunc_div(a: SymExpr, b: SymExpr):
    if a.is_constant and b.is_constant:
        x, y = a.constant_value, b.constant_value
        q = abs(x) // abs(y)
        return q if (x >= 0) == (y >= 0) else -q
    if b.is_constant and b.constant_value > 0 and a.nonneg:
        return floordiv(a, b)
    if a.nonneg and b.nonneg:
        return floordiv(a, b)  # shape arithmetic: sizes are >= 0
    return None


def _decide_eq(a: SymExpr, b: SymExpr) -> bool | None:
    d = as_expr(a) - as_expr(b)
    if d.is_constant:
        return d.constant_value == 0
    if d.nonneg and d.constant_term > 0:
        return False
    if (-d).nonneg and (-d).constant_term > 0:
        return False
    if as_expr(a).nonneg and as_expr(b).is_constant and as_expr(b).constant_value < 0:
        return False
    if as_expr(b).nonneg and as_expr(a).is_constant and as_expr(a).constant_value < 0:
        return False
    return None


# --- binary arithmetic ------------------------------------------------------------------

_NUMPY_BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Max": np.maximum,
    "Min": np.minimum,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
}
_IR_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Max": "max",
    "Min": "min",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
    "Equal": "eq",
    "Less": "lt",
    "Greater": "gt",
    "LessOrEqual": "le",
    "GreaterOrEqual": "ge",
}
_KNOWN_BINARY = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _trunc_div,
    "Max": lambda a, b: as_expr(sym_max(a, b)),
    "Min": lambda a, b: as_expr(sym_min(a, b)),
}


def _numpy_div(a, b):
    if a.dtype.kind in "iu":
        q = np.abs(a) // np.abs(b)
        return np.where((a >= 0) == (b >= 0), q, -q).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _need_input_beside_known(ctx: LowerCtx, a: Value, b: Value, what: str) -> None:
    """Shape arithmetic with a graph input (``Max(Shape(x), target)``): its value is a
    shape too, so ask for it (``NeedsInputValue``) rather than compute with shapes."""
    for known, other in ((a, b), (b, a)):
        if known.known is not None and other.input_name is not None and other.rank <= 1:
            if other.dtype.is_int:
                ctx.known_of(other, what)


def binary(ctx: LowerCtx, op_type: str, a: Value, b: Value, what: str) -> Value:
    """``a <op> b`` with NumPy broadcasting, folded when both are known."""
    fn = _numpy_div if op_type == "Div" else _NUMPY_BINARY.get(op_type)
    folded = _fold_const(lambda x, y: fn(x, y), [a, b]) if fn is not None else None
    if folded is None and op_type in _KNOWN_BINARY:
        _need_input_beside_known(ctx, a, b, what)
        folded = _fold_known(_KNOWN_BINARY[op_type], [a, b], a.dtype)
    if folded is None and op_type == "Equal":
        folded = _fold_known(_decide_eq, [a, b], DType.b8)
        if folded is not None:
            v = folded[0]
            if v.known is not None and all(isinstance(k, int) for k in v.known):
                arr = np.array(v.known, dtype=bool).reshape(v.shape)
                folded = [Value.of_const(arr)]
    if folded is not None:
        return folded[0]
    x, y = ctx.node(a), ctx.node(b)
    if x.dtype != y.dtype:
        raise UnsupportedError(f"{what}: operand dtypes differ ({x.dtype} and {y.dtype})")
    x, y = ctx.broadcast_all([x, y], what)
    return Value.of_node(ctx.op(_IR_BINARY[op_type], x, y))


@rule(*_IR_BINARY, first=1)
def _binary_rule(ctx, node, ins):
    if node.op_type in ("Max", "Min"):
        out = ins[0]
        for v in ins[1:]:
            out = binary(ctx, node.op_type, out, v, node.describe())
        return [out]
    return [binary(ctx, node.op_type, ins[0], ins[1], node.describe())]


@rule("Pow", first=1)
def _pow(ctx, node, ins):
    base, exponent = ins
    folded = _fold_const(lambda x, y: np.power(x, y).astype(x.dtype), ins)
    if folded:
        return folded
    x = ctx.node(base)
    if exponent.const is not None and exponent.const.size == 1:
        p = float(exponent.const.reshape(-1)[0])
        if p == 1.0:
            return [Value.of_node(x)]
        if p == 2.0:
            return [Value.of_node(ctx.op("mul", x, x))]
        if p == 0.5 and x.dtype.is_float:
            return [Value.of_node(ctx.op("sqrt", x))]
    y = ctx.cast(ctx.node(exponent), x.dtype)
    x, y = ctx.broadcast_all([x, y], node.describe())
    return [Value.of_node(ctx.op("pow", x, y))]


# --- unary math and activations ---------------------------------------------------------

_UNARY = {
    "Sqrt": ("sqrt", np.sqrt),
    "Exp": ("exp", np.exp),
    "Log": ("log", np.log),
    "Tanh": ("tanh", np.tanh),
    "Neg": ("neg", np.negative),
    "Abs": ("abs", np.abs),
    "Floor": ("floor", np.floor),
    "Ceil": ("ceil", np.ceil),
    "Sin": ("sin", np.sin),
    "Cos": ("cos", np.cos),
    "Sign": ("sign", np.sign),
    "Tan": ("tan", np.tan),
    "Asin": ("asin", np.arcsin),
    "Acos": ("acos", np.arccos),
    "Atan": ("atan", np.arctan),
    "Sinh": ("sinh", np.sinh),
    "Cosh": ("cosh", np.cosh),
    "Asinh": ("asinh", np.arcsinh),
    "Acosh": ("acosh", np.arccosh),
    "Atanh": ("atanh", np.arctanh),
    "Round": ("round", np.round),  # half to even, as np.round and nearbyint
}


@rule(*_UNARY, first=1)
def _unary(ctx, node, ins):
    ir_name, fn = _UNARY[node.op_type]
    folded = _fold_const(lambda x: fn(x).astype(x.dtype), ins)
    if folded:
        return folded
    (v,) = ins
    if node.op_type == "Neg" and v.known is not None:
        return [Value.of_known([-as_expr(d) for d in v.known], v.dtype, scalar=v.rank == 0)]
    return [Value.of_node(ctx.op(ir_name, ctx.node(v)))]


@rule("IsNaN", "IsInf", first=9)
def _is_nan_inf(ctx, node, ins):
    x = ctx.node(ins[0])
    if node.op_type == "IsNaN":
        return [Value.of_node(ctx.op("isnan", x))]
    neg, pos = int(node.attr("detect_negative", 1)), int(node.attr("detect_positive", 1))
    inf = ctx.op("isinf", x)
    if neg and pos:
        return [Value.of_node(inf)]
    zero = ctx.full(0, x.shape, x.dtype)
    side = ctx.op("gt" if pos else "lt", x, zero)
    if not (neg or pos):
        return [Value.of_node(ctx.full(False, x.shape, DType.b8))]
    return [Value.of_node(ctx.op("and", inf, side))]


@rule("Sum", "Mean", first=6)
def _sum_mean(ctx, node, ins):
    out = ins[0]
    for v in ins[1:]:
        out = binary(ctx, "Add", out, v, node.describe())
    if node.op_type == "Mean" and len(ins) > 1:
        out = binary(ctx, "Div", out, Value.of_const(np.array(len(ins), out.dtype.to_numpy())), "")
    return [out]


@rule("Clip", first=1)
def _clip(ctx, node, ins):
    x = ctx.node(ins[0])
    if node.opset >= 11:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
    else:
        lo_attr, hi_attr = node.attr("min"), node.attr("max")
        lo = None if lo_attr is None else Value.of_const(np.array(lo_attr, np.float32))
        hi = None if hi_attr is None else Value.of_const(np.array(hi_attr, np.float32))
    for bound, op in ((lo, "max"), (hi, "min")):
        if bound is not None:
            b = ctx.cast(ctx.node(bound), x.dtype)
            x = ctx.op(op, x, ctx.broadcast_to(b, x.shape))
    return [Value.of_node(x)]


@rule("Erf", first=9)
def _erf(ctx, node, ins):
    return [Value.of_node(ctx.op("erf", ctx.node(ins[0])))]


@rule("Sigmoid", first=1)
def _sigmoid(ctx, node, ins):
    return [Value.of_node(ctx.op("sigmoid", ctx.node(ins[0])))]


@rule("Reciprocal", first=1)
def _reciprocal(ctx, node, ins):
    folded = _fold_const(lambda x: (1 / x).astype(x.dtype), ins)
    if folded:
        return folded
    x = ctx.node(ins[0])
    return [Value.of_node(ctx.op("div", ctx.full(1, x.shape, x.dtype), x))]


@rule("Relu", first=1)
def _relu(ctx, node, ins):
    x = ctx.node(ins[0])
    return [Value.of_node(ctx.op("max", x, ctx.full(0, x.shape, x.dtype)))]


@rule("LeakyRelu", first=1)
def _leaky_relu(ctx, node, ins):
    x = ctx.node(ins[0])
    alpha = float(node.attr("alpha", 0.01))
    zero = ctx.full(0, x.shape, x.dtype)
    scaled = ctx.op("mul", x, ctx.full(alpha, x.shape, x.dtype))
    return [Value.of_node(ctx.op("select", ctx.op("lt", x, zero), scaled, x))]


@rule("Gelu", first=20)
def _gelu(ctx, node, ins):
    x = ctx.node(ins[0])
    approximate = node.attr("approximate", "none")

    def c(v):
        return ctx.full(v, x.shape, x.dtype)

    if approximate == "tanh":
        cube = ctx.op("mul", ctx.op("mul", x, x), x)
        inner = ctx.op("add", x, ctx.op("mul", cube, c(0.044715)))
        t = ctx.op("tanh", ctx.op("mul", inner, c(math.sqrt(2.0 / math.pi))))
    elif approximate == "none":
        t = ctx.op("erf", ctx.op("mul", x, c(1.0 / math.sqrt(2.0))))
    else:
        raise UnsupportedError(f"{node.describe()}: approximate={approximate!r}")
    half_x = ctx.op("mul", x, c(0.5))
    return [Value.of_node(ctx.op("mul", half_x, ctx.op("add", t, c(1.0))))]


@rule("Not", first=1)
def _not(ctx, node, ins):
    folded = _fold_const(np.logical_not, ins)
    if folded:
        return folded
    x = ctx.node(ins[0])
    return [Value.of_node(ctx.op("eq", x, ctx.full(False, x.shape, DType.b8)))]


@rule("Identity", first=1)
def _identity(ctx, node, ins):
    return [ins[0]]


@rule("Dropout", first=1)
def _dropout(ctx, node, ins):
    x = ins[0]
    if len(ins) > 2 and ins[2] is not None:
        training = ctx.const_of(ins[2], f"{node.describe()}: training_mode")
        if bool(np.asarray(training).reshape(-1)[0]):
            raise UnsupportedError(f"{node.describe()}: training mode (random) is not compiled")
    if int(node.attr("is_test", 1)) == 0 and node.opset < 7:
        raise UnsupportedError(f"{node.describe()}: training mode (random) is not compiled")
    outs = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        outs.append(Value.of_node(ctx.full(True, x.shape, DType.b8)))
    return outs


# --- Where and Cast ----------------------------------------------------------------------


@rule("Where", first=9)
def _where(ctx, node, ins):
    cond, a, b = ins
    folded = _fold_const(np.where, ins)
    if folded:
        return [Value.of_const(folded[0].const.astype(a.const.dtype))]
    if cond.const is not None and a.known is not None and b.known is not None:
        pick = np.broadcast_to(cond.const, np.broadcast_shapes(cond.const.shape, a.shape, b.shape))
        if pick.ndim <= 1:
            ka = a.known * (pick.size if len(a.known) == 1 else 1)
            kb = b.known * (pick.size if len(b.known) == 1 else 1)
            dims = [x if p else y for p, x, y in zip(pick.reshape(-1), ka, kb)]
            return [Value.of_known(dims, a.dtype, scalar=pick.ndim == 0)]
    c, x, y = ctx.node(cond), ctx.node(a), ctx.node(b)
    c, x, y = ctx.broadcast_all([c, x, y], node.describe())
    return [Value.of_node(ctx.op("select", c, x, y))]


@rule("Cast", first=1)
def _cast(ctx, node, ins):
    (v,) = ins
    to = ir_dtype(node.attr("to"), node.describe())
    if v.const is not None:
        with np.errstate(all="ignore"):
            return [Value.of_const(v.const.astype(to.to_numpy()))]
    if v.known is not None and to.is_int:
        return [Value.of_known(v.known, to, scalar=v.rank == 0)]
    return [Value.of_node(ctx.cast(ctx.node(v), to))]


@rule("CastLike", first=15)
def _cast_like(ctx, node, ins):
    v, like = ins
    to = like.dtype
    if v.const is not None:
        return [Value.of_const(v.const.astype(to.to_numpy()))]
    if v.known is not None and to.is_int:
        return [Value.of_known(v.known, to, scalar=v.rank == 0)]
    return [Value.of_node(ctx.cast(ctx.node(v), to))]


def dims_as_ints(dims) -> list[int] | None:
    out = []
    for d in dims:
        d = as_dim(d)
        if not isinstance(d, int):
            return None
        out.append(d)
    return out
