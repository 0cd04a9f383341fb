"""The shape-constraint store: what is known about symbolic dims, and three ways to ask.

Sits beside the graph IR (each ``Graph`` owns one store). Facts come from op
semantics (elementwise operands, matmul contraction, concat) and from frontends
(torch.export range constraints, Dynamo guards):

- equalities between expressions, kept in a union-find whose representative is
  the simplest member (a constant if the class has one);
- product equalities (``prod(a) == prod(b)``, what reshape relates);
- per-symbol ranges ``[lo, hi]`` (``hi=None`` is unbounded), plus divisibility.

Questions come in three kinds (see docs/architecture.md):

- ``prove_*``: True only when the facts imply it; never adds a runtime check.
- ``guard_*``: if not provable, records a ``Guard`` that the generated prologue
  checks on every call, and from then on assumes it.
- ``hint_*``: a best guess from example values, for heuristics only.

Every symbol is an integer >= 0. Inconclusive proofs answer False, never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .symbolic import ZERO, SymExpr, _divide_monomial, as_expr, format_expr, shape_numel


@dataclass(frozen=True)
class Guard:
    """A runtime check the prologue evaluates: ``lhs <op> rhs`` with op in eq/ne/le."""

    op: str
    lhs: SymExpr
    rhs: SymExpr
    reason: str

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether the guard holds at ``env``; not where a side divides by 0 there (a
        remainder or quotient by a size that is 0 decides nothing)."""
        try:
            a, b = self.lhs.evaluate(env), self.rhs.evaluate(env)
        except ZeroDivisionError:
            return False
        return a == b if self.op == "eq" else a != b if self.op == "ne" else a <= b

    def free_symbols_bound(self, env: Mapping[str, int]) -> bool:
        return (self.lhs.free_symbols | self.rhs.free_symbols) <= env.keys()

    def __str__(self) -> str:
        sign = {"eq": "==", "ne": "!=", "le": "<="}[self.op]
        return f"{format_expr(self.lhs)} {sign} {format_expr(self.rhs)}"


