"""Graphs of immutable nodes in SSA form, and the builder that makes them.

Sits on the op table. A ``Node`` is one op application with one result; it
never changes after construction (a rewrite builds new nodes). A ``Graph``
holds its inputs, outputs, named weights (``params``) and the
``ConstraintStore`` its type rules consulted. ``Graph.nodes()`` walks the DAG in
a deterministic topological order, which the printer, passes and backends share.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .constraints import ConstraintStore
from .dtypes import DType
from .ops import OPS, IRTypeError
from .symbolic import SymExpr, as_dim
from .types import TensorType


def freeze_attr(v: Any) -> Any:
    """Attributes are hashable: lists become tuples, constant SymExprs become ints."""
    if isinstance(v, (list, tuple)):
        return tuple(freeze_attr(x) for x in v)
    if isinstance(v, SymExpr):
        return as_dim(v)
    if isinstance(v, np.generic):
        return v.item()
    return v


@dataclass(frozen=True, eq=False)
class Node:
    """One op application: ``op(inputs) {attrs} : type``. Identity is object identity."""

    op: str
    inputs: tuple[Node, ...]
    attrs: tuple[tuple[str, Any], ...]
    type: TensorType
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    def attr(self, key: str, default: Any = ...) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        if default is ...:
            raise KeyError(f"{self.op} has no attribute {key!r}")
        return default

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def cse_key(self) -> tuple:
        return (self.op, tuple(id(i) for i in self.inputs), self.attrs, self.type)

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.type})"


class Graph:
    """A compiled unit's dataflow: inputs, outputs, weights and shape facts."""

    def __init__(
        self,
        inputs: Sequence[Node],
        outputs: Sequence[Node],
        params: dict[str, np.ndarray] | None = None,
        constraints: ConstraintStore | None = None,
        name: str = "main",
    ):
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.params = dict(params or {})
        self.constraints = constraints or ConstraintStore()
        self.name = name
        self._order: list[Node] | None = None

    def nodes(self) -> list[Node]:
        """Inputs first (in order), then every reachable node in topological order.

        Computed once per graph (inputs and outputs never change; rewrites build a
        new Graph), since the interpreter walks it on every call.
        """
        if self._order is None:
            self._order = self._topological_order()
        return list(self._order)

    def _topological_order(self) -> list[Node]:
        seen: set[int] = set()
        order: list[Node] = []
        for n in self.inputs:
            seen.add(id(n))
            order.append(n)
        for root in self.outputs:
            if id(root) in seen:
                continue
            stack: list[tuple[Node, int]] = [(root, 0)]
            while stack:
                node, i = stack.pop()
                if i < len(node.inputs):
                    stack.append((node, i + 1))
                    child = node.inputs[i]
                    if id(child) not in seen:
                        stack.append((child, 0))
                elif id(node) not in seen:
                    seen.add(id(node))
                    order.append(node)
        return order

    def with_outputs(self, outputs: Sequence[Node]) -> Graph:
        """The same graph with new outputs (used by rewrites)."""
        return Graph(self.inputs, outputs, self.params, self.constraints, self.name)

    @property
    def input_names(self) -> list[str]:
        return [n.attr("name") for n in self.inputs]

    def op_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes():
            out[n.op] = out.get(n.op, 0) + 1
        return out

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)


class GraphBuilder:
    """Builds nodes through the op table's type rules, recording shape facts."""

    def __init__(self, constraints: ConstraintStore | None = None, name: str = "main"):
        self.constraints = constraints or ConstraintStore()
        self.params: dict[str, np.ndarray] = {}
        self.inputs: list[Node] = []
        self.name = name
        self._memo: dict[tuple, Node] = {}

    def op(self, name: str, /, *inputs: Node, **attrs) -> Node:
        """Create ``name(inputs) {attrs}``; identical requests return the same node."""
        opdef = OPS.get(name)
        if opdef is None:
            raise IRTypeError(f"unknown op {name!r}")
        if opdef.arity is not None and len(inputs) != opdef.arity:
            raise IRTypeError(f"{name} takes {opdef.arity} operands, got {len(inputs)}")
        frozen = {k: freeze_attr(v) for k, v in attrs.items()}
        missing = [a for a in opdef.attrs if a not in frozen]
        if missing:
            raise IRTypeError(f"{name} is missing attributes {missing}")
        try:
            ty = opdef.rule(tuple(i.type for i in inputs), frozen, self.constraints)
        except IRTypeError as e:
            raise IRTypeError(f"{name}: {e}") from None
        node = Node(name, tuple(inputs), tuple(sorted(frozen.items())), ty)
        if "source" in opdef.traits and name in ("input", "param"):
            return node
        key = node.cse_key()
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self._memo[key] = node
        return node

    def input(self, name: str, ty: TensorType) -> Node:
        n = self.op("input", name=name, dtype=ty.dtype, shape=ty.shape)
        self.inputs.append(n)
        return n

    def param(self, name: str, value: np.ndarray) -> Node:
        if name in self.params and self.params[name] is not value:
            raise ValueError(f"param {name!r} defined twice")
        self.params[name] = value
        ty = TensorType(DType.from_numpy(value.dtype), value.shape)
        key = ("param", name)
        if key not in self._memo:
            self._memo[key] = self.op("param", name=name, dtype=ty.dtype, shape=ty.shape)
        return self._memo[key]

    def constant(self, value, dtype: DType) -> Node:
        if dtype.is_bool:
            value = bool(value)
        elif dtype.is_int:
            value = int(value)
        else:
            value = float(value)
        return self.op("constant", value=value, dtype=dtype)

    def build(self, outputs: Iterable[Node]) -> Graph:
        return Graph(self.inputs, list(outputs), self.params, self.constraints, self.name)


def graph_symbols(graph: Graph) -> frozenset[str]:
    """Every symbol the graph's types and attributes mention."""
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
