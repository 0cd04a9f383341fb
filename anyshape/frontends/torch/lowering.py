"""Lowering ATen FX nodes to IR: the driver and the helpers every rule uses.

Sits in the torch frontend between capture (FX graphs of core ATen with
symbolic sizes) and the IR. One table, ``LOWERINGS``, maps each ATen overload
to a rule ``fn(ctx, *args, **kwargs) -> Node | tuple[Node, ...]``; the rules
live in ``aten/`` by op family. Tensor arguments arrive as IR nodes, SymInt
arguments as dims (``int | SymExpr``, read from the FX metadata, so shape
arithmetic never needs its own nodes), everything else as given.

A rule that cannot handle its arguments raises ``UnsupportedError`` with the
reason; in plugin mode that node then runs in PyTorch and explain() shows why.
After each rule the driver checks the result against torch's own metadata
(dtype and symbolic shape), so a wrong rule is caught at compile time.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx as fx

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Graph, GraphBuilder, Node
from ...ir.ops import IRTypeError
from ...ir.symbolic import SymExpr, as_expr
from ...ir.types import TensorType
from ..building import IRBuilding
from .symbols import sym_ratio, to_dim, to_dtype, to_tensor_type

LowerFn = Callable[..., "Node | tuple[Node, ...]"]


@dataclass
class LoweringRule:
    fn: LowerFn
    partial: str | None = None  # what the rule does not cover, for docs/ops.md
    # Whether the rule covers this FX node as exported, before decomposition (None: yes);
    # a node it does not cover makes capture decompose the program first.
    covers_as_exported: Callable[[fx.Node], bool] | None = None


LOWERINGS: dict[object, LoweringRule] = {}


def lowering(*targets, partial: str | None = None, covers_as_exported=None):
    """Register a rule for ATen overloads (an OpOverloadPacket registers every overload)."""

    def register(fn: LowerFn) -> LowerFn:
        rule = LoweringRule(fn, partial, covers_as_exported)
        for t in targets:
            if isinstance(t, torch._ops.OpOverloadPacket):
                for name in t.overloads():
                    LOWERINGS.setdefault(getattr(t, name), rule)
            else:
                LOWERINGS[t] = rule
        return fn

    return register


def source_location(node: fx.Node) -> str:
    """The model's source line that produced ``node``: the innermost frame outside torch."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    torch_dir = os.path.dirname(torch.__file__)
    user = [ln for ln in lines if torch_dir not in ln]
    if user or lines:
        return (user or lines)[-1].replace("File ", "", 1)
    stack = node.meta.get("nn_module_stack")
    if stack:
        return "in module " + list(stack.values())[-1][0]
    return "unknown location"


def is_tensor_node(n) -> bool:
    return isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)


class LowerCtx(IRBuilding):
    """State of one lowering: the builder, the current FX node, and helpers for rules."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        self.node: fx.Node | None = None

    # --- torch metadata of the node being lowered -----------------------------
    def out_val(self, i: int | None = None):
        val = self.node.meta["val"]
        return val if i is None else val[i]

    def out_type(self, i: int | None = None) -> TensorType:
        return to_tensor_type(self.out_val(i))

    def elementwise_dtypes(self, kind: str = "DEFAULT") -> tuple[DType, DType]:
        """Torch's (computation, result) dtypes for the current node's operands."""
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        vals = [_meta_or_value(a) for a in self.node.args]
        vals += [_meta_or_value(v) for k, v in self.node.kwargs.items() if k in ("other", "input")]
        vals = [1.0 if isinstance(v, torch.SymFloat) else v for v in vals]  # (a Python float)
        vals = [v for v in vals if isinstance(v, (torch.Tensor, int, float, bool, torch.SymInt))]
        comp, res = elementwise_dtypes(
            *vals, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind)
        )
        return to_dtype(comp), to_dtype(res)

    # --- building blocks --------------------------------------------------
    def shape_scalar(self, dim, dtype: DType = DType.i64) -> Node:
        if isinstance(dim, int):
            return self.const(dim, dtype)
        return self.op("shape_scalar", expr=dim, dtype=dtype)

    def operand(self, x, dtype: DType, shape: Sequence) -> Node:
        """A tensor or Python/symbolic scalar as an IR value of ``dtype`` broadcast to ``shape``."""
        if isinstance(x, Node):
            return self.broadcast_to(self.cast(x, dtype), shape)
        if isinstance(x, SymExpr):
            return self.broadcast_to(self.cast(self.shape_scalar(x), dtype), shape)
        if isinstance(x, (bool, int, float)):
            return self.full(x, shape, dtype)
        if isinstance(x, SizeRatio):
            num, den = (self.cast(self.shape_scalar(d), DType.f64) for d in (x.num, x.den))
            return self.broadcast_to(self.cast(self.op("div", num, den), dtype), shape)
        raise UnsupportedError(f"unsupported operand {x!r}")


@dataclass(frozen=True)
class SizeRatio:
    """A symbolic float argument that is a ratio of sizes (``sym_ratio``): an operand of
    elementwise ops (``LowerCtx.operand``), computed in float64 from the sizes, as
    Python computes it, then cast to the op's type as torch casts a Python scalar."""

    num: int | SymExpr
    den: int | SymExpr


