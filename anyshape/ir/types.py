"""Tensor types of the graph IR: a dtype and a shape of static or symbolic dims.

Sits on ``dtypes`` and ``symbolic``; every IR value has exactly one TensorType.
The rank is always static (anyshape specializes on rank and dtype only).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType
from .symbolic import SymExpr, as_dim, format_dim, shape_numel

Dim = int | SymExpr


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(as_dim(d) for d in self.shape))
        for d in self.shape:
            if isinstance(d, int) and d < 0:
                raise ValueError(f"negative dim {d} in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return shape_numel(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def free_symbols(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for d in self.shape:
            if isinstance(d, SymExpr):
                out |= d.free_symbols
        return out

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(format_dim(d) for d in self.shape)}]"

    __repr__ = __str__
