"""The text builder of the StableHLO emitter: SSA names, types, literals, dim expressions.

Sits under the op rules (``ops``, ``index_ops``, ``reduce_ops``) and the driver
(``emit``). A ``Builder`` appends one line per MLIR operation and hands back the
SSA name of its result. It knows how to print an IR type as a ranked tensor type
(``?`` for a symbolic dim), a scalar literal, and how to compute a symbolic dim
expression at run time: each symbol is an ``i64`` scalar bound by the driver,
and ``SymExpr`` arithmetic becomes scalar ``stablehlo`` arithmetic, emitted once
per expression. Shape operands of the dynamic ops (``tensor<Nxi64>``) are built
from those scalars. Region bodies (reducers, scatter updates) open a scope of their own:
nothing cached inside one is visible outside it, nor the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from ...errors import UnsupportedError
from ...ir.constraints import ConstraintStore
from ...ir.dtypes import DType
from ...ir.symbolic import Compound, SymExpr, as_expr
from ...ir.types import Dim

I64 = DType.i64
RegionBody = Callable[[list[str]], tuple[list[str], list[str]]]
INT64_MAX = 2**63 - 1

ELEMENT_TYPES = {
    DType.b8: "i1",
    DType.i8: "i8",
    DType.i16: "i16",
    DType.i32: "i32",
    DType.i64: "i64",
    DType.u8: "ui8",
    DType.u16: "ui16",
    DType.u32: "ui32",
    DType.u64: "ui64",
    DType.f16: "f16",
    DType.bf16: "bf16",
    DType.f32: "f32",
    DType.f64: "f64",
}

_FLOAT_BITS = {DType.f16: (np.float16, np.uint16, 4), DType.f32: (np.float32, np.uint32, 8)}
_FLOAT_BITS[DType.f64] = (np.float64, np.uint64, 16)
_BF16_OVERFLOW = 2.0**128 - 2.0**119  # bf16's largest finite value plus half an ulp


def is_static(shape: Sequence[Dim]) -> bool:
    """Whether every dim of ``shape`` is a plain int."""
    return all(isinstance(d, int) for d in shape)


def tensor_type(dtype: DType, shape: Sequence[Dim]) -> str:
    """The ranked tensor type of an IR type: ``tensor<?x16xf32>``."""
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in shape)
    return f"tensor<{dims}{ELEMENT_TYPES[dtype]}>"


def is_signed(dtype: DType) -> bool:
    return dtype in (DType.i8, DType.i16, DType.i32, DType.i64)


def is_unsigned(dtype: DType) -> bool:
    return dtype in (DType.u8, DType.u16, DType.u32, DType.u64, DType.b8)


def compare_type(dtype: DType) -> str:
    """The comparison type ``stablehlo.compare`` needs for operands of ``dtype``."""
    if dtype.is_float:
        return "FLOAT"
    return "UNSIGNED" if is_unsigned(dtype) else "SIGNED"


def literal(value, dtype: DType) -> str:
    """A scalar literal of ``dtype`` as MLIR prints it inside ``dense<...>``."""
    if dtype is DType.b8:
        return "true" if value else "false"
    if dtype.is_int:
        return str(int(value))
    v = float(value)
    if dtype is DType.bf16:
        if math.isnan(v):
            return "0x7FC0"
        if abs(v) >= _BF16_OVERFLOW:  # rounds to an infinity
            return "0x7F80" if v > 0 else "0xFF80"
        return _decimal(v)
    npf, npu, width = _FLOAT_BITS[dtype]
    x = np.array(v, dtype=npf)
    if not np.isfinite(x):
        return f"0x{int(x.view(npu)):0{width}X}"
    return _decimal(float(x))


def _decimal(v: float) -> str:
    """A finite float in a spelling MLIR's lexer takes (it needs a '.' before any exponent)."""
    text = repr(v)
    if "." not in text:
        text = text.replace("e", ".0e") if "e" in text else text + ".0"
    return text


def min_value(dtype: DType):
    """The smallest value of ``dtype`` (-inf for floats): the identity of max."""
    if dtype.is_float:
        return -math.inf
    if dtype is DType.b8:
        return False
    return int(np.iinfo(dtype.to_numpy()).min)


def max_value(dtype: DType):
    """The largest value of ``dtype`` (+inf for floats): the identity of min."""
    if dtype.is_float:
        return math.inf
    if dtype is DType.b8:
        return True
    return int(np.iinfo(dtype.to_numpy()).max)


