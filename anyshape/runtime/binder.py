"""The call prologue: bind every symbol once from the input shapes, then check every constraint.

Sits at the start of every compiled call (model level in plugin mode, and each
compiled unit). Built once per compiled signature into a flat plan, so a call
costs a few list lookups. A violation raises ``InputError`` naming the input,
the dim, the expected value (and where that expectation came from) and the
value received.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..ir.constraints import ConstraintStore
from ..ir.dtypes import DType
from ..ir.symbolic import SymExpr, format_dim, format_expr
from ..ir.types import Dim


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: DType
    shape: tuple[Dim, ...]

    def describe(self) -> str:
        return f"{self.dtype}[{', '.join(format_dim(d) for d in self.shape)}]"


class ShapeBinder:
    """Binds symbols from concrete input shapes and checks shape facts."""

    def __init__(
        self, specs: Sequence[InputSpec], store: ConstraintStore | None = None, what: str = "model"
    ):
        self.specs = list(specs)
        self.store = store or ConstraintStore()
        self.what = what
        self.binds: list[tuple[int, int, str]] = []  # (input, dim, symbol)
        self.solves: list[tuple[int, int, str, SymExpr]] = []  # linear dims solved for a symbol
        self.checks: list[tuple[int, int, Dim]] = []
        origin: dict[str, tuple[int, int]] = {}
        for i, spec in enumerate(self.specs):
            for d, dim in enumerate(spec.shape):
                if isinstance(dim, SymExpr) and dim.is_symbol and dim.symbol_name not in origin:
                    origin[dim.symbol_name] = (i, d)
                    self.binds.append((i, d, dim.symbol_name))
                else:
                    self.checks.append((i, d, dim))
        # Dims like s0 + 1 whose only symbol no plain dim binds: solve for it.
        for i, d, dim in list(self.checks):
            if isinstance(dim, SymExpr):
                free = dim.free_symbols - origin.keys()
                if len(free) == 1:
                    (sym,) = free
                    coeff = dim.subs({sym: 1}) - dim.subs({sym: 0})
                    linear = dim == dim.subs({sym: 0}) + coeff * SymExpr.symbol(sym)
                    if (
                        linear
                        and coeff.is_constant
                        and coeff.constant_value != 0
                        and dim.subs({sym: 0}).free_symbols <= origin.keys()
                    ):
                        origin[sym] = (i, d)
                        self.solves.append((i, d, sym, dim))
        self.origin = origin
        self.ranges = [
            (s, lo, hi)
            for s, (lo, hi) in sorted(self.store.ranges.items())
            if s in origin and (lo > 0 or hi is not None)
        ]

    def _where(self, sym: str) -> str:
        i, d = self.origin[sym]
        return f"input {self.specs[i].name!r} dim {d}"

    def bind(
        self,
        shapes: Sequence[Sequence[int]],
        dtypes: Sequence[DType] | None = None,
        env: dict[str, int] | None = None,
    ) -> dict[str, int]:
        """Check ``shapes`` (and ``dtypes``) against the specs; return the symbol values."""
        specs = self.specs
        if len(shapes) != len(specs):
            names = ", ".join(s.name for s in specs)
            raise InputError(
                f"{self.what} expects {len(specs)} tensor inputs ({names}), got {len(shapes)}"
            )
        for i, (spec, shape) in enumerate(zip(specs, shapes)):
            if len(shape) != len(spec.shape):
                raise InputError(
                    f"input {spec.name!r} has rank {len(shape)} (shape {list(shape)}), expected "
                    f"rank {len(spec.shape)} ({spec.describe()}); anyshape compiles one graph "
                    f"per rank and dtype"
                )
            if dtypes is not None and dtypes[i] != spec.dtype:
                raise InputError(
                    f"input {spec.name!r} has dtype {dtypes[i]}, expected {spec.dtype} "
                    f"({spec.describe()})"
                )
        env = dict(env or {})
        for i, d, sym in self.binds:
            env[sym] = shapes[i][d]
        for i, d, sym, dim in self.solves:
            base = dim.subs({sym: 0}).evaluate(env)
            coeff = (dim.subs({sym: 1}) - dim.subs({sym: 0})).constant_value
            num = shapes[i][d] - base
            if coeff == 0 or num % coeff or num // coeff < 0:
                raise InputError(
                    f"input {specs[i].name!r} dim {d}: got {shapes[i][d]}, which no value of "
                    f"{sym} makes equal to {format_expr(dim)}"
                )
            env[sym] = num // coeff
        for i, d, dim in self.checks:
            want = dim if isinstance(dim, int) else dim.evaluate(env)
            got = shapes[i][d]
            if want != got:
                if isinstance(dim, int):
                    why = "a static dim of the compiled model"
                else:
                    src = ", ".join(f"{s} from {self._where(s)}" for s in sorted(dim.free_symbols))
                    why = f"= {format_expr(dim)}, with {src}"
                error = InputError(
                    f"input {specs[i].name!r} dim {d}: expected {want} ({why}), got {got}"
                )
                error.at_size_edge = not isinstance(dim, int) and (
                    got == 0 or want < 0 or any(env[s] == 0 for s in dim.free_symbols)
                )
                raise error
        for sym, lo, hi in self.ranges:
            v = env[sym]
            if v < lo or (hi is not None and v > hi):
                raise InputError(
                    f"{self._where(sym)} = {v} is outside the range {sym} in "
                    f"[{lo}, {'inf' if hi is None else hi}] the model was compiled for"
                )
        for g in self.store.guards:
            if g.free_symbols_bound(env) and not g.holds(env):
                raise InputError(
                    f"shape constraint {g} ({g.reason}) does not hold: "
                    + ", ".join(
                        f"{s}={env[s]} from {self._where(s)}"
                        for s in sorted(g.lhs.free_symbols | g.rhs.free_symbols)
                        if s in self.origin
                    )
                )
        return env


def arrange_inputs(names: list[str], index: dict[str, int], args, kwargs) -> list:
    """Inputs given by position and/or by name, in ``names`` order (``index``: name ->
    position); an ``InputError`` for too many, unknown, repeated or missing ones."""
    if not kwargs and len(args) == len(names):
        return list(args)
    if len(args) > len(names):
        raise InputError(
            f"the model takes {len(names)} inputs ({', '.join(names)}), got {len(args)}"
        )
    values = list(args) + [None] * (len(names) - len(args))
    for name, value in kwargs.items():
        if name not in index:
            raise InputError(f"unknown input {name!r}; the inputs are {', '.join(names)}")
        if values[index[name]] is not None:
            raise InputError(f"input {name!r} given twice")
        values[index[name]] = value
    missing = [n for n, v in zip(names, values) if v is None]
    if missing:
        raise InputError(f"missing inputs {missing}; the inputs are {', '.join(names)}")
    return values
