"""Channels last: 2-D convolutions run on [N, H, W, C] activations, which stay in that
layout from one convolution to the next.

Sits in the pass pipeline after simplify, when the backend runs float32 convolutions
through oneDNN (the CPU backend in plugin mode). oneDNN's direct convolutions work in a
channels-last layout: fed channels-first activations, each call reorders its input in
and its output back (18 of ResNet-50's 90 ms at 2x224 with every convolution on
oneDNN). Here every such convolution becomes
``transpose(conv_channels_last(transpose(x)))``, and the transposes move down through
what a CNN puts between convolutions (batch norm's per-channel scale and shift, ReLU,
the residual add, slices, pooling, the global average pool) until they meet the next
convolution's and cancel. A strided 1x1 convolution reads a strided slice of its
input, so every 1x1 convolution is a GEMM over the pixels. What is left is one transpose where the model's input enters
and one per value that leaves in channels-first order (a graph output, or an op the
layout does not pass through). Depthwise convolutions join (a generated kernel runs
them channels last), and the transposes pass reshapes that keep the moved dims
together: transformers with convolutions view tokens [N, H * W, C] as images and back
(SegFormer's Mix-FFN), and there the transposes meet the model's own and cancel.

Only the transposes this pass makes move (``meta["channels_last"]``); a model's own
transposes stay where they are, unless one of this pass's meets them: the two
compose. Pass contract: keeps every output's type and value; shapes are only
permuted, so every dim fact still holds.
"""

from __future__ import annotations

from ..config import Options
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from ..ir.symbolic import shape_numel
from ..ir.types import TensorType
from .rewrite import graph_rewrite

TO_LAST = (0, 2, 3, 1)  # [N, C, H, W] -> [N, H, W, C]
TO_FIRST = (0, 3, 1, 2)  # [N, H, W, C] -> [N, C, H, W]
_MARK = "channels_last"


def onednn_convolution(node: Node) -> bool:
    """A float32 2-D convolution without groups whose weights are a model weight: the
    convolutions the CPU backend hands to oneDNN (``codegen/cpu/routes.py``)."""
    return (
        node.op == "convolution"
        and node.dtype == DType.f32
        and node.rank == 4
        and node.attr("groups") == 1
        and node.inputs[1].op == "param"
    )


def depthwise_convolution(node: Node) -> bool:
    """A float32 2-D convolution with one input channel per group: a generated kernel
    (``codegen/cpu/depthwise_emit.py``) runs it on [N, H, W, C] with each tap a vector
    over channels."""
    return (
        node.op == "convolution"
        and node.dtype == DType.f32
        and node.rank == 4
        and node.attr("groups") > 1
        and node.inputs[1].shape[1] == 1
        and node.inputs[1].op == "param"
    )


def converts(node: Node) -> bool:
    """Such a convolution, still channels first."""
    return (onednn_convolution(node) or depthwise_convolution(node)) and not node.attr(
        "channels_last", False
    )


def _attrs(**kv) -> tuple:
    return tuple(sorted(kv.items()))


def _moved(node: Node) -> tuple[int, ...] | None:
    """The perm of a transpose this pass made, else None."""
    return node.attr("perm") if node.op == "transpose" and node.meta.get(_MARK) else None


def _inverse(perm) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _permuted(node: Node, perm, op_inputs, **changed) -> Node:
    """``node`` rebuilt on ``op_inputs``, its result the untransposed view of its old one:
    ``transpose(result, perm)`` has the old type."""
    ty = TensorType(node.dtype, [node.shape[p] for p in _inverse(perm)])
    attrs = _attrs(**{**node.attr_dict, **changed})
    return Node(node.op, tuple(op_inputs), attrs, ty, dict(node.meta))


