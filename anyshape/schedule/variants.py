"""Speculation, planned: which kernels get variants chosen per call, and their predicates.

Sits at the end of the kernel plan (``plan.py`` records both per kernel). Two
kinds of variant:

- **split**: a kernel with few rows (or outputs) leaves threads idle when whole
  rows go to each thread; its split variant splits each row (or reduction)
  over the threads instead, picked per call (``rows < threads``). What a
  target can split and where splitting stops paying are its costs
  (``TargetCosts``: ``split_reductions``, ``split_rows_max``, ``split_row_min``).
- **no broadcast**: a broadcast along a symbolic dim the constraint store
  cannot prove is 1, the output's size, or not 1 (``broadcast_dim``) selects
  its index per element at run time, which blocks vectorization; the variant
  assumes each such size is not 1 (``BroadcastVariant.assumed``), picked per
  call. Emitters ask ``broadcast_dim`` too, so the code they write and the
  predicates planned here agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.symbolic import format_dim, shape_numel
from .op_classes import ROOT_OPS

# How a broadcast reads its operand along one dim (``broadcast_dim``).
ONE = "one"  # the operand's size is 1: index 0
SAME = "same"  # the operand's size is the output's: the output's index
MAY_BE_ONE = "may be one"  # either, decided per call


@dataclass(frozen=True)
class SplitVariant:
    extent: object  # int | SymExpr: below the thread count, the split variant runs
    noun: str  # what the extent counts: "rows" or "outputs"
    what: str  # what is split, for explain(): "the last dim split over threads"


def plan_split_variant(sched, root, costs) -> SplitVariant | None:
    """The split variant of ``root``'s kernel, or None when it has none (or always splits)."""
    stitched = id(root) in sched.stitches
    if root.op == "reduce" and not stitched:
        x, axes = root.inputs[0], root.attr("axes")
        short = (
            all(isinstance(x.shape[a], int) for a in axes)
            and shape_numel([x.shape[a] for a in axes]) < costs.split_row_min
        )
        if root.attr("kind") not in costs.split_reductions or short:
            return None
        extent, noun, what = shape_numel(root.shape), "outputs", "each reduction"
    elif not (stitched or root.op not in ROOT_OPS) or root.rank < (1 if stitched else 2):
        return None
    elif isinstance(root.shape[-1], int) and root.shape[-1] < costs.split_row_min:
        return None
    elif root.shape[-1] in root.shape[:-1]:
        # Rows that count the row's own length (self-attention's [B, H, S, S] scores):
        # a stitch splits only rows longer than thousands of elements (ROW_SPLIT_WORK
        # over its cost per element), which come with as many rows, not fewer than
        # threads; a loop nest with fewer rows than threads has rows as short, all of it
        # below the parallel threshold, run on one thread either way.
        return None
    else:
        extent, noun = shape_numel(root.shape[:-1]), "rows"
        what = "each row's reductions and pass" if stitched else "the last dim"
    if isinstance(extent, int) and extent >= costs.split_rows_max:
        return None
    return SplitVariant(extent, noun, f"{what} split over threads")


@dataclass(frozen=True)
class BroadcastVariant:
    assumed: tuple  # sizes (SymExpr) the variant assumes are not 1, in a stable order

    def describe(self) -> str:
        return " and ".join(f"{format_dim(d)} != 1" for d in self.assumed)


def broadcast_dim(constraints, size, out) -> str:
    """``ONE``, ``SAME`` or ``MAY_BE_ONE``: how a broadcast reads an operand dim of
    ``size`` into an output dim of ``out``. A broadcast's operand dim is 1 or the
    output's size, so one proved not 1 is the output's."""
    if size == 1 or (not isinstance(size, int) and constraints.prove_eq(size, 1)):
        return ONE
    if isinstance(size, int) or size == out:
        return SAME
    if constraints.prove_eq(size, out) or constraints.prove_not_one(size):
        return SAME
    return MAY_BE_ONE


# Kernels with a no-broadcast variant: loop nests without early returns (elementwise,
# reductions, stitch groups, attention's softmax); library calls and window walks read
# their operands whole.
def _speculated(sched, root) -> bool:
    return (
        id(root) in sched.stitches
        or id(root) in sched.attention
        or root.op == "reduce"
        or root.op not in ROOT_OPS
    )


def plan_broadcast_variant(sched, root, computed) -> BroadcastVariant | None:
    """The no-broadcast variant of ``root``'s kernel, whose loops compute ``computed``
    (its outputs and what is fused into them), or None when it has none."""
    if not _speculated(sched, root):
        return None
    store = sched.graph.constraints
    assumed = {}
    for n in computed:
        if n.op != "broadcast_in_dim":
            continue
        x = n.inputs[0]
        for i, d in enumerate(n.attr("dims")):
            if broadcast_dim(store, x.shape[i], n.shape[d]) == MAY_BE_ONE:
                assumed.setdefault(format_dim(x.shape[i]), x.shape[i])
    if not assumed:
        return None
    return BroadcastVariant(tuple(assumed[k] for k in sorted(assumed)))
