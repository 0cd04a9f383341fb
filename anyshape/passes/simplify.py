"""Simplify: remove no-op casts, reshapes, transposes and broadcasts; compose view chains.

Also folds a comparison of integers that their value ranges decide (an iota is 0 or
more at every size: transformers' bidirectional attention mask ``kv_idx >= 0`` is all
true) and a select on a constant predicate, so a mask that masks nothing costs no load
and no select per attention score.

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


# Integer value ranges: how deep a value's producers are followed, and the values a
# range may hold (outside them: unknown, so that no fold depends on int64 wrapping).
_RANGE_DEPTH = 8
_RANGE_LIMIT = 1 << 31
_VIEWS = ("broadcast_in_dim", "reshape", "transpose")


def _int_range(node: Node, depth: int = 0) -> tuple[int | None, int | None] | None:
    """The least and greatest value of an int64 ``node`` (None: unbounded that way), or
    None where unknown. An iota is at least 0 at every size (at most its size - 1 when that
    is static); views keep their operand's values; constants, sums and differences, all
    far inside int64 (a narrower or unsigned type wraps within sizes a model meets: an i8
    iota over 200 elements is negative from 128 on)."""
    if node.dtype is not DType.i64 or depth > _RANGE_DEPTH:
        return None
    if node.op == "constant":
        v = node.attr("value")
        return (v, v) if isinstance(v, int) and abs(v) < _RANGE_LIMIT else None
    if node.op == "iota":
        size = node.shape[node.attr("dim")]
        return (0, size - 1 if isinstance(size, int) and size < _RANGE_LIMIT else None)
    if node.op in _VIEWS:
        return _int_range(node.inputs[0], depth + 1)
    if node.op not in ("add", "sub"):
        return None
    a, b = (_int_range(i, depth + 1) for i in node.inputs)
    if a is None or b is None:
        return None
    if node.op == "sub":
        b = (None if b[1] is None else -b[1], None if b[0] is None else -b[0])
    lo = None if a[0] is None or b[0] is None else a[0] + b[0]
    hi = None if a[1] is None or b[1] is None else a[1] + b[1]
    if any(v is not None and abs(v) >= _RANGE_LIMIT for v in (lo, hi)):
        return None
    return lo, hi


def _below(a, b) -> bool:
    """Whether every value of range ``a`` is below every value of range ``b``."""
    return a[1] is not None and b[0] is not None and a[1] < b[0]


def _at_most(a, b) -> bool:
    return a[1] is not None and b[0] is not None and a[1] <= b[0]


def _decided_comparison(node: Node) -> Node | None:
    """A comparison of integers whose ranges decide it, as that constant everywhere."""
    a, b = (_int_range(i) for i in node.inputs)
    if a is None or b is None:
        return None
    decided = {
        "lt": (_below(a, b), _at_most(b, a)),
        "le": (_at_most(a, b), _below(b, a)),
        "gt": (_below(b, a), _at_most(a, b)),
        "ge": (_at_most(b, a), _below(a, b)),
        "eq": (False, _below(a, b) or _below(b, a)),
        "ne": (_below(a, b) or _below(b, a), False),
    }[node.op]
    if not any(decided):
        return None
    value = (("dtype", DType.b8), ("value", decided[0]))
    scalar = Node("constant", (), value, TensorType(DType.b8, ()))
    if node.rank == 0:
        return scalar
    attrs = (("dims", ()), ("shape", tuple(node.shape)))
    return Node("broadcast_in_dim", (scalar,), attrs, node.type)


def _view_of_a_splat(node: Node) -> Node | None:
    """A view of a scalar broadcast everywhere: that scalar broadcast to the view's shape."""
    src = node.inputs[0]
    if src.op != "broadcast_in_dim" or src.inputs[0].rank != 0:
        return None
    attrs = (("dims", ()), ("shape", tuple(node.shape)))
    return Node("broadcast_in_dim", src.inputs, attrs, node.type)


def _select_on_a_constant(node: Node) -> Node | None:
    """``select(p, a, b)`` with ``p`` the same constant everywhere: ``a`` or ``b``."""
    p = node.inputs[0]
    if p.op == "broadcast_in_dim" and p.inputs[0].rank == 0:
        p = p.inputs[0]
    if p.op != "constant":
        return None
    chosen = node.inputs[1] if p.attr("value") else node.inputs[2]
    return chosen if chosen.type == node.type else None


RULES = {
    "convert": [_same_type_noop, _convert_of_convert],
    "reshape": [_same_type_noop, _view_of_a_splat, _reshape_of_view],
    "transpose": [_transpose_identity, _view_of_a_splat, _transpose_of_transpose],
    "broadcast_in_dim": [_broadcast_identity, _view_of_a_splat, _broadcast_of_unit_dims],
    **dict.fromkeys(("lt", "le", "gt", "ge", "eq", "ne"), [_decided_comparison]),
    "select": [_select_on_a_constant],
}


def run(graph: Graph, options: Options) -> Graph:
    return graph_rewrite(graph, RULES, "simplify")
