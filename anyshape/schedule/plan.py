"""Kernel planning: which values live in memory, which are fused.

Sits first in the kernel plan (``schedule/__init__.py``), before any backend
emits code; target costs come in as ``costs.TargetCosts``. A value is *materialized* (gets a buffer) when it
is a graph input, weight or output, the result of a root op (reduction, scan,
GEMM, convolution, pooling), an operand a library call needs in memory, or
used by several consumers and not cheap to recompute (a cheap value — a few
elementwise ops over values in memory — is recomputed by each elementwise
consumer instead: a GEMM's bias add feeding both uses inside GELU becomes part
of the GELU pass; a broadcast used several times stores its source, at its own
size, and each consumer reads through it). A reshape that must be in memory (a
GEMM operand) aliases its source's buffer instead of copying it. Every other value is computed
inside the loop nest of the kernel that consumes it (loop fusion of
elementwise, broadcast and view chains; input fusion into reductions). A
transpose that reads across channel planes (its input's new last dim lies
more than 64 elements apart) is not fused with other work: its input goes to
memory and it becomes a tiled copy its consumers read in order. Last,
``stitch`` folds row reductions into the kernel that consumes them
(softmax, layer norm: one kernel, one pass over memory), ``attention`` runs a
scores GEMM, its softmax stitch and the values GEMM as one kernel, ``epilogue``
runs a convolution's elementwise consumer inside it, and ``horizontal``
merges independent loop nests over the same shape into one kernel.

Which ops are roots, views, sources or cheap comes from ``op_classes`` (the op
table's traits). The plan is data (``Schedule``), printed by ``printer`` and
checked by ``verifier``; a backend's emitters (the CPU's ``kernels`` and ``host``)
write it as code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.symbolic import shape_numel
from .attention import AttentionChain, plan_attention
from .costs import TargetCosts
from .epilogue import plan_epilogues
from .horizontal import plan_horizontal
from .memory import MemoryPlan, plan_memory
from .op_classes import (
    CHEAP_OPS,
    ELEMENTWISE_OPS,
    INDEX_OPS,
    LIBRARY_OPS,
    NOT_RECOMPUTED,
    ROOT_OPS,
    SOURCE_OPS,
)
from .reads import members, memory_reads
from .stitch import plan_stitches
from .variants import BroadcastVariant, SplitVariant, plan_broadcast_variant, plan_split_variant


@dataclass
class Schedule:
    graph: Graph
    materialized: list[Node] = field(default_factory=list)  # in topological order
    kernels: list[Node] = field(default_factory=list)  # roots of kernels, in order
    # dot operands read in place through a transpose of a buffer (``reads_in_place``):
    # operand node -> buffer node
    transposed_operands: dict[int, Node] = field(default_factory=dict)
    # reshapes of a buffer that need memory: they share the buffer (no copy kernel)
    aliases: dict[int, Node] = field(default_factory=dict)
    # stitch groups (stitch.py): root id -> the row broadcasts it computes per row
    stitches: dict[int, list[Node]] = field(default_factory=dict)
    # ... and the full-row values it keeps in a per-thread row buffer (softmax's exp)
    row_buffered: dict[int, list[Node]] = field(default_factory=dict)
    # attention chains (attention.py): the second GEMM's id -> the scores and probabilities
    # its kernel computes per block of rows, never stored
    attention: dict[int, AttentionChain] = field(default_factory=dict)
    # convolution epilogues (epilogue.py): convolution id -> the loop nest it runs
    epilogues: dict[int, Node] = field(default_factory=dict)
    # horizontal groups (horizontal): the first member's id -> every member, in order
    horizontal: dict[int, list[Node]] = field(default_factory=dict)
    # what the target's costs were (the emitters estimate work from them too)
    costs: TargetCosts = field(default_factory=TargetCosts)
    # split variants (variants.py): kernel root id -> its variant for few rows
    split: dict[int, SplitVariant] = field(default_factory=dict)
    # no-broadcast variants (variants.py): kernel root id -> the sizes it assumes are not 1
    no_broadcast: dict[int, BroadcastVariant] = field(default_factory=dict)
    # the workspace: slots shared by buffers whose lifetimes do not overlap (memory.py)
    memory: MemoryPlan = field(default_factory=MemoryPlan)
    # library routes, decided by the backend after planning: kernel root id -> its own
    # record of what a library runs there (the CPU backend's ``routes.Route``)
    routes: dict[int, object] = field(default_factory=dict)

    def is_materialized(self, node: Node) -> bool:
        return id(node) in self._mat

    def __post_init__(self):
        self._mat: set[int] = set()


def reads_in_place(dot: Node, t: Node) -> bool:
    """Whether ``dot`` reads its operand ``t``, a transpose, from the transpose's input in
    place: the last two dims of ``t`` are the rows and columns of each matrix, and one of
    them must be the input's last (contiguous) dim for a GEMM to read it with a leading
    dimension; the batch dims may stride anyhow, two of them at most (attention's heads
    ``[b, s, h, d] -> [b, h, s, d]`` and keys ``-> [b, h, d, s]``: no copy). Dots that are
    loop nests over packed operands (not float32 or float64) read only a swap of the last
    two dims."""
    perm, r = tuple(t.attr("perm")), t.rank
    if r < 2 or r - 1 not in perm[-2:]:
        return False
    if perm == tuple(range(r - 2)) + (r - 1, r - 2):
        return True
    return (
        dot.dtype in (DType.f32, DType.f64)
        and r - 2 <= 2
        and tuple(t.shape[:-2]) == tuple(dot.shape[:-2])
    )


def _moves_last_dim(t: Node, costs: TargetCosts) -> bool:
    """Whether a transpose the target tiles (``tiled_transpose_itemsizes``) puts another
    dim last, neither of them statically of size 1, so that consecutive outputs read
    its input more than 64 elements apart (or a run-time distance): a channels-first
    plane, not a few channels."""
    perm = t.attr("perm")
    x = t.inputs[0]
    if perm[-1] == len(perm) - 1 or x.shape[-1] == 1 or x.shape[perm[-1]] == 1:
        return False
    if t.dtype.itemsize not in costs.tiled_transpose_itemsizes:
        return False
    stride = shape_numel(x.shape[perm[-1] + 1 :])
    return not isinstance(stride, int) or stride > 64


def _expands(b: Node) -> bool:
    """Whether a broadcast copies its input along some dim (statically > 1 copies)."""
    x, dims = b.inputs[0], tuple(b.attr("dims"))
    for i, d in enumerate(dims):
        if x.shape[i] == 1 and b.shape[d] != 1:
            return True
    return any(b.shape[d] != 1 for d in range(b.rank) if d not in dims)


def _feeds_library(n: Node, consumers: dict[int, list[Node]]) -> bool:
    return any(c.op in LIBRARY_OPS for c in consumers[id(n)])


def plan_schedule(graph: Graph, costs: TargetCosts | None = None, stitch: bool = True) -> Schedule:
    nodes = graph.nodes()
    consumers: dict[int, list[Node]] = {}  # one entry per use
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(id(i), []).append(n)
    users = {k: len(v) for k, v in consumers.items()}
    outputs = {id(o) for o in graph.outputs}
    mat: set[int] = set()
    costs = costs or TargetCosts()
    sched = Schedule(graph, costs=costs)

    def recomputable(n: Node) -> bool:
        if id(n) in mat or n.op in CHEAP_OPS:
            return True
        return n.op in INDEX_OPS and recomputable(n.inputs[0])

    for n in nodes:
        if n.op in SOURCE_OPS or n.op in ROOT_OPS or id(n) in outputs:
            mat.add(id(n))

    def need_memory(x: Node) -> None:
        """Materialize ``x``, as an alias when it is a reshape of something in memory."""
        if x.op == "reshape" and id(x) not in outputs:
            need_memory(x.inputs[0])
            root = sched.aliases.get(id(x.inputs[0]), x.inputs[0])
            sched.aliases[id(x)] = root
        mat.add(id(x))

    # An output that reshapes a computed value hands out that value's buffer (no copy),
    # unless the value is an input/weight, an output itself, or another output's buffer.
    claimed: set[int] = set()
    for o in graph.outputs:
        src = o
        while src.op == "reshape" and id(src.inputs[0]) not in outputs:
            src = src.inputs[0]
        if src is o or src.op in SOURCE_OPS or src.op in INDEX_OPS or id(src) in claimed:
            continue
        if src.op not in ROOT_OPS and users.get(id(src), 0) <= 1:
            continue  # a fused value: the output kernel computes it in place
        claimed.add(id(src))
        mat.add(id(src))
        x = o
        while x is not src:
            sched.aliases[id(x)] = src
            mat.add(id(x))
            x = x.inputs[0]

    for n in nodes:
        for k in costs.memory_operands.get(n.op, ()):
            src = n.inputs[k]
            if n.op == "dot" and src.op == "transpose" and reads_in_place(n, src):
                need_memory(src.inputs[0])
                sched.transposed_operands[id(src)] = src.inputs[0]
            else:
                need_memory(src)
    cost: dict[int, int] = {}

    def fused_cost(n: Node) -> int:
        """Work to recompute ``n`` from what is in memory (capped), for the cheap test."""
        if id(n) in mat or n.op in CHEAP_OPS:
            return 0
        if id(n) not in cost:
            own = costs.expensive_ops.get(n.op, 1)
            cost[id(n)] = min(own + sum(fused_cost(i) for i in n.inputs), 1 << 20)
        return cost[id(n)]

    for n in nodes:
        if id(n) in mat or users.get(id(n), 0) <= 1 or recomputable(n):
            continue
        # A broadcast used several times is stored at its source's size, and each consumer
        # reads through the broadcast (BERT's [1, 1, s, 1] mask, used by 12 layers, was
        # stored as [b, 12, s, s] and read a byte per score).
        if n.op == "broadcast_in_dim" and _expands(n) and not _feeds_library(n, consumers):
            x = n.inputs[0]
            while x.op in INDEX_OPS and id(x) not in mat:
                x = x.inputs[0]  # through a chain of broadcasts and views to the value
            mat.add(id(x))
            cost.clear()
            continue
        # Several elementwise consumers of a cheap value recompute it (a bias add feeding
        # GELU's two uses fuses into one pass); anything else is computed once in memory.
        cheap = fused_cost(n) <= costs.recompute_budget and n.op not in NOT_RECOMPUTED
        if cheap and not _feeds_library(n, consumers):
            continue
        mat.add(id(n))
        cost.clear()
    # A transpose that moves the last dim, computed in a loop nest over its output, reads
    # its input across whole rows per element: with work fused in it cannot be a tiled
    # copy (SegFormer's GELU after each depthwise convolution, and its decode head's
    # upsampled stages concatenated for a 1x1 convolution, ran at 2 GB/s). Its input is
    # computed in memory, in its own layout, and the transpose becomes a tiled copy
    # (``transpose_emit``) that its consumers read in order.
    for n in nodes:
        if n.op != "transpose" or not _moves_last_dim(n, costs):
            continue
        if all(c.op == "dot" for c in consumers.get(id(n), [])) and id(n) in (
            sched.transposed_operands
        ):
            continue  # (a GEMM reads it in place)
        if id(n) not in mat and all(c.op == "transpose" for c in consumers.get(id(n), [])):
            continue  # (a transpose of a transpose: the last one decides)
        x = n.inputs[0]
        while x.op == "reshape" and id(x) not in mat:
            x = x.inputs[0]
        if id(n) in mat and id(x) not in mat and fused_cost(x) <= costs.recompute_budget:
            continue  # (a GEMM operand copied with a few cheap ops fused: BERT's key bias)
        need_memory(n.inputs[0])
        mat.add(id(n))
        cost.clear()
    before = set(mat)
    if stitch:
        sched.stitches, sched.row_buffered = plan_stitches(nodes, mat, consumers, outputs)
        if costs.attention_fusion:
            sched.attention = plan_attention(nodes, mat, consumers, outputs, sched.stitches)
    unstored = before - mat  # reductions and values a stitch kernel now computes per row

    def region_unstored(x: Node) -> bool:
        stack, seen = [x], set()
        while stack:
            n = stack.pop()
            if id(n) in unstored:
                return True
            if id(n) in seen or id(n) in mat:
                continue
            seen.add(id(n))
            stack.extend(n.inputs)
        return False

    # A value computed in a loop and then broadcast to a bigger shape would be recomputed
    # for every copy (BERT's padding mask, [b, 1, 1, s], once per head and query row):
    # compute it once, at its own size.
    for n in nodes:
        if n.op != "broadcast_in_dim" or id(n) in mat:
            continue
        x = n.inputs[0]
        if id(x) in mat or recomputable(x) or fused_cost(x) < costs.hoist_cost or not _expands(n):
            continue
        if not region_unstored(x):
            mat.add(id(x))
            cost.clear()
    sched._mat = mat
    sched.materialized = [n for n in nodes if id(n) in mat]
    sched.kernels = [
        n for n in sched.materialized if n.op not in SOURCE_OPS and id(n) not in sched.aliases
    ]
    if stitch:
        read_memo: dict[int, set[int]] = {}  # both plans below ask for every kernel

        def reads(k: Node) -> set[int]:
            if id(k) not in read_memo:
                read_memo[id(k)] = _kernel_reads(sched, k)
            return read_memo[id(k)]

        aliased = {id(a) for a in sched.aliases.values()}
        sched.epilogues = plan_epilogues(
            sched.kernels, sched.stitches, outputs, aliased, reads, ELEMENTWISE_OPS
        )
        # A convolution runs where its epilogue ran: after whatever else the epilogue reads
        # (batch norm's scale and shift), and nothing else reads the convolution.
        conv_of = {id(e): c for c, e in sched.epilogues.items()}
        by_id = {id(k): k for k in sched.kernels}
        sched.kernels = [
            by_id[conv_of[id(k)]] if id(k) in conv_of else k
            for k in sched.kernels
            if id(k) not in sched.epilogues
        ]
        pointwise = {
            id(k) for k in sched.kernels if k.op not in ROOT_OPS and id(k) not in sched.stitches
        }
        sched.kernels, sched.horizontal = plan_horizontal(
            sched.kernels,
            pointwise,
            reads,
            costs.horizontal_members,
            written_in={id(e): c for c, e in sched.epilogues.items()},
        )
    for root in sched.kernels:
        variant = plan_split_variant(sched, root, costs)
        if variant is not None:
            sched.split[id(root)] = variant
        computed = [*members(sched, root), *fused_into(sched, root)]
        speculated = plan_broadcast_variant(sched, root, computed)
        if speculated is not None:
            sched.no_broadcast[id(root)] = speculated
    sched.memory = plan_memory(sched)
    return sched


def _kernel_reads(sched: Schedule, root: Node) -> set[int]:
    """Ids of the values in memory ``root``'s kernel reads (a reshape alias as its owner)."""
    return memory_reads(sched, root.inputs)


