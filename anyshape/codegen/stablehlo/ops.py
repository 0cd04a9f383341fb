"""StableHLO rules for the elementwise, source and shape ops of the IR.

Sits beside ``index_ops`` and ``reduce_ops`` under the driver (``emit``), on the
``Builder``. A rule takes the builder, the node and the SSA names of its
operands, emits the operations computing the node and returns the name of the
result, whose type is exactly ``tensor_type(node.dtype, node.shape)``. Static
shapes use the static ops; a symbolic dim in a result (or a symbolic size
attribute) switches to the dynamic ops: ``dynamic_broadcast_in_dim``,
``dynamic_reshape``, ``dynamic_iota``, ``real_dynamic_slice``, ``dynamic_pad``.
Elementwise ops carry ``?`` in their types. ``param`` and ``input`` belong to
the driver, which owns the function's arguments and the weights.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.ops import BINARY_ARITH, BINARY_BITWISE, COMPARE, UNARY_ANY, UNARY_FLOAT, UNARY_PRED
from .builder import (
    I64,
    Builder,
    compare_type,
    int_list,
    is_signed,
    is_static,
    is_unsigned,
    tensor_type,
)

Rule = Callable[[Builder, Node, list[str]], str]
B8 = DType.b8

# IR op -> the StableHLO (or CHLO, the dialect StableHLO's producers use for
# these functions) op computing it on floats.
FLOAT_UNARY = {
    "exp": "stablehlo.exponential",
    "log": "stablehlo.log",
    "log1p": "stablehlo.log_plus_one",
    "expm1": "stablehlo.exponential_minus_one",
    "sqrt": "stablehlo.sqrt",
    "rsqrt": "stablehlo.rsqrt",
    "sin": "stablehlo.sine",
    "cos": "stablehlo.cosine",
    "tan": "stablehlo.tan",
    "tanh": "stablehlo.tanh",
    "sigmoid": "stablehlo.logistic",
    "asin": "chlo.asin",
    "acos": "chlo.acos",
    "sinh": "chlo.sinh",
    "cosh": "chlo.cosh",
    "asinh": "chlo.asinh",
    "acosh": "chlo.acosh",
    "atanh": "chlo.atanh",
    "erf": "chlo.erf",
}
# Ops that are the identity on integers and bools.
FLOAT_ONLY_ROUNDING = {"floor": "floor", "ceil": "ceil", "round": "round_nearest_even"}
BINARY = {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "div": "divide",  # integers: truncated, as the IR defines it
    "rem": "remainder",  # the sign of the dividend, as the IR defines it
    "max": "maximum",
    "min": "minimum",
    "atan2": "atan2",
    "and": "and",
    "or": "or",
    "xor": "xor",
    "shl": "shift_left",
}
# On bools, arithmetic is logic (NumPy's and the IR's reading of b8).
BOOL_BINARY = {"add": "or", "mul": "and", "max": "or", "min": "and"}
DIRECTIONS = {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}


def _ty(node: Node) -> str:
    return tensor_type(node.dtype, node.shape)


def _elementwise(b: Builder, opname: str, node: Node, args: list[str]) -> str:
    """``opname`` applied to operands whose types may differ only in ``?`` vs a size."""
    tout = _ty(node)
    tins = [tensor_type(i.dtype, i.shape) for i in node.inputs]
    if all(t == tout for t in tins):
        return b.op(f"{opname} {', '.join(args)} : {tout}")
    return b.op(f"{opname} {', '.join(args)} : ({', '.join(tins)}) -> {tout}")


# --- elementwise -------------------------------------------------------------------


def _float_unary(b: Builder, node: Node, args: list[str]) -> str:
    opname = FLOAT_UNARY[node.op]
    if opname.startswith("chlo."):
        (x,) = node.inputs
        return b.op(f"{opname} {args[0]} : {tensor_type(x.dtype, x.shape)} -> {_ty(node)}")
    return _elementwise(b, opname, node, args)


def _atan(b: Builder, node: Node, args: list[str]) -> str:
    one = b.splat(1.0, node.dtype, node.shape)
    return b.binary("atan2", args[0], one, _ty(node))


def _neg(b: Builder, node: Node, args: list[str]) -> str:
    if node.dtype is B8:
        raise UnsupportedError("neg is not defined on b8 (use bitwise_not)")
    return _elementwise(b, "stablehlo.negate", node, args)


def _abs(b: Builder, node: Node, args: list[str]) -> str:
    if is_unsigned(node.dtype):
        return args[0]
    return _elementwise(b, "stablehlo.abs", node, args)


def _rounding(b: Builder, node: Node, args: list[str]) -> str:
    if not node.dtype.is_float:
        return args[0]
    return _elementwise(b, f"stablehlo.{FLOAT_ONLY_ROUNDING[node.op]}", node, args)


def _trunc(b: Builder, node: Node, args: list[str]) -> str:
    if not node.dtype.is_float:
        return args[0]
    ty = _ty(node)
    # sign(x) * floor(|x|): keeps -0.0, NaN and infinities.
    magnitude = b.unary("floor", b.unary("abs", args[0], ty), ty)
    return b.binary("multiply", b.unary("sign", args[0], ty), magnitude, ty)


def _sign(b: Builder, node: Node, args: list[str]) -> str:
    if node.dtype is B8:
        raise UnsupportedError("sign is not defined on b8")
    if is_unsigned(node.dtype):
        return b.binary("minimum", args[0], b.splat(1, node.dtype, node.shape), _ty(node))
    return _elementwise(b, "stablehlo.sign", node, args)


def _bitwise_not(b: Builder, node: Node, args: list[str]) -> str:
    return _elementwise(b, "stablehlo.not", node, args)


def _isnan(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    # x != x: true for NaN only; always false for integers.
    return b.compare("NE", args[0], args[0], x.dtype, x.shape)


def _isinf(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    if not x.dtype.is_float:
        return b.compare("NE", args[0], args[0], x.dtype, x.shape)
    magnitude = b.unary("abs", args[0], tensor_type(x.dtype, x.shape))
    return b.compare("EQ", magnitude, b.splat(float("inf"), x.dtype, x.shape), x.dtype, x.shape)


def _convert(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    # Float to integer truncates toward zero and anything to bool is `x != 0`, as in the IR.
    return b.convert(args[0], x.dtype, node.dtype, node.shape)


def _binary(b: Builder, node: Node, args: list[str]) -> str:
    dtype = node.dtype
    name = BINARY.get(node.op)
    if dtype is B8 and node.op in BOOL_BINARY:
        name = BOOL_BINARY[node.op]
    elif dtype is B8 and node.op in ("sub", "div", "rem", "shl", "shr", "pow"):
        raise UnsupportedError(f"{node.op} is not defined on b8 operands (use xor, and, or)")
    if node.op == "shr":
        name = "shift_right_arithmetic" if is_signed(dtype) else "shift_right_logical"
    if node.op == "pow":
        return _pow(b, node, args)
    assert name is not None
    return _elementwise(b, f"stablehlo.{name}", node, args)


def _pow(b: Builder, node: Node, args: list[str]) -> str:
    if not is_signed(node.dtype):
        return _elementwise(b, "stablehlo.power", node, args)
    # Integer powers as the IR defines them: a negative exponent gives 1 for base 1,
    # +-1 for base -1 (by the exponent's parity) and 0 otherwise.
    dt, shape, ty = node.dtype, node.shape, _ty(node)
    base, exp = (b.refine(a, dt, x.shape, shape) for a, x in zip(args, node.inputs))
    zero, one, minus_one = (b.splat(v, dt, shape) for v in (0, 1, -1))
    negative = b.compare("LT", exp, zero, dt, shape)
    plain = b.binary("power", base, b.binary("maximum", exp, zero, ty), ty)
    odd = b.compare("NE", b.binary("remainder", exp, b.splat(2, dt, shape), ty), zero, dt, shape)
    parity = b.select(odd, minus_one, one, dt, shape)
    tiny = b.select(
        b.compare("EQ", base, minus_one, dt, shape),
        parity,
        b.select(b.compare("EQ", base, one, dt, shape), one, zero, dt, shape),
        dt,
        shape,
    )
    return b.select(negative, tiny, plain, dt, shape)


def _compare(b: Builder, node: Node, args: list[str]) -> str:
    x, y = node.inputs
    tin = [tensor_type(i.dtype, i.shape) for i in (x, y)]
    return b.op(
        f"stablehlo.compare {DIRECTIONS[node.op]}, {args[0]}, {args[1]}, "
        f"{compare_type(x.dtype)} : ({tin[0]}, {tin[1]}) -> {_ty(node)}"
    )


def _select(b: Builder, node: Node, args: list[str]) -> str:
    tins = [tensor_type(i.dtype, i.shape) for i in node.inputs]
    if tins[1] == tins[2] == _ty(node) and tins[0] == tensor_type(B8, node.shape):
        return b.op(f"stablehlo.select {', '.join(args)} : {tins[0]}, {_ty(node)}")
    return b.op(f"stablehlo.select {', '.join(args)} : ({', '.join(tins)}) -> {_ty(node)}")


# --- sources -------------------------------------------------------------------------


def _constant(b: Builder, node: Node, args: list[str]) -> str:
    return b.const(node.attr("value"), node.dtype)


def _shape_scalar(b: Builder, node: Node, args: list[str]) -> str:
    return b.convert(b.dim(node.attr("expr")), I64, node.dtype, ())


def _iota(b: Builder, node: Node, args: list[str]) -> str:
    shape, dim = node.attr("shape"), node.attr("dim")
    if node.dtype is B8:  # indices as bools: 0 is false, every other index true
        return b.convert(b.iota(I64, shape, dim), I64, B8, shape)
    return b.iota(node.dtype, shape, dim)


# --- shape manipulation ----------------------------------------------------------------


def _broadcast_in_dim(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    return b.broadcast(args[0], x.dtype, x.shape, node.attr("shape"), node.attr("dims"))


def _reshape(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    return b.reshape(args[0], x.dtype, x.shape, node.attr("shape"))


def _transpose(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    perm, tin = int_list(node.attr("perm")), tensor_type(x.dtype, x.shape)
    return b.op(f"stablehlo.transpose {args[0]}, dims = {perm} : ({tin}) -> {_ty(node)}")


def _slice(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    start, limit, stride = node.attr("start"), node.attr("limit"), node.attr("stride")
    tin = tensor_type(x.dtype, x.shape)
    if is_static(start) and is_static(limit):
        ranges = ", ".join(
            f"{s}:{e}" + (f":{k}" if k != 1 else "") for s, e, k in zip(start, limit, stride)
        )
        return b.op(f"stablehlo.slice {args[0]} [{ranges}] : ({tin}) -> {_ty(node)}")
    vec = tensor_type(I64, (x.rank,))
    operands = [b.shape(start), b.shape(limit), b.shape(stride)]
    return b.op(
        f"stablehlo.real_dynamic_slice {args[0]}, {', '.join(operands)} : "
        f"({tin}, {vec}, {vec}, {vec}) -> {_ty(node)}"
    )


def _concatenate(b: Builder, node: Node, args: list[str]) -> str:
    tins = ", ".join(tensor_type(i.dtype, i.shape) for i in node.inputs)
    axis = node.attr("axis")
    return b.op(f"stablehlo.concatenate {', '.join(args)}, dim = {axis} : ({tins}) -> {_ty(node)}")


def _pad(b: Builder, node: Node, args: list[str]) -> str:
    x, v = node.inputs
    low, high = node.attr("low"), node.attr("high")
    tin, tv = tensor_type(x.dtype, x.shape), tensor_type(v.dtype, ())
    zeros = [0] * x.rank
    if is_static(low) and is_static(high):
        # Negative amounts crop, in StableHLO as in the IR.
        return b.op(
            f"stablehlo.pad {args[0]}, {args[1]}, low = {int_list(low)}, high = {int_list(high)}, "
            f"interior = {int_list(zeros)} : ({tin}, {tv}) -> {_ty(node)}"
        )
    vec = tensor_type(I64, (x.rank,))
    operands = [b.shape(low), b.shape(high), b.shape(zeros)]
    return b.op(
        f"stablehlo.dynamic_pad {args[0]}, {args[1]}, {', '.join(operands)} : "
        f"({tin}, {tv}, {vec}, {vec}, {vec}) -> {_ty(node)}"
    )


RULES: dict[str, Rule] = {}
for _name in UNARY_FLOAT:
    RULES[_name] = _float_unary
RULES["atan"] = _atan
for _name in UNARY_ANY:
    RULES[_name] = {
        "neg": _neg,
        "abs": _abs,
        "floor": _rounding,
        "ceil": _rounding,
        "round": _rounding,
        "trunc": _trunc,
        "sign": _sign,
    }[_name]
RULES["bitwise_not"] = _bitwise_not
for _name in UNARY_PRED:
    RULES[_name] = _isnan if _name == "isnan" else _isinf
for _name in [*BINARY_ARITH, "atan2", *BINARY_BITWISE]:
    RULES[_name] = _binary
for _name in COMPARE:
    RULES[_name] = _compare
RULES.update(
    select=_select,
    convert=_convert,
    constant=_constant,
    shape_scalar=_shape_scalar,
    iota=_iota,
    broadcast_in_dim=_broadcast_in_dim,
    reshape=_reshape,
    transpose=_transpose,
    slice=_slice,
    concatenate=_concatenate,
    pad=_pad,
)
