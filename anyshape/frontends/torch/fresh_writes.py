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
parameter or buffer), and no op before the write took a view of it. A whole
alias of such a value (``aten.alias``: an eval-mode dropout becomes one) is the
same tensor: a write into either is rewritten the same way, every later reader
of both reading the result. Anything else stays as it is, and the program is
decomposed as before.
"""

from __future__ import annotations

import torch
from torch import fx


def rewrite_fresh_writes(graph: fx.Graph) -> int:
    """Rewrite in place the writes into fresh values of ``graph``, after making each
    eval-mode dropout the alias of its input it is (``alias_eval_dropouts``); how many
    nodes were rewritten."""
    rewritten = alias_eval_dropouts(graph)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        functional = _out_of_place(node)
        if functional is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        same = _same_tensor(node.args[0], order[node], order)
        if not _fresh(same[0]):
            continue
        earlier = [
            u
            for t in same
            for u in t.users
            if u is not node and u not in same and order[u] < order[node]
        ]
        if any(_may_alias(u) for u in earlier):
            continue
        with graph.inserting_before(node):
            value = graph.call_function(functional, node.args, node.kwargs)
        value.meta = dict(node.meta)
        order[value] = order[node]
        for t in same:
            for user in [u for u in t.users if u is not node and order[u] > order[node]]:
                user.replace_input_with(t, value)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


def _same_tensor(node: fx.Node, before: int, order: dict) -> list[fx.Node]:
    """The nodes that are the very tensor ``node`` is: the value ``aten.alias`` chains
    start from, first, and every alias of it made before position ``before``."""
    while node.op == "call_function" and node.target is _ALIAS:
        node = node.args[0]
    same, k = [node], 0
    while k < len(same):
        same += [u for u in same[k].users if u.target is _ALIAS and order[u] < before]
        k += 1
    return same


_ALIAS = torch.ops.aten.alias.default


def alias_eval_dropouts(graph: fx.Graph) -> int:
    """Each dropout with ``train=False`` as ``aten.alias`` of its input; how many.

    Eager returns the input itself there, but the schema promises a new tensor, so a
    write into the result (``y = F.dropout(h, 0.1, False); y.add_(1)``) would be taken
    for a write into a fresh value, here and by torch's functionalization when the
    program is decomposed (which then drops the write: ``h`` came out unchanged). As an
    alias, the write reaches ``h`` as in eager; an alias lowers to the same value."""
    count = 0
    for node in graph.nodes:
        if (
            node.op == "call_function"
            and node.target in _DROPOUTS
            and len(node.args) == 3
            and node.args[2] is False
            and not node.kwargs
        ):
            node.target, node.args = _ALIAS, (node.args[0],)
            count += 1
    return count


_DROPOUTS = {
    torch.ops.aten.dropout.default,
    torch.ops.aten.feature_dropout.default,
    torch.ops.aten.alpha_dropout.default,
    torch.ops.aten.feature_alpha_dropout.default,
}


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
        and node.target.overloadpacket not in _RETURN_THEIR_INPUT
        and isinstance(node.meta.get("val"), torch.Tensor)
    )


# Composite ops whose schema promises a new tensor but which return their input itself
# in some calls (``type_as`` to the same type; eval-mode dropout is made an alias first):
# a write into the result writes into the input.
_RETURN_THEIR_INPUT = {torch.ops.aten.type_as}


def _may_alias(node: fx.Node) -> bool:
    """Whether ``node``'s result may share its operands' storage (conservatively yes)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return True
    return _mutable_or_view(node.target)


def _mutable_or_view(op) -> bool:
    schema = op._schema
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns)