class ConstraintStore:
    """Facts about symbolic dims, with prove / guard / hint queries."""

    def __init__(self):
        self._parent: dict[SymExpr, SymExpr] = {}
        self.ranges: dict[str, tuple[int, int | None]] = {}
        self.divisors: dict[str, int] = {}
        self.product_eqs: list[tuple[tuple[SymExpr, ...], tuple[SymExpr, ...]]] = []
        self.guards: list[Guard] = []
        self.hints: dict[str, int] = {}
        # (compound term, constant) for each compound term equated to a constant
        self._constant_compound_facts: list[tuple[SymExpr, SymExpr]] = []
        # (product of atoms, its value) for each such fact a product of two or more is
        self._product_facts: list[tuple[tuple, int]] = []

    # --- recording facts ---------------------------------------------------
    def add_symbol(self, name: str, lo: int = 0, hi: int | None = None, hint: int | None = None):
        old_lo, old_hi = self.ranges.get(name, (0, None))
        lo = max(lo, old_lo, 0)
        hi = old_hi if hi is None else (hi if old_hi is None else min(hi, old_hi))
        self.ranges[name] = (lo, hi)
        if hint is not None:
            self.hints[name] = hint

    def add_divisible(self, name: str, k: int) -> None:
        import math

        old = self.divisors.get(name, 1)
        self.divisors[name] = old * k // math.gcd(old, k)

    def add_equal(self, a, b) -> None:
        """Record ``a == b`` as a fact (the caller knows it holds)."""
        ra, rb = self._find(as_expr(a)), self._find(as_expr(b))
        if ra == rb:
            return
        keep, drop = (ra, rb) if _simpler(ra, rb) else (rb, ra)
        if keep.is_constant:
            # Every symbol of the dropped class takes the constant's range, so the
            # facts do not depend on the order the equalities arrived in.
            members = [e for e in self._parent if self._find(e) == drop] or [drop]
            v = keep.constant_value
            for e in members:
                if e.is_symbol:
                    self.add_symbol(e.symbol_name, v, v)
        self._parent[drop] = keep
        self._parent.setdefault(keep, keep)
        if keep.is_constant and drop.has_compound:
            self._constant_compound_facts.append((drop, keep))
            if len(drop.terms) == 1 and len(drop.terms[0][0]) > 1:
                (m, c), v = drop.terms[0], keep.constant_value
                if v % c == 0:  # (c*m == v: m == v / c)
                    self._product_facts.append((m, v // c))
            offset = drop.constant_term
            if offset and len(drop.terms) == 2:  # (floordiv(s, 5) - 1 == 1: floordiv(s, 5) == 2)
                self.add_equal(drop - offset, keep.constant_value - offset)
        if keep.is_constant:
            root = _power_root(drop, keep.constant_value)
            if root is not None:  # (floordiv(s, 8)**2 == 16: floordiv(s, 8) == 4)
                self.add_equal(*root)

    def add_product_equal(self, a: Iterable, b: Iterable) -> None:
        a, b = tuple(as_expr(x) for x in a), tuple(as_expr(x) for x in b)
        self.product_eqs.append((a, b))
        pa, pb = as_expr(shape_numel(a)), as_expr(shape_numel(b))
        if pa.is_symbol or pb.is_symbol or pa.is_constant or pb.is_constant:
            self.add_equal(pa, pb)

    # --- canonical forms ---------------------------------------------------
    def _find(self, e: SymExpr) -> SymExpr:
        root = e
        while root in self._parent and self._parent[root] != root:
            root = self._parent[root]
        while e in self._parent and self._parent[e] != root:
            self._parent[e], e = root, self._parent[e]
        return root

    def canonical(self, e) -> SymExpr:
        """Rewrite ``e`` with each symbol's equality class representative, and each
        compound term equated to a constant by that constant (a guard
        ``floordiv(s, 2) == 1``)."""
        e = self._find(as_expr(e))
        mapping = {}
        for s in e.free_symbols:
            rep = self._find(SymExpr.symbol(s))
            if rep != SymExpr.symbol(s):
                mapping[s] = rep
        if mapping:
            e = self._find(e.subs(mapping))
        if self._constant_compound_facts and e.has_compound:
            e = self._find(e.map_compounds(self._constant_of))
            if self._product_facts and len(e.terms) > 1:
                e = self._find(self._monomials_as_constants(e))
        return e

    def _monomials_as_constants(self, e: SymExpr) -> SymExpr:
        """``e`` with each product a fact equates to a constant replaced by it, inside
        larger products too (``floordiv(h, 8)*floordiv(w, 8) == 16``: ``32*n*that + 1``
        is ``512*n + 1``)."""
        terms: dict = {}
        for m, c in e.terms:
            for fm, fv in self._product_facts:
                rest = _divide_monomial(m, fm)
                if rest is not None:
                    m, c = rest, c * fv
            terms[m] = terms.get(m, 0) + c
        return SymExpr(terms)

    def _constant_of(self, e: SymExpr) -> SymExpr:
        """``e``'s value where a fact equates it (its symbols as their representatives)
        to a constant, else ``e`` (a compound term equated to a symbol stays as written:
        proofs over products name it so)."""
        rep = self._find(e)
        if rep.is_constant:
            return rep
        for key, value in self._constant_compound_facts:
            if key == e or self._symbols_canonical(key) == e:
                return value
        return e

    def _symbols_canonical(self, e: SymExpr) -> SymExpr:
        mapping = {}
        for s in e.free_symbols:
            rep = self._find(SymExpr.symbol(s))
            if rep != SymExpr.symbol(s):
                mapping[s] = rep
        return e.subs(mapping) if mapping else e

    # --- bounds ------------------------------------------------------------
    def bounds(self, e) -> tuple[int | None, int | None]:
        """Interval [lo, hi] of ``e`` over all allowed symbol values (None = unbounded)."""
        e = self.canonical(e)
        lo: int | None = 0
        hi: int | None = 0
        for m, c in e.terms:
            mlo, mhi = self._monomial_bounds(m)
            if c > 0:
                lo = None if lo is None or mlo is None else lo + c * mlo
                hi = None if hi is None or mhi is None else hi + c * mhi
            else:
                lo = None if lo is None or mhi is None else lo + c * mhi
                hi = None if hi is None or mlo is None else hi + c * mlo
        return lo, hi

    def _monomial_bounds(self, m) -> tuple[int | None, int | None]:
        lo: int | None = 1
        hi: int | None = 1
        for atom, p in m:
            if isinstance(atom, str):
                alo, ahi = self.ranges.get(atom, (0, None))
            else:
                alo, ahi = (0, None) if atom.nonneg else (None, None)
                if atom.kind == "mod" and atom.nonneg:  # by a positive constant
                    alo, ahi = 0, atom.args[1].constant_value - 1
            if alo is None or (lo is not None and lo < 0):
                return None, None  # sign unknown: give up on a product bound
            for _ in range(p):
                lo = None if lo is None else lo * alo
                hi = None if hi is None or ahi is None else hi * ahi
        return lo, hi

    # --- prove -------------------------------------------------------------
    def prove_eq(self, a, b) -> bool:
        diff = self.canonical(as_expr(a) - as_expr(b))
        if diff == ZERO:
            return True
        if self.canonical(a) == self.canonical(b):
            return True
        lo, hi = self.bounds(diff)
        if lo == 0 and hi == 0:
            return True
        return self._prove_by_products(as_expr(a), as_expr(b))

    def _prove_by_products(self, a: SymExpr, b: SymExpr) -> bool:
        ca, cb = self.canonical(a), self.canonical(b)
        for pa, pb in self.product_eqs:
            na = self.canonical(shape_numel(pa))
            nb = self.canonical(shape_numel(pb))
            if {ca, cb} == {na, nb}:
                return True
        return False

    def prove_le(self, a, b) -> bool:
        _, hi = self.bounds(as_expr(a) - as_expr(b))
        return hi is not None and hi <= 0

    def prove_lt(self, a, b) -> bool:
        return self.prove_le(as_expr(a) + 1, b)

    def prove_ne(self, a, b) -> bool:
        lo, hi = self.bounds(as_expr(a) - as_expr(b))
        return (lo is not None and lo > 0) or (hi is not None and hi < 0)

    def prove_nonzero(self, a) -> bool:
        return self.prove_ne(a, 0)

    def prove_not_one(self, a) -> bool:
        return self.prove_ne(a, 1)

    def prove_divisible(self, a, k: int) -> bool:
        e = self.canonical(a)
        for m, c in e.terms:
            if c % k == 0:
                continue
            if any(isinstance(at, str) and self.divisors.get(at, 1) % k == 0 for at, _ in m):
                continue
            return False
        return True

    # --- guard -------------------------------------------------------------
    def guard_eq(self, a, b, reason: str) -> bool:
        """Ensure ``a == b``: proven, or checked at run time from now on."""
        a, b = as_expr(a), as_expr(b)
        if self.prove_eq(a, b):
            return True
        if self.prove_ne(a, b):
            raise ValueError(f"{reason}: {a} == {b} can never hold")
        if not any(g.op == "eq" and {g.lhs, g.rhs} == {a, b} for g in self.guards):
            # (a guard a frontend recorded, e.g. Dynamo's for a view, is checked already)
            self.guards.append(Guard("eq", a, b, reason))
        self.add_equal(a, b)
        return True

    def guard_le(self, a, b, reason: str) -> bool:
        a, b = as_expr(a), as_expr(b)
        if self.prove_le(a, b):
            return True
        if self.prove_lt(b, a):
            raise ValueError(f"{reason}: {a} <= {b} can never hold")
        if any(g.op == "le" and g.lhs == a and g.rhs == b for g in self.guards):
            return True  # (already checked: upsampling guards each resized dim per op)
        self.guards.append(Guard("le", a, b, reason))
        if a.is_symbol and as_expr(b).is_constant:
            self.add_symbol(a.symbol_name, hi=as_expr(b).constant_value)
        return True

    def add_guard(self, guard: Guard) -> None:
        """Record a guard the prologue checks before anything runs. One that equates a
        compound term with a constant (``floordiv(s, 2) == 1``) is then a fact too, which
        ``canonical`` applies inside other terms (other equalities stay guards only, as
        before: a product proof names their terms as written)."""
        self.guards.append(guard)
        lhs, rhs = as_expr(guard.lhs), as_expr(guard.rhs)
        if guard.op == "eq" and (
            (lhs.has_compound and rhs.is_constant) or (rhs.has_compound and lhs.is_constant)
        ):
            self.add_equal(lhs, rhs)

    # --- hint --------------------------------------------------------------
    def hint(self, e) -> int | None:
        """A guess of ``e``'s value from example sizes, or None if a symbol has no hint."""
        e = as_expr(e)
        if not e.free_symbols <= self.hints.keys():
            return None
        return e.evaluate(self.hints)

    # --- text --------------------------------------------------------------
    def describe(self) -> list[str]:
        """Stable one-line facts, for the printer and for explain()."""
        lines = []
        for name in sorted(self.ranges):
            lo, hi = self.ranges[name]
            if lo > 0 or hi is not None:
                lines.append(f"range {name} in [{lo}, {'inf' if hi is None else hi}]")
        for name in sorted(self.divisors):
            if self.divisors[name] > 1:
                lines.append(f"divisible {name} by {self.divisors[name]}")
        classes: dict[SymExpr, list[SymExpr]] = {}
        for e in list(self._parent):
            classes.setdefault(self._find(e), []).append(e)
        for rep in sorted(classes, key=lambda e: format_expr(e)):
            for m in sorted(classes[rep], key=lambda e: format_expr(e)):
                if m != rep:
                    lines.append(f"equal {format_expr(m)} == {format_expr(rep)}")
        for a, b in self.product_eqs:
            fa = " * ".join(format_expr(x) for x in a) or "1"
            fb = " * ".join(format_expr(x) for x in b) or "1"
            lines.append(f"product {fa} == {fb}")
        for g in self.guards:
            lines.append(
                f"guard {g.op} {format_expr(g.lhs)} ; {format_expr(g.rhs)} ; {json.dumps(g.reason)}"
            )
        return lines


def _simpler(a: SymExpr, b: SymExpr) -> bool:
    """Whether ``a`` makes a better class representative than ``b``."""
    if a.is_constant != b.is_constant:
        return a.is_constant
    if a.is_symbol != b.is_symbol:
        return a.is_symbol
    return (len(format_expr(a)), format_expr(a)) <= (len(format_expr(b)), format_expr(b))


def _power_root(e: SymExpr, value: int) -> tuple[SymExpr, int] | None:
    """For ``e == value`` with ``e`` one power ``c * a**p`` (p > 1) of a non-negative atom:
    ``(a, r)`` with ``a == r`` implied (the exact integer root), else None."""
    if len(e.terms) != 1:
        return None
    monomial, c = e.terms[0]
    if len(monomial) != 1 or c <= 0 or value < 0 or value % c:
        return None
    atom, p = monomial[0]
    if p < 2 or not (isinstance(atom, str) or atom.nonneg):
        return None
    target = value // c
    r = round(target ** (1 / p))
    root = next((x for x in (r - 1, r, r + 1) if x >= 0 and x**p == target), None)
    if root is None:
        return None
    return SymExpr({((atom, 1),): 1}), root
