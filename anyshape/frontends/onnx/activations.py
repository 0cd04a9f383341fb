"""ONNX activations and bitwise/integer arithmetic: Elu ... SwiGLU, Hardmax, Lp/MVN, Mod, bits.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). What it
covers, and how:

- Pointwise activations (Elu, Selu, Celu, Softplus, Softsign, ThresholdedRelu,
  HardSigmoid, HardSwish, Mish, Shrink, Swish, PRelu, SwiGLU) are each written once,
  as a ``body(k, *xs)`` over a small kit ``k`` of elementwise ops named as the IR
  names them: ``_BuildIR`` builds IR, ``_FoldNumpy`` folds constant inputs with
  NumPy, so a folded value is what the compiled code computes. f16/bf16 compute in
  f32 (``acc_dtype``); PRelu's slope broadcasts unidirectionally to X, SwiGLU's two
  inputs have one shape (symbolic dims guarded equal, never broadcast).
- Hardmax: ``argreduce`` along the axis compared with an ``iota`` (the first maximum
  wins); before opset 13 the input is coerced to 2-D at ``axis``, as Softmax's is.
- LpNormalization (p = 1 or 2; a zero norm gives 0) and MeanVarianceNormalization
  (``(x - mean) / (std + 1e-9)``, the op's function body) reduce in the acc dtype.
- Mod: ``fmod=1`` is the IR's ``rem`` (C ``fmod`` / ``%``: the dividend's sign);
  ``fmod=0`` adds the divisor where the remainder's sign differs from the divisor's
  (and a float zero takes the divisor's sign). Shape values (``known``) fold with
  symbolic dims where the divisors are positive constants.
- BitShift: ``shl``/``shr`` (arithmetic for signed types) where the amount is in
  ``0..bits-1``; elsewhere the fill ONNX specifies (-1 for a right shift of a
  negative value, else 0) instead of C's undefined behaviour.
- BitwiseAnd/Or/Xor/Not: the IR's ``and``/``or``/``xor``/``bitwise_not`` on integers.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, mod, shape_numel
from .context import LowerCtx, Value, norm_axis, rule_registry
from .nn_ops import acc_dtype

RULES, rule = rule_registry()


# --- the two kits a pointwise body runs on ------------------------------------------------

_NUMPY_OPS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "abs": np.abs,
    "exp": np.exp,
    "expm1": np.expm1,
    "log1p": np.log1p,
    "tanh": np.tanh,
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),  # as the interpreter computes it
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "select": np.where,
}


class _FoldNumpy:
    """Elementwise ops on NumPy arrays of one dtype (constants fold through it)."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype

    def __call__(self, op: str, *args):
        return np.asarray(_NUMPY_OPS[op](*args))

    def c(self, value):
        return np.asarray(value, self.dtype)


class _BuildIR:
    """The same ops as IR nodes of the shape and dtype of ``like``."""

    def __init__(self, ctx: LowerCtx, like: Node):
        self.ctx, self.shape, self.dtype = ctx, tuple(like.shape), like.dtype

    def __call__(self, op: str, *args):
        return self.ctx.op(op, *args)

    def c(self, value):
        return self.ctx.full(value, self.shape, self.dtype)


def pointwise(ctx: LowerCtx, values: list[Value], body, acc: DType) -> Value:
    """``body(k, *xs)`` computed in ``acc`` over ``values`` (each broadcastable to the
    first's shape), returned in the first's dtype; folded when every value is constant."""
    out = values[0].dtype
    if all(v.const is not None for v in values):
        with np.errstate(all="ignore"):
            y = body(_FoldNumpy(acc.to_numpy()), *[v.const.astype(acc.to_numpy()) for v in values])
        return Value.of_const(np.asarray(y).astype(out.to_numpy()))
    shape = values[0].shape
    xs = [ctx.broadcast_to(ctx.cast(ctx.node(v), acc), shape) for v in values]
    return Value.of_node(ctx.cast(body(_BuildIR(ctx, xs[0]), *xs), out))


def float_acc(v: Value, what: str) -> DType:
    if not v.dtype.is_float:
        raise UnsupportedError(f"{what}: needs a float input, got {v.dtype}")
    return acc_dtype(v.dtype)