class _Layout:
    """The rules, sharing one transpose node per (value, perm); new nodes' types come
    from the op table's rules over the graph's shape facts."""

    def __init__(self, store):
        self.store = store
        self.made: dict[tuple[int, tuple[int, ...]], Node] = {}

    def transpose(self, x: Node, perm) -> Node:
        """``x`` permuted, composed with a transpose of this pass below it."""
        perm = tuple(perm)
        inner = _moved(x)
        if inner is not None:
            perm, x = tuple(inner[p] for p in perm), x.inputs[0]
        if perm == tuple(range(len(perm))):
            return x
        key = (id(x), perm)
        if key not in self.made:
            ty = TensorType(x.dtype, [x.shape[p] for p in perm])
            self.made[key] = Node("transpose", (x,), _attrs(perm=perm), ty, {_MARK: True})
        return self.made[key]

    def convolution(self, node: Node) -> Node | None:
        if not converts(node):
            return None
        x, w = node.inputs
        x = self.reshaped_transpose(x, TO_LAST) or self.transpose(x, TO_LAST)
        stride = tuple(node.attr("stride"))
        if w.shape[2:] == (1, 1) and not any(node.attr("padding")) and stride != (1, 1):
            x = self.subsample(
                x, stride
            )  # a strided 1x1 convolution: a 1x1 one of every s-th pixel
            stride = (1, 1)
        conv = _permuted(node, TO_FIRST, (x, w), channels_last=True, stride=stride)
        return self.transpose(conv, TO_FIRST)

    def elementwise(self, node: Node) -> Node | None:
        """op(transpose(a), broadcast(s), b) -> transpose(op(a, broadcast'(s), b')):
        broadcasts are re-targeted, and a value in the model's layout (b) is transposed
        the other way, only when fewer of those are left than transposes moved (moving
        one for one would not save a transpose, and would keep a channels-first
        convolution from running this op as its epilogue)."""
        moved = [_moved(x) for x in node.inputs]
        perm = next((p for p in moved if p is not None), None)
        if perm is None:
            return None
        retargeted = [
            _broadcast_moved(x, perm) if p != perm and x.op == "broadcast_in_dim" else None
            for x, p in zip(node.inputs, moved)
        ]
        plain = sum(p != perm and b is None for p, b in zip(moved, retargeted))
        if plain and plain >= moved.count(perm):
            return None
        operands = [
            x.inputs[0] if p == perm else b if b is not None else self.transpose(x, _inverse(perm))
            for x, p, b in zip(node.inputs, moved, retargeted)
        ]
        return self.transpose(_permuted(node, perm, operands), perm)

    def slice(self, node: Node) -> Node | None:
        perm = _moved(node.inputs[0])
        if perm is None:
            return None
        inv = _inverse(perm)
        bounds = {k: tuple(node.attr(k)[i] for i in inv) for k in ("start", "limit", "stride")}
        return self.transpose(_permuted(node, perm, node.inputs[0].inputs, **bounds), perm)

    def pool(self, node: Node) -> Node | None:
        """A 2-D float pool of a [N, C, H, W] view of [N, H, W, C] pools the latter."""
        if _moved(node.inputs[0]) != TO_FIRST or len(node.attr("kernel")) != 2:
            return None
        if node.dtype not in (DType.f32, DType.f64) or node.attr("channels_last", False):
            return None
        pooled = _permuted(node, TO_FIRST, node.inputs[0].inputs, channels_last=True)
        return self.transpose(pooled, TO_FIRST)

    def reduce(self, node: Node) -> Node | None:
        """A reduction over transposed axes reduces the matching axes of the source; the
        kept axes may come out in another order, which one more transpose restores."""
        perm = _moved(node.inputs[0])
        if perm is None:
            return None
        axes = node.attr("axes")
        src = node.inputs[0].inputs[0]
        kept = [perm[i] for i in range(len(perm)) if i not in axes]  # source axes, result order
        order = sorted(kept)
        ty = TensorType(node.dtype, [src.shape[a] for a in order])
        attrs = _attrs(**{**node.attr_dict, "axes": tuple(sorted(perm[a] for a in axes))})
        reduced = Node(node.op, (src,), attrs, ty, dict(node.meta))
        return self.transpose(reduced, tuple(order.index(a) for a in kept))

    def reshaped_transpose(self, r: Node, perm) -> Node | None:
        """``transpose(reshape(v), perm)`` as ``reshape(transpose(v, perm'))`` where
        ``perm`` moves whole groups of the dims the reshape splits or merges, so that a
        transpose of ``v`` (a model's own [N, H * W, C] -> [N, C, H * W] before a view as
        [N, C, H, W]) composes with it (None: the reshape does not allow it)."""
        if r.op != "reshape":
            return None
        groups = _reshape_groups(r.inputs[0].shape, r.shape, self.store)
        if groups is None:
            return None
        owner = {d: g for g, (_, dims) in enumerate(groups) for d in range(*dims)}
        order = [owner[p] for k, p in enumerate(perm) if k == 0 or owner[perm[k - 1]] != owner[p]]
        if len(set(order)) != len(order):
            return None  # a group's dims do not stay together
        runs = [p for g in order for p in range(*groups[g][1])]
        if runs != list(perm):
            return None  # nor in order
        v, v_perm = r.inputs[0], [d for g in order for d in range(*groups[g][0])]
        if v.op == "transpose":  # (the model's own: the two become one, or none)
            v, v_perm = v.inputs[0], [v.attr("perm")[p] for p in v_perm]
        v = self.transpose(v, v_perm)
        shape = tuple(r.shape[p] for p in perm)
        return Node("reshape", (v,), _attrs(shape=shape), TensorType(r.dtype, shape))

    def reshape(self, node: Node) -> Node | None:
        """reshape(transpose(u, perm)) -> transpose(reshape(u), perm') where each group
        of dims the reshape splits or merges is consecutive in ``u``: the transpose moves
        on down (to a model's own transpose back, where the two cancel)."""
        perm = _moved(node.inputs[0])
        if perm is None:
            return None
        u = node.inputs[0].inputs[0]
        groups = _reshape_groups(node.inputs[0].shape, node.shape, self.store)
        if groups is None:
            return None
        for (a, b), _ in groups:
            if list(perm[a:b]) != list(range(perm[a], perm[a] + b - a)):
                return None
        by_source = sorted(range(len(groups)), key=lambda g: perm[groups[g][0][0]])
        shape, start = [], {}
        for g in by_source:
            start[g] = len(shape)
            shape += node.shape[slice(*groups[g][1])]
        new_perm = [start[g] + k for g, (_, (c, d)) in enumerate(groups) for k in range(d - c)]
        ty = TensorType(node.dtype, shape)
        reshaped = Node("reshape", (u,), _attrs(shape=tuple(shape)), ty, dict(node.meta))
        return self.transpose(reshaped, new_perm)

    def compose(self, node: Node) -> Node | None:
        """A transpose of a transpose this pass moved: one transpose, or none."""
        if _moved(node.inputs[0]) is None:
            return None
        return self.transpose(node.inputs[0], node.attr("perm"))

    def subsample(self, x: Node, stride) -> Node:
        """Every ``stride``-th row and column of [N, H, W, C] ``x``."""
        attrs = dict(start=(0, 0, 0, 0), limit=tuple(x.shape), stride=(1, *stride, 1))
        ty = OPS["slice"].rule((x.type,), attrs, self.store)
        return Node("slice", (x,), _attrs(**attrs), ty)

    def rules(self) -> dict:
        rules: dict = {
            "convolution": [self.convolution],
            "slice": [self.slice],
            "pool": [self.pool],
            "reduce": [self.reduce],
            "reshape": [self.reshape],
            "transpose": [self.compose],
        }
        for name, opdef in OPS.items():
            if "elementwise" in opdef.traits:
                rules[name] = [self.elementwise]
        return rules


