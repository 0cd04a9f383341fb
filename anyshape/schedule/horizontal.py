"""Horizontal fusion: independent loop nests over the same shape become one kernel.

Sits at the end of the kernel plan (``plan.py``), after stitch planning. Two pointwise kernels
(loop fusion roots, not stitch groups nor library calls) whose outputs have
the same symbolic shape and neither of which reads the other, even through
other kernels, can share one loop nest that stores both outputs: one parallel
region and one kernel call instead of two, and a value both read is loaded
once. BERT's query, key and value head-layout transposes, each
``[b, s, 768] -> [b, 12, s, 64]`` after its bias add, are such a trio.

A group runs where its first member ran: a later kernel may join when every
kernel it reads runs before that point, so moving it up breaks no dependency
(and nothing between can have read it). GPT-2's value transpose, computed from
the fused q/k/v GEMM, joins the query transpose that way, ahead of the
attention scores. Groups are capped at ``max_members`` outputs (a target cost), which keeps
the streams a loop nest reads and writes within what the prefetchers track.
"""

from __future__ import annotations

from ..ir.graph import Node


def plan_horizontal(
    kernels: list[Node],
    pointwise: set[int],
    region_reads,
    max_members: int = 4,
    written_in: dict[int, int] | None = None,
) -> tuple[list[Node], dict[int, list[Node]]]:
    """The kernel order with each group at its first member, and the groups:
    first member's id -> every member in order (the first member included).

    ``pointwise`` holds the ids of roots that may group; ``region_reads(root)``
    gives the ids of the values in memory a root's kernel reads; ``written_in``
    maps a value some other kernel writes (a convolution's epilogue) to that
    kernel's root, so a reader of it waits for that kernel.
    """
    position = {id(k): i for i, k in enumerate(kernels)}
    for value, root in (written_in or {}).items():
        position[value] = position[root]
    groups: dict[tuple, list[list[Node]]] = {}
    for k in kernels:
        if id(k) not in pointwise:
            continue
        key = (tuple(k.shape), k.dtype)
        ready = max((position[v] for v in region_reads(k) if v in position), default=-1)
        joinable = [
            g for g in groups.get(key, []) if len(g) < max_members and ready < position[id(g[0])]
        ]
        if joinable:
            joinable[0].append(k)
        else:
            groups.setdefault(key, []).append([k])
    fused = {id(g[0]): g for gs in groups.values() for g in gs if len(g) > 1}
    moved = {id(m) for g in fused.values() for m in g[1:]}
    order = [k for k in kernels if id(k) not in moved]
    return order, fused
