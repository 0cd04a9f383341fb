"""How the kernel planner treats each op of the op table, read from the ops' traits.

Sits under the planning (``plan``, ``stitch``, ``epilogue``, ``horizontal``;
the CPU backend's ``memory`` and emitters too): they ask these sets which ops
get a buffer, which are recomputed by every consumer and which fuse into a loop
nest. Each op's class follows from its traits in ``ir/ops.py``
(``CLASS_OF_TRAIT``); the only decisions made here are the planner's own,
commented where they are made. What an op costs on a target is not here but in
``costs.py``, given by the backend.
"""

from __future__ import annotations

from ..ir.ops import OPS

# The planner's class of an op: the first of these traits the op has decides it.
CLASS_OF_TRAIT = (
    ("external", "buffer"),  # given by the caller or the graph: always in memory
    ("generated", "cheap"),  # from attributes and the index: recomputed wherever read
    ("view", "index"),  # reads its operand at another index: fused, never costed
    ("elementwise", "elementwise"),  # fused into the loop nest of its consumer
    # Index arithmetic, clamps and selects per element: fused into one consumer, but
    # computed once in memory when several read it.
    ("piecewise", "not_recomputed"),
    ("indirect", "not_recomputed"),
    # Loop nests of their own, results in memory. A cheap operand is recomputed inside
    # a reduction's loops (input fusion); library calls, window walks and scans read
    # theirs from memory when anything else reads it too.
    ("reduction", "reduction_root"),
    ("scan", "library_root"),
    ("contraction", "library_root"),
    ("window", "library_root"),
    # A copy of its base, then its updates written at the positions its indices hold: no
    # element of the result is known before every update is in, so it is never fused into
    # a consumer; its own kernel reads the operands (fused or in memory) as a scan does.
    ("scatter", "library_root"),
)


def op_class(op: str) -> str:
    """The planner's class of ``op`` (see ``CLASS_OF_TRAIT``); a ``KeyError`` for an op
    none of whose traits is classified."""
    traits = OPS[op].traits
    for trait, cls in CLASS_OF_TRAIT:
        if trait in traits:
            return cls
    raise KeyError(f"the kernel planner has no class for op {op!r} (traits {sorted(traits)})")


def ops_of_class(*classes: str) -> frozenset[str]:
    return frozenset(op for op in OPS if op_class(op) in classes)


SOURCE_OPS = ops_of_class("buffer")
CHEAP_OPS = ops_of_class("cheap")
INDEX_OPS = ops_of_class("index")
ELEMENTWISE_OPS = ops_of_class("elementwise")
NOT_RECOMPUTED = ops_of_class("not_recomputed")
# A value feeding one of these is in memory whenever another consumer reads it too.
LIBRARY_OPS = ops_of_class("library_root")
# Every result in memory: one kernel per root.
ROOT_OPS = ops_of_class("reduction_root", "library_root")
# Computed element by element at an index, inside a loop nest: stitch groups grow through
# them and may recompute one that is stored.
POINTWISE_OPS = ops_of_class("cheap", "index", "elementwise")
