"""What a target's costs are, as data the planner reads: the backend gives its own.

Sits beside the planner (``plan.py``): which values are recomputed in each
consumer and which get a buffer depends on how much recomputing costs on the
target, and which operands a library call needs in memory on what the target
runs in a library. A backend passes a ``TargetCosts`` (the CPU backend's is
``codegen/cpu/costs.py``); the defaults are the CPU's measured ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_TRANSCENDENTALS = ("exp", "log", "erf", "tanh", "sigmoid", "pow", "sin", "cos", "log1p", "expm1")


@dataclass(frozen=True)
class TargetCosts:
    # Relative cost of recomputing an op, per element, where it is not 1.
    expensive_ops: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(_TRANSCENDENTALS, 8)
    )
    # Operands an op reads from memory (a library call or a window walk): op -> positions.
    memory_operands: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"dot": (0, 1), "convolution": (0, 1), "pool": (0,)}
    )
    # Recomputing a value in each consumer is fine up to this much work (ops, weighted).
    recompute_budget: int = 4
    # A broadcast value at least this costly is computed once at its own size, not per copy.
    hoist_cost: int = 2
    # Independent loop nests over one shape share one kernel, up to this many outputs.
    horizontal_members: int = 4
    # Split variants (variants.py): reductions the target splits over threads (OpenMP's
    # reduction clauses), rows (outputs) statically this many or more never split, and
    # rows statically shorter than this never split.
    split_reductions: frozenset[str] = frozenset({"sum", "prod", "max", "min"})
    split_rows_max: int = 256
    split_row_min: int = 1024
    # Element sizes (bytes) whose transposes moving the last dim the target copies in
    # tiles (the CPU's ``transpose_emit``); the plan keeps other work out of those
    # transposes when they read across channel planes (``plan._moves_last_dim``).
    tiled_transpose_itemsizes: tuple[int, ...] = (4, 8)
    # Attention chains (attention.py): scores GEMM, softmax stitch and values GEMM as one
    # kernel over blocks of rows, when the target emits them (the CPU does).
    attention_fusion: bool = True
