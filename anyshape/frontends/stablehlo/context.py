"""StableHLO ops and values during lowering: the view of one op, the rule table, the context.

Sits between the driver (``lower.py``) and the rule families (``elementwise.py``,
``shape_ops.py``, ``compute_ops.py``). Values are the shared
``frontends/values.Value``: shape computations (``get_dimension_size``, scalar
arithmetic, ``concatenate`` into a shape operand; torch-mlir's ``shape``,
``tensor`` and ``arith`` ops) fold into ``known`` vectors of symbolic dims, so
``dynamic_reshape`` and ``dynamic_broadcast_in_dim`` take their shapes as dims
and never as tensor code. A ``Value`` whose ``fact`` is set is a comparison of
dims (a shape assertion's predicate).

``rule("stablehlo.add", ...)`` records ``fn(ctx, op) -> list[Value]`` for those
op names; ``mhlo.*`` spellings are read as the ``stablehlo.*`` op of the same
name. ``OpView`` gives a rule its operands as values and its attributes as
Python values.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ..values import Value, ValueLowering
from .reader import import_bindings, tensor_type

RULES: dict[str, Callable] = {}


def rule(*names: str):
    def register(fn):
        for n in names:
            RULES[n] = fn
        return fn

    return register


def canonical_name(name: str) -> str:
    """``mhlo.add`` -> ``stablehlo.add``; ``func.return`` and ``return`` as one."""
    if name.startswith("mhlo."):
        return "stablehlo." + name[5:]
    return name


class OpView:
    """One MLIR op as a rule sees it: name, operand values, result types, attributes."""

    def __init__(self, op, operands: list[Value], program):
        self.op = op.operation
        self.name = canonical_name(self.op.name)
        self.operands = operands
        self.program = program

    def describe(self) -> str:
        """The op's name, with the producer's name for it and its first source line."""
        loc = str(self.op.location)
        bits = []
        name = re.match(r'loc\("([^"]+)"\(', loc)
        if name:
            bits.append(name.group(1))
        src = re.search(r'"([^"]+)":(\d+)', loc)
        if src and not src.group(1).startswith("<"):
            bits.append(f"{src.group(1).rsplit('/', 1)[-1]}:{src.group(2)}")
        return f"{self.name} ({', '.join(bits)})" if bits else self.name

    # --- results ----------------------------------------------------------
    @property
    def num_results(self) -> int:
        return len(self.op.results)

    def result_type(self, i: int = 0) -> tuple[DType, tuple]:
        """The declared dtype and dims (None for ``?``) of result ``i``."""
        return tensor_type(self.op.results[i].type)

    def result_dtype(self, i: int = 0) -> DType:
        return self.result_type(i)[0]

    def static_result_shape(self, i: int = 0) -> tuple:
        dtype, dims = self.result_type(i)
        if any(d is None for d in dims):
            raise UnsupportedError(f"{self.describe()}: its result needs a static shape")
        return dims

    # --- attributes ---------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.op.attributes

    def attr(self, name: str):
        if name not in self.op.attributes:
            raise UnsupportedError(f"{self.describe()}: no attribute {name!r}")
        return self.op.attributes[name]

    def _absent(self, name: str, default):
        """``default`` for an attribute the op does not have; without one, an error."""
        if default is None:
            raise UnsupportedError(f"{self.describe()}: no attribute {name!r}")
        return default

    def int_attr(self, name: str, default: int | None = None) -> int:
        if not self.has(name):
            return self._absent(name, default)
        ir = import_bindings()[0]
        return int(ir.IntegerAttr(self.attr(name)).value)

    def ints(self, name: str, default: tuple | None = None) -> tuple[int, ...]:
        """An ``array<i64: ...>``, a ``dense<...>`` of integers or an array of integers."""
        if not self.has(name):
            return tuple(self._absent(name, default))
        return attr_ints(self.attr(name))

    def string(self, name: str, default: str | None = None) -> str:
        if not self.has(name):
            return self._absent(name, default)
        ir = import_bindings()[0]
        a = self.attr(name)
        if isinstance(a, ir.StringAttr):
            return a.value
        if isinstance(a, ir.FlatSymbolRefAttr):
            return a.value
        return str(a).strip('"')

    def enum(self, name: str) -> str:
        """``#stablehlo<comparison_direction GE>`` -> ``GE``."""
        text = str(self.attr(name))
        m = re.search(r"(\w+)\s*>\s*$", text)
        return m.group(1) if m else text

    def flag(self, name: str) -> bool:
        return self.has(name) and str(self.attr(name)) in ("true", "unit")

    def region_body(self, i: int = 0) -> list:
        """The ops of region ``i``'s only block, and that block's arguments."""
        region = self.op.regions[i]
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise UnsupportedError(f"{self.describe()}: a region of {len(blocks)} blocks")
        return list(blocks[0].operations), list(blocks[0].arguments)


