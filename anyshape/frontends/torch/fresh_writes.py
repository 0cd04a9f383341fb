"""In-place ops on values the program made itself, rewritten to their out-of-place forms.

Sits in capture (``capture.py``), on the exported program before it decides
whether to lower the program as exported or to decompose it first. Models
write into their own intermediates: T5's relative position buckets
(``relative_buckets += ...``), a ResNet block's residual (``hidden += shortcut``).
Such a write is the only thing that made those programs take the whole-program
decomposition (T5-small: 10 s of an 11 s cold compile went to re-tracing and
its larger graph); rewritten, they lower as exported.

A write ``x.add_(y)`` becomes ``x2 = x.add(y)`` with every later reader of ``x``
reading ``x2`` instead, which is exact when nothing else can see ``x``'s storage:
``x`` is made by an op that returns a new tensor (not a view, not an input,
parameter or buffer), and no op before the write took a view of it. Anything
else stays as it is, and the program is decomposed as before.
"""

from __future__ import annotations

import torch
from torch import fx


def rewrite_fresh_writes(graph: fx.Graph) -> int:
    """Rewrite in place the writes into fresh values of ``graph``; how many there were."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    rewritten = 0
    for node in list(graph.nodes):
        functional = _out_of_place(node)
        if functional is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        target = node.args[0]
        if not _fresh(target):
            continue
        earlier = [u for u in target.users if u is not node and order[u] < order[node]]
        if any(_may_alias(u) for u in earlier):
            continue
        with graph.inserting_before(node):
            value = graph.call_function(functional, node.args, node.kwargs)
        value.meta = dict(node.meta)
        order[value] = order[node]
        for user in [u for u in target.users if u is not node and order[u] > order[node]]:
            user.replace_input_with(target, value)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _out_of_place(node: fx.Node):
    """The out-of-place overload of an op that writes only into its first operand."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    schema = target._schema
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or written[0] is not schema.arguments[0]:
        return None
    name = target.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None or _mutable_or_view(functional):
        return None
    return functional


def _fresh(node: fx.Node) -> bool:
    """Whether ``node`` is a new tensor the program made (no input's or view's storage)."""
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and not _mutable_or_view(node.target)
        and isinstance(node.meta.get("val"), torch.Tensor)
    )


def _may_alias(node: fx.Node) -> bool:
    """Whether ``node``'s result may share its operands' storage (conservatively yes)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return True
    return _mutable_or_view(node.target)


def _mutable_or_view(op) -> bool:
    schema = op._schema
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns)