# --- pointwise activation bodies -------------------------------------------------------------


def _elu(k, x, alpha: float):
    return k("select", k("lt", x, k.c(0)), k("mul", k.c(alpha), k("expm1", x)), x)


def _selu(k, x, alpha: float, gamma: float):
    neg = k("mul", k.c(gamma * alpha), k("expm1", x))
    return k("select", k("le", x, k.c(0)), neg, k("mul", k.c(gamma), x))


def _celu(k, x, alpha: float):
    neg = k("mul", k.c(alpha), k("expm1", k("div", x, k.c(alpha))))
    return k("add", k("max", x, k.c(0)), k("min", neg, k.c(0)))


def _softplus(k, x):
    """``log(1 + exp(x))`` as ``max(x, 0) + log1p(exp(-|x|))``: no overflow."""
    tail = k("log1p", k("exp", k("sub", k.c(0), k("abs", x))))
    return k("add", k("max", x, k.c(0)), tail)


def _softsign(k, x):
    return k("div", x, k("add", k.c(1), k("abs", x)))


def _thresholded_relu(k, x, alpha: float):
    return k("select", k("gt", x, k.c(alpha)), x, k.c(0))


def _hard_sigmoid(k, x, alpha: float, beta: float):
    y = k("add", k("mul", x, k.c(alpha)), k.c(beta))
    return k("max", k("min", y, k.c(1)), k.c(0))


def _hard_swish(k, x):
    return k("mul", x, _hard_sigmoid(k, x, 1.0 / 6.0, 0.5))


def _mish(k, x):
    return k("mul", x, k("tanh", _softplus(k, x)))


def _swish(k, x, alpha: float):
    return k("mul", x, k("sigmoid", k("mul", x, k.c(alpha))))


def _swiglu(k, a, b, alpha: float):
    return k("mul", _swish(k, a, alpha), b)


def _shrink(k, x, lambd: float, bias: float):
    high = k("select", k("gt", x, k.c(lambd)), k("sub", x, k.c(bias)), k.c(0))
    return k("select", k("lt", x, k.c(-lambd)), k("add", x, k.c(bias)), high)


def _prelu(k, x, slope):
    return k("select", k("lt", x, k.c(0)), k("mul", x, slope), x)


def float_attrs(node, defaults: dict) -> dict:
    """The node's float attributes named in ``defaults``, each with its default."""
    return {key: float(node.attr(key, d)) for key, d in defaults.items()}


# Selu's defaults, as the float32 attribute values ONNX stores.
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875