def mlir_string(text: str) -> str:
    """``text`` as an MLIR string literal (quotes, backslashes, non-ASCII escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\' or not 0x20 <= byte < 0x7F:
            out.append(f"\\{byte:02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def int_list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def i64_array(values: Sequence[int]) -> str:
    """A ``DenseI64ArrayAttr``: ``array<i64: 1, 2>``."""
    return (
        "array<i64" + "".join(f"{', ' if i else ': '}{int(v)}" for i, v in enumerate(values)) + ">"
    )


class Builder:
    """Appends StableHLO operations as text; every result gets a fresh SSA name."""

    def __init__(self, store: ConstraintStore):
        self.store = store
        self.lines: list[str] = []
        self._count = 0
        self._depth = 2
        self._caches: list[dict] = [{}]
        self.symbols: dict[str, str] = {}  # symbol -> its i64 scalar (function scope)

    # --- lines and names -------------------------------------------------------
    def fresh(self) -> str:
        name = f"%{self._count}"
        self._count += 1
        return name

    def emit(self, line: str) -> None:
        self.lines.append("  " * self._depth + line)

    def op(self, text: str) -> str:
        """Emit ``%N = text`` and return ``%N``."""
        name = self.fresh()
        self.emit(f"{name} = {text}")
        return name

    def cached(self, key, make: Callable[[], str]) -> str:
        """The value cached under ``key`` in the current scope, made on first use."""
        cache = self._caches[-1]
        if key not in cache:
            cache[key] = make()
        return cache[key]

    @contextmanager
    def block(self, arg_types: Sequence[str]) -> Iterator[list[str]]:
        """A region's single block: emits its ``^bb0`` label, yields its argument names.

        The caller emits the block's operations (ending in ``stablehlo.return``)
        inside the ``with``; the block has a cache scope of its own.
        """
        names = [self.fresh() for _ in arg_types]
        args = ", ".join(f"{n}: {t}" for n, t in zip(names, arg_types))
        self.emit(f"^bb0({args}):")
        self._depth += 1
        self._caches.append({})
        try:
            yield names
        finally:
            self._caches.pop()
            self._depth -= 1

    def region_op(
        self,
        head: str,
        regions: Sequence[tuple[Sequence[str], RegionBody]],
        tail: str,
        results: int = 1,
    ) -> list[str]:
        """A generic-form op with regions: ``%N = head ({region}, ...) : tail``.

        Each region is (its block's argument types, a body that emits its operations
        and returns the values and types the block's ``stablehlo.return`` gives).
        """
        name = self.fresh()
        self.emit(f"{name}{f':{results}' if results > 1 else ''} = {head} ({{")
        for i, (arg_types, body) in enumerate(regions):
            if i:
                self.emit("}, {")
            with self.block(arg_types) as params:
                values, types = body(params)
                self.emit(f"stablehlo.return {', '.join(values)} : {', '.join(types)}")
        self.emit(f"}}) : {tail}")
        return [f"{name}#{i}" for i in range(results)] if results > 1 else [name]

    def combiner(self, opname: str, dtype: DType) -> RegionBody:
        """A reducer body combining its two scalar arguments with ``stablehlo.<opname>``."""
        ty = tensor_type(dtype, ())

        def body(params: list[str]) -> tuple[list[str], list[str]]:
            return [self.binary(opname, params[0], params[1], ty)], [ty]

        return body

    @property
    def in_region(self) -> bool:
        return len(self._caches) > 1

    # --- constants and elementwise helpers -----------------------------------
    def const(self, value, dtype: DType) -> str:
        """A rank-0 constant."""
        text = literal(value, dtype)
        ty = tensor_type(dtype, ())
        return self.cached(
            ("const", text, dtype), lambda: self.op(f"stablehlo.constant dense<{text}> : {ty}")
        )

    def splat(self, value, dtype: DType, shape: Sequence[Dim]) -> str:
        """``value`` broadcast to ``shape`` (dynamic_broadcast_in_dim when symbolic)."""
        scalar = self.const(value, dtype)
        if not shape:
            return scalar
        key = ("splat", scalar, tuple(shape))
        return self.cached(key, lambda: self.broadcast(scalar, dtype, (), shape, ()))

    def broadcast(
        self, x: str, dtype: DType, src: Sequence[Dim], shape: Sequence[Dim], dims: Sequence[int]
    ) -> str:
        """``broadcast_in_dim`` of ``x`` (shape ``src``) to ``shape``, dims mapped by ``dims``."""
        tin, tout = tensor_type(dtype, src), tensor_type(dtype, shape)
        if is_static(src) and is_static(shape):
            return self.op(
                f"stablehlo.broadcast_in_dim {x}, dims = {int_list(dims)} : ({tin}) -> {tout}"
            )
        vec = self.shape(shape)
        return self.op(
            f"stablehlo.dynamic_broadcast_in_dim {x}, {vec}, dims = {int_list(dims)} : "
            f"({tin}, {tensor_type(I64, (len(shape),))}) -> {tout}"
        )

    def unary(self, name: str, x: str, ty: str) -> str:
        return self.op(f"stablehlo.{name} {x} : {ty}")

    def binary(self, name: str, a: str, b: str, ty: str) -> str:
        return self.op(f"stablehlo.{name} {a}, {b} : {ty}")

    def compare(self, direction: str, a: str, b: str, dtype: DType, shape: Sequence[Dim]) -> str:
        tin = tensor_type(dtype, shape)
        tout = tensor_type(DType.b8, shape)
        return self.op(
            f"stablehlo.compare {direction}, {a}, {b}, {compare_type(dtype)} : "
            f"({tin}, {tin}) -> {tout}"
        )

    def select(self, pred: str, a: str, b: str, dtype: DType, shape: Sequence[Dim]) -> str:
        return self.op(
            f"stablehlo.select {pred}, {a}, {b} : "
            f"{tensor_type(DType.b8, shape)}, {tensor_type(dtype, shape)}"
        )

    def convert(self, x: str, src: DType, dst: DType, shape: Sequence[Dim]) -> str:
        if src is dst:
            return x
        return self.op(
            f"stablehlo.convert {x} : ({tensor_type(src, shape)}) -> {tensor_type(dst, shape)}"
        )

    def refine(self, x: str, dtype: DType, src: Sequence[Dim], shape: Sequence[Dim]) -> str:
        """``x`` typed with ``shape``, a dim known where ``src`` has ``?`` or the other way
        round (the shapes are equal at run time; a same-type convert changes the type only)."""
        tin, tout = tensor_type(dtype, src), tensor_type(dtype, shape)
        return x if tin == tout else self.op(f"stablehlo.convert {x} : ({tin}) -> {tout}")

    def reshape(self, x: str, dtype: DType, src: Sequence[Dim], shape: Sequence[Dim]) -> str:
        """``x`` reshaped to ``shape`` (dynamic_reshape when either shape is symbolic)."""
        tin, tout = tensor_type(dtype, src), tensor_type(dtype, shape)
        if is_static(src) and is_static(shape):
            return self.op(f"stablehlo.reshape {x} : ({tin}) -> {tout}")
        vec = self.shape(shape)
        return self.op(
            f"stablehlo.dynamic_reshape {x}, {vec} : "
            f"({tin}, {tensor_type(I64, (len(shape),))}) -> {tout}"
        )

    def iota(self, dtype: DType, shape: Sequence[Dim], dim: int) -> str:
        """Indices along ``dim`` broadcast to ``shape`` (dynamic_iota when symbolic)."""
        ty = tensor_type(dtype, shape)
        if is_static(shape):
            return self.op(f"stablehlo.iota dim = {dim} : {ty}")
        vec, tvec = self.shape(shape), tensor_type(I64, (len(shape),))
        return self.op(f"stablehlo.dynamic_iota {vec}, dim = {dim} : ({tvec}) -> {ty}")

    # --- dim expressions -----------------------------------------------------
    def dim(self, d: Dim) -> str:
        """The run-time value of a dim expression, as a ``tensor<i64>`` scalar."""
        e = as_expr(d)
        if e.is_constant:
            return self.const(e.constant_value, I64)
        return self.cached(("dim", e), lambda: self._polynomial(e))

    def _polynomial(self, e: SymExpr) -> str:
        scalar = tensor_type(I64, ())
        total: str | None = None
        for monomial, coeff in e.terms:
            if not monomial:
                term, negative = self.const(abs(coeff), I64), coeff < 0
            else:
                term, negative = self._monomial(monomial, abs(coeff)), coeff < 0
            if total is None and negative:  # 0 - term: shape refinement folds subtract
                total = self.const(0, I64)
            if total is None:
                total = term
            else:
                total = self.binary("subtract" if negative else "add", total, term, scalar)
        assert total is not None
        return total

    def _monomial(self, monomial, coeff: int) -> str:
        scalar = tensor_type(I64, ())
        value = self.const(coeff, I64) if coeff != 1 else None
        for atom, power in monomial:
            base = self._atom(atom)
            for _ in range(power):
                value = base if value is None else self.binary("multiply", value, base, scalar)
        assert value is not None
        return value

    def _atom(self, atom) -> str:
        if isinstance(atom, str):
            if atom not in self.symbols or self.in_region:
                where = "inside a region body" if self.in_region else "(no input dim carries it)"
                raise UnsupportedError(f"symbol {atom} has no run-time value {where}")
            return self.symbols[atom]
        return self.cached(("atom", atom.key), lambda: self._compound(atom))

    def _compound(self, atom: Compound) -> str:
        args = [self.dim(a) for a in atom.args]
        scalar = tensor_type(I64, ())
        if atom.kind in ("max", "min"):
            out = args[0]
            for a in args[1:]:
                out = self.binary("maximum" if atom.kind == "max" else "minimum", out, a, scalar)
            return out
        num, den = atom.args
        exact = self._nonneg(num) and self._positive(den)
        if atom.kind == "floordiv":
            quotient = self.binary("divide", args[0], args[1], scalar)
            return quotient if exact else self._floor_fix(args, quotient, floor=True)
        remainder = self.binary("remainder", args[0], args[1], scalar)
        return remainder if exact else self._floor_fix(args, remainder, floor=False)

    def _floor_fix(self, args: list[str], value: str, floor: bool) -> str:
        """Truncated division/remainder turned into Python's floor semantics.

        The remainder r of a truncated division has the sign of the numerator; when
        it is nonzero and its sign differs from the divisor's, floor division is one
        less than the truncated quotient, and Python's modulo is r + divisor.
        """
        scalar = tensor_type(I64, ())
        num, den = args
        zero = self.const(0, I64)
        rem = value if not floor else self.binary("remainder", num, den, scalar)
        nonzero = self.compare("NE", rem, zero, I64, ())
        rem_negative = self.compare("LT", rem, zero, I64, ())
        den_negative = self.compare("LT", den, zero, I64, ())
        boolean = tensor_type(DType.b8, ())
        signs_differ = self.binary("xor", rem_negative, den_negative, boolean)
        fix = self.binary("and", nonzero, signs_differ, boolean)
        if floor:
            adjusted = self.binary("subtract", value, self.const(1, I64), scalar)
        else:
            adjusted = self.binary("add", value, den, scalar)
        return self.select(fix, adjusted, value, I64, ())

    def _nonneg(self, e: SymExpr) -> bool:
        lo, _ = self.store.bounds(e)
        return e.nonneg or (lo is not None and lo >= 0)

    def _positive(self, e: SymExpr) -> bool:
        lo, _ = self.store.bounds(e)
        return (e.is_constant and e.constant_value > 0) or (lo is not None and lo > 0)

    def shape(self, dims: Sequence[Dim]) -> str:
        """A ``tensor<Nxi64>`` shape operand holding ``dims`` (static runs as one constant)."""
        return self.cached(("shape", tuple(dims)), lambda: self._shape(list(dims)))

    def _shape(self, dims: list[Dim]) -> str:
        parts: list[tuple[str, int]] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                ty = tensor_type(I64, (len(run),))
                text = f"stablehlo.constant dense<[{', '.join(str(v) for v in run)}]> : {ty}"
                parts.append((self.cached(("ints", tuple(run)), lambda: self.op(text)), len(run)))
                run.clear()

        for d in dims:
            if isinstance(d, int):
                run.append(d)
                continue
            flush()
            parts.append((self.vector1(self.dim(d)), 1))
        flush()
        if not parts:
            return self.op(f"stablehlo.constant dense<> : {tensor_type(I64, (0,))}")
        if len(parts) == 1:
            return parts[0][0]
        names = ", ".join(p for p, _ in parts)
        types = ", ".join(tensor_type(I64, (n,)) for _, n in parts)
        tout = tensor_type(I64, (len(dims),))
        return self.op(f"stablehlo.concatenate {names}, dim = 0 : ({types}) -> {tout}")

    def vector1(self, scalar: str) -> str:
        """An i64 scalar reshaped to ``tensor<1xi64>``."""
        return self.cached(
            ("vec1", scalar),
            lambda: self.op(
                f"stablehlo.reshape {scalar} : ({tensor_type(I64, ())}) -> {tensor_type(I64, (1,))}"
            ),
        )
