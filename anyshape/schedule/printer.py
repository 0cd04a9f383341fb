"""The kernel plan as stable text: what a dump shows and a golden file pins.

Sits beside the planner; names values as ``ir/printer.py`` does, so a plan
reads next to the graph's own dump (``<graph>.plan`` beside the passes'
``.ir`` files in ``dump_dir``). One line per value in memory, then one per
kernel in call order: its root, kind, what it fuses (``%n:op``), and where it
applies an attention chain (its scores and probabilities, computed per block of
rows), stitch rows, a row buffer, an epilogue, a horizontal group, operands
read transposed in place (``^T``: the last two dims swapped; ``^(0,2,1,3)``: the
buffer's dims in that order), a no-broadcast variant, a split variant for few
rows, and the backend's library route; last, the
workspace slots, each with the buffers sharing it and their lifetimes (first
and last kernel, counted from 0)::

    plan @cluster0
      buffers: %x, %0, %2, %8 (alias of %x), %11, ...
      kernel %11 = library dot f32[s0*s1, 32] transposed(%10 as %9^T) <- %10:transpose route(...)
      kernel %36 = stitch div f32[s1, 2, s0, s0] rows(%31, %35) row_buffer(%33) <- %26:reshape, ...
      kernel %45 = attention dot f32[s1, 2, s0, 16] scores(%25) probs(%35) rows(%30, %34) ...
      kernel %2 = library convolution f32[s1, s2, s3, 8] epilogue(%21) <- %10:broadcast_in_dim, ...
"""

from __future__ import annotations

from ..ir.printer import value_names
from ..ir.symbolic import format_dim
from .op_classes import CHEAP_OPS, ROOT_OPS
from .plan import Schedule, fused_into, stitch_root
from .reads import members


def _permuted(t) -> str:
    """How a dot reads its transposed operand ``t``: ``^T`` (the last two dims swapped) or
    the permutation of the buffer's dims (attention's heads read in place)."""
    perm, r = tuple(t.attr("perm")), t.rank
    if perm == (*range(r - 2), r - 1, r - 2):
        return "^T"
    return "^(" + ",".join(str(p) for p in perm) + ")"


def print_plan(sched: Schedule) -> str:
    names = value_names(sched.graph)

    def ref(n) -> str:
        return f"%{names[id(n)]}"

    buffers = []
    for n in sched.materialized:
        owner = sched.aliases.get(id(n))
        buffers.append(ref(n) + (f" (alias of {ref(owner)})" if owner is not None else ""))
    lines = [f"plan @{sched.graph.name}", "  buffers: " + ", ".join(buffers)]
    for root in sched.kernels:
        lines.append("  kernel " + _kernel(sched, root, ref))
    memory = sched.memory
    for k in range(len(memory.slots)):
        shared = sorted(b for b, s in memory.slot_of.items() if s == k)
        spans = [
            f"{ref(sched.materialized[b])} {memory.lifetimes[b][0]}..{memory.lifetimes[b][1]}"
            for b in shared
        ]
        lines.append(f"  workspace slot {k}: " + ", ".join(spans))
    return "\n".join(lines) + "\n"


def _kind(sched: Schedule, root) -> str:
    if id(root) in sched.attention:
        return "attention"
    if id(root) in sched.stitches:
        return "stitch"
    if root.op in ROOT_OPS:
        return "reduction" if root.op in ("reduce", "argreduce") else "library"
    return "loop"


def _kernel(sched: Schedule, root, ref) -> str:
    group = members(sched, root)
    text = f"{ref(root)} = {_kind(sched, root)} {root.op} {root.type}"
    if len(group) > 1:
        text += " horizontal(" + ", ".join(ref(m) for m in group) + ")"
    chain = sched.attention.get(id(root))
    if chain is not None:
        text += f" scores({ref(chain.scores)}) probs({ref(chain.probs)})"
    stitch = stitch_root(sched, root)
    if id(stitch) in sched.stitches:
        text += " rows(" + ", ".join(ref(r) for r in sched.stitches[id(stitch)]) + ")"
        buffered = sched.row_buffered.get(id(stitch), [])
        if buffered:
            text += " row_buffer(" + ", ".join(ref(b) for b in buffered) + ")"
    epilogue = sched.epilogues.get(id(root))
    if epilogue is not None:
        text += f" epilogue({ref(epilogue)})"
    operands = [*root.inputs, *(chain.scores.inputs if chain is not None else ())]
    transposed = [
        f"{ref(i)} as {ref(sched.transposed_operands[id(i)])}{_permuted(i)}"
        for i in operands
        if id(i) in sched.transposed_operands
    ]
    if transposed:
        text += " transposed(" + ", ".join(transposed) + ")"
    fused = sorted(
        (n for n in fused_into(sched, root) if n.op not in CHEAP_OPS and n is not epilogue),
        key=lambda n: int(ref(n)[1:]) if ref(n)[1:].isdigit() else -1,
    )
    if fused:
        text += " <- " + ", ".join(f"{ref(n)}:{n.op}" for n in fused)
    assumed = sched.no_broadcast.get(id(root))
    if assumed is not None:
        text += f" speculate({assumed.describe()}: no run-time broadcast)"
    split = sched.split.get(id(root))
    if split is not None:
        text += f" split({format_dim(split.extent)} {split.noun} < threads: {split.what})"
    route = sched.routes.get(id(root))
    if route is not None:
        text += f" route({getattr(route, 'description', route)})"
    return text
