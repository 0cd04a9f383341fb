"""Reductions of the CPU backend: accumulators, combining steps and their loop nests.

Sits beside ``kernels``, which runs ``emit_reduce``, ``emit_argreduce`` and
``emit_cumulative`` for those roots; ``stitch_emit`` builds a stitch group's
per-row reductions from the same accumulators and steps. The fused input
expression is read inside the reduction loops (input fusion); sums of f32
accumulate in double. When there are fewer outputs than threads, a reduction
splits its innermost reduced dim into one block per thread (``split_open``),
each block into its own accumulator, combined once.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from .ctypes_map import compute_type, literal
from .expr import KernelScope
from .loop_nest import PARALLEL_WORK, indent, loop_vars, nest_close, nest_open, statements, store

_INIT = {
    "sum": "0",
    "prod": "1",
    "any": "false",
    "all": "true",
}


def acc_type(kind: str, dt: DType) -> str:
    """The C type a ``kind`` reduction over ``dt`` accumulates in."""
    if kind in ("any", "all"):
        return "bool"
    if kind in ("sum", "prod"):
        return "double" if dt.is_float else "int64_t"
    return compute_type(dt)


def combine(kind: str, acc: str, v: str, dt: DType) -> str:
    """The statement folding ``v`` into the accumulator ``acc``."""
    if kind == "sum":
        return f"{acc} += {v};"
    if kind == "prod":
        return f"{acc} *= {v};"
    if kind == "any":
        return f"{acc} = {acc} || ({v} != 0);"
    if kind == "all":
        return f"{acc} = {acc} && ({v} != 0);"
    return f"{acc} = as_{kind}({acc}, {v});"


def accumulate(kind: str, acc: str, v: str, dt: DType, float_minmax: bool) -> str:
    """The statement folding ``v`` into ``acc``; a float max/min keeps a NaN flag beside
    a plain compare (which vectorizes), as torch propagates NaN."""
    if float_minmax:
        better = ">" if kind == "max" else "<"
        return f"{acc}_nan |= ({v} != {v}); {acc} = {v} {better} {acc} ? {v} : {acc};"
    return combine(kind, acc, v, dt)


# OpenMP reductions that vectorize the innermost reduction loop (reassociating the sum).
SIMD_REDUCTION = {"sum": "reduction(+:acc)", "prod": "reduction(*:acc)"}


def reduce_init(kind: str, dt: DType) -> str:
    """The identity of a ``kind`` reduction over ``dt``, as a C literal."""
    if kind in _INIT:
        return _INIT[kind]
    if dt.is_float:
        return f"(({compute_type(dt)})({'' if kind == 'min' else '-'}__builtin_inf()))"
    if dt.is_bool:
        return "true" if kind == "min" else "false"
    info = np.iinfo(dt.to_numpy())
    return literal(info.max if kind == "min" else info.min, dt)


def split_open(n: str, clauses: str) -> list[str]:
    """Open a loop over ``n`` elements split into one block per thread (``cb``), closed
    by two braces; ``split_range`` opens the block's own loop. Each block reduces into
    its own accumulator and combines once: an ``omp parallel for simd`` reduction run on
    one thread (below the work bar) came out 4x slower than a plain simd loop."""
    return [
        "{",
        f"const int64_t bs = as_split_block({n}, omp_get_max_threads()), nb = ({n} + bs - 1) / bs;",
        f"#pragma omp parallel for {clauses}",
        "for (int64_t cb = 0; cb < nb; ++cb) {",
    ]


def split_range(var: str, n: str) -> str:
    """The loop over block ``cb``'s share of ``n`` (see ``split_open``)."""
    return f"for (int64_t {var} = cb * bs; {var} < as_min64({n}, (cb + 1) * bs); ++{var}) {{"


def split_combine(kind: str, acc: str, part: str, nan: bool) -> str:
    """Fold a block's partial ``part`` into ``acc`` (NaN flags folded apart)."""
    if nan:
        better = ">" if kind == "max" else "<"
        return f"{acc}_nan |= {part}_nan; {acc} = {part} {better} {acc} ? {part} : {acc};"
    return {"sum": f"{acc} += {part};", "prod": f"{acc} *= {part};"}.get(
        kind, f"{acc} = as_{kind}({acc}, {part});"
    )


