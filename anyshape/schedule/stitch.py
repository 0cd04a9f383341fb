"""Stitch fusion planning: row reductions computed inside the kernel that consumes them.

Sits inside the kernel plan (``plan.py``), after materialization is decided. A *stitch group*
is a pointwise root R (softmax's divide, layer norm's affine output) whose
fused expression reads reductions over the last axis of R's own shape, broadcast
back along that axis. Instead of one kernel per reduction (each a pass over
memory) and one for R, the group becomes one kernel that, per row, computes
every reduction into a local (the row stays in cache), then writes R's row:
one read and one write of memory for softmax, layer norm, RMS norm.

A group is formed only when nothing outside it needs its reductions or the
full-size values recomputed inside it (every consumer is in the group), so
the rest of the schedule is unchanged. Planning is pure IR: shapes must match
structurally (the same symbolic dims), which the constraint store has
canonicalized.
"""

from __future__ import annotations

from ..ir.graph import Node
from .op_classes import CHEAP_OPS, POINTWISE_OPS

STITCH_KINDS = {"sum", "max", "min"}


def plan_stitches(
    nodes: list[Node], mat: set[int], consumers: dict[int, list[Node]], outputs: set[int]
) -> tuple[dict[int, list[Node]], dict[int, list[Node]]]:
    """Stitch groups: root id -> the row broadcasts it reads (in graph order), and
    root id -> the full-row values it keeps in a row buffer.

    Removes the group's reductions and row-buffered values from ``mat``: values
    that were stored because several consumers read them (and are not cheap)
    are computed once per row into the buffer instead.
    """
    order = {id(n): k for k, n in enumerate(nodes)}
    groups: dict[int, list[Node]] = {}
    buffered: dict[int, list[Node]] = {}
    # Consumers first: the outermost root claims its group, and a root swallowed by
    # an earlier group (recomputed there) is no longer stored, so it is skipped.
    for root in reversed(nodes):
        if id(root) not in mat or root.op not in POINTWISE_OPS or root.rank == 0:
            continue
        blocked: set[int] = set()  # stored values the group reads from memory after all
        while True:
            members, unmaterialized, broadcasts = _group(root, mat, outputs, blocked)
            escaping = _escaping(unmaterialized, members, root, consumers)
            if not escaping:
                break
            blocked |= {id(n) for n in escaping}
        if not any(n.op == "reduce" for n in unmaterialized):
            continue
        for n in unmaterialized:
            mat.discard(id(n))
        groups[id(root)] = sorted(broadcasts, key=lambda b: order[id(b)])
        kept = [n for n in unmaterialized if n.op != "reduce" and n.dtype == root.dtype]
        buffered[id(root)] = sorted(kept, key=lambda n: order[id(n)])
    return groups, buffered


def _escaping(unmat: set[Node], members: set[int], root: Node, consumers) -> set[Node]:
    """The unstored values some kernel outside the group would still need.

    A fused (unstored) value is computed inside every kernel that reads it, so
    every path up from it through its consumers must stay in the group.
    """
    out = set()
    for n in unmat:
        seen: set[int] = set()
        stack = [n]
        while stack and n not in out:
            for c in consumers.get(id(stack.pop()), []):
                if c is root or id(c) in seen:
                    continue
                if id(c) not in members:
                    out.add(n)
                    break
                seen.add(id(c))
                stack.append(c)
    return out


def _group(root: Node, mat: set[int], outputs: set[int], blocked: set[int]):
    """(member ids, nodes to stop materializing, row broadcasts), or None if not a group."""
    full = tuple(root.shape)
    last = len(full) - 1
    rows = {full[:-1], full[:-1] + (1,)}  # per-row values, with or without a kept dim
    members: set[int] = set()
    unmat: set[Node] = set()
    broadcasts: list[Node] = []

    def row_broadcast(n: Node) -> bool:
        if n.op != "broadcast_in_dim":
            return False
        src = tuple(n.inputs[0].shape)
        return (
            id(n) not in mat
            and src in rows
            and tuple(n.attr("dims")) == tuple(range(len(src)))
            and tuple(n.shape) == full
        )

    def stitchable_reduce(n: Node) -> bool:
        return (
            n.op == "reduce"
            and n.attr("kind") in STITCH_KINDS
            and tuple(n.attr("axes")) == (last,)
            and tuple(n.inputs[0].shape) == full
            and id(n) not in outputs
        )

    def visit_full(x: Node) -> None:
        """A value the group reads at full-row indices."""
        if id(x) in members:
            return
        if row_broadcast(x):
            members.add(id(x))
            broadcasts.append(x)
            visit_row(x.inputs[0])
        elif id(x) not in mat:
            members.add(id(x))
            for i in x.inputs:
                visit_full(i)
        elif (
            id(x) not in blocked
            and x.op in POINTWISE_OPS
            and x.op not in CHEAP_OPS
            and tuple(x.shape) == full
            and id(x) not in outputs
        ):
            members.add(id(x))  # stored only for its consumers here: recompute it
            unmat.add(x)
            for i in x.inputs:
                visit_full(i)

    def visit_row(q: Node) -> None:
        if id(q) in members:
            return
        if stitchable_reduce(q) and id(q) in mat and id(q) not in blocked:
            members.add(id(q))
            unmat.add(q)
            visit_full(q.inputs[0])
        elif id(q) not in mat:  # (a blocked or other stored value is read from memory)
            members.add(id(q))
            for x in q.inputs:
                if tuple(x.shape) in rows:
                    visit_row(x)
                elif id(x) not in mat:
                    members.add(id(x))  # a broadcast constant and the like, fused as is

    for i in root.inputs:
        visit_full(i)
    return members, unmat, broadcasts
