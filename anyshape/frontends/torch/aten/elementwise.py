"""Lowering rules for elementwise ATen ops: math, compare, logic, where, casts, activations.

Part of the torch frontend's lowering table (see ``lowering.py``). Each rule
follows torch's type promotion (``ctx.elementwise_dtypes``): operands are cast
to the computation dtype, broadcast to the output shape torch recorded, and the
result cast to torch's result dtype. Composite activations (gelu, silu,
hardswish, ...) decompose into IR primitives here.
"""

from __future__ import annotations

import math

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ....ir.graph import Node
from ..lowering import LowerCtx, lowering
from ..symbols import to_dtype

aten = torch.ops.aten


def _binary(ctx: LowerCtx, op: str, a, b, kind: str = "DEFAULT"):
    comp, res = ctx.elementwise_dtypes(kind)
    out = ctx.out_type()
    x = ctx.op(op, ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape))
    return ctx.cast(x, out.dtype if op not in _COMPARE else DType.b8)


_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}


def _register_binary(op: str, *targets, kind: str = "DEFAULT"):
    @lowering(*targets)
    def rule(ctx, a, b, alpha=1):
        return _binary(ctx, op, a, _scaled(ctx, b, alpha), kind)

    return rule


def _scaled(ctx, x, alpha):
    """x * alpha for the alpha argument of add/sub/rsub."""
    if alpha == 1:
        return x
    if isinstance(x, Node):
        return ctx.op("mul", x, ctx.full(alpha, x.shape, x.dtype))
    return x * alpha


_register_binary("add", aten.add.Tensor, aten.add.Scalar)
_register_binary("sub", aten.sub.Tensor, aten.sub.Scalar)
_register_binary("mul", aten.mul.Tensor, aten.mul.Scalar)
_register_binary("max", aten.maximum.default, aten.max.other)
_register_binary("min", aten.minimum.default, aten.min.other)
_register_binary("atan2", aten.atan2.default, kind="INT_TO_FLOAT")
for _op, _name in [
    ("eq", "eq"),
    ("ne", "ne"),
    ("lt", "lt"),
    ("le", "le"),
    ("gt", "gt"),
    ("ge", "ge"),
]:
    _register_binary(
        _op, getattr(aten, _name).Tensor, getattr(aten, _name).Scalar, kind="ALWAYS_BOOL"
    )


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, a, b, alpha=1):
    return _binary(ctx, "sub", b, _scaled(ctx, a, alpha))


@lowering(
    aten.div.Tensor,
    aten.div.Scalar,
    aten.div.Tensor_mode,
    aten.div.Scalar_mode,
    aten.true_divide.Tensor,
    aten.true_divide.Scalar,
)
def _div(ctx, a, b, rounding_mode=None):
    out = ctx.out_type()
    if rounding_mode is None:
        comp, _ = ctx.elementwise_dtypes("INT_TO_FLOAT")
        x = ctx.op("div", ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape))
        return ctx.cast(x, out.dtype)
    comp, _ = ctx.elementwise_dtypes("DEFAULT")
    x, y = ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape)
    if rounding_mode == "trunc":
        q = ctx.op("div", x, y)
        return ctx.cast(ctx.op("trunc", q) if comp.is_float else q, out.dtype)
    return ctx.cast(_floor_divide(ctx, x, y), out.dtype)


