"""StableHLO rules for the IR's indexing ops: gather, take_along_axis and scatter.

Sits beside ``ops`` and ``reduce_ops`` under the driver (``emit``), on the
``Builder``. ``gather`` is one ``stablehlo.gather`` (``dynamic_gather`` when a
kept dim is symbolic, since its slice sizes are then run-time values), with
negative indices wrapped as the IR defines; ``take_along_axis`` gathers single
elements at full index vectors (an iota per dim, the indices along the axis);
``scatter`` with mode ``add`` is one ``stablehlo.scatter`` with an add body.
Mode ``set`` must let the last update (in row-major order) of duplicate indices
win, which ``stablehlo.scatter`` leaves unspecified; it is written as a
scatter-max of update positions (the winner of every row), a gather of the
winning updates and a select against the base: deterministic on every backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, shape_numel
from ...ir.types import Dim
from .builder import (
    I64,
    Builder,
    RegionBody,
    i64_array,
    int_list,
    is_signed,
    is_static,
    tensor_type,
)
from .ops import Rule


def gather_numbers(kind: str, **fields: Sequence[int] | int) -> str:
    """``#stablehlo.gather<...>`` / ``#stablehlo.scatter<...>``, empty lists left out."""
    parts = []
    for key, value in fields.items():
        if isinstance(value, int):
            parts.append(f"{key} = {value}")
        elif value:
            parts.append(f"{key} = {int_list(value)}")
    return f"#stablehlo.{kind}<{', '.join(parts)}>"


def wrapped_indices(b: Builder, idx: str, dtype: DType, shape: Sequence[Dim], n: Dim) -> str:
    """Indices as i64, a negative one counted from the end of a dim of size ``n``."""
    value = b.convert(idx, dtype, I64, shape)
    if not is_signed(dtype):
        return value
    ty = tensor_type(I64, shape)
    negative = b.compare("LT", value, b.splat(0, I64, shape), I64, shape)
    size = (
        b.splat(n, I64, shape) if isinstance(n, int) else b.broadcast(b.dim(n), I64, (), shape, ())
    )
    return b.select(negative, b.binary("add", value, size, ty), value, I64, shape)


def nonempty(
    b: Builder, x: str, dtype: DType, shape: Sequence[Dim], dims: Sequence[int]
) -> tuple[str, tuple[Dim, ...]]:
    """``x`` with one element of padding at the end of each of ``dims`` that may be 0.

    A gather's slice of one element must fit in the operand even when no index
    reads it (an empty dim has nothing to read and no valid index either).
    """
    grow = [i in dims and _may_be_empty(b, d) for i, d in enumerate(shape)]
    if not any(grow):
        return x, tuple(shape)
    padded = tuple(as_dim(as_expr(d) + 1) if g else d for d, g in zip(shape, grow))
    zero = b.const(False if dtype is DType.b8 else 0, dtype)
    zeros = [0] * len(shape)
    high = [int(g) for g in grow]
    out = b.op(
        f"stablehlo.pad {x}, {zero}, low = {int_list(zeros)}, high = {int_list(high)}, "
        f"interior = {int_list(zeros)} : ({tensor_type(dtype, shape)}, "
        f"{tensor_type(dtype, ())}) -> {tensor_type(dtype, padded)}"
    )
    return out, padded


def _may_be_empty(b: Builder, d: Dim) -> bool:
    if isinstance(d, int):
        return d < 1
    lo, _ = b.store.bounds(d)
    return lo is None or lo < 1


def take(
    b: Builder,
    x: str,
    dtype: DType,
    x_shape: Sequence[Dim],
    index: str,
    index_shape: Sequence[Dim],
    axis: int,
    out_shape: Sequence[Dim],
) -> str:
    """``x.take(index, axis)`` for in-range i64 indices: one gather."""
    x, x_shape = nonempty(b, x, dtype, x_shape, [axis])
    rank, k = len(x_shape), len(index_shape)
    numbers = gather_numbers(
        "gather",
        offset_dims=[*range(axis), *range(axis + k, k + rank - 1)],
        collapsed_slice_dims=[axis],
        start_index_map=[axis],
        index_vector_dim=k,
    )
    sizes = [1 if i == axis else d for i, d in enumerate(x_shape)]
    tx, ti, tout = (
        tensor_type(dtype, x_shape),
        tensor_type(I64, index_shape),
        tensor_type(dtype, out_shape),
    )
    if is_static(sizes):
        return b.op(
            f'"stablehlo.gather"({x}, {index}) <{{dimension_numbers = {numbers}, '
            f"indices_are_sorted = false, slice_sizes = {i64_array(sizes)}}}> : "
            f"({tx}, {ti}) -> {tout}"
        )
    vec = b.shape(sizes)
    return b.op(
        f'"stablehlo.dynamic_gather"({x}, {index}, {vec}) <{{dimension_numbers = {numbers}, '
        f"indices_are_sorted = false}}> : ({tx}, {ti}, {tensor_type(I64, (rank,))}) -> {tout}"
    )


def _gather(b: Builder, node: Node, args: list[str]) -> str:
    x, idx = node.inputs
    axis = node.attr("axis")
    index = wrapped_indices(b, args[1], idx.dtype, idx.shape, x.shape[axis])
    return take(b, args[0], x.dtype, x.shape, index, idx.shape, axis, node.shape)


