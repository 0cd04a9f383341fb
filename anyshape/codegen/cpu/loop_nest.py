"""Loop nests and statement blocks shared by every kernel emitter of the CPU backend.

Sits under ``kernels`` and the emitters beside it (``reduce_emit``,
``stitch_emit``, ``pool_emit``): the outer dims of a kernel as one OpenMP-parallel
loop nest (parallel only above a work threshold), stores of a value at the loop
indices, and statement blocks emitted in a fresh scope of the ``KernelScope``.
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .ctypes_map import c_type
from .expr import KernelScope

PARALLEL_WORK = 32768  # work (elements x cost per element) below which a kernel stays serial
BLOCK = 4096  # elements per parallel block of a 1-D loop
# Work of one row below which a stitch kernel keeps it on one thread: each of the row's
# loops is its own parallel region (softmax over one row of 20000: 11 -> 17 us split).
ROW_SPLIT_WORK = 8 * PARALLEL_WORK


def loop_vars(rank: int, prefix: str = "i") -> list[str]:
    """Index names of a loop nest: ``i0, i1, ...``."""
    return [f"{prefix}{k}" for k in range(rank)]


def nest_open(
    scope: KernelScope, shape, names, work: str, lines: list[str], mode: str = "outer"
) -> None:
    """Open loops over ``shape``: the outer dims as one collapsed parallel loop nest.

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
        return
    par = f"schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
    last = names[-1]
    outer = " ".join(
        f"for (int64_t {names[k]} = 0; {names[k]} < {scope.dim(shape[k])}; ++{names[k]})"
        for k in range(r - 1)
    )
    if mode == "serial":
        lines.append(outer + " {")
        lines.append(f"  for (int64_t {last} = 0; {last} < {scope.dim(shape[-1])}; ++{last}) {{")
        return
    if mode == "inner" and r >= 2:
        n = scope.dim(shape[-1])
        lines.append(f"const int64_t bs = as_split_block({n}, omp_get_max_threads());")
        lines.append(f"const int64_t nb = ({n} + bs - 1) / bs;")
        lines.append(f"#pragma omp parallel for collapse({r}) {par}")
        lines.append(f"{outer} for (int64_t ob = 0; ob < nb; ++ob) {{")
        lines.append(
            f"  for (int64_t {last} = ob * bs; {last} < as_min64({n}, (ob + 1) * bs); ++{last}) {{"
        )
        return
    if r == 1:
        n = scope.dim(shape[0])
        lines.append(f"#pragma omp parallel for {par}")
        lines.append(f"for (int64_t ob = 0; ob < ({n} + {BLOCK - 1}) / {BLOCK}; ++ob) {{")
        lines.append(
            f"  for (int64_t {last} = ob * {BLOCK}; {last} < as_min64({n}, (ob + 1) * {BLOCK}); "
            f"++{last}) {{"
        )
        return
    collapse = f"collapse({r - 1}) " if r > 2 else ""
    lines.append(f"#pragma omp parallel for {collapse}{par}")
    lines.append(outer + " {")
    lines.append(f"  for (int64_t {last} = 0; {last} < {scope.dim(shape[-1])}; ++{last}) {{")


def nest_close(rank: int, lines: list[str]) -> None:
    """Close what ``nest_open`` opened for a nest of ``rank`` dims."""
    if rank:
        lines.append("  }")
        lines.append("}")


def out_offset(scope: KernelScope, node: Node, names) -> str:
    """The row-major offset of index ``names`` in ``node``'s buffer."""
    terms = []
    for k, n in enumerate(names):
        st = scope.dim(shape_numel(node.shape[k + 1 :]))
        terms.append(n if st == "1" else f"{n} * {st}")
    return " + ".join(terms) if terms else "0"


def store(scope: KernelScope, node: Node, names, value: str) -> str:
    """The statement storing ``value`` into ``node``'s buffer at index ``names``."""
    out = scope.ptr(node)
    return (
        f"(({c_type(node.dtype)}*){out})[{out_offset(scope, node, names)}] = "
        f"({c_type(node.dtype)})({value});"
    )


def statements(scope: KernelScope, compute) -> list[str]:
    """Run ``compute`` in a fresh statement scope; returns its statements."""
    saved_lines, saved_memo = scope.lines, scope.memo
    scope.lines, scope.memo = [], dict(saved_memo)
    last = compute()
    out = scope.lines + [last]
    scope.lines, scope.memo = saved_lines, saved_memo
    return out


def indent(lines, depth):
    """``lines`` indented ``depth`` levels."""
    return ["  " * depth + ln for ln in lines]