def _floor_divide(ctx, x, y):
    if x.dtype.is_float:
        return ctx.op("floor", ctx.op("div", x, y))
    q = ctx.op("div", x, y)  # truncates
    r = ctx.op("rem", x, y)
    zero = ctx.full(0, x.shape, x.dtype)
    adjust = ctx.op(
        "and", ctx.op("ne", r, zero), ctx.op("ne", ctx.op("lt", r, zero), ctx.op("lt", y, zero))
    )
    return ctx.op("sub", q, ctx.cast(adjust, x.dtype))


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_div(ctx, a, b):
    comp, _ = ctx.elementwise_dtypes("DEFAULT")
    out = ctx.out_type()
    return ctx.cast(
        _floor_divide(ctx, ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape)),
        out.dtype,
    )


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.fmod.Tensor, aten.fmod.Scalar)
def _remainder(ctx, a, b):
    comp, _ = ctx.elementwise_dtypes("DEFAULT")
    out = ctx.out_type()
    x, y = ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape)
    r = ctx.op("rem", x, y)  # C fmod: sign of the dividend
    if ctx.node.target in (aten.fmod.Tensor, aten.fmod.Scalar):
        return ctx.cast(r, out.dtype)
    zero = ctx.full(0, out.shape, comp)
    fix = ctx.op(
        "and", ctx.op("ne", r, zero), ctx.op("ne", ctx.op("lt", r, zero), ctx.op("lt", y, zero))
    )
    return ctx.cast(ctx.op("select", fix, ctx.op("add", r, y), r), out.dtype)


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(ctx, a, b):
    comp, _ = ctx.elementwise_dtypes("DEFAULT")
    out = ctx.out_type()
    if isinstance(b, (int, float)) and not isinstance(b, bool) and comp.is_float:
        x = ctx.operand(a, comp, out.shape)
        if b == 2:
            return ctx.cast(ctx.op("mul", x, x), out.dtype)
        if b == 0.5:
            return ctx.cast(ctx.op("sqrt", x), out.dtype)
        if b == 1:
            return ctx.cast(x, out.dtype)
    if not comp.is_float and isinstance(b, int) and b < 0:
        raise UnsupportedError("integer pow with a negative exponent")
    x, y = ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape)
    return ctx.cast(ctx.op("pow", x, y), out.dtype)


@lowering(
    aten.bitwise_and.Tensor,
    aten.bitwise_and.Scalar,
    aten.logical_and.default,
    aten.__and__.Tensor,  # `mask_a & mask_b` as exported, before decomposition
)
def _and(ctx, a, b):
    return _logic(ctx, "and", a, b)


@lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.logical_or.default)
def _or(ctx, a, b):
    return _logic(ctx, "or", a, b)


@lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.logical_xor.default)
def _xor(ctx, a, b):
    return _logic(ctx, "xor", a, b)


def _logic(ctx, op, a, b):
    out = ctx.out_type()
    if ctx.node.target in (
        aten.logical_and.default,
        aten.logical_or.default,
        aten.logical_xor.default,
    ):
        x = _truthy(ctx, a, out.shape)
        y = _truthy(ctx, b, out.shape)
        return ctx.cast(ctx.op(op, x, y), out.dtype)
    comp, _ = ctx.elementwise_dtypes("DEFAULT")
    if comp.is_float:
        raise UnsupportedError("bitwise ops on floats")
    return ctx.cast(
        ctx.op(op, ctx.operand(a, comp, out.shape), ctx.operand(b, comp, out.shape)), out.dtype
    )


def _truthy(ctx, x, shape):
    if isinstance(x, Node):
        if x.dtype is DType.b8:
            return ctx.broadcast_to(x, shape)
        return ctx.broadcast_to(ctx.op("ne", x, ctx.full(0, x.shape, x.dtype)), shape)
    return ctx.full(bool(x), shape, DType.b8)


@lowering(aten.logical_not.default)
def _logical_not(ctx, x):
    out = ctx.out_type()
    return ctx.cast(
        ctx.op("eq", _truthy(ctx, x, x.shape), ctx.full(False, x.shape, DType.b8)), out.dtype
    )


@lowering(aten.bitwise_not.default)
def _bitwise_not(ctx, x):
    if x.dtype is DType.b8:
        return ctx.op("eq", x, ctx.full(False, x.shape, DType.b8))
    return ctx.op("bitwise_not", x)


# --- unary math ---------------------------------------------------------------------

_FLOAT_UNARY = {
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.log1p.default: "log1p",
    aten.expm1.default: "expm1",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.tan.default: "tan",
    aten.asin.default: "asin",
    aten.acos.default: "acos",
    aten.atan.default: "atan",
    aten.sinh.default: "sinh",
    aten.cosh.default: "cosh",
    aten.tanh.default: "tanh",
    aten.asinh.default: "asinh",
    aten.acosh.default: "acosh",
    aten.atanh.default: "atanh",
    aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid",
}


def _float_unary_rule(op):
    def rule(ctx, x):
        comp, res = ctx.elementwise_dtypes("INT_TO_FLOAT")
        return ctx.cast(ctx.op(op, ctx.cast(x, comp)), res)

    return rule


for _t, _op in _FLOAT_UNARY.items():
    lowering(_t)(_float_unary_rule(_op))


@lowering(aten.neg.default, aten.abs.default, aten.sign.default)
def _any_unary(ctx, x):
    op = {aten.neg.default: "neg", aten.abs.default: "abs", aten.sign.default: "sign"}[
        ctx.node.target
    ]
    if x.dtype is DType.b8:
        if op == "neg":
            raise UnsupportedError("negation of a bool tensor")
        return x
    return ctx.op(op, x)


