"""Memory plan of the host program: intermediate buffers share slots of one workspace.

Sits between the kernels and the host program. Every buffer that is neither an
input, a weight, a reshape alias nor a returned output lives in a *slot* of
one workspace. A buffer's lifetime runs from the kernel that writes it to the
last kernel that reads it (through any alias). Buffers whose lifetimes do not
overlap share a slot; the slot's size is the run-time maximum of its members'
sizes (expressions over the symbols), so the plan holds for every shape.
Buffers join the free slot of provably equal size when there is one, else the
free slot closest in size at a representative shape.

The host program sizes the slots per call and takes the workspace from a
per-thread arena that grows, so steady-state calls allocate nothing but their
outputs and concurrent calls on different threads never share memory. A call
needing more than twice, and over 64 MiB more than, the largest of the last 16
calls gives the pages past that mark back when it ends (``AsWorkspaceArena`` in
``prelude.h``): one long sequence does not stay resident for the process's life.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.symbolic import SymExpr, as_expr
from ...schedule.op_classes import SOURCE_OPS
from ...schedule.plan import Schedule
from .kernels import Kernel

REPRESENTATIVE = 64  # the value every symbol takes when sizes are compared heuristically


@dataclass
class MemoryPlan:
    slots: list[list[int]] = field(default_factory=list)  # buffer ids per slot
    slot_of: dict[int, int] = field(default_factory=dict)  # buffer id -> slot
    bytes: dict[int, SymExpr] = field(default_factory=dict)  # buffer id -> size in bytes
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)  # first, last kernel


def plan_memory(
    sched: Schedule, buffer_of: dict[int, int], kernels: list[Kernel], returned: set[int]
) -> MemoryPlan:
    plan = MemoryPlan()
    root = {}  # alias buffer -> the buffer that owns the memory
    for n in sched.materialized:
        alias = sched.aliases.get(id(n))
        if alias is not None:
            root[buffer_of[id(n)]] = buffer_of[id(alias)]
    planned = {}
    for n in sched.materialized:
        b = buffer_of[id(n)]
        if n.op in SOURCE_OPS or b in root or b in returned:
            continue
        planned[b] = as_expr(n.type.numel) * n.dtype.itemsize
    for k, kernel in enumerate(kernels):
        for p in kernel.ptrs:
            b = root.get(p, p)
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