def attr_ints(a) -> tuple[int, ...]:
    """Integers of an MLIR attribute: dense arrays, dense elements, arrays of integers."""
    ir = import_bindings()[0]
    if isinstance(a, (ir.DenseI64ArrayAttr, ir.DenseI32ArrayAttr)):
        return tuple(int(x) for x in a)
    if isinstance(a, ir.DenseBoolArrayAttr):
        return tuple(int(bool(x)) for x in a)
    if isinstance(a, ir.DenseIntElementsAttr):
        return tuple(int(x) for x in np.array(a).reshape(-1))
    if isinstance(a, ir.ArrayAttr):
        return tuple(int(ir.IntegerAttr(x).value) for x in a)
    text = str(a)
    m = re.fullmatch(r"array<i\d+(?::\s*([-\d,\s]*))?>", text)
    if m:
        return tuple(int(x) for x in (m.group(1) or "").split(",") if x.strip())
    raise UnsupportedError(f"attribute {text} is not a list of integers")


def dense_array(attr, program) -> np.ndarray:
    """A ``dense<...>`` or ``dense_resource<...>`` elements attribute as a NumPy array."""
    ir = import_bindings()[0]
    dtype, dims = tensor_type(attr.type)
    np_dtype = dtype.to_numpy()
    text = str(attr)
    if text.startswith("dense_resource<"):
        key = text[len("dense_resource<") : text.index(">")]
        blob = program.resources.get(key)
        if blob is None:
            raise UnsupportedError(f"dense_resource<{key}> has no blob in the module")
        if dtype is DType.b8:
            arr = np.frombuffer(blob, dtype=np.uint8).astype(np.bool_)
        else:
            arr = np.frombuffer(blob, dtype=np_dtype)
        count = int(np.prod(dims)) if dims else 1
        if arr.size == 1 and count != 1:
            return np.full(dims, arr[0], dtype=np_dtype)  # a splat blob
        return arr.reshape(dims).copy()
    if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
        v = attr.get_splat_value()
        return np.full(dims, _scalar_of(v, dtype), dtype=np_dtype)
    try:
        arr = np.array(attr)
    except (RuntimeError, ValueError, TypeError) as e:
        raise UnsupportedError(f"constant {text[:60]}... cannot be read ({e})") from None
    if dtype is DType.b8:
        arr = arr.astype(np.bool_)
    return arr.astype(np_dtype, copy=False).reshape(dims)


def _scalar_of(v, dtype: DType):
    ir = import_bindings()[0]
    if isinstance(v, ir.FloatAttr):
        return float(v.value)
    if isinstance(v, ir.BoolAttr):
        return bool(v.value)
    if isinstance(v, ir.IntegerAttr):
        value = int(v.value)
        if dtype is DType.b8:
            return bool(value & 1)
        if dtype.is_int and dtype.value.startswith("u") and value < 0:
            value += 1 << (8 * dtype.itemsize)  # printed as signed
        return value
    raise UnsupportedError(f"constant element {v} is not a number")


class LowerCtx(ValueLowering):
    """The shared value lowering, over one StableHLO program."""

    const_prefix = "shlo_const_"

    def __init__(self, builder, program):
        super().__init__(builder)
        self.program = program

    def result_shape(self, op: OpView, shape_operand: int) -> tuple:
        """The result shape of an op with a ``dynamic_`` form: read from its shape operand
        (``shape_operand``) in that form, else its static result type."""
        if op.name.startswith("stablehlo.dynamic_"):
            return self.known_of(op.operands[shape_operand], f"{op.name}'s output shape")
        return op.static_result_shape()

    def known_of(self, v: Value, what: str) -> tuple:
        """The elements of an integer vector or scalar as dims (constants or shape values)."""
        dims = v.dims()
        if dims is not None:
            return dims
        raise UnsupportedError(
            f"{what} must be known at compile time (a constant or computed from shapes); "
            "here it depends on tensor data"
        )

    def clamp_index(self, idx, hi):
        """Integer indices (a node) as i64, clamped to ``[0, hi]`` (a dim), as StableHLO
        clamps the start indices of slices and gathers."""
        idx = self.cast(idx, DType.i64)
        top = self.broadcast_to(self.scalar(hi, DType.i64), idx.shape)
        return self.op("max", self.op("min", idx, top), self.full(0, idx.shape, DType.i64))

    def window(self, start, n):
        """The indices ``start + [0, n)`` of a window whose start (an i64 scalar node) is
        read from tensor data."""
        idx = self.op("iota", shape=(n,), dim=0, dtype=DType.i64)
        return self.op("add", idx, self.broadcast_to(start, (n,)))

    def const_of(self, v: Value, what: str) -> np.ndarray:
        if v.const is not None:
            return v.const
        if v.known is not None and all(isinstance(d, int) for d in v.known):
            return np.array(v.known, dtype=v.dtype.to_numpy()).reshape(v.shape)
        raise UnsupportedError(f"{what} must be a constant (here it is computed)")
