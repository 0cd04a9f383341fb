"""Attention fusion planning: scores GEMM, softmax stitch and values GEMM in one kernel.

Sits inside the kernel plan (``plan.py``), right after stitch planning. Attention
is a chain of three kernels over a ``[..., m, n]`` score matrix: a batched GEMM
``q @ k^T`` writes the scores, a stitch group (scale, mask, position bias,
softmax: ``stitch.py``) reads each row of them and writes the probabilities,
and a second GEMM ``p @ v`` reads those. Unfused, the scores and the
probabilities each go to memory and back (BERT-base at 4 x 502 tokens: 48 MB
per layer, written once and read twice). Fused, the chain becomes one kernel
that, for each batch entry and block of query rows on one thread, computes the
block's scores into a buffer of the thread's, runs the stitch group's row code
over it into a second one, and multiplies that by the values into the output
rows: the score matrix never reaches memory (``codegen/cpu/attention_emit.py``).

A chain fuses only when nothing outside it reads the scores or the
probabilities, the stitch group reads the scores at its own row and column
(elementwise ops, row reductions and row broadcasts between them: no view that
moves elements), and both GEMMs are float32. The scores and probabilities then
have no buffer: the plan records the chain under the second GEMM, its kernel's
root.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.graph import Node
from .op_classes import ELEMENTWISE_OPS
from .stitch import STITCH_KINDS


@dataclass(frozen=True)
class AttentionChain:
    """The two values an attention kernel computes per block of rows, never stored."""

    scores: Node  # the first GEMM, [..., m, n]
    probs: Node  # the stitch group's root over the scores' rows: the second GEMM's left operand


def plan_attention(
    nodes: list[Node],
    mat: set[int],
    consumers: dict[int, list[Node]],
    outputs: set[int],
    stitches: dict[int, list[Node]],
) -> dict[int, AttentionChain]:
    """Second GEMM id -> its chain, for every chain that fuses; takes the scores and the
    probabilities out of ``mat``."""
    chains: dict[int, AttentionChain] = {}
    for out in nodes:
        chain = _chain(out, mat, consumers, outputs, stitches)
        if chain is not None:
            chains[id(out)] = chain
            mat.discard(id(chain.scores))
            mat.discard(id(chain.probs))
    return chains


def _chain(out: Node, mat, consumers, outputs, stitches) -> AttentionChain | None:
    if out.op != "dot" or out.dtype != DType.f32 or not 2 <= out.rank <= 4:
        return None
    probs, values = out.inputs
    if id(probs) not in stitches or probs is values or id(probs) in outputs:
        return None
    if len(consumers.get(id(probs), [])) != 1 or tuple(probs.shape[:-1]) != tuple(out.shape[:-1]):
        return None
    region = _region(probs, mat)
    dots = [n for n in region.values() if n.op == "dot" and id(n) in mat]
    if len(dots) != 1:
        return None
    (scores,) = dots
    if (
        scores.dtype != DType.f32
        or tuple(scores.shape) != tuple(probs.shape)
        or id(scores) in outputs
        or any(id(c) not in region for c in consumers.get(id(scores), []))
        or not _read_in_place(scores, probs, region, consumers, mat)
    ):
        return None
    return AttentionChain(scores, probs)


def _region(root: Node, mat: set[int]) -> dict[int, Node]:
    """The nodes ``root``'s stitch kernel computes (not in memory), the root, and the
    values in memory it reads."""
    region: dict[int, Node] = {id(root): root}
    stack = list(root.inputs)
    while stack:
        n = stack.pop()
        if id(n) in region:
            continue
        region[id(n)] = n
        if id(n) not in mat:
            stack.extend(n.inputs)
    return region


def _read_in_place(scores: Node, probs: Node, region, consumers, mat: set[int]) -> bool:
    """Whether every value of the group computed from ``scores`` reads it at its own row
    and column: full-row elementwise ops, row reductions over the last axis, per-row
    values (elementwise, or a reshape adding or dropping the kept dim) and their
    broadcasts back along the row; and none of them but the root is in memory (another
    kernel would read the scores there)."""
    full = tuple(scores.shape)
    rows = {full[:-1], full[:-1] + (1,)}
    last = len(full) - 1
    stack, seen = [scores], set()
    while stack:
        n = stack.pop()
        for c in consumers.get(id(n), []):
            if id(c) in seen or id(c) not in region:
                continue
            seen.add(id(c))
            if id(c) in mat and c is not probs:
                return False
            shape = tuple(c.shape)
            if c.op in ELEMENTWISE_OPS and shape in (full, *rows):
                ok = True
            elif c.op == "reduce":
                ok = c.attr("kind") in STITCH_KINDS and tuple(c.attr("axes")) == (last,)
            elif c.op == "reshape":
                ok = shape in rows and tuple(c.inputs[0].shape) in rows
            elif c.op == "broadcast_in_dim":
                src = tuple(c.inputs[0].shape)
                ok = (
                    src in rows
                    and shape == full
                    and tuple(c.attr("dims")) == tuple(range(len(src)))
                )
            else:
                ok = False
            if not ok:
                return False
            if c is not probs:
                stack.append(c)
    return True
