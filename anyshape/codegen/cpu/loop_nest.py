"""Loop nests and statement blocks shared by every kernel emitter of the CPU backend.

Sits under ``kernels`` and the emitters beside it (``reduce_emit``,
``stitch_emit``, ``pool_emit``), over the loop-nest level (``loop_ir``): the
outer dims of a kernel as one OpenMP-parallel loop nest (parallel only above a
work threshold), stores of a value at the loop indices, and statement blocks
emitted in a fresh scope of the ``KernelScope``.
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .ctypes_map import c_type
from .expr import KernelScope
from .loop_ir import For, Stmt, loop, stmt

PARALLEL_WORK = 32768  # work (elements x cost per element) below which a kernel stays serial
BLOCK = 4096  # elements per parallel block of a 1-D loop
# Work of one row below which a stitch kernel keeps it on one thread: each of the row's
# loops is its own parallel region (softmax over one row of 20000: 11 -> 17 us split).
ROW_SPLIT_WORK = 8 * PARALLEL_WORK


def loop_vars(rank: int, prefix: str = "i") -> list[str]:
    """Index names of a loop nest: ``i0, i1, ...``."""
    return [f"{prefix}{k}" for k in range(rank)]


def nest_open(scope: KernelScope, shape, names, work: str, mode: str = "outer"):
    """Loops over ``shape``: the outer dims as one collapsed parallel loop nest.

    Returns ``close(body) -> nodes``, the nest around ``body`` (the sizes are read
    here, before the body's, so the kernel's parameters keep their order).
    OpenMP's ``collapse`` splits the outer iterations over threads and steps the
    indices incrementally (no divide/modulo per row, which dominated short rows
    such as a CNN's [N, C, H, W] maps). A 1-D nest is split into blocks so it
    can run in parallel too. The innermost loop is left to the vectorizer.
    ``mode`` "inner" (fewer rows than threads) also splits each row into
    blocks, one share per thread; "serial" opens plain loops (the work is split
    further in).
    """
    r = len(shape)
    if r == 0:
        return lambda body: list(body)
    par = f"schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
    last = names[-1]
    outer = [For(names[k], "0", scope.dim(shape[k])) for k in range(r - 1)]
    if mode == "serial":
        inner = For(last, "0", scope.dim(shape[-1]))
        return lambda body: [loop(outer, [loop(inner, body)])] if outer else [loop(inner, body)]
    if mode == "inner" and r >= 2:
        n = scope.dim(shape[-1])
        share = For(last, "ob * bs", test=f"{last} < as_min64({n}, (ob + 1) * bs)")
        return lambda body: [
            stmt(f"const int64_t bs = as_split_block({n}, omp_get_max_threads());", "bs"),
            stmt(f"const int64_t nb = ({n} + bs - 1) / bs;", "nb"),
            loop(
                [*outer, For("ob", "0", "nb")],
                [loop(share, body)],
                [f"#pragma omp parallel for collapse({r}) {par}"],
            ),
        ]
    if r == 1:
        n = scope.dim(shape[0])
        block = For("ob", "0", f"({n} + {BLOCK - 1}) / {BLOCK}")
        share = For(last, f"ob * {BLOCK}", test=f"{last} < as_min64({n}, (ob + 1) * {BLOCK})")
        return lambda body: [loop(block, [loop(share, body)], [f"#pragma omp parallel for {par}"])]
    collapse = f"collapse({r - 1}) " if r > 2 else ""
    inner = For(last, "0", scope.dim(shape[-1]))
    return lambda body: [
        loop(outer, [loop(inner, body)], [f"#pragma omp parallel for {collapse}{par}"])
    ]


def out_offset(scope: KernelScope, node: Node, names) -> str:
    """The row-major offset of index ``names`` in ``node``'s buffer."""
    terms = []
    for k, n in enumerate(names):
        st = scope.dim(shape_numel(node.shape[k + 1 :]))
        terms.append(n if st == "1" else f"{n} * {st}")
    return " + ".join(terms) if terms else "0"


def store(scope: KernelScope, node: Node, names, value: str) -> Stmt:
    """The statement storing ``value`` into ``node``'s buffer at index ``names``."""
    out = scope.ptr(node)
    return stmt(
        f"(({c_type(node.dtype)}*){out})[{out_offset(scope, node, names)}] = "
        f"({c_type(node.dtype)})({value});",
        out,
    )


def statements(scope: KernelScope, compute) -> tuple:
    """Run ``compute`` in a fresh statement scope; returns its statements, then the node
    (or nodes) ``compute`` returns."""
    saved_lines, saved_memo = scope.lines, scope.memo
    scope.lines, scope.memo = [], dict(saved_memo)
    last = compute()
    out = (*scope.lines, *(last if isinstance(last, (list, tuple)) else [last]))
    scope.lines, scope.memo = saved_lines, saved_memo
    return out
