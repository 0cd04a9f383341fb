"""One compiled unit: a lowered cluster run through the pass pipeline and a backend.

Sits at the end of plugin-mode compilation. A ``CompiledCluster`` is called
with the cluster's input tensors (plus the values of any symbols its inputs do
not carry); it binds the symbols and checks its shape guards in its prologue
(``ShapeBinder``), runs the graph, and returns output tensors that share memory
with the computed arrays (no copy). It holds no per-call state, so one
instance serves many threads at once.
"""

from __future__ import annotations

import numpy as np
import torch

from ..codegen.cpu.conv_emit import channels_last_convolutions
from ..codegen.cpu.executable import CpuExecutable
from ..codegen.cpu.host import HostProgram
from ..config import Options
from ..frontends.torch.lowering import LoweredCluster, tensor_to_numpy
from ..ir.graph import Graph
from ..passes.pipeline import run_pipeline
from ..runtime.binder import InputSpec, ShapeBinder
from ..runtime.interpreter import run_graph
from .profile import SiteTiming


def graph_symbols(graph: Graph) -> frozenset[str]:
    """Every symbol the graph's types and attributes mention."""
    from ..ir.symbolic import SymExpr

    out: set[str] = set()

    def visit(v):
        if isinstance(v, SymExpr):
            out.update(v.free_symbols)
        elif isinstance(v, tuple):
            for x in v:
                visit(x)

    for n in graph.nodes():
        out.update(n.type.free_symbols)
        for _, v in n.attrs:
            visit(v)
    return frozenset(out)


class CompiledCluster:
    """A callable compiled unit for one cluster of an FX graph."""

    def __init__(self, lowered: LoweredCluster, options: Options):
        layouts = ("channels_last",) if channels_last_convolutions(options) else ()
        self._setup(run_pipeline(lowered.graph, options, layouts), options)

    @classmethod
    def from_graph(
        cls, graph: Graph, options: Options, program: HostProgram | None = None
    ) -> CompiledCluster:
        """A unit for a graph the pass pipeline already ran on (the model cache's), with
        the CPU backend's translation unit emitted for it before, if kept."""
        unit = cls.__new__(cls)
        unit._setup(graph, options, program)
        return unit

    def _setup(self, graph: Graph, options: Options, program: HostProgram | None = None) -> None:
        self.graph = graph
        specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in self.graph.inputs]
        self.binder = ShapeBinder(specs, self.graph.constraints, what=f"cluster @{self.graph.name}")
        self.extra_symbols = sorted(graph_symbols(self.graph) - self.binder.origin.keys())
        self.num_tensor_inputs = len(specs)
        self.__name__ = self.__qualname__ = f"anyshape_{self.graph.name}"  # FX codegen names it
        # Outputs that are graph inputs are returned as the same tensor object.
        self._passthrough = [
            self.graph.inputs.index(o) if o in self.graph.inputs else -1 for o in self.graph.outputs
        ]
        self.backend = options.backend
        self.native = None
        if options.backend == "cpu":
            self.native = CpuExecutable(
                self.graph, self.extra_symbols, torch.get_num_threads(), program
            )
            self.native.set_profiling(options.profile)
        elif options.backend != "interpreter":
            raise ValueError(f"unknown backend {options.backend!r} (cpu or interpreter)")

    def __call__(self, *args):
        n = self.num_tensor_inputs
        tensors = args[:n]
        arrays = [tensor_to_numpy(t) for t in tensors]
        if self.native is not None:
            outs = self.native(arrays, [int(v) for v in args[n:]])
        else:
            env = {s: int(v) for s, v in zip(self.extra_symbols, args[n:])}
            env = self.binder.bind([a.shape for a in arrays], None, env)
            outs = run_graph(self.graph, arrays, env)
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
        if self.native is None:
            return []
        return [
            SiteTiming(self.graph.name, k, label, calls, sec)
            for k, (label, calls, sec) in enumerate(self.native.read_profile())
        ]

    def __repr__(self) -> str:
        return f"CompiledCluster(@{self.graph.name}, {len(self.graph.nodes())} nodes)"
