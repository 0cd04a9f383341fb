"""Canonical shapes: every dim the constraint store knows equal is written one way.

Pass contract: needs a verified graph; keeps every output's type up to proven
equality; runs first, so every later pass and the CPU backend compare shapes
structurally and still see equal dims as equal.

The graph's constraint store holds the shape facts the type rules recorded
while the graph was built (elementwise operands, matmul contraction, concat,
reshape products, frontend ranges). A node built before a fact arrived still
carries the dim as it was then: ``y: f32[s2, s1]`` feeding ``sin(y)`` keeps
``s2`` even after ``add(x, y)`` with ``x: f32[s0, s1]`` made ``s2 == s0``.
This pass rewrites every node's type and dim-valued attributes with each
dim's class representative, so ``sin(y)`` becomes ``f32[s0, s1]`` and fuses
with loops over ``x`` (horizontal fusion, stitch matching and broadcast
specialization all match shapes structurally). Graph inputs and weights keep
their declared dims: the prologue binds symbols from them and checks the
facts on every call.
"""

from __future__ import annotations

from typing import Any

from ..config import Options
from ..ir.constraints import ConstraintStore
from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.symbolic import SymExpr, as_dim
from ..ir.types import TensorType
from .rewrite import graph_rewrite

SOURCES = {"input", "param"}


def _canonical_attr(store: ConstraintStore, v: Any) -> Any:
    if isinstance(v, tuple):
        return tuple(_canonical_attr(store, x) for x in v)
    if isinstance(v, SymExpr):
        return as_dim(store.canonical(v))
    return v


def run(graph: Graph, options: Options) -> Graph:
    store = graph.constraints

    def canonical(node: Node) -> Node | None:
        shape = tuple(_canonical_attr(store, d) for d in node.type.shape)
        attrs = _canonical_attr(store, node.attrs)
        if shape == tuple(node.type.shape) and attrs == node.attrs:
            return None
        return Node(node.op, node.inputs, attrs, TensorType(node.dtype, shape), node.meta)

    rules = {op: [canonical] for op in OPS if op not in SOURCES}
    return graph_rewrite(graph, rules, "canonical_shapes")
