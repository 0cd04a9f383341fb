"""Element types of the graph IR.

Sits at the bottom of the IR: every ``TensorType`` carries one ``DType``. The
names printed here (``f32``, ``i64``, ``b8`` ...) are the IR's text spelling;
conversions to NumPy live here, conversions to torch live in the torch frontend.
"""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    """An element type, named by its IR spelling."""

    b8 = "b8"
    i8 = "i8"
    u8 = "u8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    u16 = "u16"  # the wider unsigned types come last: the order is the ABI's dtype code
    u32 = "u32"
    u64 = "u64"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_bool(self) -> bool:
        return self is DType.b8

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def to_numpy(self) -> np.dtype:
        """The NumPy dtype; bf16 has none and raises."""
        if self is DType.bf16:
            raise TypeError("bf16 has no NumPy equivalent")
        return np.dtype(_NUMPY[self])

    @staticmethod
    def from_numpy(dt: np.dtype) -> DType:
        dt = np.dtype(dt)
        for k, v in _NUMPY.items():
            if np.dtype(v) == dt:
                return k
        raise TypeError(f"NumPy dtype {dt} has no anyshape equivalent")

    @staticmethod
    def parse(text: str) -> DType:
        try:
            return DType(text)
        except ValueError:
            raise ValueError(f"unknown dtype {text!r}") from None


_FLOATS = {DType.f16, DType.bf16, DType.f32, DType.f64}
_INTS = {DType.i8, DType.u8, DType.i16, DType.i32, DType.i64, DType.u16, DType.u32, DType.u64}
_ITEMSIZE = {
    DType.b8: 1,
    DType.i8: 1,
    DType.u8: 1,
    DType.i16: 2,
    DType.i32: 4,
    DType.i64: 8,
    DType.f16: 2,
    DType.bf16: 2,
    DType.f32: 4,
    DType.f64: 8,
    DType.u16: 2,
    DType.u32: 4,
    DType.u64: 8,
}
_NUMPY = {
    DType.b8: "bool",
    DType.i8: "int8",
    DType.u8: "uint8",
    DType.i16: "int16",
    DType.i32: "int32",
    DType.i64: "int64",
    DType.f16: "float16",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.u16: "uint16",
    DType.u32: "uint32",
    DType.u64: "uint64",
}

DTYPE_NAMES = frozenset(d.value for d in DType)