# op type -> (first opset, body, its float attributes with their defaults)
_UNARY = {
    "Elu": (1, _elu, {"alpha": 1.0}),
    "Selu": (1, _selu, {"alpha": SELU_ALPHA, "gamma": SELU_GAMMA}),
    "Celu": (12, _celu, {"alpha": 1.0}),
    "Softplus": (1, _softplus, {}),
    "Softsign": (1, _softsign, {}),
    "ThresholdedRelu": (10, _thresholded_relu, {"alpha": 1.0}),
    "HardSigmoid": (1, _hard_sigmoid, {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": (14, _hard_swish, {}),
    "Mish": (18, _mish, {}),
    "Swish": (24, _swish, {"alpha": 1.0}),
}


def _unary_rule(ctx, node, ins):
    _, body, defaults = _UNARY[node.op_type]
    attrs = float_attrs(node, defaults)
    (x,) = ins
    acc = float_acc(x, node.describe())
    return [pointwise(ctx, [x], lambda k, v: body(k, v, **attrs), acc)]


for _op_type, (_first, _, _) in _UNARY.items():
    rule(_op_type, first=_first)(_unary_rule)


@rule("Shrink", first=9)
def _shrink_rule(ctx, node, ins):
    (x,) = ins
    if x.dtype.is_bool:
        raise UnsupportedError(f"{node.describe()}: a bool input")
    attrs = float_attrs(node, {"lambd": 0.5, "bias": 0.0})
    acc = acc_dtype(x.dtype) if x.dtype.is_float else DType.f64  # float attributes, int data
    return [pointwise(ctx, [x], lambda k, v: _shrink(k, v, **attrs), acc)]


def _guard_dims(ctx: LowerCtx, dims, against, what: str) -> None:
    """Guard each dim of ``dims`` equal to the one of ``against`` (an UnsupportedError
    where they can never be equal)."""
    store = ctx.b.constraints
    for i, (d, e) in enumerate(zip(dims, against)):
        try:
            store.guard_eq(d, e, f"{what}: dim {i}")
        except ValueError as err:
            raise UnsupportedError(str(err)) from None


@rule("PRelu", first=6)
def _prelu_rule(ctx, node, ins):
    """``slope`` broadcasts unidirectionally: to X's shape, never X to the slope's."""
    x, slope = ins
    what = node.describe()
    if x.dtype.is_bool or slope.dtype != x.dtype:
        raise UnsupportedError(f"{what}: X {x.dtype} and slope {slope.dtype}")
    if node.opset < 7 and slope.rank == 1 and x.rank > 2 and slope.shape[0] != 1:
        # before opset 7 a [C] slope is per channel (axis 1), not NumPy-aligned to the end
        per_channel = (slope.shape[0],) + (1,) * (x.rank - 2)
        slope = Value.of_node(ctx.reshape(ctx.node(slope), per_channel))
    if slope.rank > x.rank:
        raise UnsupportedError(f"{what}: slope of rank {slope.rank} for X of rank {x.rank}")
    lead = x.rank - slope.rank
    kept = [(d, x.shape[lead + i]) for i, d in enumerate(slope.shape) if as_dim(d) != 1]
    _guard_dims(ctx, [d for d, _ in kept], [e for _, e in kept], f"{what}: slope vs X")
    acc = acc_dtype(x.dtype)
    return [pointwise(ctx, [x, slope], _prelu, acc)]


@rule("SwiGLU", first=28)
def _swiglu_rule(ctx, node, ins):
    """``A`` and ``B`` have one shape (no broadcasting): symbolic dims are guarded equal."""
    a, b = ins
    what = node.describe()
    if a.rank != b.rank or a.dtype != b.dtype:
        raise UnsupportedError(f"{what}: A and B differ ({a.dtype}{a.shape}, {b.dtype}{b.shape})")
    _guard_dims(ctx, b.shape, a.shape, f"{what}: B vs A")
    alpha = float(node.attr("alpha", 1.0))
    return [pointwise(ctx, [a, b], lambda k, x, y: _swiglu(k, x, y, alpha), float_acc(a, what))]


# --- Hardmax ------------------------------------------------------------------------------------


def hardmax(ctx: LowerCtx, x: Node, axis: int) -> Node:
    """1 at the first maximum along ``axis``, 0 elsewhere, in ``x``'s dtype."""
    first = ctx.op("argreduce", x, kind="argmax", axis=axis)
    pos = ctx.op("iota", shape=tuple(x.shape), dim=axis, dtype=DType.i64)
    hit = ctx.op("eq", pos, ctx.expand_back(first, x.shape, (axis,)))
    return ctx.cast(hit, x.dtype)


def _hardmax_input(ctx: LowerCtx, node, v: Value) -> Node:
    if v.rank == 0:
        raise UnsupportedError(f"{node.describe()}: Hardmax of a scalar")
    float_acc(v, node.describe())
    return ctx.node(v)


@rule("Hardmax", first=13)
def _hardmax(ctx, node, ins):
    x = _hardmax_input(ctx, node, ins[0])
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node.describe())
    return [Value.of_node(hardmax(ctx, x, axis))]


@rule("Hardmax", first=1, last=12)
def _hardmax_v1(ctx, node, ins):
    """Before opset 13 the input is coerced to 2-D at ``axis`` and each row is one set."""
    x = _hardmax_input(ctx, node, ins[0])
    axis = norm_axis(int(node.attr("axis", 1)), x.rank, node.describe())
    rows = ctx.reshape(x, (shape_numel(x.shape[:axis]), shape_numel(x.shape[axis:])))
    return [Value.of_node(ctx.reshape(hardmax(ctx, rows, 1), x.shape))]


# --- normalizations -------------------------------------------------------------------------------


@rule("LpNormalization", first=1)
def _lp_normalization(ctx, node, ins):
    what = node.describe()
    acc = float_acc(ins[0], what)
    x = ctx.node(ins[0])
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, what)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise UnsupportedError(f"{what}: p={p} (ONNX defines p = 1 or 2)")
    xs = ctx.cast(x, acc)
    if p == 1:
        norm = ctx.reduce(ctx.op("abs", xs), "sum", (axis,))
    else:
        norm = ctx.op("sqrt", ctx.reduce(ctx.op("mul", xs, xs), "sum", (axis,)))
    norm = ctx.expand_back(norm, xs.shape, (axis,))
    zero = ctx.full(0, xs.shape, acc)
    y = ctx.op("select", ctx.op("eq", norm, zero), zero, ctx.op("div", xs, norm))
    return [Value.of_node(ctx.cast(y, x.dtype))]


