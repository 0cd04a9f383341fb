"""Convolution epilogues oneDNN runs as post-ops, inside the convolution.

Sits beside ``conv_emit`` (which asks for the post-ops of a channels-last float32
convolution whose epilogue ``schedule/epilogue.py`` planned). A CNN's epilogue is
mostly a chain on the convolution's output: batch norm (times a per-channel scale,
plus a per-channel shift), then ReLU. Run by the kernel, it is one more pass over
the output (a 1x1 convolution 64 -> 256 at 2x48x48: 0.312 ms alone, 0.382 ms with
batch norm and ReLU); oneDNN applies such a chain to each output block while it is
still in registers. So a chain of ``x * v``, ``x + v``, ``x - v`` (``v`` a
materialized vector of one value per output channel, broadcast along the last dim),
``x + t`` (``t`` a materialized tensor of the output's shape: a residual block's skip
add) and ``max(x, 0)`` becomes a post-op code (``dnnl.h``: 4 bits per op, the first op
lowest). Anything else stays the kernel's epilogue loop, which also runs wherever
oneDNN declines the post-ops. Only with the ``conv_post_ops`` option: oneDNN's ReLU
turns NaN into 0 (``maxps``; none of its post-ops keeps NaN) where eager keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtypes import DType
from ...ir.graph import Node

MAX_OPS = 8  # AS_POST_OPS_MAX in dnnl.h
_BINARY = {"mul": 1, "add": 2, "sub": 3}
_RELU = 4
_ADD_TENSOR = 5  # x + t, t a tensor of the output's shape (a residual block's skip add)


@dataclass(frozen=True)
class PostOps:
    code: int  # the ops, 4 bits each, the first lowest (dnnl.h)
    operands: list[Node]  # each binary op's operand, in order: a per-channel vector or a
    # tensor of the output's shape (``tensors`` says which)
    tensors: list[bool]


def post_ops(sched, conv: Node, epilogue: Node) -> PostOps | None:
    """The post-ops that compute ``epilogue`` from ``conv``'s output, or None where the
    epilogue is not such a chain."""
    if conv.dtype != DType.f32 or epilogue.dtype != DType.f32 or epilogue.shape != conv.shape:
        return None
    if not conv.attr("channels_last", False):
        return None  # (the channels are the last dim)
    channels = conv.shape[-1]
    ops: list[tuple[int, Node | None]] = []
    n = epilogue
    while n is not conv:
        if n is not epilogue and sched.is_materialized(n):
            return None
        if n.op not in (*_BINARY, "max") or len(n.inputs) != 2:
            return None
        a, b = n.inputs
        if n.op in ("mul", "add", "max") and not _on_chain(sched, a, conv):
            a, b = b, a  # the chain on the left, the operand on the right
        if not _on_chain(sched, a, conv) or _on_chain(sched, b, conv):
            return None
        if n.op == "max":
            if b.op != "broadcast_in_dim" or _scalar(b) != 0.0:
                return None
            ops.append((_RELU, None))
        elif n.op == "add" and _whole(sched, b, conv):
            ops.append((_ADD_TENSOR, b))
        else:
            v = _per_channel(sched, b, channels, conv.rank)
            if v is None:
                return None
            ops.append((_BINARY[n.op], v))
        n = a
    if not ops or len(ops) > MAX_OPS:
        return None
    ops.reverse()  # from the convolution's output outwards
    code = 0
    for k, (op, _) in enumerate(ops):
        code |= op << (4 * k)
    binary = [(op, v) for op, v in ops if v is not None]
    return PostOps(code, [v for _, v in binary], [op == _ADD_TENSOR for op, _ in binary])


def _on_chain(sched, n: Node, conv: Node) -> bool:
    """Whether ``n`` is the convolution or a value the epilogue computes from it (not in
    memory, not a broadcast operand)."""
    return n is conv or (n.op != "broadcast_in_dim" and not sched.is_materialized(n))


def _whole(sched, t: Node, conv: Node) -> bool:
    """A float32 tensor in memory with the convolution output's shape (read as is)."""
    return (
        t is not conv
        and t.dtype == DType.f32
        and sched.is_materialized(t)
        and tuple(t.shape) == tuple(conv.shape)
    )


def _scalar(b: Node) -> float | None:
    """The value of a broadcast constant scalar, else None."""
    (src,) = b.inputs
    if b.attr("dims") or src.op != "constant" or src.shape:
        return None
    return float(src.attr("value"))


def _per_channel(sched, b: Node, channels, rank: int) -> Node | None:
    """The materialized float32 vector ``b`` broadcasts along the last (channel) dim."""
    if b.op != "broadcast_in_dim":
        return None  # (a tensor in memory multiplied or subtracted: no post-op)
    (v,) = b.inputs
    if tuple(b.attr("dims")) != (rank - 1,) or tuple(v.shape) != (channels,):
        return None
    if v.dtype != DType.f32 or not sched.is_materialized(v):
        return None
    return v
