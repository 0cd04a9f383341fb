"""The CPU backend's costs, as the kernel planner reads them (``schedule/costs.py``).

The planner's defaults are these, measured on x86-64 (AVX2 and AVX-512): a
transcendental costs about 8 simple ops per element, recomputing up to 4 ops
in each consumer beats a round trip through memory, a broadcast value of 2 or
more ops is computed once at its own size (BERT's padding mask), and up to 4
independent loop nests share one kernel (docs/architecture.md, "Decisions").
"""

from __future__ import annotations

from ...schedule.costs import TargetCosts

CPU_COSTS = TargetCosts()
