"""Convolution epilogues: the elementwise kernel after a convolution runs inside it.

Sits inside the kernel plan (``plan.py``), after stitch planning and before horizontal fusion.
A CNN follows every convolution with batch norm and ReLU (and, closing a
residual block, the skip add): one loop nest that reads the convolution's
output once more from memory, a full pass over every activation (6 % of
ResNet-50's time). When that loop nest is the only reader of the convolution
and reads it elementwise (the same index, through elementwise ops of the same
shape only), the convolution kernel runs it per image, right after that
image's GEMM, while the output is still in cache.
"""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.graph import Node


def plan_epilogues(
    kernels: list[Node], stitches, outputs: set[int], aliased: set[int], reads, elementwise
) -> dict[int, Node]:
    """Convolution id -> the loop-nest root that runs as its epilogue.

    ``reads(root)`` gives the ids of the values in memory a kernel reads;
    ``elementwise`` the ops that map an index to the same index of their operands.
    """
    readers: dict[int, list[Node]] = {}
    for k in kernels:
        for v in reads(k):
            readers.setdefault(v, []).append(k)
    plan: dict[int, Node] = {}
    claimed: set[int] = set()
    # The last convolution a loop nest reads hosts it (a residual block's closing add
    # reads two: the other one runs before, as a kernel of its own).
    for conv in reversed(kernels):
        if conv.op != "convolution" or conv.dtype not in (DType.f32, DType.f64):
            continue
        if id(conv) in outputs or id(conv) in aliased:
            continue
        (consumer, *more) = readers.get(id(conv), [None])
        if consumer is None or more or consumer.op not in elementwise:
            continue
        if id(consumer) in stitches or tuple(consumer.shape) != tuple(conv.shape):
            continue
        if id(consumer) in claimed:
            continue
        if _reads_elementwise(consumer, conv, set(reads(consumer)), elementwise):
            plan[id(conv)] = consumer
            claimed.add(id(consumer))
    return plan


def _reads_elementwise(root: Node, conv: Node, in_memory: set[int], elementwise) -> bool:
    """Whether every path from ``root`` to ``conv`` runs through same-shaped elementwise ops."""
    ok = True
    seen: dict[int, bool] = {}

    def reaches(n: Node) -> bool:
        nonlocal ok
        if n is conv:
            return True
        if id(n) in in_memory:
            return False
        if id(n) not in seen:
            hit = any([reaches(i) for i in n.inputs])  # a list: every path is checked
            if hit and (n.op not in elementwise or tuple(n.shape) != tuple(conv.shape)):
                ok = False
            seen[id(n)] = hit
        return seen[id(n)]

    return reaches(root) and ok
