"""StableHLO text for other MLIR compilers: ``graph_to_stablehlo(graph)``.

Sits after the shared IR passes, beside the backends (it is not one: it prints
a Graph as a StableHLO MLIR module and compiles nothing). ``emit`` is the
driver; ``builder`` the SSA text builder; ``ops``, ``index_ops`` and
``reduce_ops`` hold one rule per IR op.
"""

from __future__ import annotations

from .emit import graph_to_stablehlo

__all__ = ["graph_to_stablehlo"]