def _meta_or_value(a):
    if isinstance(a, fx.Node):
        return a.meta.get("val")
    return a


def norm_dim(d: int, rank: int) -> int:
    """A possibly negative dim index as 0..rank-1 (rank 0 accepts -1 and 0)."""
    r = max(rank, 1)
    if not -r <= d < r:
        raise UnsupportedError(f"dim {d} out of range for rank {rank}")
    return d % r


# --- the driver ----------------------------------------------------------------


@dataclass
class LoweredCluster:
    graph: Graph
    inputs: list[fx.Node]  # FX tensor nodes feeding the graph's inputs, in order
    outputs: list[fx.Node]  # FX nodes whose values the graph's outputs are
    params: list[fx.Node] = field(default_factory=list)


def _convert_arg(a, env: dict):
    if isinstance(a, fx.Node):
        if a in env:
            if env[a] is None:
                raise UnsupportedError(f"{a.name} is an output the lowering does not produce")
            return env[a]
        val = a.meta.get("val")
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            return to_dim(val)
        ratio = sym_ratio(val)
        if ratio is not None:
            return SizeRatio(*ratio)
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            raise UnsupportedError(f"symbolic {type(val).__name__} arguments are not supported")
        if isinstance(val, (float, bool)):
            return val
        raise UnsupportedError(f"argument {a.name} has no lowered value")
    if isinstance(a, (list, tuple)):
        return type(a)(_convert_arg(x, env) for x in a)
    if isinstance(a, torch.SymInt):
        return to_dim(a)
    if isinstance(a, torch.dtype):
        return a
    return a


def _check_against_meta(node: fx.Node, result) -> None:
    val = node.meta.get("val")
    if isinstance(result, tuple):
        for i, r in enumerate(result):
            if r is not None and isinstance(val[i], torch.Tensor):
                _check_one(node, r, val[i])
    else:
        _check_one(node, result, val)


def _check_one(node: fx.Node, r: Node, val) -> None:
    want = to_tensor_type(val)
    if (
        r.dtype != want.dtype
        or r.rank != want.rank
        or any(as_expr(a) != as_expr(b) for a, b in zip(r.shape, want.shape))
    ):
        raise UnsupportedError(
            f"lowering of {node.target} produced {r.type} where torch expects {want} "
            f"(an anyshape bug; the op runs in PyTorch meanwhile)"
        )


@functools.cache
def _views() -> frozenset:
    aten = torch.ops.aten
    return frozenset({
        aten.t.default, aten.transpose.int, aten.permute.default, aten.movedim.int,
        aten.narrow.default, aten.select.int, aten.slice.Tensor, aten.alias.default,
        aten.detach.default, aten._unsafe_view.default, aten.view.default,
        aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
        aten.diagonal.default, aten.unfold.default,
    })  # fmt: skip


def _feeds_as_strided(node: fx.Node, views) -> bool:
    """Whether ``node``, a view, reaches an ``as_strided`` through views only."""
    if node.target not in views:
        return False
    for user in node.users:
        if user.target is torch.ops.aten.as_strided.default or _feeds_as_strided(user, views):
            return True
    return False


def feeds_as_strided(node: fx.Node) -> bool:
    """Whether ``node`` is a view that reaches an ``as_strided`` through views only."""
    return _feeds_as_strided(node, _views())


def rule_for(node: fx.Node) -> LoweringRule:
    if node.op != "call_function":
        raise UnsupportedError(f"{node.op} nodes are not compiled")
    rule = LOWERINGS.get(node.target)
    if rule is None:
        raise UnsupportedError(f"no lowering for {node.target}")
    if _feeds_as_strided(node, _views()):
        # A compiled view is a new contiguous tensor: as_strided, run in PyTorch, would
        # read it with strides meant for the view's storage (offset and strides).
        raise UnsupportedError("a view read by as_strided stays in PyTorch (storage strides)")
    return rule