def _take_along_axis(b: Builder, node: Node, args: list[str]) -> str:
    x, idx = node.inputs
    axis, shape, rank = node.attr("axis"), idx.shape, idx.rank
    index = wrapped_indices(b, args[1], idx.dtype, shape, x.shape[axis])
    column = (*shape, 1)
    parts = [
        b.reshape(index, I64, shape, column) if d == axis else b.iota(I64, column, d)
        for d in range(rank)
    ]
    full = (*shape, rank)
    source, source_shape = nonempty(b, args[0], x.dtype, x.shape, range(rank))
    if rank == 1:
        vectors = parts[0]
    else:
        types = ", ".join(tensor_type(I64, column) for _ in parts)
        vectors = b.op(
            f"stablehlo.concatenate {', '.join(parts)}, dim = {rank} : ({types}) -> "
            f"{tensor_type(I64, full)}"
        )
    # Every dim collapsed, slices of one element: the index vectors may address a
    # smaller region of x than its shape (as torch.gather allows).
    numbers = gather_numbers(
        "gather",
        collapsed_slice_dims=list(range(rank)),
        start_index_map=list(range(rank)),
        index_vector_dim=rank,
    )
    return b.op(
        f'"stablehlo.gather"({source}, {vectors}) <{{dimension_numbers = {numbers}, '
        f"indices_are_sorted = false, slice_sizes = {i64_array([1] * rank)}}}> : "
        f"({tensor_type(x.dtype, source_shape)}, {tensor_type(I64, full)}) -> "
        f"{tensor_type(node.dtype, node.shape)}"
    )


def scatter(
    b: Builder,
    base: tuple[str, DType, Sequence[Dim]],
    index: tuple[str, DType, Sequence[Dim]],
    updates: tuple[str, Sequence[Dim]],
    axis: int,
    body: RegionBody,
) -> str:
    """One ``stablehlo.scatter`` of ``updates`` (shape base[:axis] + index + base[axis+1:])."""
    x, dtype, shape = base
    idx, idx_dtype, idx_shape = index
    upd, upd_shape = updates
    k = len(idx_shape)
    numbers = gather_numbers(
        "scatter",
        update_window_dims=[*range(axis), *range(axis + k, k + len(shape) - 1)],
        inserted_window_dims=[axis],
        scatter_dims_to_operand_dims=[axis],
        index_vector_dim=k,
    )
    scalar = tensor_type(dtype, ())
    tx = tensor_type(dtype, shape)
    head = (
        f'"stablehlo.scatter"({x}, {idx}, {upd}) <{{indices_are_sorted = false, '
        f"scatter_dimension_numbers = {numbers}, unique_indices = false}}>"
    )
    tail = f"({tx}, {tensor_type(idx_dtype, idx_shape)}, {tensor_type(dtype, upd_shape)}) -> {tx}"
    return b.region_op(head, [([scalar, scalar], body)], tail)[0]


def _scatter(b: Builder, node: Node, args: list[str]) -> str:
    base, idx, upd = node.inputs
    axis = node.attr("axis")
    if node.attr("mode") == "add":
        opname = "or" if base.dtype is DType.b8 else "add"
        return scatter(
            b,
            (args[0], base.dtype, base.shape),
            (args[1], idx.dtype, idx.shape),
            (args[2], upd.shape),
            axis,
            b.combiner(opname, base.dtype),
        )
    return _scatter_last_wins(b, node, args)


def _scatter_last_wins(b: Builder, node: Node, args: list[str]) -> str:
    """Mode ``set``: out[.., j, ..] = the update of the last position p with idx[p] == j."""
    base, idx, upd = node.inputs
    axis = node.attr("axis")
    n = base.shape[axis]
    count = shape_numel(idx.shape)
    flat = b.reshape(b.convert(args[1], idx.dtype, I64, idx.shape), I64, idx.shape, (count,))
    positions = b.iota(I64, (count,), 0)
    # A fresh (uncached) operand: a scatter's result must not alias a value used elsewhere.
    unwritten = b.broadcast(b.const(-1, I64), I64, (), (n,), ())
    winner = scatter(
        b,
        (unwritten, I64, (n,)),
        (flat, I64, (count,)),
        (positions, (count,)),
        0,
        b.combiner("maximum", I64),
    )
    written = b.compare("GE", winner, b.splat(0, I64, (n,)), I64, (n,))
    row = b.binary("maximum", winner, b.splat(0, I64, (n,)), tensor_type(I64, (n,)))
    lead, tail = tuple(base.shape[:axis]), tuple(base.shape[axis + 1 :])
    rows_shape = (*lead, count, *tail)
    rows = b.reshape(args[2], upd.dtype, upd.shape, rows_shape)
    picked = take(b, rows, upd.dtype, rows_shape, row, (n,), axis, base.shape)
    mask = b.broadcast(written, DType.b8, (n,), base.shape, (axis,))
    return b.select(mask, picked, args[0], base.dtype, base.shape)


RULES: dict[str, Rule] = {
    "gather": _gather,
    "take_along_axis": _take_along_axis,
    "scatter": _scatter,
}
