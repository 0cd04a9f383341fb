"""Reading an ONNX model: the first stage of the ONNX frontend.

``read_model`` takes a ``ModelProto``, a path, or serialized bytes; loads
external weight files (relative to the model's folder, or ``base_dir``);
inlines model-local functions; runs ``onnx.shape_inference.infer_shapes`` (its
results are only a cross-check of the lowering's own types, see ``lower.py``);
and returns an ``OnnxModel``: the
default-domain opset, the graph's real inputs (initializers listed as inputs,
as old exporters do, are weights), their declared types with dims made
symbolic by ``dims.DimNamer``, and every initializer as a NumPy array.

Imports ``onnx`` (never torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.types import TensorType
from .dims import DimNamer, is_plain_name

# TensorProto.DataType -> IR dtype (the element types the IR has).
ONNX_DTYPES = {
    1: DType.f32,
    2: DType.u8,
    3: DType.i8,
    4: DType.u16,
    5: DType.i16,
    6: DType.i32,
    7: DType.i64,
    9: DType.b8,
    10: DType.f16,
    11: DType.f64,
    12: DType.u32,
    13: DType.u64,
}


def ir_dtype(elem_type: int, what: str) -> DType:
    """The IR dtype of an ONNX element type, or ``UnsupportedError`` naming ``what``."""
    dt = ONNX_DTYPES.get(int(elem_type))
    if dt is None:
        import onnx

        name = onnx.TensorProto.DataType.Name(int(elem_type)) if elem_type else "UNDEFINED"
        raise UnsupportedError(f"{what}: element type {name} is not supported")
    return dt


def onnx_dtype(dtype: DType) -> int:
    """The ONNX element type of an IR dtype."""
    for k, v in ONNX_DTYPES.items():
        if v is dtype:
            return k
    raise UnsupportedError(f"dtype {dtype} has no ONNX element type here")


@dataclass
class OnnxModel:
    """What the lowering needs from a model file."""

    proto: object  # onnx.ModelProto, after shape inference
    opset: int  # of the default domain
    inputs: list[tuple[str, TensorType]]  # the graph's real inputs, in order
    output_names: list[str]
    initializers: dict[str, np.ndarray]
    inferred: dict[str, tuple[DType | None, tuple | None]] = field(default_factory=dict)
    name: str = "onnx_model"


def load_proto(model_or_path, base_dir: str | None = None):
    """A ``ModelProto`` with external data loaded, and the folder external data is under."""
    import onnx

    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no ONNX model at {path!r}")
        proto = onnx.load(path, load_external_data=False)
        folder = base_dir if base_dir is not None else os.path.dirname(os.path.abspath(path))
    elif isinstance(model_or_path, (bytes, bytearray)):
        proto = onnx.load_model_from_string(bytes(model_or_path))
        folder = base_dir or ""
    elif isinstance(model_or_path, onnx.ModelProto):
        proto = model_or_path
        folder = base_dir or ""
    else:
        raise TypeError(
            f"expected an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}"
        )
    return proto, folder


def _has_external(tensor) -> bool:
    import onnx

    return tensor.HasField("data_location") and tensor.data_location == onnx.TensorProto.EXTERNAL


def tensor_to_array(tensor, folder: str, what: str) -> np.ndarray:
    """A TensorProto's value as a NumPy array (external data read from ``folder``)."""
    from onnx import numpy_helper

    ir_dtype(tensor.data_type, what)  # refuse element types the IR lacks, with a name
    if _has_external(tensor):
        location = {e.key: e.value for e in tensor.external_data}.get("location", "?")
        if not folder:
            raise UnsupportedError(
                f"{what} is stored in the external file {location!r}: pass the model's path, "
                "or base_dir= the folder that file is in"
            )
        if not os.path.exists(os.path.join(folder, location)):
            raise FileNotFoundError(f"{what}: external data file {location!r} not in {folder!r}")
    return np.asarray(numpy_helper.to_array(tensor, folder))


def default_opset(proto) -> int:
    """The opset of the default ONNX domain the model imports."""
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise UnsupportedError("the model imports no version of the default ONNX domain")


def _dims_of(value_info) -> list | None:
    t = value_info.type
    if t.WhichOneof("value") != "tensor_type":
        return None
    if not t.tensor_type.HasField("shape"):
        return None
    return list(t.tensor_type.shape.dim)


def _inferred_types(graph) -> dict[str, tuple[DType | None, tuple | None]]:
    """name -> (dtype, shape of int | str | None) from shape inference, for cross-checks."""
    out = {}
    for vi in list(graph.value_info) + list(graph.output):
        t = vi.type
        if t.WhichOneof("value") != "tensor_type":
            continue
        dt = ONNX_DTYPES.get(int(t.tensor_type.elem_type))
        dims = _dims_of(vi)
        shape = None
        if dims is not None:
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims
            )
        out[vi.name] = (dt, shape)
    return out


def read_model(
    model_or_path, base_dir: str | None = None, values: dict[str, np.ndarray] | None = None
) -> OnnxModel:
    """Load, infer shapes, and gather inputs, outputs and weights of an ONNX model.

    ``values``: graph inputs given a fixed value (``specialize.py``); they become
    constants like initializers and leave the input list.
    """
    import onnx

    proto, folder = load_proto(model_or_path, base_dir)
    opset = default_opset(proto)
    if len(proto.functions):  # model-local functions: their bodies, inlined at each call
        import onnx.inliner

        proto = onnx.inliner.inline_local_functions(proto)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # inference is only a cross-check: a model it fails on still lowers
        inferred = proto
    graph = inferred.graph
    if len(graph.node) == 0 and len(proto.graph.node) > 0:
        graph = proto.graph  # inference dropped the body (e.g. on a huge model)
    initializers = {
        t.name: tensor_to_array(t, folder, f"initializer {t.name!r}") for t in graph.initializer
    }
    initializers.update(values or {})
    real_inputs = [vi for vi in graph.input if vi.name not in initializers]
    plain = set()
    for vi in real_inputs:
        for d in _dims_of(vi) or []:
            if d.HasField("dim_param") and is_plain_name(d.dim_param):
                plain.add(d.dim_param.strip())
    namer = DimNamer(plain)
    inputs = []
    for vi in real_inputs:
        what = f"input {vi.name!r}"
        if vi.type.WhichOneof("value") != "tensor_type":
            raise UnsupportedError(f"{what} is not a tensor ({vi.type.WhichOneof('value')})")
        dtype = ir_dtype(vi.type.tensor_type.elem_type, what)
        dims = _dims_of(vi)
        if dims is None:
            raise UnsupportedError(f"{what} has no declared rank; anyshape compiles per rank")
        inputs.append((vi.name, TensorType(dtype, namer.shape(dims))))
    name = graph.name or "onnx_model"
    return OnnxModel(
        proto=inferred,
        opset=opset,
        inputs=inputs,
        output_names=[o.name for o in graph.output],
        initializers=initializers,
        inferred=_inferred_types(graph),
        name=name,
    )
