"""Text form of a graph: deterministic, diff-friendly, and parsed back by ``parser``.

Sits at the end of the IR package; every pass dump, golden file and explain()
report uses it. Layout::

    graph @main(%x: f32[s0, 64], %m: b8[s0, 64]) {
      facts:
        range s0 in [0, 512]
      %0 = param {dtype=f32, name="w", shape=[64, 64]} : f32[64, 64]
      %1 = add(%x, %0) : f32[s0, 64]
      return %1
    }
"""

from __future__ import annotations

import json
import math
import re

from .dtypes import DType
from .symbolic import SymExpr, format_expr


def format_attr(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, DType):
        return v.value
    if isinstance(v, SymExpr):
        return format_expr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")


def value_names(graph) -> dict[int, str]:
    """Node id -> the name ``print_graph`` gives it (``x`` for input x, else 0, 1, ...)."""
    names: dict[int, str] = {}
    used: set[str] = set()
    for i, n in enumerate(graph.inputs):
        base = re.sub(r"\W", "_", str(n.attr("name")))
        if not base or base[0].isdigit() or base in used:
            base = f"in{i}"
            while base in used:  # a user input may already be called in<i>
                base += "_"
        used.add(base)
        names[id(n)] = base
    k = 0
    for n in graph.nodes():
        if id(n) not in names:
            names[id(n)] = str(k)
            k += 1
    return names


def print_graph(graph) -> str:
    names = value_names(graph)
    args = ", ".join(f"%{names[id(n)]}: {n.type}" for n in graph.inputs)
    lines = [f"graph @{graph.name}({args}) {{"]
    facts = graph.constraints.describe()
    if facts:
        lines.append("  facts:")
        lines.extend(f"    {f}" for f in facts)
    for n in graph.nodes():
        if n.op == "input":
            continue
        operands = ", ".join(f"%{names[id(i)]}" for i in n.inputs)
        attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in n.attrs)
        text = f"  %{names[id(n)]} = {n.op}"
        if n.inputs:
            text += f"({operands})"
        if attrs:
            text += f" {{{attrs}}}"
        lines.append(f"{text} : {n.type}")
    lines.append("  return " + ", ".join(f"%{names[id(o)]}" for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"
