"""The op table: every IR primitive, declared once with its type rule and traits.

Sits at the heart of the IR. Frontends lower to these ops, the reference
interpreter and each backend register an implementation per op in their own
tables, and a test asserts every table covers every op here.

Traits (``TRAITS``) say what kind of computation an op is: elementwise, a view, a
reduction... Passes and backends read them (``ops_with``) instead of listing op
names of their own.

A type rule takes the operand types, the attribute dict and the graph's
``ConstraintStore``; it returns the result type or raises ``IRTypeError``. Where
two symbolic dims must agree (elementwise operands, a matmul's contraction) the
rule asks the store to *guard* the equality: proven at compile time, or checked
in the prologue on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .constraints import ConstraintStore
from .dtypes import DType
from .symbolic import SymExpr, as_dim, as_expr, floordiv, shape_numel
from .types import TensorType


class IRTypeError(TypeError):
    """An op was built with operands or attributes its type rule rejects."""


TypeRule = Callable[[tuple[TensorType, ...], dict, ConstraintStore], TensorType]


# What each trait says about an op.
TRAITS = {
    "elementwise": "each result element reads its own index of every operand, nothing else",
    "unary": "one operand",
    "binary": "two operands",
    "commutative": "the two operands may be swapped",
    "compare": "the result is b8",
    "source": "no operands",
    "external": "a source given from outside: a call's input or a weight the graph holds",
    "generated": "a source computed from its attributes and the element's index alone",
    "view": "reads one element of its operand at an index computed from its own",
    "piecewise": "each region of the result is a different operand or a fill value",
    "indirect": "reads its operand at positions held as values in another operand",
    "scatter": "writes into a copy of its operand at positions held as values in another "
    "operand: no element of the result is computable on its own",
    "reduction": "combines the elements along some axes into one",
    "scan": "each element combines every element before it along an axis",
    "contraction": "sums products over contracted dims (matrix product, convolution)",
    "window": "each element combines a window over the operand's spatial dims",
}


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int | None  # None: variadic
    rule: TypeRule
    traits: frozenset[str]  # keys of TRAITS
    attrs: tuple[str, ...]
    doc: str


OPS: dict[str, OpDef] = {}


def _op(name: str, arity: int | None, traits: str = "", attrs: str = "", doc: str = ""):
    def register(rule: TypeRule) -> TypeRule:
        OPS[name] = OpDef(name, arity, rule, frozenset(traits.split()), tuple(attrs.split()), doc)
        return rule

    return register


def ops_with(trait: str) -> frozenset[str]:
    """The names of the ops declared with ``trait`` (a key of ``TRAITS``)."""
    if trait not in TRAITS:
        raise KeyError(f"unknown op trait {trait!r}")
    return frozenset(name for name, d in OPS.items() if trait in d.traits)


def _same_shape(types, store: ConstraintStore, what: str) -> tuple:
    shape = types[0].shape
    for t in types[1:]:
        if t.rank != len(shape):
            raise IRTypeError(f"{what}: rank mismatch {types[0]} vs {t}")
        for i, (a, b) in enumerate(zip(shape, t.shape)):
            store.guard_eq(a, b, f"{what} operands dim {i}")
    return shape


def _same_dtype(types, what: str) -> DType:
    dts = {t.dtype for t in types}
    if len(dts) != 1:
        raise IRTypeError(f"{what}: operand dtypes differ: {', '.join(map(str, types))}")
    return types[0].dtype


# --- elementwise ---------------------------------------------------------------

UNARY_FLOAT = (
    "exp log log1p expm1 sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh "
    "asinh acosh atanh erf sigmoid"
).split()
UNARY_ANY = "neg abs floor ceil round trunc sign".split()
UNARY_INT = ["bitwise_not"]
UNARY_PRED = "isnan isinf".split()
BINARY_ARITH = "add sub mul div rem pow max min".split()
BINARY_FLOAT = ["atan2"]
BINARY_BITWISE = "and or xor shl shr".split()
COMPARE = "eq ne lt le gt ge".split()


def _unary_rule(kind: str) -> TypeRule:
    def rule(types, attrs, store):
        (t,) = types
        if kind == "float" and not t.dtype.is_float:
            raise IRTypeError(f"needs a float operand, got {t}")
        if kind == "int" and t.dtype.is_float:
            raise IRTypeError(f"needs an integer or bool operand, got {t}")
        if kind == "pred":
            return t.with_dtype(DType.b8)
        return t

    return rule


def _binary_rule(kind: str, name: str) -> TypeRule:
    def rule(types, attrs, store):
        dt = _same_dtype(types, name)
        shape = _same_shape(types, store, name)
        if kind == "float" and not dt.is_float:
            raise IRTypeError(f"{name} needs float operands, got {dt}")
        if kind == "bitwise" and dt.is_float:
            raise IRTypeError(f"{name} needs integer or bool operands, got {dt}")
        return TensorType(DType.b8 if kind == "compare" else dt, shape)

    return rule


for _n in UNARY_FLOAT:
    _op(_n, 1, "elementwise unary", doc="float -> float")(_unary_rule("float"))
for _n in UNARY_ANY:
    _op(_n, 1, "elementwise unary")(_unary_rule("any"))
for _n in UNARY_INT:
    _op(_n, 1, "elementwise unary", doc="integer/bool")(_unary_rule("int"))
for _n in UNARY_PRED:
    _op(_n, 1, "elementwise unary", doc="-> b8")(_unary_rule("pred"))
for _n in BINARY_ARITH:
    _traits = "elementwise binary" + (" commutative" if _n in ("add", "mul", "max", "min") else "")
    _op(_n, 2, _traits)(_binary_rule("any", _n))
for _n in BINARY_FLOAT:
    _op(_n, 2, "elementwise binary")(_binary_rule("float", _n))
for _n in BINARY_BITWISE:
    _op(_n, 2, "elementwise binary")(_binary_rule("bitwise", _n))
for _n in COMPARE:
    _op(_n, 2, "elementwise binary compare")(_binary_rule("compare", _n))


@_op("select", 3, "elementwise", doc="select(pred, on_true, on_false)")
def _select(types, attrs, store):
    pred, a, b = types
    if pred.dtype is not DType.b8:
        raise IRTypeError(f"select predicate must be b8, got {pred}")
    dt = _same_dtype((a, b), "select")
    return TensorType(dt, _same_shape(types, store, "select"))


@_op("convert", 1, "elementwise unary", attrs="dtype")
def _convert(types, attrs, store):
    return types[0].with_dtype(attrs["dtype"])


# --- sources -------------------------------------------------------------------


@_op("input", 0, "source external", attrs="name dtype shape")
def _input(types, attrs, store):
    return TensorType(attrs["dtype"], attrs["shape"])


@_op(
    "param", 0, "source external", attrs="name dtype shape", doc="a named weight held by the graph"
)
def _param(types, attrs, store):
    return TensorType(attrs["dtype"], attrs["shape"])


@_op("constant", 0, "source generated", attrs="value dtype", doc="a scalar literal, rank 0")
def _constant(types, attrs, store):
    return TensorType(attrs["dtype"], ())


@_op(
    "shape_scalar",
    0,
    "source generated",
    attrs="expr dtype",
    doc="the run-time value of a dim expression",
)
def _shape_scalar(types, attrs, store):
    return TensorType(attrs["dtype"], ())


@_op(
    "iota",
    0,
    "source generated",
    attrs="shape dim dtype",
    doc="index along `dim`, broadcast to `shape`",
)
def _iota(types, attrs, store):
    if not 0 <= attrs["dim"] < len(attrs["shape"]):
        raise IRTypeError(f"iota dim {attrs['dim']} out of range for {attrs['shape']}")
    return TensorType(attrs["dtype"], attrs["shape"])


# --- shape manipulation ----------------------------------------------------------


@_op("broadcast_in_dim", 1, "view", attrs="shape dims")
def _broadcast(types, attrs, store):
    (t,) = types
    shape, dims = attrs["shape"], attrs["dims"]
    if len(dims) != t.rank or any(not 0 <= d < len(shape) for d in dims):
        raise IRTypeError(f"broadcast_in_dim dims {dims} do not fit {t} -> {shape}")
    if list(dims) != sorted(dims):
        raise IRTypeError(f"broadcast_in_dim dims {dims} must be increasing")
    for i, d in enumerate(dims):
        src = t.shape[i]
        if src == 1:
            continue
        if store.prove_eq(src, shape[d]):
            continue
        if isinstance(src, int) and isinstance(shape[d], int):
            raise IRTypeError(f"cannot broadcast dim {i} of {t} to {shape[d]}")
        # Symbolic: either src == 1 (broadcast) or src == out; decided per call.
    return TensorType(t.dtype, shape)


@_op("reshape", 1, "view", attrs="shape")
def _reshape(types, attrs, store):
    (t,) = types
    shape = attrs["shape"]
    store.guard_eq(shape_numel(t.shape), shape_numel(shape), "reshape element count")
    return TensorType(t.dtype, shape)


@_op("transpose", 1, "view", attrs="perm")
def _transpose(types, attrs, store):
    (t,) = types
    perm = attrs["perm"]
    if sorted(perm) != list(range(t.rank)):
        raise IRTypeError(f"transpose perm {perm} is not a permutation of rank {t.rank}")
    return t.with_shape(t.shape[p] for p in perm)


@_op("slice", 1, "view", attrs="start limit stride")
def _slice(types, attrs, store):
    (t,) = types
    start, limit, stride = attrs["start"], attrs["limit"], attrs["stride"]
    if not len(start) == len(limit) == len(stride) == t.rank:
        raise IRTypeError(f"slice bounds do not match rank of {t}")
    out = []
    for s, e, k in zip(start, limit, stride):
        if not isinstance(k, int) or k < 1:
            raise IRTypeError(f"slice stride must be a positive int, got {k}")
        out.append(as_dim(floordiv(as_expr(e) - as_expr(s) + (k - 1), k)))
    return t.with_shape(out)


@_op("concatenate", None, "piecewise", attrs="axis")
def _concatenate(types, attrs, store):
    axis = attrs["axis"]
    if not types:
        raise IRTypeError("concatenate needs at least one operand")
    dt = _same_dtype(types, "concatenate")
    first = types[0]
    total = as_expr(0)
    for t in types:
        if t.rank != first.rank:
            raise IRTypeError("concatenate operands differ in rank")
        for i, (a, b) in enumerate(zip(first.shape, t.shape)):
            if i != axis:
                store.guard_eq(a, b, f"concatenate operands dim {i}")
        total = total + as_expr(t.shape[axis])
    shape = list(first.shape)
    shape[axis] = as_dim(total)
    return TensorType(dt, shape)


@_op("pad", 2, "piecewise", attrs="low high", doc="pad(x, scalar value); negative amounts crop")
def _pad(types, attrs, store):
    t, v = types
    if v.rank != 0 or v.dtype != t.dtype:
        raise IRTypeError(f"pad value must be a rank-0 {t.dtype}, got {v}")
    low, high = attrs["low"], attrs["high"]
    return t.with_shape(
        as_dim(as_expr(d) + lo + hi) for d, lo, hi in zip(t.shape, low, high, strict=True)
    )


# --- indexing --------------------------------------------------------------------


@_op(
    "gather", 2, "indirect", attrs="axis", doc="x.take(indices, axis): x[:axis] + idx + x[axis+1:]"
)
def _gather(types, attrs, store):
    x, idx = types
    if not idx.dtype.is_int:
        raise IRTypeError(f"gather indices must be integers, got {idx}")
    a = attrs["axis"]
    return TensorType(x.dtype, x.shape[:a] + idx.shape + x.shape[a + 1 :])


@_op(
    "take_along_axis",
    2,
    "indirect",
    attrs="axis",
    doc="torch.gather: out[i..] = x[.., idx[i..], ..]",
)
def _take_along(types, attrs, store):
    x, idx = types
    if not idx.dtype.is_int or idx.rank != x.rank:
        raise IRTypeError(f"take_along_axis needs integer indices of rank {x.rank}, got {idx}")
    return TensorType(x.dtype, idx.shape)


SCATTER_MODES = ("add", "set")


@_op(
    "scatter",
    3,
    "scatter",
    attrs="axis mode",
    doc="the inverse of gather: scatter(base, indices, updates) is base with, at every "
    "position p of updates, out[p[:axis] + (indices[p[axis:axis+k]],) + p[axis+k:]] "
    "+= (mode add) or = (mode set) updates[p], k = indices.rank; updates has the shape "
    "base[:axis] + indices + base[axis+1:]; an index outside [0, base.shape[axis]) is "
    "a run-time error; with mode set, of duplicate indices the last update in "
    "row-major order over updates wins",
)
def _scatter(types, attrs, store):
    base, idx, upd = types
    a, mode = attrs["axis"], attrs["mode"]
    if not idx.dtype.is_int:
        raise IRTypeError(f"scatter indices must be integers, got {idx}")
    if not isinstance(a, int) or not 0 <= a < base.rank:
        raise IRTypeError(f"scatter axis {a} out of range for {base}")
    if mode not in SCATTER_MODES:
        raise IRTypeError(f"unknown scatter mode {mode!r} (one of {', '.join(SCATTER_MODES)})")
    if upd.dtype != base.dtype:
        raise IRTypeError(f"scatter updates must be {base.dtype} like the base, got {upd}")
    want = base.shape[:a] + idx.shape + base.shape[a + 1 :]
    if upd.rank != len(want):
        raise IRTypeError(f"scatter updates must have rank {len(want)}, got {upd}")
    # Every static mismatch is refused before any dim is guarded: no guard left behind.
    dims = [(as_expr(u), as_expr(w)) for u, w in zip(upd.shape, want)]
    for i, (u, w) in enumerate(dims):
        if store.prove_ne(u, w):
            raise ValueError(f"scatter updates dim {i}: {u} == {w} can never hold")
    for i, (u, w) in enumerate(dims):
        store.guard_eq(u, w, f"scatter updates dim {i}")
    return base


# --- reductions ------------------------------------------------------------------

REDUCE_KINDS = ("sum", "prod", "max", "min", "any", "all")


@_op("reduce", 1, "reduction", attrs="kind axes")
def _reduce(types, attrs, store):
    (t,) = types
    if attrs["kind"] not in REDUCE_KINDS:
        raise IRTypeError(f"unknown reduce kind {attrs['kind']!r}")
    axes = attrs["axes"]
    if any(not 0 <= a < t.rank for a in axes) or len(set(axes)) != len(axes):
        raise IRTypeError(f"reduce axes {axes} invalid for {t}")
    dt = DType.b8 if attrs["kind"] in ("any", "all") else t.dtype
    return TensorType(dt, [d for i, d in enumerate(t.shape) if i not in axes])


@_op("argreduce", 1, "reduction", attrs="kind axis", doc="argmax/argmin -> i64, first index wins")
def _argreduce(types, attrs, store):
    (t,) = types
    a = attrs["axis"]
    if attrs["kind"] not in ("argmax", "argmin") or not 0 <= a < t.rank:
        raise IRTypeError(f"bad argreduce {attrs} for {t}")
    return TensorType(DType.i64, t.shape[:a] + t.shape[a + 1 :])


@_op("cumulative", 1, "scan", attrs="kind axis", doc="inclusive scan (sum or prod) along axis")
def _cumulative(types, attrs, store):
    (t,) = types
    if attrs["kind"] not in ("sum", "prod") or not 0 <= attrs["axis"] < t.rank:
        raise IRTypeError(f"bad cumulative {attrs} for {t}")
    return t


# --- contractions and windows ------------------------------------------------------


@_op("dot", 2, "contraction", doc="batched matmul: [..., M, K] x [..., K, N] -> [..., M, N]")
def _dot(types, attrs, store):
    a, b = types
    dt = _same_dtype(types, "dot")
    if a.rank < 2 or a.rank != b.rank:
        raise IRTypeError(f"dot needs equal ranks >= 2, got {a} and {b}")
    for i in range(a.rank - 2):
        store.guard_eq(a.shape[i], b.shape[i], f"dot batch dim {i}")
    store.guard_eq(a.shape[-1], b.shape[-2], "dot contraction dim")
    return TensorType(dt, a.shape[:-1] + b.shape[-1:])


def _window_out(d, k, s, p, dil) -> int | SymExpr:
    return as_dim(floordiv(as_expr(d) + 2 * p - dil * (k - 1) - 1, s) + 1)


@_op(
    "convolution",
    2,
    "contraction window",
    attrs="stride padding dilation groups",
    doc="channels first: x [N, C, *spatial] -> [N, O, *spatial']; with channels_last=true "
    "x [N, *spatial, C] -> [N, *spatial', O]; weights [O, C / groups, *kernel] either way",
)
def _convolution(types, attrs, store):
    x, w = types
    dt = _same_dtype(types, "convolution")
    nsp = x.rank - 2
    last = bool(attrs.get("channels_last", False))
    if w.rank != x.rank or nsp < 1:
        raise IRTypeError(f"convolution needs input/weight of equal rank >= 3, got {x}, {w}")
    if not all(isinstance(k, int) for k in w.shape):
        raise IRTypeError(f"convolution weight must be static, got {w}")
    g = attrs["groups"]
    if g < 1 or w.shape[0] % g:
        raise IRTypeError(f"convolution output channels {w.shape[0]} not divisible by groups {g}")
    if not len(attrs["stride"]) == len(attrs["padding"]) == len(attrs["dilation"]) == nsp:
        raise IRTypeError(f"convolution stride/padding/dilation must have {nsp} entries")
    store.guard_eq(x.shape[-1 if last else 1], w.shape[1] * g, "convolution input channels")
    first = 1 if last else 2  # the first spatial dim
    spatial = [
        _window_out(
            x.shape[first + i],
            w.shape[2 + i],
            attrs["stride"][i],
            attrs["padding"][i],
            attrs["dilation"][i],
        )
        for i in range(nsp)
    ]
    if last:
        return TensorType(dt, [x.shape[0], *spatial, w.shape[0]])
    return TensorType(dt, [x.shape[0], w.shape[0], *spatial])


@_op(
    "pool",
    1,
    "window",
    attrs="kind kernel stride padding dilation count_include_pad",
    doc="windows over the trailing dims, or with channels_last=true over the dims before "
    "the last one ([N, *spatial, C])",
)
def _pool(types, attrs, store):
    (x,) = types
    k = attrs["kernel"]
    nsp = len(k)
    last = 1 if attrs.get("channels_last", False) else 0
    if attrs["kind"] not in ("max", "avg"):
        raise IRTypeError(f"unknown pool kind {attrs['kind']!r}")
    if x.rank < nsp + 1 + last:
        raise IRTypeError(f"pool over {nsp} dims needs rank >= {nsp + 1 + last}, got {x}")
    if not len(attrs["stride"]) == len(attrs["padding"]) == len(attrs["dilation"]) == nsp:
        raise IRTypeError(f"pool stride/padding/dilation must have {nsp} entries")
    first = x.rank - nsp - last  # the first spatial dim
    lead, tail = x.shape[:first], x.shape[x.rank - last :]
    spatial = [
        _window_out(
            x.shape[first + i],
            k[i],
            attrs["stride"][i],
            attrs["padding"][i],
            attrs["dilation"][i],
        )
        for i in range(nsp)
    ]
    return TensorType(x.dtype, [*lead, *spatial, *tail])


def check_op_table() -> list[str]:
    """Sanity of the table itself: the ops without a rule or with a trait ``TRAITS``
    does not define."""
    return [n for n, d in OPS.items() if d.rule is None or not d.traits <= TRAITS.keys()]
