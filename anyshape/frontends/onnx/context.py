"""ONNX values during lowering, and the helpers every ONNX rule uses.

Sits between the driver (``lower.py``) and the rule families
(``elementwise.py``, ``shape_ops.py``, ``nn_ops.py``). Each ONNX value is a
shared ``frontends/values.Value`` (IR node, constant, or known vector of
symbolic dims: ``Shape -> Gather -> Concat -> Reshape`` folds into symbolic dims
and never becomes tensor code), lowered under the shared broadcasting policy
(``values.ValueLowering``). ``LowerCtx`` adds ONNX's reads of compile-time
values: a shape, axes or starts given as a graph input need that input's value.

``Rule`` registration: ``rule("Add", first=7)`` records a function
``fn(ctx, onnx_node, inputs) -> list[Value]`` for opsets ``first..last`` in the
family's ``RULES`` list; ``rules.py`` gathers the families into one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import UnsupportedError
from ...ir.types import TensorType
from ..values import Dim, Value, ValueLowering, clamp_nonneg

__all__ = ["Dim", "LowerCtx", "NeedsInputValue", "Value", "clamp_nonneg", "norm_axis"]
# The newest opset the rules were checked against. Versions 23-28 of the ops
# here add element types (float4/8, int2/4...) or attributes for those types
# only (Cast's round_mode for float8e8m0, Range's stash_type for 16-bit floats);
# the reader refuses those element types, so the rules' semantics hold.
LAST_OPSET = 28


class NeedsInputValue(UnsupportedError):
    """A rule needs the value of a graph input (a shape, axes or starts given as an input).

    Raised by ``LowerCtx.const_of`` and ``known_of``; ``compile.py`` answers it by
    compiling the model per distinct value of that input (``specialize.py``).
    """

    def __init__(self, input_name: str, what: str):
        super().__init__(
            f"{what} must be known at compile time; it is the graph input {input_name!r}"
        )
        self.input_name = input_name


@dataclass
class RuleEntry:
    op_type: str
    first: int
    last: int
    fn: Callable


def rule_registry() -> tuple[list[RuleEntry], Callable]:
    """A family's ``RULES`` list and the decorator that fills it."""
    rules: list[RuleEntry] = []

    def rule(*op_types: str, first: int = 1, last: int = LAST_OPSET):
        def register(fn):
            for op_type in op_types:
                rules.append(RuleEntry(op_type, first, last, fn))
            return fn

        return register

    return rules, rule


class OnnxNodeView:
    """An ONNX NodeProto's attributes as Python values."""

    def __init__(self, proto, opset: int):
        from onnx import helper

        self.proto = proto
        self.opset = opset
        self.op_type = proto.op_type
        self.name = proto.name or f"<unnamed {proto.op_type} -> {list(proto.output)}>"
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        self.outputs = list(proto.output)

    def attr(self, key: str, default=None):
        v = self.attrs.get(key, default)
        if isinstance(v, bytes):
            return v.decode()
        return v

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type}, opset {self.opset})"


class LowerCtx(ValueLowering):
    """The shared value lowering plus ONNX's reads of compile-time values."""

    const_prefix = "onnx_const_"

    @staticmethod
    def const_of(v: Value, what: str) -> np.ndarray:
        if v.const is None and v.input_name is not None:
            raise NeedsInputValue(v.input_name, what)
        if v.const is None:
            if v.known is not None and all(isinstance(d, int) for d in v.known):
                return np.array(v.known, dtype=v.dtype.to_numpy()).reshape(v.shape)
            raise UnsupportedError(f"{what} must be a constant (here it is computed)")
        return v.const

    @staticmethod
    def known_of(v: Value, what: str) -> tuple:
        """The elements of an integer vector as dims (constants or shape values)."""
        dims = v.dims()
        if dims is not None:
            return dims
        if v.input_name is not None:
            raise NeedsInputValue(v.input_name, what)
        raise UnsupportedError(
            f"{what} must be known at compile time (a constant or computed from shapes); "
            "here it depends on tensor data"
        )


def norm_axis(axis: int, rank: int, what: str) -> int:
    """An ONNX axis (negative counts from the end) as 0..rank-1."""
    r = max(rank, 1)
    if not -r <= int(axis) < r:
        raise UnsupportedError(f"{what}: axis {axis} out of range for rank {rank}")
    return int(axis) % r


def tensor_type(v: Value) -> TensorType:
    return TensorType(v.dtype, v.shape)
