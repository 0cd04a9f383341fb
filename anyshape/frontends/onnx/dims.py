"""ONNX ``dim_param`` strings as symbolic dims: the first step of the ONNX frontend.

Sits between the reader (which hands over each graph input's declared shape) and
the lowering (which sees every dim as ``int | SymExpr``). A ``dim_param`` is
either a plain name (``"batch"``) or, as torch's exporter writes derived dims,
a sympy-style expression over names (``"s1 + s2"``, ``"4*s1 + 4*s2"``,
``"(s0 + 1)//2"``, ``"Max(s0, s1)"``). Expressions are read by the IR's own
expression parser (``ir.symbolic.parse_expr``, never ``eval``): integers, names,
``+ - * // % **``, parentheses, and the functions ``FloorDiv``, ``Mod``, ``Max``
and ``Min``. Anything else (``"batch size"``, ``"seq-len"`` whose parts are not
names of other dims) is an opaque name, turned into a valid symbol.

A dim with neither ``dim_value`` nor ``dim_param`` gets a fresh symbol of its
own (``unk0``, ``unk1``, ...), so two unnamed dims never have to agree.
"""

from __future__ import annotations

import re

from ...ir.symbolic import SymExpr, as_dim, parse_expr

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DimParseError(ValueError):
    """A ``dim_param`` is not an expression this parser reads."""


def symbol_name(text: str) -> str:
    """A valid symbol name for an opaque ``dim_param`` (other characters become ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text.strip()) or "dim"
    return name if _IDENT.fullmatch(name) else "d_" + name


def parse_dim_expr(text: str) -> SymExpr:
    """Parse a ``dim_param`` expression with the IR's own expression parser (never
    ``eval``); every name becomes a symbol of that name."""
    try:
        return parse_expr(text)
    except (ValueError, TypeError, ZeroDivisionError) as e:
        raise DimParseError(f"dim expression {text!r}: {e}") from None


class DimNamer:
    """Turns each input dim of an ONNX graph into ``int | SymExpr``, consistently.

    The same ``dim_param`` text always gives the same dim. ``plain_names`` are the
    names used alone as a dim somewhere among the graph's inputs: an expression is
    read as one only when all its names are among them (or it is a single name),
    so an input-bound symbol exists for each name it mentions.
    """

    def __init__(self, plain_names=()):
        self.plain: set[str] = {symbol_name(n) for n in plain_names}
        self.by_text: dict[str, SymExpr] = {}
        self.used: set[str] = set()
        self._fresh = 0

    def shape(self, dims) -> tuple:
        """A TensorShapeProto's dims: values, ``dim_param`` names, fresh symbols for unnamed."""
        out = []
        for d in dims:
            if d.HasField("dim_value"):
                out.append(int(d.dim_value))
            elif d.dim_param.strip():
                out.append(self.named(d.dim_param))
            else:
                out.append(self.fresh())
        return tuple(out)

    def named(self, text: str) -> int | SymExpr:
        """The dim a ``dim_param`` names."""
        text = text.strip()
        if text in self.by_text:
            return as_dim(self.by_text[text])
        if text.lstrip("-").isdigit():
            return int(text)
        if _IDENT.fullmatch(text):
            expr = SymExpr.symbol(text)
        else:
            try:
                expr = parse_dim_expr(text)
            except (DimParseError, ValueError, ZeroDivisionError):
                expr = None
            if expr is not None and not expr.free_symbols <= self.plain:
                expr = None
            if expr is None:
                expr = SymExpr.symbol(self._unused(symbol_name(text)))
        self.by_text[text] = expr
        self.used |= expr.free_symbols
        return as_dim(expr)

    def fresh(self) -> SymExpr:
        """A new symbol for a dynamic dim with no name."""
        while True:
            name = f"unk{self._fresh}"
            self._fresh += 1
            if name not in self.used and name not in self.plain:
                self.used.add(name)
                return SymExpr.symbol(name)

    def _unused(self, name: str) -> str:
        if name not in self.used and name not in self.plain:
            return name
        k = 1
        while f"{name}_{k}" in self.used or f"{name}_{k}" in self.plain:
            k += 1
        return f"{name}_{k}"


def is_plain_name(text: str) -> bool:
    """Whether a ``dim_param`` is one name (not an expression)."""
    return bool(_IDENT.fullmatch(text.strip()))


__all__ = [
    "DimNamer",
    "DimParseError",
    "is_plain_name",
    "parse_dim_expr",
    "symbol_name",
]
