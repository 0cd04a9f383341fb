"""StableHLO rules for the IR's reductions, scans, contractions and windows.

Sits beside ``ops`` and ``index_ops`` under the driver (``emit``), on the
``Builder``. ``reduce`` is one ``stablehlo.reduce`` (half floats summed in f32);
``argreduce`` a variadic reduce over (value, index) whose comparator is a total
order (NaN first, then the better value, then the lower index), so the result
does not depend on the reduction order; ``cumulative`` a ``reduce_window`` with
the whole axis as window and low padding (log2 steps of shifted adds when the
axis size is symbolic, since a window size is static); ``dot`` a ``dot_general``;
``convolution`` a ``stablehlo.convolution``; ``pool`` a ``reduce_window``, the
average dividing by the window's element count or by the count of its
in-bounds elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, sym_min
from ...ir.types import Dim
from .builder import (
    I64,
    INT64_MAX,
    Builder,
    compare_type,
    i64_array,
    int_list,
    max_value,
    min_value,
    tensor_type,
)
from .ops import Rule

B8 = DType.b8
HALF = (DType.f16, DType.bf16)
# kind -> (combiner on numbers, combiner on bools)
REDUCERS = {
    "sum": ("add", "or"),
    "prod": ("multiply", "and"),
    "max": ("maximum", "or"),
    "min": ("minimum", "and"),
    "any": ("or", "or"),
    "all": ("and", "and"),
}


def _identity(kind: str, dtype: DType):
    if dtype is B8:
        return kind in ("prod", "min", "all")
    return {"sum": 0, "prod": 1, "max": min_value(dtype), "min": max_value(dtype)}[kind]


def _accumulator(kind: str, dtype: DType) -> DType:
    """Sums and products of half floats accumulate in f32; any/all work on bools."""
    if kind in ("any", "all"):
        return B8
    if kind in ("sum", "prod") and dtype in HALF:
        return DType.f32
    return dtype


def _reduce(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    kind, axes = node.attr("kind"), sorted(node.attr("axes"))
    acc = _accumulator(kind, x.dtype)
    value = b.convert(args[0], x.dtype, acc, x.shape)
    opname = REDUCERS[kind][1 if acc is B8 else 0]
    init = b.const(_identity(kind, acc), acc)
    tout = tensor_type(acc, node.shape)
    out = b.op(
        f"stablehlo.reduce({value} init: {init}) applies stablehlo.{opname} across "
        f"dimensions = {int_list(axes)} : ({tensor_type(acc, x.shape)}, "
        f"{tensor_type(acc, ())}) -> {tout}"
    )
    return b.convert(out, acc, node.dtype, node.shape)


def _argreduce(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    axis, dtype = node.attr("axis"), x.dtype
    better = "GT" if node.attr("kind") == "argmax" else "LT"
    indices = b.iota(I64, x.shape, axis)
    init = _identity("max" if better == "GT" else "min", dtype)
    inits = [b.const(init, dtype), b.const(INT64_MAX, I64)]
    sv, si = tensor_type(dtype, ()), tensor_type(I64, ())
    boolean = tensor_type(B8, ())
    cmp = compare_type(dtype)

    def body(p: list[str]) -> tuple[list[str], list[str]]:
        value, index, other, other_index = p

        def test(direction: str, a: str, c: str, kind: str = cmp, ty: str = sv) -> str:
            return b.op(
                f"stablehlo.compare {direction}, {a}, {c}, {kind} : ({ty}, {ty}) -> {boolean}"
            )

        wins = test(better, value, other)
        ties = test("EQ", value, other)
        if dtype.is_float:  # NaN beats every number; two NaNs tie
            nan, other_nan = test("NE", value, value), test("NE", other, other)
            only_nan = b.binary("and", nan, b.unary("not", other_nan, boolean), boolean)
            wins = b.binary("or", wins, only_nan, boolean)
            ties = b.binary("or", ties, b.binary("and", nan, other_nan, boolean), boolean)
        first = test("LT", index, other_index, "SIGNED", si)
        pick = b.binary("or", wins, b.binary("and", ties, first, boolean), boolean)
        return [
            b.select(pick, value, other, dtype, ()),
            b.select(pick, index, other_index, I64, ()),
        ], [sv, si]

    tx, ti = tensor_type(dtype, x.shape), tensor_type(I64, x.shape)
    outs = (tensor_type(dtype, node.shape), tensor_type(I64, node.shape))
    results = b.region_op(
        f'"stablehlo.reduce"({args[0]}, {indices}, {inits[0]}, {inits[1]}) '
        f"<{{dimensions = {i64_array([axis])}}}>",
        [([sv, si, sv, si], body)],
        f"({tx}, {ti}, {sv}, {si}) -> ({outs[0]}, {outs[1]})",
        results=2,
    )
    return results[1]


def _reduce_window(
    b: Builder,
    x: str,
    dtype: DType,
    shapes: tuple[Sequence[Dim], Sequence[Dim]],
    window: tuple[list[int], list[int], list[int]],
    padding: list[tuple[int, int]],
    opname: str,
    init,
) -> str:
    """``reduce_window`` of ``x`` (window sizes, strides, dilations) combining with ``opname``."""
    src, out = shapes
    sizes, strides, dilations = window
    pads = ", ".join(f"[{lo}, {hi}]" for lo, hi in padding)
    head = (
        f'"stablehlo.reduce_window"({x}, {b.const(init, dtype)}) <{{padding = dense<[{pads}]> : '
        f"tensor<{len(padding)}x2xi64>, window_dilations = {i64_array(dilations)}, "
        f"window_dimensions = {i64_array(sizes)}, window_strides = {i64_array(strides)}}}>"
    )
    tail = f"({tensor_type(dtype, src)}, {tensor_type(dtype, ())}) -> {tensor_type(dtype, out)}"
    return b.region_op(head, [([tensor_type(dtype, ())] * 2, b.combiner(opname, dtype))], tail)[0]


def _cumulative(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    kind, axis = node.attr("kind"), node.attr("axis")
    acc = _accumulator(kind, x.dtype)
    value = b.convert(args[0], x.dtype, acc, x.shape)
    opname = REDUCERS[kind][1 if acc is B8 else 0]
    n = x.shape[axis]
    if not isinstance(n, int):
        out = _scan_unrolled(b, value, acc, x.shape, axis, (opname, _identity(kind, acc)))
    elif n <= 1:
        out = value
    else:
        ones = [1] * x.rank
        sizes = [n if i == axis else 1 for i in range(x.rank)]
        padding = [(n - 1 if i == axis else 0, 0) for i in range(x.rank)]
        window = (sizes, ones, ones)
        init = _identity(kind, acc)
        out = _reduce_window(b, value, acc, (x.shape, x.shape), window, padding, opname, init)
    return b.convert(out, acc, node.dtype, node.shape)


def _scan_unrolled(
    b: Builder, x: str, dtype: DType, shape: Sequence[Dim], axis: int, combine: tuple[str, object]
) -> str:
    """An inclusive scan along a symbolic axis (Hillis-Steele): ``x = x op shift(x, k)`` for
    k = 1, 2, 4 ... up to the axis's largest size n (its range's bound, else 2**31, since
    ``get_dimension_size`` is 32-bit). A shift is a ``dynamic_pad`` of m = min(k, n)
    identities in front and -m behind: no intermediate grows, every amount is a dim
    expression (constant once a shape refinement knows the input's shape), and a step
    with k >= n at run time shifts in identities only, changing nothing."""
    opname, identity = combine
    n = shape[axis]
    _, hi = b.store.bounds(n)
    limit = hi if hi is not None else 2**31
    rank = len(shape)
    fill = b.const(identity, dtype)
    ty, vec = tensor_type(dtype, shape), tensor_type(I64, (rank,))
    interior = b.shape([0] * rank)
    k = 1
    while k < limit:
        m = as_dim(sym_min(k, n))
        low = b.shape([m if i == axis else 0 for i in range(rank)])
        high = b.shape([as_dim(-as_expr(m)) if i == axis else 0 for i in range(rank)])
        shifted = b.op(
            f"stablehlo.dynamic_pad {x}, {fill}, {low}, {high}, {interior} : "
            f"({ty}, {tensor_type(dtype, ())}, {vec}, {vec}, {vec}) -> {ty}"
        )
        x = b.binary(opname, x, shifted, ty)
        k *= 2
    return x


def _dot(b: Builder, node: Node, args: list[str]) -> str:
    lhs, rhs = node.inputs
    rank = lhs.rank
    dtype = I64 if node.dtype is B8 else node.dtype  # bools: count, then nonzero
    a = b.convert(args[0], lhs.dtype, dtype, lhs.shape)
    c = b.convert(args[1], rhs.dtype, dtype, rhs.shape)
    batch = list(range(rank - 2))
    numbers = f"contracting_dims = [{rank - 1}] x [{rank - 2}]"
    if batch:
        numbers = f"batching_dims = {int_list(batch)} x {int_list(batch)}, {numbers}"
    out = b.op(
        f"stablehlo.dot_general {a}, {c}, {numbers} : ({tensor_type(dtype, lhs.shape)}, "
        f"{tensor_type(dtype, rhs.shape)}) -> {tensor_type(dtype, node.shape)}"
    )
    return b.convert(out, dtype, node.dtype, node.shape)


def _convolution(b: Builder, node: Node, args: list[str]) -> str:
    x, w = node.inputs
    if node.dtype is B8:
        raise UnsupportedError("convolution of b8 tensors has no StableHLO form")
    nsp = x.rank - 2
    spatial = ", ".join(str(i) for i in range(nsp))
    layout = f"[b, {spatial}, f]" if node.attr("channels_last", False) else f"[b, f, {spatial}]"
    pads = ", ".join(f"[{p}, {p}]" for p in node.attr("padding"))
    window = (
        f"stride = {int_list(node.attr('stride'))}, pad = [{pads}], "
        f"rhs_dilate = {int_list(node.attr('dilation'))}"
    )
    return b.op(
        f"stablehlo.convolution({args[0]}, {args[1]}) dim_numbers = {layout}x[o, i, {spatial}]->"
        f"{layout}, window = {{{window}}} {{batch_group_count = 1 : i64, "
        f"feature_group_count = {node.attr('groups')} : i64}} : "
        f"({tensor_type(x.dtype, x.shape)}, {tensor_type(w.dtype, w.shape)}) -> "
        f"{tensor_type(node.dtype, node.shape)}"
    )


def _pool(b: Builder, node: Node, args: list[str]) -> str:
    (x,) = node.inputs
    kernel, stride = node.attr("kernel"), node.attr("stride")
    padding, dilation = node.attr("padding"), node.attr("dilation")
    nsp = len(kernel)
    first = x.rank - nsp - (1 if node.attr("channels_last", False) else 0)
    spatial = range(first, first + nsp)

    def per_dim(values: Sequence[int], other: int) -> list[int]:
        return [values[i - first] if i in spatial else other for i in range(x.rank)]

    window = (per_dim(kernel, 1), per_dim(stride, 1), per_dim(dilation, 1))
    pads = [(p, p) for p in per_dim(padding, 0)]
    if node.attr("kind") == "max":
        init = min_value(x.dtype)
        opname = "or" if x.dtype is B8 else "maximum"
        return _reduce_window(
            b, args[0], x.dtype, (x.shape, node.shape), window, pads, opname, init
        )
    acc = x.dtype if x.dtype in (DType.f32, DType.f64) else DType.f32
    acc = DType.f64 if x.dtype.is_int or x.dtype is B8 else acc
    value = b.convert(args[0], x.dtype, acc, x.shape)
    total = _reduce_window(b, value, acc, (x.shape, node.shape), window, pads, "add", 0)
    ty = tensor_type(acc, node.shape)
    if node.attr("count_include_pad"):
        count = b.splat(float(math.prod(kernel)), acc, node.shape)
    else:
        count = _in_bounds_count(b, acc, x.shape, node.shape, spatial, (window, padding))
    return b.convert(b.binary("divide", total, count, ty), acc, node.dtype, node.shape)


def _in_bounds_count(
    b: Builder,
    dtype: DType,
    shapes: Sequence[Dim],
    out_shape: Sequence[Dim],
    spatial: range,
    geometry: tuple[tuple[list[int], list[int], list[int]], Sequence[int]],
) -> str:
    """How many in-bounds elements each window holds, broadcast to the pool's result.

    Counted over ones of shape [1, *spatial] (a pool's own layout, channels first).
    """
    (sizes, strides, dilations), padding = geometry
    src = [1, *(shapes[i] for i in spatial)]
    dst = [1, *(out_shape[i] for i in spatial)]
    ones = b.splat(1.0, dtype, src)
    window = (
        [1, *(sizes[i] for i in spatial)],
        [1, *(strides[i] for i in spatial)],
        [1, *(dilations[i] for i in spatial)],
    )
    pads = [(0, 0), *((p, p) for p in padding)]
    counts = _reduce_window(b, ones, dtype, (src, dst), window, pads, "add", 0)
    return b.broadcast(counts, dtype, dst, out_shape, [0, *spatial])


RULES: dict[str, Rule] = {
    "reduce": _reduce,
    "argreduce": _argreduce,
    "cumulative": _cumulative,
    "dot": _dot,
    "convolution": _convolution,
    "pool": _pool,
}