def emit_reduce(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    kind, axes = root.attr("kind"), tuple(root.attr("axes"))
    out_names = tuple(loop_vars(root.rank))
    lines: list[str] = []
    work = scope.dim(x.type.numel)
    nest_open(scope, root.shape, out_names, work, lines, "serial" if scope.split else "outer")
    idx, it = [], iter(out_names)
    for d in range(x.rank):
        idx.append(f"r{d}" if d in axes else next(it))
    acc_t = acc_type(kind, x.dtype)
    inner = [f"{acc_t} acc = {reduce_init(kind, x.dtype)};"]
    simd = SIMD_REDUCTION.get(kind)
    float_minmax = kind in ("max", "min") and x.dtype.is_float
    if float_minmax:  # NaN propagates: tracked apart so the max/min itself vectorizes
        inner.append("int acc_nan = 0;  // an int: a bool flag blocks vectorization (13x slower)")
        simd = f"reduction({kind}:acc) reduction(|:acc_nan)"
    loop_acc = "acc"
    if scope.split:  # fewer outputs than threads: blocks of the innermost reduced dim
        n_last = scope.dim(x.shape[axes[-1]])
        clause = (simd or f"reduction({kind}:acc)") + (
            f" schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
        )
        inner += split_open(n_last, clause)
        inner.append(f"{acc_t} accp = {reduce_init(kind, x.dtype)};")
        if float_minmax:
            inner.append("int accp_nan = 0;")
        loop_acc = "accp"
    for k, a in enumerate(axes):
        n_axis = scope.dim(x.shape[a])
        if simd and k == len(axes) - 1:
            inner.append(f"#pragma omp simd {simd.replace('acc', loop_acc)}")
        if scope.split and k == len(axes) - 1:
            inner.append(split_range(f"r{a}", n_axis))
        else:
            inner.append(f"for (int64_t r{a} = 0; r{a} < {n_axis}; ++r{a}) {{")

    def step():
        return accumulate(kind, loop_acc, scope.value(x, tuple(idx)), x.dtype, float_minmax)

    inner += indent(statements(scope, step), len(axes))
    inner += ["}"] * len(axes)
    if scope.split:
        inner += [split_combine(kind, "acc", "accp", float_minmax), "}", "}"]
    if float_minmax:
        inner.append(f'if (acc_nan) acc = ({acc_t})__builtin_nan("");')
    inner.append(store(scope, root, out_names, "acc"))
    lines += indent(inner, 2 if root.rank else 0)
    nest_close(root.rank, lines)
    if any(x.shape[a] == 0 for a in axes) and kind in ("max", "min"):
        raise UnsupportedError("max/min over an empty dim")
    return lines


def emit_argreduce(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    out_names = tuple(loop_vars(root.rank))
    lines: list[str] = []
    nest_open(scope, root.shape, out_names, scope.dim(x.type.numel), lines)
    idx = list(out_names[:axis]) + ["r"] + list(out_names[axis:])
    better = ">" if kind == "argmax" else "<"
    t = compute_type(x.dtype)
    # Eager refuses an empty reduced dim, even when the result is empty too.
    lines.insert(0, f"if ({scope.dim(x.shape[axis])} == 0) return 5;")
    inner = [
        f"{t} best = 0; int64_t arg = 0;",
        f"for (int64_t r = 0; r < {scope.dim(x.shape[axis])}; ++r) {{",
    ]

    def step():
        v = scope.value(x, tuple(idx))
        nan = f"as_isnan({v})"
        return (
            f"if (r == 0 || (!as_isnan(best) && ({nan} || {v} {better} best))) "
            f"{{ best = {v}; arg = r; }}"
        )

    inner += indent(statements(scope, step), 1)
    inner.append("}")
    inner.append(store(scope, root, out_names, "arg"))
    lines += indent(inner, 2 if root.rank else 0)
    nest_close(root.rank, lines)
    return lines


def emit_cumulative(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    outer_shape = tuple(d for k, d in enumerate(root.shape) if k != axis)
    outer_names = tuple(f"i{k}" for k in range(root.rank) if k != axis)
    idx = tuple(f"i{k}" if k != axis else "r" for k in range(root.rank))
    lines: list[str] = []
    nest_open(scope, outer_shape, outer_names, scope.dim(root.type.numel), lines)
    acc_t = acc_type(kind, x.dtype)
    inner = [
        f"{acc_t} acc = {_INIT[kind]};",
        f"for (int64_t r = 0; r < {scope.dim(root.shape[axis])}; ++r) {{",
    ]
    body = statements(
        scope,
        lambda: (
            combine(kind, "acc", scope.value(x, idx), x.dtype)
            + " "
            + store(scope, root, idx, "acc")
        ),
    )
    inner += indent(body, 1)
    inner.append("}")
    lines += indent(inner, 2 if outer_shape else 0)
    nest_close(len(outer_shape), lines)
    return lines
