"""Simplify: remove no-op casts, reshapes, transposes and broadcasts; compose view chains.

Pass contract: needs a verified graph; keeps every output's type; under dynamic
shapes it compares dims structurally (canonical SymExprs), never by value, so
it is valid for every size. Leaves fusion decisions to later passes.
"""

from __future__ import annotations

from ..config import Options
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from .rewrite import graph_rewrite


def _same_type_noop(node: Node) -> Node | None:
    src = node.inputs[0]
    return src if src.type == node.type else None


def _transpose_identity(node: Node) -> Node | None:
    perm = node.attr("perm")
    return node.inputs[0] if tuple(perm) == tuple(range(len(perm))) else None


def _transpose_of_transpose(node: Node) -> Node | None:
    src = node.inputs[0]
    if src.op != "transpose":
        return None
    inner, outer = src.attr("perm"), node.attr("perm")
    perm = tuple(inner[p] for p in outer)
    attrs = tuple(sorted({"perm": perm}.items()))
    return Node("transpose", src.inputs, attrs, node.type)


def _reshape_of_view(node: Node) -> Node | None:
    src = node.inputs[0]
    if src.op != "reshape":
        return None
    return Node("reshape", src.inputs, node.attrs, node.type)


def _convert_of_convert(node: Node) -> Node | None:
    src = node.inputs[0]
    # A round trip folds only through a type that holds every value of the first one
    # exactly (f32 -> f64 -> f32, i8 -> f32 -> i8); not through bool (5 -> true -> 1) or
    # between f16 and bf16 (neither holds the other's values).
    if (
        src.op == "convert"
        and src.inputs[0].dtype == node.dtype
        and src.dtype in _HOLDS_EXACTLY[node.dtype]
    ):
        return src.inputs[0]
    return None


# dtype -> the types that represent each of its values exactly
_HOLDS_EXACTLY = {
    DType.b8: frozenset(DType) - {DType.b8},
    DType.i8: frozenset(
        {DType.i16, DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32, DType.f64}
    ),
    DType.u8: frozenset(
        {DType.i16, DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32, DType.f64}
        | {DType.u16, DType.u32, DType.u64}
    ),
    DType.u16: frozenset({DType.i32, DType.i64, DType.u32, DType.u64, DType.f32, DType.f64}),
    DType.u32: frozenset({DType.i64, DType.u64, DType.f64}),
    DType.u64: frozenset(),
    DType.i16: frozenset({DType.i32, DType.i64, DType.f32, DType.f64}),
    DType.i32: frozenset({DType.i64, DType.f64}),
    DType.i64: frozenset(),
    DType.f16: frozenset({DType.f32, DType.f64}),
    DType.bf16: frozenset({DType.f32, DType.f64}),
    DType.f32: frozenset({DType.f64}),
    DType.f64: frozenset(),
}


def _broadcast_identity(node: Node) -> Node | None:
    src = node.inputs[0]
    dims = node.attr("dims")
    if src.type == node.type and tuple(dims) == tuple(range(src.rank)):
        return src
    return None


def _broadcast_of_unit_dims(node: Node) -> Node | None:
    """``broadcast_in_dim`` of an operand whose static size-1 dims are expanded: those dims
    dropped from the operand first (a reshape, a view), so a reduction's result that was
    reshaped to keep its reduced dim reaches the broadcast as the reduction itself."""
    src = node.inputs[0]
    dims, shape = node.attr("dims"), node.shape
    drop = [i for i, d in enumerate(dims) if src.shape[i] == 1 and shape[d] != 1]
    if not drop:
        return None
    kept = [i for i in range(src.rank) if i not in drop]
    inner_type = TensorType(src.dtype, tuple(src.shape[i] for i in kept))
    inner = Node("reshape", (src,), (("shape", inner_type.shape),), inner_type)
    if src.op == "reshape":
        inner = _reshape_of_view(inner)
        if inner.type == inner.inputs[0].type:
            inner = inner.inputs[0]
    attrs = tuple(sorted({"dims": tuple(dims[i] for i in kept), "shape": shape}.items()))
    return Node("broadcast_in_dim", (inner,), attrs, node.type)


RULES = {
    "convert": [_same_type_noop, _convert_of_convert],
    "reshape": [_same_type_noop, _reshape_of_view],
    "transpose": [_transpose_identity, _transpose_of_transpose],
    "broadcast_in_dim": [_broadcast_identity, _broadcast_of_unit_dims],
}


def run(graph: Graph, options: Options) -> Graph:
    return graph_rewrite(graph, RULES, "simplify")
