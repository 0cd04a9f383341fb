"""Lowering an ONNX graph to one IR graph: the ONNX frontend's driver.

Sits after the reader (``reader.py``: inputs with symbolic dims, weights,
opset) and before the shared compile path (``pipelines.compile_graph``). It
walks the ONNX nodes in their (topological) file order, lowering only those the
graph's outputs need, each through the rule ``rules.rule_for`` picks for its op
type and opset. Values flow as ``context.Value`` (IR node, constant, or known
vector of symbolic dims), so shape computations fold away here.

After each node, the lowered types are checked against ``onnx.shape_inference``
where it gave one (dtype, rank and static dims): a mismatch is an anyshape bug,
reported with the node's name instead of a wrong result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UnsupportedError
from ...ir.graph import Graph, GraphBuilder
from ...ir.symbolic import as_dim
from ..building import ir_name
from ..values import lowering_error
from .context import LowerCtx, NeedsInputValue, OnnxNodeView, Value
from .reader import OnnxModel, tensor_to_array
from .rules import rule_for


@dataclass
class LoweredOnnx:
    graph: Graph
    input_names: list[str]  # the ONNX names, in graph-input order
    output_names: list[str]


def needed_nodes(graph, outputs: list[str]) -> set[int]:
    """Indices of the nodes the outputs depend on."""
    producer = {}
    for i, n in enumerate(graph.node):
        for o in n.output:
            if o:
                producer[o] = i
    needed: set[int] = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        reads = list(graph.node[i].input) + sorted(outer_reads(graph.node[i]))
        stack.extend(producer[x] for x in reads if x in producer)
    return needed


def outer_reads(node) -> set[str]:
    """Names a node's subgraphs (If's branches) read from the scope around them."""
    reads: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            made = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                reads |= {x for x in list(n.input) + sorted(outer_reads(n)) if x and x not in made}
                made |= set(n.output)
            reads |= {o.name for o in g.output if o.name not in made}
    return reads


def lower_model(model: OnnxModel) -> LoweredOnnx:
    """The whole ONNX graph as one IR graph, or an ``UnsupportedError`` naming a node."""
    graph = model.proto.graph
    gname = ir_name(model.name, set())[:48]
    builder = GraphBuilder(name=gname)
    ctx = LowerCtx(builder)
    env: dict[str, Value | None] = {}
    taken: set[str] = set()
    for name, ty in model.inputs:
        env[name] = Value.of_node(builder.input(ir_name(name, taken), ty))
        env[name].input_name = name
    weights: set[str] = set()
    for name, array in model.initializers.items():
        if name in env:
            continue
        v = Value.of_const(array)
        v.param_name = ir_name(name, weights)
        env[name] = v
    needed = needed_nodes(graph, model.output_names)
    for i, proto in enumerate(graph.node):
        if i not in needed:
            continue
        lower_node(ctx, proto, model, env)
    outputs = []
    for name in model.output_names:
        v = env.get(name)
        if v is None:
            raise UnsupportedError(f"graph output {name!r} is not computed by any lowered node")
        outputs.append(ctx.node(v))
    return LoweredOnnx(builder.build(outputs), [n for n, _ in model.inputs], model.output_names)


def lower_node(ctx: LowerCtx, proto, model: OnnxModel, env: dict) -> None:
    opset = model.opset
    node = OnnxNodeView(proto, opset)
    if proto.op_type == "If" and proto.domain in ("", "ai.onnx"):
        _lower_if(ctx, node, model, env)
        return
    fn = rule_for(proto.op_type, opset, node.name, proto.domain)
    ins: list[Value | None] = []
    for x in proto.input:
        if not x:
            ins.append(None)
            continue
        if x not in env:
            raise UnsupportedError(f"{node.describe()}: input {x!r} is not defined before it")
        v = env[x]
        if v is None:
            raise UnsupportedError(
                f"{node.describe()}: reads {x!r}, an output its producer's lowering does not "
                "compute"
            )
        ins.append(v)
    try:
        outs = fn(ctx, node, ins)
    except NeedsInputValue:
        raise
    except Exception as e:  # named after the node, never a bare traceback
        raise lowering_error(e, node.describe(), node.name, "model") from e.__cause__
    for name, v in zip(proto.output, outs):
        if name:
            env[name] = v
            if v is not None:
                _check_inferred(node, name, v, model)
    for name in list(proto.output)[len(outs) :]:
        if name:
            env[name] = None


def _lower_if(ctx: LowerCtx, node: OnnxNodeView, model: OnnxModel, env: dict) -> None:
    """``If`` with a condition known at compile time (a constant, or a fact about shapes):
    the taken branch's nodes are lowered in place. A condition that depends on tensor
    data would need both branches compiled and a choice per call: refused."""
    what = node.describe()
    cond = env.get(node.proto.input[0])
    if cond is None:
        raise UnsupportedError(f"{what}: its condition is not computed by any lowered node")
    if cond.const is not None and cond.const.size == 1:
        flag = bool(cond.const.reshape(-1)[0])
    else:
        known = LowerCtx.known_of(cond, f"{what}: the condition")
        if len(known) != 1 or not isinstance(as_dim(known[0]), int):
            raise UnsupportedError(f"{what}: the condition depends on symbolic sizes ({known})")
        flag = bool(as_dim(known[0]))
    branch = node.attr("then_branch" if flag else "else_branch")
    for t in branch.initializer:
        env[t.name] = Value.of_const(tensor_to_array(t, "", f"initializer {t.name!r}"))
    for inner in branch.node:
        lower_node(ctx, inner, model, env)
    for name, out in zip(node.outputs, branch.output):
        if name:
            env[name] = env.get(out.name)


def _check_inferred(node: OnnxNodeView, name: str, v: Value, model: OnnxModel) -> None:
    dtype, shape = model.inferred.get(name, (None, None))
    if dtype is not None and dtype != v.dtype:
        raise UnsupportedError(
            f"{node.describe()}: output {name!r} lowered as {v.dtype}, ONNX infers {dtype} "
            "(an anyshape bug)"
        )
    if shape is None:
        return
    bad = len(shape) != v.rank or any(
        isinstance(want, int) and isinstance(as_dim(got), int) and want != as_dim(got)
        for want, got in zip(shape, v.shape)
    )
    if bad:
        raise UnsupportedError(
            f"{node.describe()}: output {name!r} lowered with shape {list(v.shape)}, ONNX infers "
            f"{list(shape)} (an anyshape bug)"
        )
