"""What a kernel of the plan covers: the outputs it writes, the values in memory it reads.

Sits under the planner (``plan``), the memory plan (``memory``), the verifier
and the printer, which all ask these two questions of a ``plan.Schedule``.
"""

from __future__ import annotations


def members(sched, root) -> list:
    """The outputs ``root``'s kernel writes: its horizontal group, or ``root`` alone."""
    return sched.horizontal.get(id(root), [root])


def kernel_inputs(sched, group) -> list:
    """The operands the kernel writing ``group`` reads, as it reads them: a dot takes a
    transposed operand's buffer in place (``Schedule.transposed_operands``)."""
    return [
        sched.transposed_operands.get(id(i), i) if m.op == "dot" else i
        for m in group
        for i in m.inputs
    ]


def memory_reads(sched, start) -> set[int]:
    """Ids of the values in memory read from the values ``start`` through what is fused
    there (a reshape alias as the buffer it shares)."""
    out, seen, stack = set(), set(), list(start)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if sched.is_materialized(n):
            out.add(id(sched.aliases.get(id(n), n)))
        else:
            stack.extend(n.inputs)
    return out