@rule("MeanVarianceNormalization", first=9)
def _mean_variance_normalization(ctx, node, ins):
    """``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes``, as the op's function body."""
    what = node.describe()
    acc = float_acc(ins[0], what)
    x = ctx.node(ins[0])
    axes = sorted({norm_axis(int(a), x.rank, what) for a in node.attr("axes", (0, 2, 3))})
    xs = ctx.cast(x, acc)
    d = ctx.op("sub", xs, ctx.expand_back(ctx.mean(xs, axes), xs.shape, axes))
    std = ctx.op("sqrt", ctx.mean(ctx.op("mul", d, d), axes))
    std = ctx.op("add", std, ctx.full(1e-9, std.shape, acc))
    y = ctx.op("div", d, ctx.expand_back(std, xs.shape, axes))
    return [Value.of_node(ctx.cast(y, x.dtype))]


# --- Mod ----------------------------------------------------------------------------------------------


def _is_unsigned(dt: DType) -> bool:
    return dt.is_int and dt.to_numpy().kind == "u"


def _fold_known_mod(a: Value, b: Value, fmod: int) -> Value | None:
    """``a mod b`` on shape values: each divisor a positive int and, for C's fmod,
    each dividend provably >= 0 (where both rounding modes agree)."""
    if a.known is None or b.known is None or a.rank > 1 or b.rank > 1:
        return None
    ka, kb = a.known, b.known
    if len(ka) != len(kb) and 1 not in (len(ka), len(kb)):
        return None
    n = max(len(ka), len(kb))
    ka, kb = (ka * n if len(ka) == 1 else ka), (kb * n if len(kb) == 1 else kb)
    if not all(isinstance(d, int) and d > 0 for d in kb):
        return None
    if fmod and not all(as_expr(d).nonneg for d in ka):
        return None
    dims = [mod(as_expr(x), as_expr(y)) for x, y in zip(ka, kb)]
    return Value.of_known(dims, a.dtype, scalar=a.rank == 0 and b.rank == 0)


def floor_mod_fix(ctx: LowerCtx, r: Node, b: Node) -> Node:
    """C's remainder ``r`` of ``a / b`` turned into the floor one (the sign of ``b``)."""
    zero = ctx.full(0, r.shape, r.dtype)
    differs = ctx.op("ne", ctx.op("lt", r, zero), ctx.op("lt", b, zero))
    fix = ctx.op("and", ctx.op("ne", r, zero), differs)
    y = ctx.op("select", fix, ctx.op("add", r, b), r)
    if r.dtype.is_float:  # a zero result takes the divisor's sign: |0| * sign(b)
        signed_zero = ctx.op("mul", ctx.op("abs", r), ctx.op("sign", b))
        y = ctx.op("select", ctx.op("eq", r, zero), signed_zero, y)
    return y


