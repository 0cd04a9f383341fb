"""Rebuild an FX graph so each cluster is one call to its compiled unit.

Sits after partitioning and per-cluster compilation. The new graph lists the
original nodes in a topological order of the condensed graph (clusters as single
units, PyTorch ops as themselves), so a PyTorch op that reads a cluster output
always runs after that cluster. Symbols a cluster needs but its inputs do not
carry are passed as ``sym_size`` values of the model inputs. In export mode the
model-level prologue (``ModelPrologue``) replaces torch.export's own guard call.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from ..errors import CaptureError
from .compiled_cluster import CompiledCluster


def assemble(
    gm: fx.GraphModule,
    clusters: list[tuple[list[fx.Node], list[fx.Node], list[fx.Node], CompiledCluster]],
    symbol_sources: dict[str, tuple[fx.Node, int]],
    prologue: Callable | None = None,
) -> fx.GraphModule:
    """Rewrite ``gm`` in place; ``clusters`` holds (members, inputs, outputs, compiled)."""
    old = gm.graph
    order = {n: i for i, n in enumerate(old.nodes)}
    unit_of: dict[fx.Node, int] = {}
    units: list[list[fx.Node]] = []
    for members, *_ in clusters:
        for n in members:
            unit_of[n] = len(units)
        units.append(members)
    cluster_count = len(units)
    for n in old.nodes:
        if n not in unit_of:
            unit_of[n] = len(units)
            units.append([n])

    deps: list[set[int]] = [set() for _ in units]
    for u, members in enumerate(units):
        for n in members:
            for a in n.all_input_nodes:
                if unit_of[a] != u:
                    deps[u].add(unit_of[a])
    users: list[list[int]] = [[] for _ in units]
    for u, ds in enumerate(deps):
        for d in ds:
            users[d].append(u)
    pending = [len(d) for d in deps]
    heap = [(order[units[u][0]], u) for u in range(len(units)) if pending[u] == 0]
    heapq.heapify(heap)

    new = fx.Graph()
    new._codegen = old._codegen
    env: dict[fx.Node, fx.Node] = {}
    placeholders: list[fx.Node] = []
    sym_cache: dict[str, fx.Node] = {}

    def sym_value(name: str) -> fx.Node:
        if name not in sym_cache:
            if name not in symbol_sources:
                raise CaptureError(f"symbol {name} is not the size of any model input")
            src, dim = symbol_sources[name]
            sym_cache[name] = (
                env[src]
                if dim < 0
                else new.call_function(torch.ops.aten.sym_size.int, (env[src], dim))
            )
        return sym_cache[name]

    done = 0
    while heap:
        _, u = heapq.heappop(heap)
        done += 1
        if u < cluster_count:
            members, inputs, outputs, compiled = clusters[u]
            args = [env[i] for i in inputs] + [sym_value(s) for s in compiled.extra_symbols]
            call = new.call_function(compiled, tuple(args))
            call.name = compiled.graph.name
            for k, o in enumerate(outputs):
                item = new.call_function(operator.getitem, (call, k))
                item.meta = dict(o.meta)
                env[o] = item
        else:
            (n,) = units[u]
            if n.op == "call_module" and n.target == "_guards_fn":
                continue  # replaced by the model prologue
            env[n] = new.node_copy(n, lambda a: env[a])
            if n.op == "placeholder":
                placeholders.append(env[n])
        for v in users[u]:
            pending[v] -= 1
            if pending[v] == 0:
                heapq.heappush(heap, (order[units[v][0]], v))
    if done != len(units):
        raise RuntimeError("cluster assembly found a cycle (an anyshape bug)")

    new.eliminate_dead_code()
    placeholders = [n for n in new.nodes if n.op == "placeholder"]
    if prologue is not None and placeholders:
        with new.inserting_after(placeholders[-1]):
            checked = getattr(prologue, "names", None)  # (inputs of unsupported dtypes: none)
            tensors = tuple(
                n
                for n in new.nodes
                if n.op == "placeholder"
                and isinstance(n.meta.get("val"), torch.Tensor)
                and (checked is None or n.name in checked)
            )
            new.call_function(prologue, tensors)
    gm.graph = new  # (torch's setter regenerates the module's Python)
    return gm
