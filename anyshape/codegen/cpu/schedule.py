"""Kernel planning for the CPU backend: which values live in memory, which are fused.

Sits first in the CPU codegen. A value is *materialized* (gets a buffer) when it
is a graph input, weight or output, the result of a root op (reduction, scan,
GEMM, convolution, pooling), an operand a library call needs in memory, or
used by several kernels and not cheap to recompute. A reshape that must be in
memory (a GEMM operand) aliases its source's buffer instead of copying it. Every
other value is
computed inside the loop nest of the kernel that consumes it (loop fusion of
elementwise, broadcast and view chains; input fusion into reductions).

The plan is data (``Schedule``); ``kernels`` and ``host`` print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.graph import Graph, Node

ROOT_OPS = {"reduce", "argreduce", "cumulative", "dot", "convolution", "pool"}
SOURCE_OPS = {"input", "param"}
CHEAP_OPS = {"constant", "iota", "shape_scalar"}
INDEX_OPS = {"broadcast_in_dim", "transpose", "slice", "reshape"}
# Operands these ops read from memory (a library call or a window walk).
MEMORY_OPERANDS = {"dot": (0, 1), "convolution": (0, 1), "pool": (0,)}


@dataclass
class Schedule:
    graph: Graph
    materialized: list[Node] = field(default_factory=list)  # in topological order
    kernels: list[Node] = field(default_factory=list)  # roots of kernels, in order
    # dot operands read through a transpose of a buffer: operand node -> buffer node
    transposed_operands: dict[int, Node] = field(default_factory=dict)
    # reshapes of a buffer that need memory: they share the buffer (no copy kernel)
    aliases: dict[int, Node] = field(default_factory=dict)

    def is_materialized(self, node: Node) -> bool:
        return id(node) in self._mat

    def __post_init__(self):
        self._mat: set[int] = set()


def _swaps_last_two(node: Node) -> bool:
    perm = node.attr("perm")
    r = len(perm)
    return r >= 2 and tuple(perm) == tuple(range(r - 2)) + (r - 1, r - 2)


def plan_schedule(graph: Graph) -> Schedule:
    nodes = graph.nodes()
    users: dict[int, int] = {}
    for n in nodes:
        for i in n.inputs:
            users[id(i)] = users.get(id(i), 0) + 1
    outputs = {id(o) for o in graph.outputs}
    mat: set[int] = set()
    sched = Schedule(graph)

    def recomputable(n: Node) -> bool:
        if id(n) in mat or n.op in CHEAP_OPS:
            return True
        return n.op in INDEX_OPS and recomputable(n.inputs[0])

    for n in nodes:
        if n.op in SOURCE_OPS or n.op in ROOT_OPS or id(n) in outputs:
            mat.add(id(n))

    def need_memory(x: Node) -> None:
        """Materialize ``x``, as an alias when it is a reshape of something in memory."""
        if x.op == "reshape" and id(x) not in outputs:
            need_memory(x.inputs[0])
            root = sched.aliases.get(id(x.inputs[0]), x.inputs[0])
            sched.aliases[id(x)] = root
        mat.add(id(x))

    for n in nodes:
        for k in MEMORY_OPERANDS.get(n.op, ()):
            src = n.inputs[k]
            if n.op == "dot" and src.op == "transpose" and _swaps_last_two(src):
                need_memory(src.inputs[0])
                sched.transposed_operands[id(src)] = src.inputs[0]
            else:
                need_memory(src)
    for n in nodes:
        if id(n) not in mat and users.get(id(n), 0) > 1 and not recomputable(n):
            mat.add(id(n))
    sched._mat = mat
    sched.materialized = [n for n in nodes if id(n) in mat]
    sched.kernels = [
        n for n in sched.materialized if n.op not in SOURCE_OPS and id(n) not in sched.aliases
    ]
    return sched
