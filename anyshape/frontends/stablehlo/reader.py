"""Reading StableHLO/MHLO text: the StableHLO frontend's first stage.

Parses with the MLIR Python bindings that ``jaxlib`` ships (the stablehlo and
chlo dialects, plus func, arith, shape and tensor, which torch-mlir's output
uses): no hand-written MLIR parser. Hands the driver (``lower.py``) a
``Program``: the parsed module, its functions by name, the entry function and
the ``dense_resource`` blobs of the module's resource section (torch-mlir keeps
weights there; the bindings parse the references but give no way to read the
bytes back, so the section is read from the text here).

MHLO text (no mhlo dialect in jaxlib) is read as StableHLO where it does not
parse as written. Ops of dialects the bindings do not register (TensorFlow's leftover ``tf.*``)
parse as unregistered ops, so the lowering can name them in its error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ...errors import UnsupportedError
from ...ir.dtypes import DType

_ELEMENT_TYPES = {
    "f16": DType.f16,
    "bf16": DType.bf16,
    "f32": DType.f32,
    "f64": DType.f64,
    "i1": DType.b8,
    "i8": DType.i8,
    "i16": DType.i16,
    "i32": DType.i32,
    "i64": DType.i64,
    "ui8": DType.u8,
    "ui16": DType.u16,
    "ui32": DType.u32,
    "ui64": DType.u64,
    "index": DType.i64,  # shape computations in torch-mlir's output
}
_RESOURCE_ENTRY = re.compile(r"^\s*([A-Za-z_][\w.$-]*)\s*:\s*\"0x([0-9A-Fa-f]*)\"", re.M)


def import_bindings():
    """jaxlib's MLIR bindings (``ir``, ``stablehlo``, ``chlo``), or a clear error."""
    try:
        from jaxlib.mlir import ir
        from jaxlib.mlir._mlir_libs import _jax_mlir_ext
        from jaxlib.mlir.dialects import chlo, stablehlo
    except ImportError as e:
        raise UnsupportedError(
            "the StableHLO frontend parses with the MLIR bindings jaxlib ships: "
            f"pip install 'anyshape[stablehlo]' (or jaxlib) ({e})"
        ) from None
    return ir, stablehlo, chlo, _jax_mlir_ext


def mlir_context():
    """A context with every dialect StableHLO producers write registered."""
    ir, stablehlo, chlo, jax_ext = import_bindings()
    registry = ir.DialectRegistry()
    jax_ext.register_dialects(registry)  # func, arith, shape, tensor, ... (without it: no func)
    ctx = ir.Context()
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    return ctx


@dataclass
class Program:
    """A parsed module: its functions by name, the entry, the resource blobs."""

    context: object
    module: object
    functions: dict = field(default_factory=dict)
    entry: object = None
    resources: dict[str, bytes] = field(default_factory=dict)
    name: str = "stablehlo"


def read_text(text_or_path) -> tuple[str, str]:
    """The module text and a name for it, from text, bytes or a path."""
    if isinstance(text_or_path, bytes):
        text_or_path = text_or_path.decode()
    if isinstance(text_or_path, os.PathLike) or (
        isinstance(text_or_path, str) and "\n" not in text_or_path and "{" not in text_or_path
    ):
        path = os.fspath(text_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no StableHLO file at {path!r}")
        with open(path, encoding="utf-8") as f:
            return f.read(), os.path.splitext(os.path.basename(path))[0]
    if not isinstance(text_or_path, str):
        raise TypeError(
            f"expected StableHLO text, bytes or a path, got {type(text_or_path).__name__}"
        )
    return text_or_path, "stablehlo"


def read_program(text_or_path, entry: str = "main") -> Program:
    """Parse a module and find its entry function (``main``, or the only public one)."""
    text, name = read_text(text_or_path)
    ctx = mlir_context()
    ir = import_bindings()[0]
    with ctx:
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # the bindings raise MLIRError with the diagnostics
            if not _MHLO.search(text):
                raise UnsupportedError(f"the StableHLO text does not parse: {e}") from None
            module = _parse_mhlo(ir, text, e)
    program = Program(ctx, module, name=_module_name(module) or name)
    for op in module.body.operations:
        if op.operation.name == "func.func":
            fname = str(op.attributes["sym_name"]).strip('"')
            program.functions[fname] = op
    if not program.functions:
        raise UnsupportedError("the StableHLO module has no func.func")
    if entry in program.functions:
        program.entry = program.functions[entry]
    else:
        public = [
            f
            for f in program.functions.values()
            if "sym_visibility" not in f.attributes
            or str(f.attributes["sym_visibility"]).strip('"') == "public"
        ]
        if len(public) != 1:
            raise UnsupportedError(
                f"no function @{entry} and {len(public)} public functions: "
                f"pick one with entry= (functions: {', '.join(program.functions)})"
            )
        program.entry = public[0]
    program.resources = read_resources(text)
    return program


_MHLO = re.compile(r"(#?)\bmhlo([.<])")


def _parse_mhlo(ir, text: str, first_error):
    """MHLO text: jaxlib registers no mhlo dialect, but the ops StableHLO shares with it
    print alike, so the text is read with ``mhlo`` spelled ``stablehlo``."""
    try:
        return ir.Module.parse(_MHLO.sub(r"\1stablehlo\2", text))
    except Exception as e:
        raise UnsupportedError(
            f"the MHLO text does not parse as StableHLO (an op without a StableHLO "
            f"equivalent?): {e}\n(as written: {first_error})"
        ) from None


def _module_name(module) -> str | None:
    attrs = module.operation.attributes
    if "sym_name" in attrs:
        return re.sub(r"[^A-Za-z0-9_]", "_", str(attrs["sym_name"]).strip('"'))
    return None


def read_resources(text: str) -> dict[str, bytes]:
    """The ``dialect_resources`` blobs: name -> raw bytes (the 4-byte alignment dropped)."""
    at = text.rfind("{-#")
    if at < 0 or "dialect_resources" not in text[at:]:
        return {}
    out = {}
    for m in _RESOURCE_ENTRY.finditer(text[at:]):
        blob = bytes.fromhex(m.group(2))
        out[m.group(1)] = blob[4:]  # the blob starts with its alignment, a little-endian u32
    return out


def element_dtype(element_type) -> DType:
    text = str(element_type)
    if text not in _ELEMENT_TYPES:
        raise UnsupportedError(f"element type {text} is not supported")
    return _ELEMENT_TYPES[text]


def tensor_type(t) -> tuple[DType, tuple]:
    """An MLIR ranked tensor (or index/integer scalar) type: dtype, dims (None for ``?``)."""
    ir = import_bindings()[0]
    if isinstance(t, ir.RankedTensorType):
        dims = tuple(None if t.is_dynamic_dim(i) else t.get_dim_size(i) for i in range(t.rank))
        return element_dtype(t.element_type), dims
    if isinstance(t, (ir.IndexType, ir.IntegerType, ir.F32Type, ir.F64Type)):
        return element_dtype(t), ()
    raise UnsupportedError(f"type {t} is not a ranked tensor")