@rule("Mod", first=10)
def _mod(ctx, node, ins):
    a, b = ins
    what = node.describe()
    fmod = int(node.attr("fmod", 0))
    if fmod not in (0, 1):
        raise UnsupportedError(f"{what}: fmod={fmod} (0 or 1)")
    if a.dtype != b.dtype or a.dtype.is_bool:
        raise UnsupportedError(f"{what}: operands {a.dtype} and {b.dtype}")
    if a.const is not None and b.const is not None:
        with np.errstate(all="ignore"):
            out = (np.fmod if fmod else np.mod)(a.const, b.const)
        return [Value.of_const(np.asarray(out).astype(a.const.dtype))]
    known = _fold_known_mod(a, b, fmod)
    if known is not None:
        return [known]
    acc = acc_dtype(a.dtype)
    x, y = ctx.broadcast_all([ctx.cast(ctx.node(a), acc), ctx.cast(ctx.node(b), acc)], what)
    r = ctx.op("rem", x, y)
    if not fmod and not _is_unsigned(a.dtype):
        r = floor_mod_fix(ctx, r, y)
    return [Value.of_node(ctx.cast(r, a.dtype))]


# --- bitwise ops ---------------------------------------------------------------------------------------


def _int_operands(ins, what: str) -> None:
    for v in ins:
        if not v.dtype.is_int:
            raise UnsupportedError(f"{what}: needs integer operands, got {v.dtype}")
    if len({v.dtype for v in ins}) != 1:
        raise UnsupportedError(f"{what}: operand dtypes differ")


def _shift_numpy(x: np.ndarray, n: np.ndarray, left: bool) -> np.ndarray:
    """BitShift as ONNX defines it, amounts outside ``0..bits-1`` included."""
    x, n = np.broadcast_arrays(x, n)
    valid = (n >= 0) & (n < 8 * x.dtype.itemsize)
    safe = np.where(valid, n, 0).astype(x.dtype)
    shifted = np.left_shift(x, safe) if left else np.right_shift(x, safe)
    fill = np.where(x < 0, -1, 0) if not left and x.dtype.kind == "i" else 0
    return np.where(valid, shifted, fill).astype(x.dtype)


def bit_shift(ctx: LowerCtx, x: Node, n: Node, left: bool) -> Node:
    """``x << n`` or ``x >> n`` (arithmetic when signed), with ONNX's result for an
    amount outside ``0..bits-1`` (C leaves it undefined)."""
    zero = ctx.full(0, x.shape, x.dtype)
    bits = ctx.full(8 * x.dtype.itemsize, x.shape, x.dtype)
    valid = ctx.op("lt", n, bits)
    if not _is_unsigned(x.dtype):
        valid = ctx.op("and", ctx.op("ge", n, zero), valid)
    shifted = ctx.op("shl" if left else "shr", x, ctx.op("select", valid, n, zero))
    fill = zero
    if not left and not _is_unsigned(x.dtype):
        fill = ctx.op("select", ctx.op("lt", x, zero), ctx.full(-1, x.shape, x.dtype), zero)
    return ctx.op("select", valid, shifted, fill)


@rule("BitShift", first=11)
def _bitshift(ctx, node, ins):
    what = node.describe()
    _int_operands(ins, what)
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedError(f"{what}: direction {direction!r} (LEFT or RIGHT)")
    left = direction == "LEFT"
    x, n = ins
    if x.const is not None and n.const is not None:
        return [Value.of_const(_shift_numpy(x.const, n.const, left))]
    xn, nn = ctx.broadcast_all([ctx.node(x), ctx.node(n)], what)
    return [Value.of_node(bit_shift(ctx, xn, nn, left))]


_BITWISE = {
    "BitwiseAnd": ("and", np.bitwise_and),
    "BitwiseOr": ("or", np.bitwise_or),
    "BitwiseXor": ("xor", np.bitwise_xor),
}


@rule(*_BITWISE, first=18)
def _bitwise(ctx, node, ins):
    what = node.describe()
    _int_operands(ins, what)
    ir_op, fn = _BITWISE[node.op_type]
    a, b = ins
    if a.const is not None and b.const is not None:
        return [Value.of_const(np.asarray(fn(a.const, b.const)))]
    x, y = ctx.broadcast_all([ctx.node(a), ctx.node(b)], what)
    return [Value.of_node(ctx.op(ir_op, x, y))]


@rule("BitwiseNot", first=18)
def _bitwise_not(ctx, node, ins):
    _int_operands(ins, node.describe())
    (x,) = ins
    if x.const is not None:
        return [Value.of_const(np.invert(x.const))]
    return [Value.of_node(ctx.op("bitwise_not", ctx.node(x)))]
