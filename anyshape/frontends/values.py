"""Frontend values: an IR node, a compile-time constant, or a vector of symbolic dims.

Sits under the lowering contexts of the frontends that read files with shape
computations in them (``frontends/onnx/context.LowerCtx``,
``frontends/stablehlo/context.LowerCtx``). Each value of the source program is a
``Value``: its dtype and shape, and up to three forms of its contents:

- ``node``: the IR node computing it (built on first use for the other forms);
- ``const``: a NumPy array when the value is known at compile time (weights,
  constants, anything folded from constants);
- ``known``: for an integer tensor of rank 0 or 1, its elements as dims
  (``int | SymExpr``). Shape reads produce one and shape arithmetic folds it,
  so shape computations become symbolic dims at lowering time, never tensor code.

Broadcasting policy (NumPy rules, per dim, right-aligned): a dim that is
statically 1 takes the other; equal dims (proved by the constraint store) stay;
two different symbolic dims (or a symbolic and a static one) are *guarded* equal
(``ConstraintStore.guard_eq``: checked in every call's prologue, then assumed),
so the compiled graph never broadcasts a symbolic dim that happens to be 1 at
run time. A call that breaks a guard gets an ``InputError`` naming the dims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..ir.dtypes import DType
from ..ir.graph import GraphBuilder, Node
from ..ir.symbolic import SymExpr, as_dim, as_expr, sym_max
from .building import IRBuilding

Dim = int | SymExpr


@dataclass
class Value:
    """One value of the source program: dtype, shape and the forms of its contents we have."""

    dtype: DType
    shape: tuple
    node: Node | None = None
    const: np.ndarray | None = None
    known: tuple | None = None
    param_name: str | None = None  # the weight's name, when the constant is a named weight
    input_name: str | None = None  # the graph input's name, when the value is one
    fact: tuple | None = None  # (direction, lhs, rhs): a comparison of dims (an assertion's)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def dims(self) -> tuple | None:
        """The elements as dims: ``known``, or an integer constant of rank 0 or 1."""
        if self.known is not None:
            return self.known
        if self.const is not None and self.const.dtype.kind in "iu" and self.const.ndim <= 1:
            return tuple(int(x) for x in self.const.reshape(-1))
        return None

    @staticmethod
    def of_node(node: Node) -> Value:
        return Value(node.dtype, tuple(node.shape), node=node)

    @staticmethod
    def of_const(array: np.ndarray) -> Value:
        array = np.asarray(array)
        known = None
        if array.ndim <= 1 and array.dtype.kind in "iu":
            known = tuple(int(v) for v in array.reshape(-1))
        return Value(DType.from_numpy(array.dtype), tuple(array.shape), const=array, known=known)

    @staticmethod
    def of_known(dims: Sequence, dtype: DType = DType.i64, scalar: bool = False) -> Value:
        """An integer vector (or scalar) of dims; constant when every dim is an int."""
        dims = tuple(as_dim(d) for d in dims)
        if all(isinstance(d, int) for d in dims):
            # integer arithmetic wraps in the value's type, as in the program
            if dtype.is_int and not dtype.is_bool:
                arr = np.array([d & ((1 << 64) - 1) for d in dims], dtype=np.uint64)
                arr = arr.astype(dtype.to_numpy())
            else:
                arr = np.array(dims, dtype=dtype.to_numpy())
            return Value.of_const(arr.reshape(()) if scalar else arr)
        return Value(dtype, () if scalar else (len(dims),), known=dims)


class ValueLowering(IRBuilding):
    """The builder plus what every value-based lowering needs: materializing values, the
    broadcasting policy above, reductions. ``const_prefix`` names unnamed constant weights."""

    const_prefix = "const_"

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        self._consts = 0

    # --- values -------------------------------------------------------------
    def node(self, v: Value) -> Node:
        """The IR node of ``v``, built from its constant or known form if needed."""
        if v.node is not None:
            return v.node
        if v.const is not None:
            v.node = self.const_node(v.const, v.param_name)
        elif v.known is not None:
            v.node = self.known_node(v.known, v.dtype, scalar=v.rank == 0)
        elif v.fact is not None:  # a comparison of dims, computed at run time
            direction, a, b = v.fact
            x, y = self.scalar(a, DType.i64), self.scalar(b, DType.i64)
            v.node = self.op(direction.lower(), x, y)
        else:
            raise UnsupportedError("a value with no contents (an anyshape bug)")
        return v.node

    def const_node(self, array: np.ndarray, name: str | None = None) -> Node:
        """A constant as IR: a broadcast literal when uniform, else a named weight."""
        array = np.asarray(array)
        dtype = DType.from_numpy(array.dtype)
        flat = array.reshape(-1)
        uniform = flat.size == 0 or bool(np.all(flat == flat[0]))
        if not uniform and flat.dtype.kind == "f":
            uniform = bool(np.all(np.isnan(flat)))  # NaN != NaN: a NaN fill is uniform too
        if uniform:
            return self.full(flat[0].item() if flat.size else 0, array.shape, dtype)
        if name is None or name in self.b.params:
            self._consts += 1
            name = f"{self.const_prefix}{self._consts}"
        return self.b.param(name, np.ascontiguousarray(array))

    def known_node(self, dims: Sequence, dtype: DType, scalar: bool = False) -> Node:
        parts = [self.scalar(d, dtype) for d in dims]
        if scalar:
            return parts[0]
        if not parts:
            return self.full(0, (0,), dtype)
        parts = [self.reshape(p, (1,)) for p in parts]
        return parts[0] if len(parts) == 1 else self.op("concatenate", *parts, axis=0)

    def scalar(self, d: Dim, dtype: DType) -> Node:
        d = as_dim(d)
        if isinstance(d, int):
            return self.b.constant(d, dtype)
        return self.op("shape_scalar", expr=d, dtype=dtype)

    # --- building blocks ---------------------------------------------------
    def broadcast_shape(self, shapes: Sequence[Sequence], what: str) -> tuple:
        """The NumPy broadcast of ``shapes`` under the policy in the module docstring."""
        rank = max((len(s) for s in shapes), default=0)
        out = []
        store = self.b.constraints
        for i in range(rank):
            dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
            result: Dim = 1
            for d in dims:
                d = as_dim(d)
                if isinstance(d, int) and d == 1:
                    continue
                if isinstance(result, int) and result == 1:
                    result = d
                    continue
                if store.prove_eq(result, d):
                    continue
                if isinstance(result, int) and isinstance(d, int):
                    raise UnsupportedError(f"{what}: cannot broadcast dims {result} and {d}")
                try:
                    store.guard_eq(result, d, f"{what}: broadcast dim {i}")
                except ValueError as e:
                    raise UnsupportedError(str(e)) from None
                if isinstance(d, int) or (isinstance(result, SymExpr) and _simpler(d, result)):
                    result = d
            out.append(result)
        return tuple(out)

    def broadcast_all(self, nodes: Sequence[Node], what: str) -> list[Node]:
        shape = self.broadcast_shape([n.shape for n in nodes], what)
        return [self.broadcast_to(n, shape) for n in nodes]

    def reduce(self, x: Node, kind: str, axes: Sequence[int]) -> Node:
        axes = tuple(sorted(axes))
        return self.op("reduce", x, kind=kind, axes=axes) if axes else x

    def expand_back(self, r: Node, shape: Sequence, axes: Sequence[int]) -> Node:
        """A reduction result (``axes`` dropped) broadcast back over ``shape``."""
        if not axes:
            return r
        kept = tuple(i for i in range(len(shape)) if i not in axes)
        return self.op("broadcast_in_dim", r, shape=tuple(shape), dims=kept)

    def mean(self, x: Node, axes: Sequence[int]) -> Node:
        s = self.reduce(x, "sum", axes)
        n = as_expr(1)
        for a in axes:
            n = n * as_expr(x.shape[a])
        count = self.cast(self.scalar(as_dim(n), DType.i64), x.dtype)
        return self.op("div", s, self.broadcast_to(count, s.shape))

    def keep_dims(self, r: Node, shape: Sequence, axes: Sequence[int]) -> Node:
        """A reduction result reshaped with each reduced axis kept as 1."""
        return self.reshape(r, [1 if i in axes else d for i, d in enumerate(shape)])


def _simpler(a, b) -> bool:
    """Whether symbolic dim ``a`` makes a better representative than ``b`` (a symbol)."""
    a, b = as_expr(a), as_expr(b)
    return a.is_symbol and not b.is_symbol


def clamp_nonneg(e) -> Dim:
    """``max(e, 0)`` for a dim expression, simplified when the sign is known."""
    e = as_expr(e)
    if e.is_constant:
        return max(e.constant_value, 0)
    if e.nonneg:
        return as_dim(e)
    return as_dim(sym_max(e, as_expr(0)))


def lowering_error(e: Exception, where: str, name: str, program: str) -> UnsupportedError:
    """What a rule raised, as the ``UnsupportedError`` a user sees: named after the node
    or op (``where``; kept if ``name`` is in the message already), the sizes of the
    ``program`` ("model") disagreeing, or an anyshape bug with the original as cause."""
    from ..ir.ops import IRTypeError

    text = str(e)
    if isinstance(e, UnsupportedError):
        return UnsupportedError(text if name in text else f"{where}: {text}")
    if isinstance(e, IRTypeError):
        return UnsupportedError(f"{where}: {text}")
    if isinstance(e, ValueError) and "can never hold" in text:  # static sizes disagree
        return UnsupportedError(f"{where}: the {program}'s sizes disagree: {text}")
    err = UnsupportedError(f"{where}: {type(e).__name__}: {text} (an anyshape bug)")
    err.__cause__ = e
    return err
