"""Symbolic dimension expressions: anyshape's own canonical integer algebra.

Sits at the bottom of the IR, below ``TensorType``. A dim is either an ``int``
or a ``SymExpr``: a canonical sum of products of atoms with integer
coefficients. Atoms are symbols (named dims, always integers >= 0) and compound
terms ``floordiv(a, b)``, ``mod(a, b)``, ``max(...)``, ``min(...)`` whose
arguments are themselves canonical. Because the form is canonical, equal
polynomials are structurally equal: ``s0*768 == s0*12*64`` holds by ``==``.

Division follows Python's floor semantics (as torch's ``FloorDiv``/``Mod`` do).
Simplification uses only facts that hold for every integer value of every
symbol, plus the standing assumption that symbols are >= 0; anything that needs
more (ranges, equalities) belongs to ``constraints.ConstraintStore``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Monomial = tuple  # tuple[tuple[Atom, int], ...] sorted by atom key


@dataclass(frozen=True)
class Compound:
    """A non-polynomial atom: floordiv, mod, max or min of canonical expressions."""

    kind: str
    args: tuple[SymExpr, ...]
    key: tuple = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "key", (1, self.kind, tuple(a.key for a in self.args)))

    @property
    def nonneg(self) -> bool:
        if self.kind == "floordiv":
            return self.args[0].nonneg and self.args[1].nonneg
        if self.kind == "mod":
            return self.args[1].is_constant and self.args[1].constant_value > 0
        if self.kind == "max":
            return any(a.nonneg for a in self.args)
        return all(a.nonneg for a in self.args)  # min


def _atom_key(atom) -> tuple:
    return (0, atom) if isinstance(atom, str) else atom.key


def _monomial_key(m: Monomial) -> tuple:
    # Powers are part of the key: s0**2*s1 and s0*s1**2 must sort apart.
    return tuple((_atom_key(a), p) for a, p in m)


def _atom_nonneg(atom) -> bool:
    return True if isinstance(atom, str) else atom.nonneg


class SymExpr:
    """An immutable canonical integer expression over named symbols."""

    __slots__ = ("terms", "key", "_hash")

    def __init__(self, terms: Mapping[Monomial, int] | Iterable = ()):
        items = terms.items() if isinstance(terms, Mapping) else terms
        cleaned = [(m, c) for m, c in items if c != 0]
        if len(cleaned) > 1:
            cleaned.sort(key=lambda mc: (-sum(p for _, p in mc[0]), _monomial_key(mc[0])))
        self.terms: tuple[tuple[Monomial, int], ...] = tuple(cleaned)
        self.key = tuple((_monomial_key(m), c) for m, c in self.terms)
        # A constant compares equal to its int, so it must hash like it too.
        self._hash = hash(self.constant_value if self.is_constant else self.key)

    # --- construction -------------------------------------------------------
    # Made once each, shared (immutable): BERT-base's compile asks 10 000 symbols, 40 000 ints.
    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def symbol(name: str) -> SymExpr:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"invalid symbol name {name!r}")
        return SymExpr({((name, 1),): 1})

    @staticmethod
    def const(value: int) -> SymExpr:
        return _constant(int(value))

    # --- queries -----------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return not self.terms or (len(self.terms) == 1 and self.terms[0][0] == ())

    @property
    def constant_value(self) -> int:
        """The value of a constant expression (raises otherwise)."""
        if not self.is_constant:
            raise ValueError(f"{self} is not a constant")
        return self.terms[0][1] if self.terms else 0

    @property
    def constant_term(self) -> int:
        for m, c in self.terms:
            if m == ():
                return c
        return 0

    @property
    def is_symbol(self) -> bool:
        if len(self.terms) != 1:
            return False
        m, c = self.terms[0]
        return c == 1 and len(m) == 1 and isinstance(m[0][0], str) and m[0][1] == 1

    @property
    def symbol_name(self) -> str:
        if not self.is_symbol:
            raise ValueError(f"{self} is not a single symbol")
        return self.terms[0][0][0][0]

    @property
    def nonneg(self) -> bool:
        """True when every value of the symbols makes this >= 0 (structural proof only)."""
        return all(c > 0 and all(_atom_nonneg(a) for a, _ in m) for m, c in self.terms)

    @property
    def free_symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for m, _ in self.terms:
            for a, _p in m:
                if isinstance(a, str):
                    out.add(a)
                else:
                    for arg in a.args:
                        out |= arg.free_symbols
        return frozenset(out)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The integer value under ``env`` (every free symbol must be bound)."""
        total = 0
        for m, c in self.terms:
            v = c
            for a, p in m:
                v *= (env[a] if isinstance(a, str) else _eval_compound(a, env)) ** p
            total += v
        return total

    def subs(self, mapping: Mapping[str, SymExpr | int]) -> SymExpr:
        """Substitute symbols by expressions (each >= 0, as symbols are), re-canonicalizing."""
        if not mapping or not (self.free_symbols & mapping.keys()):
            return self

        def symbol(a: str) -> SymExpr:
            return as_expr(mapping[a]) if a in mapping else SymExpr.symbol(a)

        def compound(a: Compound) -> SymExpr:
            return _build_compound(a.kind, [x.subs(mapping) for x in a.args])

        return self._rebuilt(symbol, compound)

    @property
    def has_compound(self) -> bool:
        """Whether any atom is a compound term (floordiv, mod, max, min)."""
        return any(not isinstance(a, str) for m, _ in self.terms for a, _ in m)

    def map_compounds(self, fn) -> SymExpr:
        """Each compound atom rebuilt from its arguments (mapped first, innermost out) and
        replaced by ``fn`` of it, re-canonicalizing: ``floordiv(16, floordiv(s, 2))``
        with ``fn`` mapping ``floordiv(s, 2)`` to 1 becomes 16. A term whose mapped
        divisor is 0 stays as it was (``floordiv(t, mod(s, 4))`` where ``mod(s, 4) == 0``:
        the size is then a term of an empty dim, never evaluated by this rewrite)."""
        if not self.has_compound:
            return self

        def compound(a: Compound) -> SymExpr:
            try:
                return fn(_build_compound(a.kind, [x.map_compounds(fn) for x in a.args]))
            except ZeroDivisionError:
                return fn(SymExpr({((a, 1),): 1}))

        return self._rebuilt(SymExpr.symbol, compound)

    def _rebuilt(self, symbol, compound) -> SymExpr:
        """This expression with each symbol atom replaced by ``symbol(name)`` and each
        compound atom by ``compound(atom)``, re-canonicalizing."""
        total = ZERO
        for m, c in self.terms:
            v = SymExpr.const(c)
            for a, p in m:
                base = symbol(a) if isinstance(a, str) else compound(a)
                for _ in range(p):
                    v = v * base
            total = total + v
        return total

    # --- arithmetic --------------------------------------------------------
    def __add__(self, other) -> SymExpr:
        other = as_expr(other)
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return SymExpr(acc)

    __radd__ = __add__

    def __neg__(self) -> SymExpr:
        return SymExpr({m: -c for m, c in self.terms})

    def __sub__(self, other) -> SymExpr:
        return self + (-as_expr(other))

    def __rsub__(self, other) -> SymExpr:
        return as_expr(other) - self

    def __mul__(self, other) -> SymExpr:
        other = as_expr(other)
        acc: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = _mul_monomials(m1, m2)
                acc[m] = acc.get(m, 0) + c1 * c2
        return SymExpr(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other) -> SymExpr:
        return floordiv(self, other)

    def __rfloordiv__(self, other) -> SymExpr:
        return floordiv(other, self)

    def __mod__(self, other) -> SymExpr:
        return mod(self, other)

    def __rmod__(self, other) -> SymExpr:
        return mod(other, self)

    # --- identity ----------------------------------------------------------
    def __eq__(self, other) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return self.is_constant and self.constant_value == other
        return isinstance(other, SymExpr) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return format_expr(self)

    __str__ = __repr__