def _reshape_groups(src, dst, store) -> list | None:
    """The dims of a reshape as ((src start, stop), (dst start, stop)) pairs, each the
    fewest consecutive dims of equal size on both sides, the last whatever is left: the
    sizes before it are equal and the reshape keeps the element count (if an earlier
    size is 0, every layout of the empty tensor is the same). None where one side runs
    out first."""
    i, j, out = 0, 0, []
    while i < len(src) and j < len(dst):
        found = None
        for total in range(2, len(src) - i + len(dst) - j + 1):
            for na in range(1, total):
                nb = total - na
                if i + na <= len(src) and j + nb <= len(dst):
                    if store.prove_eq(shape_numel(src[i : i + na]), shape_numel(dst[j : j + nb])):
                        found = (na, nb)
                        break
            if found:
                break
        if found is None:  # the rest is one group: the reshape keeps the element count
            found = (len(src) - i, len(dst) - j)
        out.append(((i, i + found[0]), (j, j + found[1])))
        i, j = i + found[0], j + found[1]
    return out if i == len(src) and j == len(dst) else None


def _broadcast_moved(b: Node, perm) -> Node | None:
    """A broadcast operand re-targeted to the untransposed layout (None: its dims would
    not stay increasing)."""
    dims = tuple(perm[d] for d in b.attr("dims"))
    if list(dims) != sorted(dims):
        return None
    shape = tuple(b.shape[p] for p in _inverse(perm))
    return _permuted(b, perm, b.inputs, dims=dims, shape=shape)


def run(graph: Graph, options: Options) -> Graph:
    if not any(converts(n) for n in graph.nodes()):
        return graph
    return graph_rewrite(graph, _Layout(graph.constraints).rules(), "channels_last")
