"""Checks a kernel plan is one a backend can emit as it stands.

Sits beside the planner; run after planning when the ``verify`` option is on
(the test suite turns it on), as the IR verifier runs after every pass. A plan
is sound when every value a kernel reads is an input, a weight or written by an
earlier kernel; buffers sharing a workspace slot are never alive at once; every value in memory that is not an input, weight or alias is
written by exactly one kernel; graph outputs are in memory; the values a stitch
kernel computes per row are not, nor an attention kernel's scores and
probabilities; a horizontal group's members share one shape
and dtype; attention chains, routes and variants name kernels of the plan; and a no-broadcast
variant assumes only sizes its kernel broadcasts and nothing proves either way.
"""

from __future__ import annotations

from ..errors import AnyshapeError
from .op_classes import SOURCE_OPS
from .plan import Schedule, fused_into, stitch_root
from .reads import kernel_inputs, members, memory_reads
from .variants import MAY_BE_ONE, broadcast_dim


class PlanError(AnyshapeError, AssertionError):
    """The planner produced a plan no backend can emit (an anyshape bug); says where."""


def verify_plan(sched: Schedule) -> None:
    mat = {id(n) for n in sched.materialized}
    owner = {id(n): id(sched.aliases.get(id(n), n)) for n in sched.materialized}
    ready = {id(n) for n in sched.materialized if n.op in SOURCE_OPS}
    written: dict[int, int] = {}
    roots = {id(k) for k in sched.kernels}
    for o in sched.graph.outputs:
        if id(o) not in mat:
            raise PlanError(f"graph output {o.op} {o.type} is not in memory")
    for k in sched.kernels:
        if id(k) not in mat or k.op in SOURCE_OPS or id(k) in sched.aliases:
            raise PlanError(f"kernel root {k.op} {k.type} is not a value it writes to memory")
        chain = sched.attention.get(id(k))
        if chain is not None and (id(chain.scores) in mat or id(chain.probs) in mat):
            raise PlanError(f"attention kernel {k.op} {k.type} stores its scores or probabilities")
        for row_value in sched.stitches.get(id(stitch_root(sched, k)), []):
            if id(row_value) in mat:
                raise PlanError(f"stitch kernel {k.op} stores its per-row value {row_value.op}")
        group = members(sched, k)
        _check_ready(k, memory_reads(sched, kernel_inputs(sched, group)), owner, ready)
        for m in group:
            if m.dtype != k.dtype or tuple(m.shape) != tuple(k.shape):
                raise PlanError(f"horizontal group of {k.op} mixes {k.type} and {m.type}")
        epilogue = sched.epilogues.get(id(k))
        outs = group
        if epilogue is not None:  # runs inside the kernel, on what the kernel just wrote
            ready.add(id(k))
            _check_ready(k, memory_reads(sched, list(epilogue.inputs)), owner, ready)
            outs = [*group, epilogue]
        for m in outs:
            if id(m) in written:
                raise PlanError(f"{m.op} {m.type} is written by two kernels")
            written[id(m)] = id(k)
            ready.add(id(m))
    for n in sched.materialized:
        if n.op not in SOURCE_OPS and id(n) not in sched.aliases and id(n) not in written:
            raise PlanError(f"{n.op} {n.type} is in memory but no kernel writes it")
    _check_slots(sched)
    decisions = (
        ("attention chain", sched.attention),
        ("route", sched.routes),
        ("split variant", sched.split),
        ("no-broadcast variant", sched.no_broadcast),
    )
    for name, decided in decisions:
        stray = set(decided) - roots
        if stray:
            raise PlanError(f"{len(stray)} {name}(s) for values that are not kernel roots")
    for k in sched.kernels:
        if id(k) in sched.no_broadcast:
            _check_assumed(sched, k, sched.no_broadcast[id(k)].assumed)


def _check_assumed(sched: Schedule, root, assumed) -> None:
    """Each size a no-broadcast variant assumes is not 1 is one its kernel's broadcasts
    decide per call (not provably 1, the output's size, or not 1)."""
    undecided = set()
    for n in [*members(sched, root), *fused_into(sched, root)]:
        if n.op == "broadcast_in_dim":
            for i, d in enumerate(n.attr("dims")):
                size = n.inputs[0].shape[i]
                if broadcast_dim(sched.graph.constraints, size, n.shape[d]) == MAY_BE_ONE:
                    undecided.add(size)
    for size in assumed:
        if size not in undecided:
            raise PlanError(
                f"kernel {root.op} {root.type} assumes {size} != 1, which none of its "
                "broadcasts decides per call"
            )


def _check_ready(kernel, reads: set[int], owner: dict[int, int], ready: set[int]) -> None:
    for value in reads:
        if owner[value] not in ready and value not in ready:
            raise PlanError(
                f"kernel {kernel.op} {kernel.type} reads a value in memory before any kernel "
                "wrote it"
            )


def _check_slots(sched: Schedule) -> None:
    """Buffers sharing a workspace slot are never alive at once."""
    memory = sched.memory
    by_slot: dict[int, list[int]] = {}
    for b, slot in memory.slot_of.items():
        by_slot.setdefault(slot, []).append(b)
    for slot, buffers in by_slot.items():
        spans = sorted(memory.lifetimes[b] for b in buffers)
        for (_, last), (first, _) in zip(spans, spans[1:]):
            if first <= last:
                raise PlanError(f"workspace slot {slot} holds two buffers alive at once")
