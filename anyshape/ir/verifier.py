"""The graph verifier: re-derives every node's type and checks graph invariants.

Sits after the builder and between passes (``ANYSHAPE_VERIFY=1`` or the test
suite turns it on after every pass). It re-runs each op's type rule on a copy
of the graph's constraint store, so it never adds facts to the real one, and
reports every broken invariant at once.
"""

from __future__ import annotations

import copy

from .graph import Graph
from .ops import OPS, IRTypeError


class VerificationError(AssertionError):
    pass


def verify_graph(graph: Graph) -> None:
    problems: list[str] = []
    store = copy.deepcopy(graph.constraints)
    seen: set[int] = set()
    for n in graph.nodes():
        for i in n.inputs:
            if id(i) not in seen:
                problems.append(f"{n.op}: operand {i} used before its definition")
        seen.add(id(n))
        opdef = OPS.get(n.op)
        if opdef is None:
            problems.append(f"unknown op {n.op!r}")
            continue
        if opdef.arity is not None and len(n.inputs) != opdef.arity:
            problems.append(f"{n.op}: {len(n.inputs)} operands, expected {opdef.arity}")
        if n.op == "input" and n not in graph.inputs:
            problems.append(f"input node {n.attr('name')!r} is not a graph input")
        if n.op == "param" and graph.params and n.attr("name") not in graph.params:
            problems.append(f"param {n.attr('name')!r} has no data")
        try:
            ty = opdef.rule(tuple(i.type for i in n.inputs), n.attr_dict, store)
        except (IRTypeError, KeyError, ValueError) as e:
            problems.append(f"{n.op}: type rule failed: {e}")
            continue
        if ty.dtype != n.type.dtype or ty.rank != n.type.rank:
            problems.append(f"{n.op}: recorded {n.type}, rule gives {ty}")
            continue
        for a, b in zip(ty.shape, n.type.shape):
            if not store.prove_eq(a, b):
                problems.append(f"{n.op}: recorded {n.type}, rule gives {ty}")
                break
    if len(store.guards) != len(graph.constraints.guards):
        new = [str(g) for g in store.guards[len(graph.constraints.guards) :]]
        problems.append(f"graph relies on unrecorded shape guards: {new}")
    if problems:
        # (the first problem on the first line: a fallback's reason quotes only that line)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise VerificationError(
            f"graph @{graph.name} is invalid: {problems[0]}{more}\n  " + "\n  ".join(problems)
        )