def _mul_monomials(m1: Monomial, m2: Monomial) -> Monomial:
    if not m1:
        return m2
    if not m2:
        return m1
    acc: dict = {}
    for a, p in m1 + m2:
        acc[a] = acc.get(a, 0) + p
    return tuple(sorted(acc.items(), key=lambda ap: _atom_key(ap[0])))


@functools.lru_cache(maxsize=4096)
def _constant(value: int) -> SymExpr:
    return SymExpr({(): value})


ZERO = SymExpr()
ONE = SymExpr.const(1)


def as_expr(x) -> SymExpr:
    """An int or SymExpr as a SymExpr."""
    if isinstance(x, SymExpr):
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            import operator

            x = operator.index(x)
        except TypeError:
            raise TypeError(f"cannot use {x!r} ({type(x).__name__}) as a dim") from None
    return SymExpr.const(x)


def as_dim(x) -> int | SymExpr:
    """Normalize a dim: constant expressions become plain ints."""
    if isinstance(x, SymExpr):
        return x.constant_value if x.is_constant else x
    return int(x)


def _eval_compound(a: Compound, env: Mapping[str, int]) -> int:
    vals = [x.evaluate(env) for x in a.args]
    if a.kind == "floordiv":
        return vals[0] // vals[1]
    if a.kind == "mod":
        return vals[0] % vals[1]
    if a.kind == "max":
        return max(vals)
    return min(vals)


