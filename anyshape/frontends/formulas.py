"""Index and weight formulas over IR tensors, written as arithmetic.

Sits beside ``building.py`` under every frontend's lowering: ``T`` wraps a node of
a lowering context (``frontends/torch/lowering.LowerCtx``, ``frontends/onnx/
context.LowerCtx``) with Python operators, so a rule that computes positions as
tensors (resizing, sampling grids, padding modes) reads as the formula it
implements: ``iota`` -> ``(y + 0.5) / s - 0.5`` -> ``floor`` -> ``gather``. A
number next to a tensor takes the tensor's dtype; lower ranks broadcast on the
right, as NumPy does.
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.graph import Node
from ..ir.symbolic import SymExpr, as_dim

I64 = DType.i64


def elementwise(ctx, op: str, *args, dtype: DType | None = None) -> Node:
    """An elementwise op on nodes (or ``T``) and numbers; numbers and lower ranks broadcast."""
    args = [a.n if isinstance(a, T) else a for a in args]
    nodes = [a for a in args if isinstance(a, Node)]
    shape = max((n.shape for n in nodes), key=len)
    dtype = dtype or next((n.dtype for n in nodes if n.dtype is not DType.b8), DType.b8)
    fit = [ctx.broadcast_to(a, shape) if isinstance(a, Node) else a for a in args]
    return ctx.op(op, *[a if isinstance(a, Node) else ctx.full(a, shape, dtype) for a in fit])


def _binary(op: str, swap: bool = False):
    def method(self, other):
        return T(self.ctx, elementwise(self.ctx, op, *((other, self) if swap else (self, other))))

    return method


class T:
    """A node with operators, so index computations read as formulas (a number takes the
    other operand's dtype; ``eq``/``ne`` compare; ``p.where(a, b)`` selects on ``p``)."""

    __slots__ = ("ctx", "n")

    def __init__(self, ctx, n: Node):
        self.ctx, self.n = ctx, n

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __mod__ = _binary("rem")
    __lt__, __le__, __gt__, __ge__ = _binary("lt"), _binary("le"), _binary("gt"), _binary("ge")
    __and__, __or__ = _binary("and"), _binary("or")
    eq, ne, pow = _binary("eq"), _binary("ne"), _binary("pow")
    max, min = _binary("max"), _binary("min")

    def un(self, op: str) -> T:
        return T(self.ctx, self.ctx.op(op, self.n))

    def to(self, dtype: DType) -> T:
        return T(self.ctx, self.ctx.cast(self.n, dtype))

    def clamp(self, lo, hi) -> T:
        return self.min(hi).max(lo)

    def where(self, a, b, dtype: DType | None = None) -> T:
        return T(self.ctx, elementwise(self.ctx, "select", self, a, b, dtype=dtype))


def iota(ctx, shape, dim: int, dtype: DType) -> T:
    """0, 1, 2... along ``dim`` of ``shape``."""
    return T(ctx, ctx.op("iota", shape=tuple(shape), dim=dim, dtype=dtype))


def dim_value(ctx, d, dtype: DType) -> T:
    """A dim (a number or a symbolic size) as a rank-0 value of ``dtype``."""
    d = as_dim(d)
    if isinstance(d, SymExpr):
        return T(ctx, ctx.cast(ctx.op("shape_scalar", expr=d, dtype=I64), dtype))
    return T(ctx, ctx.const(d, dtype))


def along(ctx, v: Node, shape, axis: int) -> Node:
    """A vector laid along ``axis`` of ``shape``."""
    return ctx.op("broadcast_in_dim", v, shape=tuple(shape), dims=(axis,))


def cubic_kernel(t: T, a: float) -> T:
    """Keys' cubic convolution kernel at distance ``t >= 0`` (0 from 2 on)."""
    t2 = t * t
    t3 = t2 * t
    far = (t < 2.0).where(t3 * a - t2 * (5 * a) + t * (8 * a) - 4 * a, 0.0)
    return (t <= 1.0).where(t3 * (a + 2) - t2 * (a + 3) + 1.0, far)


def weighted_taps(ctx, x: Node, axis: int, taps) -> Node:
    """One resampling pass along ``axis``: the sum over ``(index, weight)`` taps of ``x``
    gathered at ``index`` (a vector of the output's length) times ``weight`` (a vector
    of it, or None for 1), added in the taps' order."""
    total = None
    for index, weight in taps:
        g = ctx.op("gather", x, index.n, axis=axis)
        if weight is not None:
            g = ctx.op("mul", g, along(ctx, weight.to(g.dtype).n, g.shape, axis))
        total = g if total is None else ctx.op("add", total, g)
    return total
