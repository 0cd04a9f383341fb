"""The one rewrite driver: apply (op, function) rules bottom-up until nothing changes.

Sits under every rewriting pass. A rule set is data: a dict from op name to
functions ``fn(node) -> Node | None`` (None = no change); a rule builds its
result only from nodes that are already rewritten (the node's inputs). The driver
rebuilds each node on its rewritten inputs, reusing the node itself when
nothing below it changed, and repeats a node's rules until none fires.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph, Node

Rule = Callable[[Node], "Node | None"]


def graph_rewrite(graph: Graph, rules: dict[str, list[Rule]], name: str) -> Graph:
    """Rewrite every node reachable from the outputs with ``rules`` to a fixpoint."""
    memo: dict[int, Node] = {}

    def visit(node: Node) -> None:
        new_inputs = tuple(memo[id(i)] for i in node.inputs)
        cur = node
        if any(a is not b for a, b in zip(new_inputs, node.inputs)):
            cur = Node(node.op, new_inputs, node.attrs, node.type, node.meta)
        for _ in range(64):
            for rule in rules.get(cur.op, ()):
                out = rule(cur)
                if out is not None and out is not cur:
                    cur = out  # built from already-rewritten inputs
                    break
            else:
                break
        else:
            raise RuntimeError(f"rewrite {name!r} did not converge at {cur}")
        memo[id(node)] = cur

    # Inputs before users, without recursion: a deep model (ViT-base: over a thousand
    # nodes in a chain) would exceed Python's recursion limit.
    for node in graph.nodes():
        visit(node)
    outputs = [memo[id(o)] for o in graph.outputs]
    if all(a is b for a, b in zip(outputs, graph.outputs)):
        return graph
    return graph.with_outputs(outputs)
