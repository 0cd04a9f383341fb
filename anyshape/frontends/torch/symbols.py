"""Torch-to-IR conversions of sizes, dtypes and fake tensors.

Sits at the bottom of the torch frontend. Torch describes symbolic sizes with
sympy expressions inside ``SymInt``s; anyshape's core has its own algebra, so
every size crosses here exactly once: ``to_dim`` turns a SymInt / sympy
expression / int into an ``int | SymExpr``.
"""

from __future__ import annotations

import functools
import weakref
from fractions import Fraction

import torch

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.symbolic import SymExpr, as_dim, as_expr, floordiv, mod, sym_max, sym_min
from ...ir.types import TensorType

TORCH_TO_DTYPE = {
    torch.bool: DType.b8,
    torch.int8: DType.i8,
    torch.uint8: DType.u8,
    torch.int16: DType.i16,
    torch.int32: DType.i32,
    torch.int64: DType.i64,
    torch.float16: DType.f16,
    torch.bfloat16: DType.bf16,
    torch.float32: DType.f32,
    torch.float64: DType.f64,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}


def to_dtype(dt: torch.dtype) -> DType:
    try:
        return TORCH_TO_DTYPE[dt]
    except KeyError:
        raise UnsupportedError(f"dtype {dt} is not supported") from None


@functools.lru_cache(maxsize=65536)
def sympy_to_expr(e) -> SymExpr:
    """Convert a sympy expression over size symbols (as torch's ShapeEnv builds them).
    Remembered per expression (sympy's are immutable and hashed once; a model's sizes
    repeat on every node): T5-small converts about 16 000 while partitioning alone."""
    import sympy

    if isinstance(e, (int, sympy.Integer)):
        return SymExpr.const(int(e))
    if isinstance(e, sympy.Symbol):
        return SymExpr.symbol(e.name)
    if isinstance(e, sympy.Add):
        out = as_expr(0)
        for a in e.args:
            out = out + sympy_to_expr(a)
        return out
    if isinstance(e, sympy.Mul):
        out = as_expr(1)
        for a in e.args:
            out = out * sympy_to_expr(a)
        return out
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) >= 0:
        base = sympy_to_expr(e.base)
        out = as_expr(1)
        for _ in range(int(e.exp)):
            out = out * base
        return out
    name = type(e).__name__
    if name in ("TruncToInt", "FloorToInt"):
        return _scaled_size(e.args[0], e)
    args = [sympy_to_expr(a) for a in e.args] if name not in ("Rational",) else []
    if name in ("FloorDiv", "floor_divide"):
        return floordiv(args[0], args[1])
    if name == "CeilDiv" or name == "CleanDiv":
        return floordiv(args[0] + args[1] - 1, args[1]) if name == "CeilDiv" else floordiv(*args)
    if name in ("Mod", "PythonMod"):
        return mod(args[0], args[1])
    if name == "Max":
        return sym_max(*args)
    if name == "Min":
        return sym_min(*args)
    raise UnsupportedError(f"symbolic size expression {e} ({name}) is not supported")


def _scaled_size(f, whole) -> SymExpr:
    """``trunc(c * float(size))``, an upsampling's output size for scale factor ``c``,
    as ``size * p // q`` where ``p / q`` is the decimal ``c`` reads as (``repr``).

    Eager rounds ``size * c`` to double and truncates. ``c`` is ``p / q`` rounded, so
    the rounded product lies next to ``size * p / q``: on the same side of every
    integer when that is not one (its distance from one is at least ``1 / q``, the
    rounding error below ``size * c / 2**52``: so while the output size times ``q``
    stays under 2**52, outputs under 4.5e9 for ``q`` up to 10**6), and equal to it
    when it is one, unless ``c`` lies below ``p / q`` by ``2**-54`` of it or more
    (then an integer product can round down: such scales, like 0.7, are refused,
    as are long decimals like 1/3). Sizes are not negative, so trunc is floor."""
    coeff, rest = f.as_coeff_Mul()
    c = float(coeff)
    decimal = Fraction(repr(c)) if c > 0 else None
    if (
        type(rest).__name__ != "ToFloat"
        or decimal is None
        or decimal.denominator > 10**6
        or (decimal - Fraction(c)) * 2**54 >= decimal
    ):
        raise UnsupportedError(
            f"symbolic size expression {whole} is not supported (a scale factor whose "
            "double product with a size may round across an integer)"
        )
    return floordiv(sympy_to_expr(rest.args[0]) * decimal.numerator, decimal.denominator)


# Per captured graph (keyed by its ShapeEnv): sympy size expressions torch derived under
# a guard, each with the expression that holds for every size (see capture.py).
_SIZE_REWRITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_size_rewrites(shape_env, rewrites: dict) -> None:
    """Read every size of ``shape_env``'s graph with ``rewrites`` applied (sympy to sympy)."""
    if rewrites:
        _SIZE_REWRITES.setdefault(shape_env, {}).update(rewrites)


def size_rewrites(shape_env) -> dict:
    return _SIZE_REWRITES.get(shape_env, {}) if shape_env is not None else {}


def to_dim(x) -> int | SymExpr:
    """An int, SymInt or sympy expression as an IR dim."""
    if isinstance(x, torch.SymInt):
        node = x.node
        if hasattr(node, "maybe_as_int") and node.maybe_as_int() is not None:
            return int(node.maybe_as_int())
        return as_dim(sympy_to_expr(_rewritten_expr(node)))
    if isinstance(x, int):
        return x
    return as_dim(sympy_to_expr(x))


def sym_ratio(x) -> tuple[int | SymExpr, int | SymExpr] | None:
    """A symbolic float that is a ratio of sizes (``8 / (h // 8)``, ``float(h)``: torch's
    ``IntTrueDiv`` and ``ToFloat``) as (numerator, denominator) dims; None otherwise."""
    if not isinstance(x, torch.SymFloat):
        return None
    expr = _rewritten_expr(x.node)
    name = type(expr).__name__
    try:
        if name == "IntTrueDiv":
            return to_dim(expr.args[0]), to_dim(expr.args[1])
        if name == "ToFloat":
            return to_dim(expr.args[0]), 1
    except UnsupportedError:  # a size expression the IR's algebra does not take
        return None
    return None


def _rewritten_expr(node):
    """A SymNode's sympy expression with the capture's size rewrites applied."""
    rewrites = size_rewrites(getattr(node, "shape_env", None))
    return node.expr.xreplace(rewrites) if rewrites else node.expr


def to_tensor_type(t) -> TensorType:
    """A (fake) tensor's dtype and (symbolic) shape as a TensorType."""
    return TensorType(to_dtype(t.dtype), tuple(to_dim(s) for s in t.shape))
