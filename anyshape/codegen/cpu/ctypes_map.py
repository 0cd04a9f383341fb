"""C++ spellings of IR dtypes and literals for the CPU backend.

Sits at the bottom of the C++ emitter. Float literals are written in hex so the
generated code holds exactly the value the graph holds; f16 is stored as
``_Float16`` and computed in float.
"""

from __future__ import annotations

import math

from ...errors import UnsupportedError
from ...ir.dtypes import DType

C_TYPE = {
    DType.b8: "bool",
    DType.i8: "int8_t",
    DType.u8: "uint8_t",
    DType.i16: "int16_t",
    DType.i32: "int32_t",
    DType.i64: "int64_t",
    DType.f16: "_Float16",
    DType.f32: "float",
    DType.f64: "double",
    DType.u16: "uint16_t",
    DType.u32: "uint32_t",
    DType.u64: "uint64_t",
}

# The type arithmetic happens in (f16 computes in float, like torch's opmath).
COMPUTE_TYPE = {**C_TYPE, DType.f16: "float"}

# Codes shared with the runtime's tensor descriptors.
DTYPE_CODE = {d: i for i, d in enumerate(DType)}


def c_type(dt: DType) -> str:
    try:
        return C_TYPE[dt]
    except KeyError:
        raise UnsupportedError(f"dtype {dt} is not supported by the CPU backend") from None


def compute_type(dt: DType) -> str:
    c_type(dt)
    return COMPUTE_TYPE[dt]


def rounded(dt: DType, expr: str) -> str:
    """``expr`` (computed in float) rounded to ``dt`` when f16 stores narrower than it
    computes: each f16 op eager runs rounds its result to half, so a fused chain must too
    ((x - m) * s differed from eager in 1 element of 6 without it)."""
    return f"((float)(_Float16)({expr}))" if dt is DType.f16 else expr


def literal(value, dt: DType) -> str:
    """A C++ literal of ``value`` in the compute type of ``dt``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt is DType.u64:
            return f"UINT64_C({v % 2**64})"
        if dt is DType.i64:
            return "(INT64_C(-9223372036854775807) - 1)" if v == -(2**63) else f"INT64_C({v})"
        return f"(({compute_type(dt)}){v})"
    v = float(value)
    ct = compute_type(dt)
    if math.isnan(v):
        return f'(({ct})__builtin_nan(""))'
    if math.isinf(v):
        return f"(({ct})({'-' if v < 0 else ''}__builtin_inf()))"
    return f"(({ct}){v.hex()})"
