"""Sizes read from the graph's inputs, not from intermediate tensors: a pass before clustering.

Sits between capture and ``partition.py``. AOTAutograd graphs (training, and
Dynamo's) read sizes off intermediate tensors (``sym_size(view_3, 0)``) to
feed later views. Lowering never needs those nodes (it reads symbolic sizes
from FX metadata), but the clustering does see them as edges: a cluster, then
a size node in Python, then a view reading it, is a path that keeps the two
clusters apart. Each such size is rewritten as arithmetic on the inputs' sizes
(its symbolic expression: ``s0 * s1``), so no path leaves a cluster through it.
"""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

_SYM_SIZE = torch.ops.aten.sym_size.int


def _symbol_nodes(graph: fx.Graph) -> dict[sympy.Symbol, fx.Node]:
    """A node giving each symbol that is a whole input dim (a size of a placeholder)."""
    out: dict[sympy.Symbol, fx.Node] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
            out.setdefault(val.node.expr, node)
    for node in placeholders:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, s in enumerate(val.shape):
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                if s.node.expr not in out:
                    with graph.inserting_after(placeholders[-1]):
                        size = graph.call_function(_SYM_SIZE, (node, d))
                    size.meta["val"] = s
                    out[s.node.expr] = size
    return out


def _build(graph: fx.Graph, expr, symbols) -> fx.Node | int | None:
    """Nodes computing ``expr`` (sums and products of symbols and integers), or None."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return symbols.get(expr)
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        fn = operator.add if isinstance(expr, sympy.Add) else operator.mul
        parts = [_build(graph, a, symbols) for a in expr.args]
        if any(p is None for p in parts):
            return None
        acc = parts[0]
        for p in parts[1:]:
            acc = graph.call_function(fn, (acc, p))
        return acc
    return None


def read_sizes_from_inputs(gm: fx.GraphModule) -> int:
    """Rewrite sizes of intermediate tensors as input-size arithmetic; how many were."""
    graph = gm.graph
    reads = [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and n.target is _SYM_SIZE
        and isinstance(n.args[0], fx.Node)
        and n.args[0].op != "placeholder"
        and isinstance(n.meta.get("val"), torch.SymInt)
    ]
    if not reads:
        return 0
    symbols = _symbol_nodes(graph)
    done = 0
    for n in reads:
        expr = n.meta["val"].node.expr
        with graph.inserting_before(n):
            new = _build(graph, expr, symbols)
        if new is None:
            continue
        if isinstance(new, fx.Node) and "val" not in new.meta:
            new.meta["val"] = n.meta["val"]
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        done += 1
    graph.lint()
    return done  # (the graph only: ``assemble`` regenerates the module's Python once)
