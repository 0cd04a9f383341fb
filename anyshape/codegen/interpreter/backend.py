"""The ``interpreter`` backend: graphs run op by op by the NumPy reference interpreter.

Sits behind ``codegen/registry.py`` like every backend; the interpreter itself
(``runtime/interpreter.py``) is the oracle the tests compare generated code
with. Its executable binds the graph's symbols from the input shapes (checking
them as generated code does in its prologue) and evaluates the graph.
"""

from __future__ import annotations

import numpy as np

from ...config import Options
from ...ir.graph import Graph
from ...runtime.binder import InputSpec, ShapeBinder
from ...runtime.interpreter import run_graph
from ..backend import Backend


class InterpreterExecutable:
    kernel_descriptions: list[str] = []
    packed_params: list[str] = []

    def __init__(self, graph: Graph, extra_symbols: list[str]):
        self.graph = graph
        self.extra_symbols = extra_symbols
        specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in graph.inputs]
        self.binder = ShapeBinder(specs, graph.constraints, what=f"cluster @{graph.name}")

    def __call__(self, arrays: list[np.ndarray], extra: list[int]) -> list[np.ndarray | None]:
        env = dict(zip(self.extra_symbols, extra))
        env = self.binder.bind([a.shape for a in arrays], None, env)
        return run_graph(self.graph, arrays, env)

    def set_profiling(self, on: bool) -> None:
        pass  # nothing to time: no kernels

    def read_profile(self) -> list[tuple[str, int, float]]:
        return []

    def saved(self) -> dict | None:
        return None


class InterpreterBackend(Backend):
    name = "interpreter"
    description = "the NumPy reference interpreter (slow; the oracle of the tests)"

    def compile(
        self, graph: Graph, extra_symbols: list[str], options: Options, saved: dict | None = None
    ) -> InterpreterExecutable:
        return InterpreterExecutable(graph, extra_symbols)
