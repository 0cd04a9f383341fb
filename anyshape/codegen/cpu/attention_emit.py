"""The attention kernel: scores GEMM, softmax rows and values GEMM per block of query rows.

Sits beside ``kernels`` (which dispatches here for the roots the kernel plan made
attention chains, see ``anyshape/schedule/attention.py``), over the stitch
emitter's row code (``stitch_emit.row_body``) and the GEMM glue (``gemm.h``:
``as_block_sgemm``, ``as_attention_rows``, ``as_copy_scratch``). The tasks (each batch entry's blocks
of ``as_attention_rows`` query rows) are split into one contiguous range per
thread. For each, on its thread:

1. the block's scores, ``q[rows] @ k^T``, into the thread's buffer ``sb``;
2. the stitch group's row code (scale, mask, bias, softmax) over each of the
   block's rows, reading the scores from ``sb`` and writing the probabilities
   to the thread's second buffer ``pb``;
3. ``pb @ v`` into the block's rows of the output.

Both buffers stay in the core's L2; only the queries, keys, values, what the
softmax reads beside the scores (masks, position bias) and the output touch
memory. Operands read through a transpose of a buffer (attention's heads in a
``[b, s, h, d]`` projection) are read in place, as the unfused GEMMs read them
(``gemm_emit.operand_layout``).
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .gemm_emit import OperandLayout, operand_layout, outer_inner
from .loop_ir import For, block, loop, stmt, text
from .loop_nest import PARALLEL_WORK, loop_vars
from .stitch_emit import StitchScope, row_body, row_buffer


class AttentionScope(StitchScope):
    """A stitch scope whose scores are read from the block buffer ``sb``: row ``i`` of the
    block is query row ``m0 + i``."""

    def __init__(self, sched, buffer_of, out: Node):
        self.chain = sched.attention[id(out)]
        super().__init__(sched, buffer_of, self.chain.probs)

    def value(self, node: Node, idx) -> str:
        if node is self.chain.scores:
            n = self.dim(node.shape[-1])
            return f"sb[({idx[-2]} - m0) * {n} + {idx[-1]}]"
        return super().value(node, idx)


def emit_attention(scope: AttentionScope, out: Node) -> list:
    """The kernel of ``out``, the values GEMM of an attention chain."""
    scores, probs = scope.chain.scores, scope.chain.probs
    broadcasts = scope.sched.stitches[id(probs)]
    names = tuple(loop_vars(probs.rank))
    rows, last = names[:-1], names[-1]
    scope.row_names = rows
    scope.row_loops.add(last)
    q, k = scores.inputs
    v = out.inputs[1]
    sizes = (scores.shape[-2], scores.shape[-1], q.shape[-1], out.shape[-1])
    m, n, kk, dv = (scope.dim(d) for d in sizes)
    batch = list(out.shape[:-2])
    inner_s = scope.dim(outer_inner(batch, 1)[1])
    total = scope.dim(shape_numel(batch))

    def view(lay: OperandLayout, rows_from: str = "") -> str:
        o, i = (scope.dim(s) for s in outer_inner(lay.batch_strides))
        base = f"as_view((const float*){scope.ptr(lay.buffer)}, {o}, {i}, p, {inner_s})"
        if not rows_from:
            return base
        step = rows_from if lay.transposed else f"{rows_from} * {scope.dim(lay.ld)}"
        return f"{base} + {step}"

    def trans(lay: OperandLayout) -> str:
        return "CblasTrans" if lay.transposed else "CblasNoTrans"

    lq, lk, lv = (operand_layout(scope.sched, x) for x in (q, k, v))
    body, buffered = row_body(
        scope,
        probs,
        broadcasts,
        names,
        lambda value: stmt(f"pb[({rows[-1]} - m0) * {n} + {last}] = (float)({value});", "pb"),
    )
    task = [
        stmt("const int64_t p = task / nb, m0 = task % nb * mb;", "p", "m0"),
        stmt(f"const int64_t mr = as_min64(mb, {m} - m0);", "mr"),
    ]
    if len(rows) == 3:
        split = f"const int64_t {rows[0]} = p / {inner_s}, {rows[1]} = p % {inner_s};"
        task.append(stmt(split, *rows[:2]))
    elif len(rows) == 2:
        task.append(stmt(f"const int64_t {rows[0]} = p;", rows[0]))
    task += [
        text(
            f"as_block_sgemm({trans(lq)}, {trans(lk)}, mr, {n}, {kk}, {view(lq, 'm0')}, "
            f"{scope.dim(lq.ld)}, {view(lk)}, {scope.dim(lk.ld)}, sb, {n});"
        ),
        loop(For(rows[-1], "m0", "m0 + mr"), body),
        text(
            f"as_block_sgemm(CblasNoTrans, {trans(lv)}, mr, {dv}, {n}, pb, {n}, {view(lv)}, "
            f"{scope.dim(lv.ld)}, (float*){scope.ptr(out)} + (p * {m} + m0) * {dv}, {dv});"
        ),
    ]
    width = f"as_max64({n}, 1)"
    region = [
        stmt("const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();", "nt", "th"),
        stmt(f"const int64_t mb = as_attention_rows({n}), nb = ({m} + mb - 1) / mb;", "mb", "nb"),
        stmt(f"const int64_t tasks = {total} * nb;", "tasks"),
        stmt("const int64_t lo = tasks * th / nt, hi = tasks * (th + 1) / nt;", "lo", "hi"),
        stmt(f"float* sb = lo < hi ? as_copy_scratch(2 * mb * {width}) : nullptr;", "sb"),
        stmt("if (lo < hi && !sb) err_flag = 3;", "err_flag"),
        stmt(f"float* pb = sb ? sb + mb * {width} : nullptr;", "pb"),
    ]
    guard = "sb && "
    if buffered:
        region += row_buffer(scope, probs, buffered)
        guard += "rb && "
    region.append(loop(For("task", "lo", test=f"{guard}task < hi"), task))
    work = f"({total}) * ({m}) * ({n}) * ({kk} + {dv} + {scope.element_cost})"
    return [block(region, [f"#pragma omp parallel if({work} > {PARALLEL_WORK})"])]
