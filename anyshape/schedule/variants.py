"""Speculation on extents, planned: which kernels get a split variant, chosen per call.

Sits at the end of the kernel plan (``plan.py`` records it per kernel). A
kernel with few rows (or outputs) leaves threads idle when whole rows go to
each thread; its split variant splits each row (or reduction) over the threads
instead, and the emitted kernel picks one per call (``rows < threads``). The
planner decides which kernels have that variant and over what extent; what a
target can split and where splitting stops paying are its costs
(``TargetCosts``: ``split_reductions``, ``split_rows_max``, ``split_row_min``).
The other speculation, assuming no dim broadcasts at run time, is found while
emitting, where each broadcast's index is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.symbolic import shape_numel
from .op_classes import ROOT_OPS


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
    else:
        extent, noun = shape_numel(root.shape[:-1]), "rows"
        what = "each row's reductions and pass" if stitched else "the last dim"
    if isinstance(extent, int) and extent >= costs.split_rows_max:
        return None
    return SplitVariant(extent, noun, f"{what} split over threads")