def _divide_monomial(m: Monomial, d: Monomial) -> Monomial | None:
    """m / d as a monomial, or None when d does not divide m."""
    acc = dict(m)
    for a, p in d:
        if acc.get(a, 0) < p:
            return None
        acc[a] -= p
        if acc[a] == 0:
            del acc[a]
    return tuple(sorted(acc.items(), key=lambda ap: _atom_key(ap[0])))


def floordiv(a, b) -> SymExpr:
    """floor(a / b), simplified where that holds for all integer symbol values."""
    a, b = as_expr(a), as_expr(b)
    if b.is_constant:
        d = b.constant_value
        if d == 0:
            raise ZeroDivisionError("symbolic floordiv by zero")
        if a.is_constant:
            return SymExpr.const(a.constant_value // d)
        if d == 1:
            return a
        if d < 0:
            return floordiv(-a, -d)
        # (d*Q + R) // d == Q + R // d for integer Q.
        q = {m: c // d for m, c in a.terms}
        r = SymExpr({m: c % d for m, c in a.terms})
        rest = ZERO if not r.terms else _floordiv_remainder(r, d)
        return SymExpr(q) + rest
    if a == b:
        return ONE
    if not a.terms:
        return ZERO
    if len(b.terms) == 1:
        bm, bc = b.terms[0]
        quotient = {}
        for m, c in a.terms:
            qm = _divide_monomial(m, bm)
            if qm is None or c % bc != 0:
                break
            quotient[qm] = c // bc
        else:
            return SymExpr(quotient)
    return _atom_expr(Compound("floordiv", (a, b)))


def _nested_floordiv(a: SymExpr) -> tuple[SymExpr, int, int] | None:
    """(y, b, c) when ``a`` is ``y // b + c`` with a constant b > 0, else None."""
    inner, c = None, 0
    for m, coeff in a.terms:
        if not m:
            c = coeff
        elif inner is None and coeff == 1 and len(m) == 1 and m[0][1] == 1:
            inner = m[0][0]
        else:
            return None
    if not isinstance(inner, Compound) or inner.kind != "floordiv":
        return None
    y, b = inner.args
    if not b.is_constant or b.constant_value <= 0:
        return None
    return y, b.constant_value, c


def _floordiv_remainder(r: SymExpr, d: int) -> SymExpr:
    # Remove the common factor of r's coefficients and d: (g*x) // (g*e) == x // e.
    g = math.gcd(d, *[c for _, c in r.terms])
    if g > 1:
        r = SymExpr({m: c // g for m, c in r.terms})
        d //= g
    if d == 1:
        return r
    # 0 <= r < d for nonneg r whose largest possible value is a constant below d.
    if r.is_constant:
        return SymExpr.const(r.constant_value // d)
    nested = _nested_floordiv(r)
    if nested is not None:  # (y // b + c) // d == (y + c*b) // (b*d) for b, d > 0
        y, b, c = nested
        return floordiv(y + c * b, b * d)
    return _atom_expr(Compound("floordiv", (r, SymExpr.const(d))))


def mod(a, b) -> SymExpr:
    """a mod b with Python sign rules (result has the sign of b)."""
    a, b = as_expr(a), as_expr(b)
    if b.is_constant:
        d = b.constant_value
        if d == 0:
            raise ZeroDivisionError("symbolic mod by zero")
        if d in (1, -1):
            return ZERO
        r = SymExpr({m: c % d for m, c in a.terms})
        if r.is_constant:
            return SymExpr.const(r.constant_value % d)
        return _atom_expr(Compound("mod", (r, b)))
    if a == b or not a.terms:
        return ZERO
    if len(b.terms) == 1 and floordiv(a, b) * b == a:
        return ZERO
    return _atom_expr(Compound("mod", (a, b)))


def sym_max(*args) -> SymExpr:
    return _build_compound("max", [as_expr(a) for a in args])


def sym_min(*args) -> SymExpr:
    return _build_compound("min", [as_expr(a) for a in args])


def _build_compound(kind: str, args: list[SymExpr]) -> SymExpr:
    if kind == "floordiv":
        return floordiv(*args)
    if kind == "mod":
        return mod(*args)
    return _minmax(kind, args)


def _minmax(kind: str, args: list[SymExpr]) -> SymExpr:
    flat: list[SymExpr] = []
    for a in args:
        if len(a.terms) == 1 and a.terms[0][1] == 1 and len(a.terms[0][0]) == 1:
            atom, p = a.terms[0][0][0]
            if p == 1 and isinstance(atom, Compound) and atom.kind == kind:
                flat.extend(atom.args)
                continue
        flat.append(a)
    pick = max if kind == "max" else min
    consts = [a.constant_value for a in flat if a.is_constant]
    rest = [a for a in flat if not a.is_constant]
    if consts:
        rest.append(SymExpr.const(pick(consts)))
    uniq: list[SymExpr] = []
    for a in rest:
        if a not in uniq:
            uniq.append(a)
    # Drop arguments dominated by another: x >= y when x - y is structurally nonneg.
    kept = []
    for i, a in enumerate(uniq):
        dominated = False
        for j, b in enumerate(uniq):
            if i == j:
                continue
            diff = (b - a) if kind == "max" else (a - b)
            if diff == 0:
                continue
            if diff.nonneg:
                dominated = True
                break
        if not dominated:
            kept.append(a)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=lambda e: e.key)
    return _atom_expr(Compound(kind, tuple(kept)))


def _atom_expr(atom: Compound) -> SymExpr:
    return SymExpr({((atom, 1),): 1})


# --- text form ---------------------------------------------------------------


def _format_atom(a) -> str:
    if isinstance(a, str):
        return a
    return f"{a.kind}({', '.join(format_expr(x) for x in a.args)})"


def format_expr(e: SymExpr | int) -> str:
    """Deterministic text: ``2*s0*s1 + s0 - 3``; parse_expr reads it back."""
    if isinstance(e, int):
        return str(e)
    if not e.terms:
        return "0"
    parts: list[str] = []
    for i, (m, c) in enumerate(e.terms):
        factors = [_format_atom(a) + (f"**{p}" if p > 1 else "") for a, p in m]
        mag = abs(c)
        body = "*".join(([str(mag)] if mag != 1 or not factors else []) + factors)
        if i == 0:
            parts.append(("-" if c < 0 else "") + body)
        else:
            parts.append((" - " if c < 0 else " + ") + body)
    return "".join(parts)


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|[-+*%(),]))")


# sympy's spellings, as torch writes derived dims (an ONNX file's dim_param, for one)
_SYMPY_FUNCTIONS = {"FloorDiv": "floordiv", "Mod": "mod", "Max": "max", "Min": "min"}


def parse_expr(text: str) -> SymExpr:
    """Parse the text form written by ``format_expr`` (and sympy's function names)."""
    parser = _ExprParser(text)
    e = parser.expr()
    parser.expect_end()
    return e


class _ExprParser:
    def __init__(self, text: str, pos: int = 0):
        self.text = text
        self.pos = pos

    def peek(self) -> str | None:
        m = _TOKEN.match(self.text, self.pos)
        return m.group(m.lastindex) if m and m.lastindex else None

    def take(self) -> str:
        m = _TOKEN.match(self.text, self.pos)
        if not m or not m.lastindex:
            raise ValueError(f"bad expression at {self.text[self.pos :]!r}")
        self.pos = m.end()
        return m.group(m.lastindex)

    def expect(self, tok: str) -> None:
        got = self.take()
        if got != tok:
            raise ValueError(f"expected {tok!r}, got {got!r} in {self.text!r}")

    def expect_end(self) -> None:
        if self.text[self.pos :].strip():
            raise ValueError(f"trailing text {self.text[self.pos :]!r}")

    def expr(self) -> SymExpr:
        e = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            t = self.term()
            e = e + t if op == "+" else e - t
        return e

    def term(self) -> SymExpr:
        e = self.unary()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            u = self.unary()
            e = e * u if op == "*" else floordiv(e, u) if op == "//" else mod(e, u)
        return e

    def unary(self) -> SymExpr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        base = self.atom()
        if self.peek() == "**":
            self.take()
            p = int(self.take())
            out = ONE
            for _ in range(p):
                out = out * base
            return out
        return base

    def atom(self) -> SymExpr:
        tok = self.take()
        if tok.isdigit():
            return SymExpr.const(int(tok))
        if tok == "(":
            e = self.expr()
            self.expect(")")
            return e
        tok = _SYMPY_FUNCTIONS.get(tok, tok) if self.peek() == "(" else tok
        if tok in ("floordiv", "mod", "max", "min") and self.peek() == "(":
            self.take()
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.expect(")")
            if tok == "floordiv":
                return floordiv(*args)
            if tok == "mod":
                return mod(*args)
            return sym_max(*args) if tok == "max" else sym_min(*args)
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):
            return SymExpr.symbol(tok)
        raise ValueError(f"unexpected {tok!r} in {self.text!r}")


def format_dim(d: int | SymExpr) -> str:
    return str(d) if isinstance(d, int) else format_expr(d)


def shape_numel(shape: Iterable[int | SymExpr]) -> int | SymExpr:
    """The product of a shape's dims, as an int when static."""
    out = ONE
    for d in shape:
        out = out * as_expr(d)
    return as_dim(out)
