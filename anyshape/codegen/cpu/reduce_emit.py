"""Reductions of the CPU backend: accumulators, combining steps and their loop nests.

Sits beside ``kernels``, which runs ``emit_reduce``, ``emit_argreduce`` and
``emit_cumulative`` for those roots; ``stitch_emit`` builds a stitch group's
per-row reductions from the same accumulators and steps. The fused input
expression is read inside the reduction loops (input fusion); sums of f32
accumulate in double. When there are fewer outputs than threads, a reduction
splits its innermost reduced dim into one block per thread (``split_block``),
each block into its own accumulator, combined once.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, floordiv
from .ctypes_map import compute_type, literal
from .expr import KernelScope
from .loop_ir import Block, For, block, loop, stmt
from .loop_nest import PARALLEL_WORK, loop_vars, nest_open, statements, store

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


def split_block(n: str, clauses: str, body) -> Block:
    """A loop over ``n`` elements split into one block per thread (``cb``) around
    ``body``; ``split_range`` is the block's own loop. Each block reduces into its own
    accumulator and combines once: an ``omp parallel for simd`` reduction run on one
    thread (below the work bar) came out 4x slower than a plain simd loop."""
    return block(
        [
            stmt(
                f"const int64_t bs = as_split_block({n}, omp_get_max_threads()), "
                f"nb = ({n} + bs - 1) / bs;",
                "bs",
                "nb",
            ),
            loop(For("cb", "0", "nb"), body, [f"#pragma omp parallel for {clauses}"]),
        ]
    )


def split_range(var: str, n: str) -> For:
    """The loop over block ``cb``'s share of ``n`` (see ``split_block``)."""
    return For(var, "cb * bs", test=f"{var} < as_min64({n}, (cb + 1) * bs)")


def split_combine(kind: str, acc: str, part: str, nan: bool) -> str:
    """Fold a block's partial ``part`` into ``acc`` (NaN flags folded apart)."""
    if nan:
        better = ">" if kind == "max" else "<"
        return f"{acc}_nan |= {part}_nan; {acc} = {part} {better} {acc} ? {part} : {acc};"
    return {"sum": f"{acc} += {part};", "prod": f"{acc} *= {part};"}.get(
        kind, f"{acc} = as_{kind}({acc}, {part});"
    )


# Columns per block of a reduction that keeps the innermost dim (``_emit_column_reduce``).
COLUMN_BLOCK = 64


def _emit_column_reduce(scope: KernelScope, root: Node, kind: str, axes: tuple) -> list:
    """A sum/prod over leading dims that keeps the innermost one (a bias gradient: [rows,
    C] -> [C]), as blocks of ``COLUMN_BLOCK`` columns, each reading its rows in order.

    One output at a time walked its column down the rows: a stride of a whole row
    per element, a new page per read, and no vector lanes. Here each block keeps
    an accumulator per column and reads every row's run of the block contiguously
    (the inner loop vectorizes): BERT-base's [2295, 3072] bias gradient went from
    42 ms to a memory-bound pass.
    """
    x = root.inputs[0]
    c = root.shape[-1]
    blocks = as_dim(floordiv(as_expr(c) + (COLUMN_BLOCK - 1), COLUMN_BLOCK))
    out_names = tuple(loop_vars(root.rank))
    close = nest_open(scope, (*root.shape[:-1], blocks), out_names, scope.dim(x.type.numel))
    acc_t = acc_type(kind, x.dtype)
    n_c = scope.dim(c)
    col = "(c0 + j)"
    idx, it = [], iter(out_names[:-1])
    for d in range(x.rank):
        idx.append(f"r{d}" if d in axes else (col if d == x.rank - 1 else next(it)))
    head = [
        stmt(f"const int64_t c0 = {out_names[-1]} * {COLUMN_BLOCK};", "c0"),
        stmt(f"const int64_t cn = as_min64({n_c} - c0, {COLUMN_BLOCK});", "cn"),
        stmt(f"{acc_t} acc[{COLUMN_BLOCK}];", "acc"),
        loop(
            For("j", "0", str(COLUMN_BLOCK)),
            [stmt(f"acc[j] = {reduce_init(kind, x.dtype)};", "acc")],
        ),
    ]

    def step():
        return stmt(combine(kind, "acc[j]", scope.value(x, tuple(idx)), x.dtype), "acc")

    body = [loop(For("j", "0", "cn"), statements(scope, step), ["#pragma omp simd"])]
    for a in reversed(axes):
        body = [loop(For(f"r{a}", "0", scope.dim(x.shape[a])), body)]
    names = (*out_names[:-1], col)
    tail = [loop(For("j", "0", "cn"), [store(scope, root, names, "acc[j]")])]
    return close([*head, *body, *tail])


