"""Clustering for plugin mode: which FX nodes compile, grouped into acyclic clusters.

Sits after capture and before lowering. Every tensor-producing call is asked
``check_supported`` (a trial lowering of that node alone); supported nodes are
grouped by torch's ``CapabilityBasedPartitioner`` into maximal clusters that
create no cycle with the PyTorch ops between them. Nodes that are not ops
(placeholders, weights, shape arithmetic on SymInts, metadata asserts) are
neither clusters nor fallbacks.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..frontends.torch import aten  # noqa: F401  (fills the lowering table)
from ..frontends.torch.lowering import (
    check_supported,
    feeds_as_strided,
    is_tensor_node,
    source_location,
)


@dataclass(frozen=True)
class Fallback:
    node: fx.Node
    reason: str
    location: str

    @property
    def target(self) -> str:
        return str(self.node.target)


@dataclass
class PartitionPlan:
    clusters: list[list[fx.Node]]  # each in graph order
    fallbacks: list[Fallback]


IGNORED_TARGETS = {
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
    "aten._assert_async.msg",
}


def is_op_node(node: fx.Node) -> bool:
    """Whether ``node`` is a tensor computation (as opposed to plumbing)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if str(node.target) in IGNORED_TARGETS or node.target == "_guards_fn":
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) for v in vals)


class _Support(OperatorSupportBase):
    def __init__(self, verdicts: dict[fx.Node, str | None]):
        self.verdicts = verdicts

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return node in self.verdicts and self.verdicts[node] is None


def _verdict(node: fx.Node) -> str | None:
    """``check_supported``, with an internal error in it a reason to run the op in PyTorch."""
    try:
        return check_supported(node)
    except Exception as e:  # an anyshape bug must not stop the model from compiling
        return f"internal error checking the lowering ({type(e).__name__}: {e})"


class _NoKey(Exception):
    """An argument ``_verdict_key`` cannot describe: the node is asked itself."""


def _verdict_key(node: fx.Node) -> tuple:
    """All that ``check_supported`` reads of ``node``: its target, its constant arguments,
    each operand's kind, dtype and symbolic shape (operands numbered by first use, so
    ``x * x`` and ``x * y`` differ), its own outputs' and which of them its users read,
    and whether it is a view feeding ``as_strided``. Nodes with equal keys lower alike in
    isolation, as a repeated block's nodes do (BERT-base: 12 layers of one op sequence).
    Raises ``_NoKey`` for an argument it cannot describe."""
    seen: dict[fx.Node, int] = {}

    def shape(v: torch.Tensor) -> tuple:
        return (
            v.dtype,
            str(v.device),
            tuple(d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in v.shape),
        )

    def value(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", *shape(v))
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return (type(v).__name__, v.node.expr)
        if isinstance(v, (tuple, list)):
            return (type(v).__name__, tuple(value(x) for x in v))
        if v is None or isinstance(v, (bool, int, str, torch.dtype, torch.device)):
            return (type(v).__name__, v)
        if isinstance(v, float):
            return ("float", repr(v))  # (-0.0 and 0.0 apart; nan equal to itself)
        raise _NoKey

    def arg(a):
        if isinstance(a, fx.Node):
            return ("node", seen.setdefault(a, len(seen)), value(a.meta.get("val")))
        if isinstance(a, (tuple, list)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(x)) for k, x in a.items()))
        if isinstance(a, slice):
            return ("slice", arg(a.start), arg(a.stop), arg(a.step))
        if isinstance(a, (torch.memory_format, torch.layout)):
            return (type(a).__name__, str(a))
        return value(a)

    users = sorted(
        (u.target is operator.getitem, u.args[1] if u.target is operator.getitem else 0)
        for u in node.users
    )
    return (
        node.op,
        node.target,
        arg(node.args),
        arg(node.kwargs),
        value(node.meta.get("val")),
        tuple(users),
        feeds_as_strided(node),
    )


def _verdicts(gm: fx.GraphModule) -> dict[fx.Node, str | None]:
    """``_verdict`` of every op node. A node whose ``_verdict_key`` compiled before
    compiles (T5-small's 741 op nodes are 142 keys), as does a selection from a tuple
    output that compiles; a node that does not is asked itself, for a reason that names
    its own operands (fallbacks are few)."""
    verdicts: dict[fx.Node, str | None] = {}
    compiles: set[tuple] = set()
    for node in gm.graph.nodes:
        if not is_op_node(node):
            continue
        src = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(src, fx.Node) and verdicts.get(src, False) is None:
            verdicts[node] = None
            continue
        try:
            key = _verdict_key(node)
            known = key in compiles
        except (_NoKey, TypeError):  # (TypeError: a value that is not hashable)
            key, known = None, False
        verdicts[node] = None if known else _verdict(node)
        if key is not None and verdicts[node] is None:
            compiles.add(key)
    return verdicts


class _Partitioner(CapabilityBasedPartitioner):
    """torch's partitioner, asking ``_Support`` without the module table it ignores:
    torch builds ``dict(named_modules())`` for every node it asks about, which walks the
    whole module tree each time (T5-small: 899 walks, 0.15 s of a 4 s compile)."""

    def _is_node_supported(self, node: fx.Node) -> bool:
        return self.operator_support.is_node_supported({}, node)


def _one_cluster(gm: fx.GraphModule, verdicts: dict) -> list[fx.Node] | None:
    """Every op node, in graph order, where they make one cluster: all of them compile,
    no node outside them but the output reads one (so no path leaves the cluster and
    comes back) and they are one connected graph, as torch's partitioner would merge
    them, without its pairwise merging (T5-small's 741 op nodes: 0.06-0.1 s). None
    otherwise: the partitioner decides."""
    if not verdicts or any(v is not None for v in verdicts.values()):
        return None
    parent = {n: n for n in verdicts}

    def root(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = n = parent[parent[n]]
        return n

    for node in gm.graph.nodes:
        for a in node.all_input_nodes:
            if a not in parent:
                continue
            if node not in parent:
                if node.op != "output":
                    return None  # (plumbing reading an op: torch's cycle checks decide)
                continue
            parent[root(a)] = root(node)
    first = root(next(iter(parent)))
    return list(parent) if all(root(n) is first for n in parent) else None


def plan_partitions(gm: fx.GraphModule, min_cluster_ops: int = 1) -> PartitionPlan:
    verdicts = _verdicts(gm)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    whole = _one_cluster(gm, verdicts)
    if whole is not None:
        proposed = [whole]
    else:
        partitioner = _Partitioner(gm, _Support(verdicts), allows_single_node_partition=True)
        proposed = [p.nodes for p in partitioner.propose_partitions()]
    clusters = []
    for p in proposed:
        nodes = sorted(p, key=order.__getitem__)
        if sum(1 for n in nodes if is_tensor_node(n)) < min_cluster_ops:
            for n in nodes:
                verdicts[n] = f"cluster smaller than min_cluster_ops={min_cluster_ops}"
            continue
        clusters.append(nodes)
    clusters.sort(key=lambda c: order[c[0]])
    fallbacks = [
        Fallback(n, verdicts[n], source_location(n))
        for n in gm.graph.nodes
        if n in verdicts and verdicts[n] is not None
    ]
    return PartitionPlan(clusters, fallbacks)