@lowering(aten.floor.default, aten.ceil.default, aten.trunc.default, aten.round.default)
def _rounding(ctx, x):
    op = {
        aten.floor.default: "floor",
        aten.ceil.default: "ceil",
        aten.trunc.default: "trunc",
        aten.round.default: "round",
    }[ctx.node.target]
    return ctx.op(op, x) if x.dtype.is_float else x


@lowering(aten.reciprocal.default)
def _reciprocal(ctx, x):
    comp, res = ctx.elementwise_dtypes("INT_TO_FLOAT")
    x = ctx.cast(x, comp)
    return ctx.cast(ctx.op("div", ctx.full(1.0, x.shape, comp), x), res)


@lowering(aten.log2.default, aten.log10.default, aten.exp2.default)
def _log_base(ctx, x):
    comp, res = ctx.elementwise_dtypes("INT_TO_FLOAT")
    x = ctx.cast(x, comp)
    t = ctx.node.target
    if t is aten.exp2.default:
        y = ctx.op("exp", ctx.op("mul", x, ctx.full(math.log(2.0), x.shape, comp)))
    else:
        base = 2.0 if t is aten.log2.default else 10.0
        y = ctx.op("div", ctx.op("log", x), ctx.full(math.log(base), x.shape, comp))
    return ctx.cast(y, res)


@lowering(aten.isnan.default, aten.isinf.default)
def _isnan(ctx, x):
    if not x.dtype.is_float:
        return ctx.full(False, x.shape, DType.b8)
    return ctx.op("isnan" if ctx.node.target is aten.isnan.default else "isinf", x)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, cond, a, b):
    out = ctx.out_type()
    pred = _truthy(ctx, cond, out.shape)
    return ctx.op(
        "select", pred, ctx.operand(a, out.dtype, out.shape), ctx.operand(b, out.dtype, out.shape)
    )


@lowering(
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.clamp_min.default,
    aten.clamp_max.default,
    aten.clamp_min.Tensor,
    aten.clamp_max.Tensor,
)
def _clamp(ctx, x, lo=None, hi=None):
    t = ctx.node.target
    if t in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    out = ctx.out_type()
    comp = out.dtype
    y = ctx.operand(x, comp, out.shape)
    if lo is not None:
        y = ctx.op("max", y, ctx.operand(lo, comp, out.shape))
    if hi is not None:
        y = ctx.op("min", y, ctx.operand(hi, comp, out.shape))
    return y


# --- casts --------------------------------------------------------------------------


@lowering(
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    torch.ops.prims.convert_element_type.default,
)
def _to_copy(ctx, x, *args, **kwargs):
    out = ctx.out_type()
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        raise UnsupportedError(f"copy to device {dev}")
    return ctx.cast(x, out.dtype)


@lowering(
    aten.clone.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.detach.default,
    aten.contiguous.default,
)
def _identity(ctx, x, **kwargs):
    return x


@lowering(aten.type_as.default)
def _type_as(ctx, x, other):
    return ctx.cast(x, other.dtype)


# --- activations ----------------------------------------------------------------------


def _float_in(ctx, x):
    comp, res = (
        ctx.elementwise_dtypes("INT_TO_FLOAT")
        if not x.dtype.is_float
        else ((DType.f32 if x.dtype in (DType.f16, DType.bf16) else x.dtype), x.dtype)
    )
    return ctx.cast(x, comp), res


def _c(ctx, v, like):
    return ctx.full(v, like.shape, like.dtype)


@lowering(aten.relu.default)
def _relu(ctx, x):
    return ctx.op("max", x, _c(ctx, 0, x)) if x.dtype is not DType.b8 else x


@lowering(aten.gelu.default)
def _gelu(ctx, x, approximate="none"):
    x, res = _float_in(ctx, x)
    half = ctx.op("mul", x, _c(ctx, 0.5, x))
    if approximate == "tanh":
        inner = ctx.op(
            "mul",
            _c(ctx, math.sqrt(2.0 / math.pi), x),
            ctx.op(
                "add", x, ctx.op("mul", _c(ctx, 0.044715, x), ctx.op("mul", x, ctx.op("mul", x, x)))
            ),
        )
        y = ctx.op("mul", half, ctx.op("add", _c(ctx, 1.0, x), ctx.op("tanh", inner)))
    else:
        e = ctx.op("erf", ctx.op("mul", x, _c(ctx, 1.0 / math.sqrt(2.0), x)))
        y = ctx.op("mul", half, ctx.op("add", _c(ctx, 1.0, x), e))
    return ctx.cast(y, res)