def lower_node(ctx: LowerCtx, node: fx.Node, env: dict):
    """Lower one FX node into ``ctx``'s builder, given lowered values of its operands."""
    rule = rule_for(node)
    args = _convert_arg(node.args, env)
    kwargs = {k: _convert_arg(v, env) for k, v in node.kwargs.items()}
    ctx.node = node
    try:
        result = rule.fn(ctx, *args, **kwargs)
    except UnsupportedError:
        raise
    except IRTypeError as e:
        raise UnsupportedError(f"{node.target}: {e}") from None
    except Exception as e:  # a rule bug must become a fallback with a reason, not a crash
        raise UnsupportedError(f"{node.target}: {type(e).__name__}: {e}") from None
    if result is None:
        raise UnsupportedError(f"{node.target}: this output is not produced by the lowering")
    if node.target is not operator.getitem:
        _check_against_meta(node, result)
    return result


def check_supported(node: fx.Node) -> str | None:
    """None if ``node`` lowers in isolation, else the reason it does not."""
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        return (
            None
            if isinstance(src, fx.Node) and check_supported(src) is None
            else "selects from an op that runs in PyTorch"
        )
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    if not any(isinstance(v, torch.Tensor) for v in vals):
        return "produces no tensor (shape arithmetic runs in Python)"
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dtype not in _NUMPY_DTYPES:
            return f"dtype {v.dtype} is not supported"
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return f"device {v.device} is not supported by the CPU backend"
    builder = GraphBuilder()
    ctx = LowerCtx(builder)
    env: dict = {}
    try:
        for a in _tensor_operands(node):
            ty = to_tensor_type(a.meta["val"])
            if a.meta["val"].dtype not in _NUMPY_DTYPES:
                return f"operand dtype {a.meta['val'].dtype} is not supported"
            env[a] = builder.input(a.name, ty)
        lower_node(ctx, node, env)
    except UnsupportedError as e:
        return str(e)
    return None


_NUMPY_DTYPES = {
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
}


def _tensor_operands(node: fx.Node) -> list[fx.Node]:
    out: list[fx.Node] = []

    def visit(a):
        if isinstance(a, fx.Node):
            if is_tensor_node(a) and a not in out:
                out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)

    visit(node.args)
    visit(node.kwargs)
    return out


def lower_cluster(
    nodes: Sequence[fx.Node],
    gm: fx.GraphModule | None,
    name: str,
    symbol_ranges: dict[str, tuple[int, int | None]] | None = None,
    *,
    inputs: Sequence[fx.Node] = (),
    outputs: Sequence[fx.Node] | None = None,
    guards: Sequence = (),
) -> LoweredCluster:
    """Lower a set of supported FX nodes (in topological order) into one IR graph.

    By default the graph's inputs are the outside values the nodes use (in order
    of first use) and its outputs the nodes used outside. A whole model passes
    ``inputs`` (every placeholder, in order, used or not) and ``outputs`` (the
    model's flat outputs, which may be inputs or weights themselves), and the
    ``guards`` its capture relied on, for the prologue to check.
    """
    members = set(nodes)
    builder = GraphBuilder(name=name)
    for sym, (lo, hi) in (symbol_ranges or {}).items():
        builder.constraints.add_symbol(sym, lo, hi)
    for g in guards:
        builder.constraints.add_guard(g)
    ctx = LowerCtx(builder)
    env: dict = {}
    used_inputs: list[fx.Node] = []
    params: list[fx.Node] = []

    def outside(a: fx.Node) -> None:
        if a.op == "get_attr" and gm is not None:
            tensor = _fetch_attr(gm, a.target)
            env[a] = builder.param(a.target, tensor_to_numpy(tensor))
            params.append(a)
        else:
            env[a] = builder.input(a.name, to_tensor_type(a.meta["val"]))
            used_inputs.append(a)

    for a in inputs:
        outside(a)
    for node in nodes:
        for a in _tensor_operands(node):
            if a not in members and a not in env:
                outside(a)
        env[node] = lower_node(ctx, node, env)
    if outputs is None:
        outputs = [n for n in nodes if is_tensor_node(n) and any(u not in members for u in n.users)]
    for o in outputs:
        if o not in env:
            outside(o)
    graph = builder.build([env[o] for o in outputs])
    return LoweredCluster(graph, used_inputs, list(outputs), params)


def _fetch_attr(gm: fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A zero-copy NumPy view of a CPU tensor (detached)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        raise UnsupportedError("bf16 tensors are not supported")
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.numpy()
