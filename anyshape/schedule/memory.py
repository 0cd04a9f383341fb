"""Memory plan: intermediate buffers share slots of one workspace, planned before emission.

Sits at the end of the kernel plan (``plan.py`` calls it once the kernel order
is final); a backend's host program sizes the slots. A buffer is a value in
memory, numbered by its place in ``Schedule.materialized``. Every buffer that is neither an
input, a weight, a reshape alias nor a returned output lives in a *slot* of
one workspace. A buffer's lifetime runs from the kernel that writes it to the
last kernel that reads it (through any alias), both read from the plan
(``kernel_buffers``: what a kernel's group and epilogue read and write). Buffers whose lifetimes do not
overlap share a slot; the slot's size is the run-time maximum of its members'
sizes (expressions over the symbols), so the plan holds for every shape.
Buffers join the free slot of provably equal size when there is one, else the
free slot closest in size at a representative shape.

The host program sizes the slots per call and takes the workspace from a
per-thread arena that grows, so steady-state calls allocate nothing but their
outputs and concurrent calls on different threads never share memory. A call
needing more than twice, and over 64 MiB more than, the largest of the last 16
calls gives the pages past that mark back when it ends (the CPU backend's
``AsWorkspaceArena`` in ``prelude.h``): one long sequence does not stay resident
for the process's life.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.symbolic import SymExpr, as_expr
from .op_classes import SOURCE_OPS
from .reads import kernel_inputs, members, memory_reads

REPRESENTATIVE = 64  # the value every symbol takes when sizes are compared heuristically


@dataclass
class MemoryPlan:
    slots: list[list[int]] = field(default_factory=list)  # buffer ids per slot
    slot_of: dict[int, int] = field(default_factory=dict)  # buffer id -> slot
    bytes: dict[int, SymExpr] = field(default_factory=dict)  # buffer id -> size in bytes
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)  # first, last kernel


def kernel_buffers(sched, root) -> set[int]:
    """Ids of the values in memory ``root``'s kernel reads or writes (its horizontal
    group and epilogue included; a reshape alias as the value whose buffer it shares)."""
    group = members(sched, root)
    out = memory_reads(sched, kernel_inputs(sched, group))
    written = list(group)
    epilogue = sched.epilogues.get(id(root))
    if epilogue is not None:
        out |= memory_reads(sched, list(epilogue.inputs))
        written.append(epilogue)
    return out | {id(sched.aliases.get(id(m), m)) for m in written}


def plan_memory(sched) -> MemoryPlan:
    """Slots for ``sched``'s intermediate buffers (the kernel order is final)."""
    plan = MemoryPlan()
    buffer_of = {id(n): k for k, n in enumerate(sched.materialized)}
    root = {}  # alias buffer -> the buffer that owns the memory
    for n in sched.materialized:
        alias = sched.aliases.get(id(n))
        if alias is not None:
            root[buffer_of[id(n)]] = buffer_of[id(alias)]
    returned = {
        buffer_of[id(sched.aliases.get(id(o), o))]
        for o in sched.graph.outputs
        if o.op not in SOURCE_OPS
    }
    planned = {}
    for n in sched.materialized:
        b = buffer_of[id(n)]
        if n.op in SOURCE_OPS or b in root or b in returned:
            continue
        planned[b] = as_expr(n.type.numel) * n.dtype.itemsize
    for k, kernel in enumerate(sched.kernels):
        # (in buffer order: ties between equal lifetimes go the same way every run)
        for b in sorted(
            {root.get(buffer_of[v], buffer_of[v]) for v in kernel_buffers(sched, kernel)}
        ):
            if b in planned:
                first, _ = plan.lifetimes.get(b, (k, k))
                plan.lifetimes[b] = (first, k)
    slot_last: list[int] = []
    slot_hint: list[int] = []
    for b in sorted(plan.lifetimes, key=lambda b: plan.lifetimes[b]):
        first, last = plan.lifetimes[b]
        size = planned[b]
        hint = _hint(size)
        free = [s for s in range(len(plan.slots)) if slot_last[s] < first]
        same = [s for s in free if any(planned[m] == size for m in plan.slots[s])]
        if same:
            s = same[0]
        elif free:
            s = min(free, key=lambda s: abs(slot_hint[s] - hint))
        else:
            plan.slots.append([])
            slot_last.append(-1)
            slot_hint.append(0)
            s = len(plan.slots) - 1
        plan.slots[s].append(b)
        plan.slot_of[b] = s
        slot_last[s] = last
        slot_hint[s] = max(slot_hint[s], hint)
    plan.bytes = {b: planned[b] for b in plan.slot_of}
    # A slot is sized by its distinct size expressions only.
    plan.slots = [list({planned[b]: b for b in members}.values()) for members in plan.slots]
    return plan


def _hint(size: SymExpr) -> int:
    return size.evaluate({s: REPRESENTATIVE for s in size.free_symbols})
