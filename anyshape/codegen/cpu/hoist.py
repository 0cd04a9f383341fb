"""Loop-invariant values moved out of generated loops, one loop level at a time.

Sits at the end of kernel emission (``kernels.emit_kernel`` runs it on every
kernel's loop-nest tree, ``loop_ir``). The expression emitter writes each value
as a single-assignment ``Const`` inside the loop that needs it; a value that
only depends on outer indices -- an attention mask broadcast along the row, a
scale, a per-row bias -- is then recomputed for every element. The C compiler
does not reliably hoist such a load itself: inside an ``omp simd`` loop a
row-invariant mask load made it unswitch the loop and give up vectorizing
(BERT's attention softmax ran 4x slower). This pass moves a ``Const`` of a
loop's body to just before the loop (and its pragmas) when nothing it reads is
declared, assigned or stored to anywhere in that loop, and it reads no
per-thread scratch or error state. A loop holding a statement whose effects are
not stated (hand-written ``Text``) keeps its body as it is.
"""

from __future__ import annotations

from dataclasses import replace

from .loop_ir import Const, Loop, Stmt, Text, children, walk, with_children

# Per-thread scratch and error state: a value reading them stays where it is.
NEVER_MOVED = frozenset({"rb", "err", "err_flag"})


def hoist_invariants(nodes) -> tuple:
    """``nodes`` with loop-invariant ``Const`` statements moved before their loops
    (inner loops first, so a value can move out one level per enclosing loop)."""
    out: list = []
    for n in nodes:
        if isinstance(n, Loop):
            moved, kept = split_invariants(n.vars, hoist_invariants(n.body))
            out += moved
            out.append(replace(n, body=kept))
        else:
            out.append(with_children(n, [hoist_invariants(b) for b in children(n)]))
    return tuple(out)


def split_invariants(loop_vars, body) -> tuple[tuple, tuple]:
    """(the ``Const`` statements of ``body`` invariant in a loop over ``loop_vars``, in
    order; the rest of ``body``). Only the body's own statements move, not those nested
    in a branch or an inner loop (the recursion handles inner loops)."""
    varying = varying_names(body)
    if varying is None:
        return (), tuple(body)
    varying |= set(loop_vars) | NEVER_MOVED
    moved, kept = [], []
    for n in body:
        if isinstance(n, Const) and not (n.reads & varying):
            moved.append(n)
            varying.discard(n.name)  # a moved value no longer varies
        else:
            kept.append(n)
    return tuple(moved), tuple(kept)


def varying_names(nodes) -> set[str] | None:
    """The names declared, assigned or stored through anywhere in ``nodes``; None when a
    statement there does not state its effects."""
    names: set[str] = set()
    for n in walk(nodes):
        if isinstance(n, Text) or (isinstance(n, Stmt) and n.writes is None):
            return None
        if isinstance(n, Stmt):
            names |= n.writes
        elif isinstance(n, Const):
            names.add(n.name)
        elif isinstance(n, Loop):
            names |= n.vars
    return names