def emit_reduce(scope: KernelScope, root: Node) -> list:
    x = root.inputs[0]
    kind, axes = root.attr("kind"), tuple(root.attr("axes"))
    if kind in ("sum", "prod") and axes and not scope.split and x.rank - 1 not in axes:
        return _emit_column_reduce(scope, root, kind, axes)
    out_names = tuple(loop_vars(root.rank))
    work = scope.dim(x.type.numel)
    close = nest_open(scope, root.shape, out_names, work, "serial" if scope.split else "outer")
    idx, it = [], iter(out_names)
    for d in range(x.rank):
        idx.append(f"r{d}" if d in axes else next(it))
    acc_t = acc_type(kind, x.dtype)
    init = reduce_init(kind, x.dtype)
    inner = [stmt(f"{acc_t} acc = {init};", "acc")]
    simd = SIMD_REDUCTION.get(kind)
    float_minmax = kind in ("max", "min") and x.dtype.is_float
    if float_minmax:  # NaN propagates: tracked apart so the max/min itself vectorizes
        note = "  // an int: a bool flag blocks vectorization (13x slower)"
        inner.append(stmt("int acc_nan = 0;" + note, "acc_nan"))
        simd = f"reduction({kind}:acc) reduction(|:acc_nan)"
    loop_acc = "acc"
    if scope.split:  # fewer outputs than threads: blocks of the innermost reduced dim
        n_last = scope.dim(x.shape[axes[-1]])
        clause = (simd or f"reduction({kind}:acc)") + (
            f" schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
        )
        loop_acc = "accp"
    n_axes = [scope.dim(x.shape[a]) for a in axes]

    def step():
        v = scope.value(x, tuple(idx))
        return stmt(
            accumulate(kind, loop_acc, v, x.dtype, float_minmax), loop_acc, f"{loop_acc}_nan"
        )

    body = statements(scope, step)
    for k in reversed(range(len(axes))):
        innermost = k == len(axes) - 1
        var = f"r{axes[k]}"
        pragmas = (
            [f"#pragma omp simd {simd.replace('acc', loop_acc)}"] if simd and innermost else []
        )
        head = (
            split_range(var, n_axes[k]) if scope.split and innermost else For(var, "0", n_axes[k])
        )
        body = [loop(head, body, pragmas)]
    if scope.split:
        part = [stmt(f"{acc_t} accp = {init};", "accp")]
        if float_minmax:
            part.append(stmt("int accp_nan = 0;", "accp_nan"))
        combined = stmt(split_combine(kind, "acc", "accp", float_minmax), "acc", "acc_nan")
        inner.append(split_block(n_last, clause, [*part, *body, combined]))
    else:
        inner += body
    if float_minmax:
        inner.append(stmt(f'if (acc_nan) acc = ({acc_t})__builtin_nan("");', "acc"))
    inner.append(store(scope, root, out_names, "acc"))
    if any(x.shape[a] == 0 for a in axes) and kind in ("max", "min"):
        raise UnsupportedError("max/min over an empty dim")
    return close(inner)


def emit_argreduce(scope: KernelScope, root: Node) -> list:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    out_names = tuple(loop_vars(root.rank))
    close = nest_open(scope, root.shape, out_names, scope.dim(x.type.numel))
    n = scope.dim(x.shape[axis])
    idx = list(out_names[:axis]) + ["r"] + list(out_names[axis:])
    better = ">" if kind == "argmax" else "<"
    t = compute_type(x.dtype)

    def step():
        v = scope.value(x, tuple(idx))
        nan = f"as_isnan({v})"
        return stmt(
            f"if (r == 0 || (!as_isnan(best) && ({nan} || {v} {better} best))) "
            f"{{ best = {v}; arg = r; }}",
            "best",
            "arg",
        )

    inner = [
        stmt(f"{t} best = 0; int64_t arg = 0;", "best", "arg"),
        loop(For("r", "0", n), statements(scope, step)),
        store(scope, root, out_names, "arg"),
    ]
    # Eager refuses an empty reduced dim, even when the result is empty too.
    return [stmt(f"if ({n} == 0) return 5;"), *close(inner)]


def emit_cumulative(scope: KernelScope, root: Node) -> list:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    outer_shape = tuple(d for k, d in enumerate(root.shape) if k != axis)
    outer_names = tuple(f"i{k}" for k in range(root.rank) if k != axis)
    idx = tuple(f"i{k}" if k != axis else "r" for k in range(root.rank))
    close = nest_open(scope, outer_shape, outer_names, scope.dim(root.type.numel))
    acc_t = acc_type(kind, x.dtype)
    n = scope.dim(root.shape[axis])
    body = statements(
        scope,
        lambda: [
            stmt(combine(kind, "acc", scope.value(x, idx), x.dtype), "acc"),
            store(scope, root, idx, "acc"),
        ],
    )
    return close([stmt(f"{acc_t} acc = {_INIT[kind]};", "acc"), loop(For("r", "0", n), body)])
