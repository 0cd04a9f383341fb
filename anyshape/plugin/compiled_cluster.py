"""One compiled unit: a lowered cluster run through the pass pipeline and a backend.

Sits at the end of plugin-mode compilation: the graph goes through the one
compile path (``pipelines.compile_graph``). A ``CompiledCluster`` is called
with the cluster's input tensors (plus the values of any symbols its inputs do
not carry); it binds the symbols and checks its shape guards in its prologue
(``ShapeBinder``), runs the graph, and returns output tensors that share memory
with the computed arrays (no copy). It holds no per-call state, so one
instance serves many threads at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..config import Options
from ..frontends.torch.lowering import LoweredCluster, tensor_to_numpy
from ..ir.graph import Graph
from ..pipelines import compile_graph
from .profile import SiteTiming


class CompiledCluster:
    """A callable compiled unit for one cluster of an FX graph."""

    def __init__(self, lowered: LoweredCluster, options: Options):
        self._setup(lowered.graph, options)

    @classmethod
    def from_graph(
        cls, graph: Graph, options: Options, saved: dict | None = None
    ) -> CompiledCluster:
        """A unit for a graph the passes already ran on (the model cache's), with what
        the backend's executable kept for it before (``saved``), if anything."""
        unit = cls.__new__(cls)
        unit._setup(graph, options, passes_ran=True, saved=saved)
        return unit

    def _setup(
        self, graph: Graph, options: Options, passes_ran: bool = False, saved: dict | None = None
    ) -> None:
        if not options.threads:  # compiled code runs on as many threads as torch
            options = dataclasses.replace(options, threads=torch.get_num_threads())
        compiled = compile_graph(graph, options, passes_ran=passes_ran, saved=saved)
        self.graph = compiled.graph
        self.binder = compiled.binder
        self.extra_symbols = compiled.extra_symbols
        self.executable = compiled.executable
        self.num_tensor_inputs = len(self.graph.inputs)
        self.__name__ = self.__qualname__ = f"anyshape_{self.graph.name}"  # FX codegen names it
        # Outputs that are graph inputs are returned as the same tensor object.
        self._passthrough = [
            self.graph.inputs.index(o) if o in self.graph.inputs else -1 for o in self.graph.outputs
        ]
        self.backend = options.backend

    @property
    def native(self):
        """The executable when it calls a native library (the C fast path may call it)."""
        return self.executable if getattr(self.executable, "native", None) is not None else None

    def __call__(self, *args):
        n = self.num_tensor_inputs
        tensors = args[:n]
        arrays = [tensor_to_numpy(t) for t in tensors]
        outs = self.executable(arrays, [int(v) for v in args[n:]])
        result = []
        for o, node, src in zip(outs, self.graph.outputs, self._passthrough):
            if src >= 0:
                result.append(tensors[src])
                continue
            if o is None:  # a weight returned as is
                o = self.graph.params[node.attr("name")]
            if not o.flags.writeable:  # a broadcast view: torch needs owned memory
                o = np.array(o)
            result.append(torch.from_numpy(o))
        return tuple(result)

    def read_profile(self) -> list[SiteTiming]:
        """Kernel timings since the last read (empty for the interpreter)."""
        return [
            SiteTiming(self.graph.name, k, label, calls, sec)
            for k, (label, calls, sec) in enumerate(self.executable.read_profile())
        ]

    def __repr__(self) -> str:
        return f"CompiledCluster(@{self.graph.name}, {len(self.graph.nodes())} nodes)"
