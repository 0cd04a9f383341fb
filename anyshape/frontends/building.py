"""IR building blocks every frontend's lowering uses, over a ``GraphBuilder``.

Sits under the frontends' lowering contexts (``frontends/torch/lowering.LowerCtx``,
``frontends/onnx/context.LowerCtx``), which inherit it: an op, a constant, a cast,
and the no-op-aware reshape, transpose and right-aligned broadcast. NumPy only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import UnsupportedError
from ..ir.dtypes import DType
from ..ir.graph import GraphBuilder, Node
from ..ir.symbolic import as_dim


class IRBuilding:
    """Building blocks over ``self.b``, the graph builder of the lowering."""

    b: GraphBuilder

    def op(self, name: str, /, *inputs: Node, **attrs) -> Node:
        return self.b.op(name, *inputs, **attrs)

    def const(self, value, dtype: DType) -> Node:
        return self.b.constant(value, dtype)

    def cast(self, x: Node, dtype: DType) -> Node:
        return x if x.dtype == dtype else self.op("convert", x, dtype=dtype)

    def full(self, value, shape: Sequence, dtype: DType) -> Node:
        """``value`` of ``dtype`` at every index of ``shape``."""
        return self.broadcast_to(self.const(value, dtype), shape)

    def broadcast_to(self, x: Node, shape: Sequence) -> Node:
        """NumPy-style broadcast of ``x`` (right-aligned) to ``shape``."""
        shape = tuple(as_dim(d) for d in shape)
        if tuple(x.shape) == shape:
            return x
        off = len(shape) - x.rank
        if off < 0:
            raise UnsupportedError(f"cannot broadcast {x.type} to rank {len(shape)}")
        return self.op("broadcast_in_dim", x, shape=shape, dims=tuple(range(off, len(shape))))

    def reshape(self, x: Node, shape: Sequence) -> Node:
        shape = tuple(as_dim(d) for d in shape)
        if tuple(x.shape) == shape:
            return x
        return self.op("reshape", x, shape=shape)

    def transpose(self, x: Node, perm: Sequence[int]) -> Node:
        perm = tuple(perm)
        if perm == tuple(range(x.rank)):
            return x
        return self.op("transpose", x, perm=perm)


def ir_name(text: str, taken: set[str], prefix: str = "") -> str:
    """A tidy unique name (letters, digits, ``_`` and ``.``) for a name from a model file."""
    name = prefix + (re.sub(r"[^A-Za-z0-9_.]", "_", text) or "v")
    if not re.match(r"[A-Za-z_]", name):
        name = "v_" + name
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name