@lowering(aten.silu.default)
def _silu(ctx, x):
    x, res = _float_in(ctx, x)
    return ctx.cast(ctx.op("mul", x, ctx.op("sigmoid", x)), res)


@lowering(aten.mish.default)
def _mish(ctx, x):
    x, res = _float_in(ctx, x)
    return ctx.cast(ctx.op("mul", x, ctx.op("tanh", _softplus_core(ctx, x, 1.0, 20.0))), res)


def _softplus_core(ctx, x, beta, threshold):
    bx = ctx.op("mul", x, _c(ctx, beta, x))
    soft = ctx.op("div", ctx.op("log1p", ctx.op("exp", bx)), _c(ctx, beta, x))
    return ctx.op("select", ctx.op("gt", bx, _c(ctx, threshold, x)), x, soft)


@lowering(aten.softplus.default)
def _softplus(ctx, x, beta=1, threshold=20):
    x, res = _float_in(ctx, x)
    return ctx.cast(_softplus_core(ctx, x, beta, threshold), res)


@lowering(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return ctx.op("min", ctx.op("max", x, _c(ctx, min_val, x)), _c(ctx, max_val, x))


@lowering(aten.hardsigmoid.default)
def _hardsigmoid(ctx, x):
    x, res = _float_in(ctx, x)
    y = ctx.op(
        "div",
        ctx.op(
            "min",
            ctx.op("max", ctx.op("add", x, _c(ctx, 3.0, x)), _c(ctx, 0.0, x)),
            _c(ctx, 6.0, x),
        ),
        _c(ctx, 6.0, x),
    )
    return ctx.cast(y, res)


@lowering(aten.hardswish.default)
def _hardswish(ctx, x):
    x, res = _float_in(ctx, x)
    r6 = ctx.op(
        "min", ctx.op("max", ctx.op("add", x, _c(ctx, 3.0, x)), _c(ctx, 0.0, x)), _c(ctx, 6.0, x)
    )
    return ctx.cast(ctx.op("div", ctx.op("mul", x, r6), _c(ctx, 6.0, x)), res)


@lowering(aten.leaky_relu.default)
def _leaky_relu(ctx, x, negative_slope=0.01):
    neg = ctx.op("mul", x, _c(ctx, negative_slope, x))
    return ctx.op("select", ctx.op("gt", x, _c(ctx, 0, x)), x, neg)


@lowering(aten.elu.default)
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    x, res = _float_in(ctx, x)
    neg = ctx.op(
        "mul", _c(ctx, alpha, x), ctx.op("expm1", ctx.op("mul", x, _c(ctx, input_scale, x)))
    )
    y = ctx.op("select", ctx.op("gt", x, _c(ctx, 0, x)), x, neg)
    return ctx.cast(ctx.op("mul", y, _c(ctx, scale, x)), res)


@lowering(aten.logit.default)
def _logit(ctx, x, eps=None):
    x, res = _float_in(ctx, x)
    if eps is not None:
        x = ctx.op("min", ctx.op("max", x, _c(ctx, eps, x)), _c(ctx, 1.0 - eps, x))
    return ctx.cast(ctx.op("log", ctx.op("div", x, ctx.op("sub", _c(ctx, 1.0, x), x))), res)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx, a, b, w):
    out = ctx.out_type()
    x, y = ctx.operand(a, out.dtype, out.shape), ctx.operand(b, out.dtype, out.shape)
    wt = ctx.operand(w, out.dtype, out.shape)
    return ctx.op("add", x, ctx.op("mul", wt, ctx.op("sub", y, x)))


@lowering(aten.addcmul.default, aten.addcdiv.default)
def _addc(ctx, x, t1, t2, value=1):
    out = ctx.out_type()
    a, b, c = (ctx.operand(v, out.dtype, out.shape) for v in (x, t1, t2))
    prod = ctx.op("mul" if ctx.node.target is aten.addcmul.default else "div", b, c)
    return ctx.op("add", a, ctx.op("mul", prod, ctx.full(value, out.shape, out.dtype)))


def torch_dtype_arg(dt) -> DType:
    return to_dtype(dt)