def fused_into(sched: Schedule, root: Node):
    """The values ``root``'s kernel computes in its loops (not its outputs, nothing in memory)."""
    seen: set[int] = set()
    stack = [i for m in members(sched, root) for i in m.inputs]
    epilogue = sched.epilogues.get(id(root))
    if epilogue is not None:  # the epilogue and its ops, up to what is in memory
        yield epilogue
        stack += epilogue.inputs
    while stack:
        n = stack.pop()
        if id(n) in seen or sched.is_materialized(n):
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.inputs)


def stitch_root(sched: Schedule, root: Node) -> Node:
    """The stitch group's root a kernel runs: an attention kernel's probabilities, else
    ``root`` itself (a key of ``Schedule.stitches`` when the kernel is a stitch)."""
    chain = sched.attention.get(id(root))
    return chain.probs if chain is not None else root


def describe_kernel(sched: Schedule, root: Node) -> str:
    """``stitch softmax-like div f32[s0, 768]: fuses exp x1, reduce x2, ...``: for explain()."""
    kind = (
        "attention"
        if id(root) in sched.attention
        else "stitch"
        if id(root) in sched.stitches
        else {
            "dot": "library GEMM",
            "convolution": "im2col + GEMM",
            "pool": "window",
            "scatter": "scatter",
        }.get(root.op, "reduce" if root.op in ROOT_OPS else "loop")
    )
    group = members(sched, root)
    if len(group) > 1:
        kind = f"horizontal loop x{len(group)}"
    if id(root) in sched.epilogues:
        kind += " + epilogue"
    fused: dict[str, int] = {}
    for n in [*group[1:], *fused_into(sched, root)]:
        if n.op not in CHEAP_OPS:
            fused[n.op] = fused.get(n.op, 0) + 1
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(fused.items()))
    return f"{kind}: {root.op} {root.type}" + (f" <- {ops}" if ops else "")
