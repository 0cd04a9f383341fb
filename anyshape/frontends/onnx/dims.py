"""ONNX ``dim_param`` strings as symbolic dims: the first step of the ONNX frontend.

Sits between the reader (which hands over each graph input's declared shape) and
the lowering (which sees every dim as ``int | SymExpr``). A ``dim_param`` is
either a plain name (``"batch"``) or, as torch's exporter writes derived dims,
a sympy-style expression over names (``"s1 + s2"``, ``"4*s1 + 4*s2"``,
``"(s0 + 1)//2"``, ``"Max(s0, s1)"``). Expressions are read by a small
tokenizer and recursive-descent parser (never ``eval``): integers, names,
``+ - * //``, parentheses, and the functions ``FloorDiv``, ``Mod``, ``Max`` and
``Min``. Anything else (``"batch size"``, ``"seq-len"`` whose parts are not
names of other dims) is an opaque name, turned into a valid symbol.

A dim with neither ``dim_value`` nor ``dim_param`` gets a fresh symbol of its
own (``unk0``, ``unk1``, ...), so two unnamed dims never have to agree.
"""

from __future__ import annotations

import re

from ...ir.symbolic import SymExpr, as_dim, floordiv, mod, sym_max, sym_min

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*(),]))")
_FUNCTIONS = {"FloorDiv": 2, "Mod": 2, "Max": None, "Min": None, "floordiv": 2, "mod": 2}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DimParseError(ValueError):
    """A ``dim_param`` is not an expression this parser reads."""


def tokenize(text: str) -> list[str]:
    """The tokens of ``text``; raises ``DimParseError`` on any other character."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or not m.lastindex:
            raise DimParseError(f"unexpected {text[pos:]!r} in dim expression {text!r}")
        tokens.append(m.group(m.lastindex))
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+' | '-') term)*; term := unary (('*' | '//') unary)*;
    unary := '-' unary | atom; atom := INT | NAME | NAME '(' args ')' | '(' expr ')'."""

    def __init__(self, text: str, symbol_of):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.symbol_of = symbol_of

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise DimParseError(f"dim expression {self.text!r} ends too early")
        self.pos += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.take()
        if got != tok:
            raise DimParseError(f"expected {tok!r}, got {got!r} in dim expression {self.text!r}")

    def parse(self) -> SymExpr:
        e = self.expr()
        if self.peek() is not None:
            raise DimParseError(f"trailing {self.peek()!r} in dim expression {self.text!r}")
        return e

    def expr(self) -> SymExpr:
        e = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            t = self.term()
            e = e + t if op == "+" else e - t
        return e

    def term(self) -> SymExpr:
        e = self.unary()
        while self.peek() in ("*", "//"):
            op = self.take()
            u = self.unary()
            e = e * u if op == "*" else floordiv(e, u)
        return e

    def unary(self) -> SymExpr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.atom()

    def atom(self) -> SymExpr:
        tok = self.take()
        if tok.isdigit():
            return SymExpr.const(int(tok))
        if tok == "(":
            e = self.expr()
            self.expect(")")
            return e
        if _IDENT.fullmatch(tok):
            if self.peek() == "(":
                return self.call(tok)
            return self.symbol_of(tok)
        raise DimParseError(f"unexpected {tok!r} in dim expression {self.text!r}")

    def call(self, name: str) -> SymExpr:
        if name not in _FUNCTIONS:
            raise DimParseError(f"unknown function {name!r} in dim expression {self.text!r}")
        self.expect("(")
        args = [self.expr()]
        while self.peek() == ",":
            self.take()
            args.append(self.expr())
        self.expect(")")
        arity = _FUNCTIONS[name]
        if arity is not None and len(args) != arity:
            raise DimParseError(f"{name} takes {arity} arguments in {self.text!r}")
        if name in ("FloorDiv", "floordiv"):
            return floordiv(*args)
        if name in ("Mod", "mod"):
            return mod(*args)
        return sym_max(*args) if name == "Max" else sym_min(*args)


def symbol_name(text: str) -> str:
    """A valid symbol name for an opaque ``dim_param`` (other characters become ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text.strip()) or "dim"
    return name if _IDENT.fullmatch(name) else "d_" + name


def parse_dim_expr(text: str) -> SymExpr:
    """Parse a ``dim_param`` expression; every name becomes a symbol of that name."""
    return _Parser(text, SymExpr.symbol).parse()


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
    "tokenize",
]
