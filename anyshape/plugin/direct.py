"""The direct call path of a compiled model: no FX interpretation, no pytree walk.

Sits between ``OptimizedModule`` and the compiled clusters. When the whole model
compiled into one cluster whose inputs are the model's own tensor inputs (the
common case), a call needs nothing but: put the flat inputs in order, run the
model prologue and the cluster, and rebuild the output structure. ``plan_direct``
recognises that shape of assembled graph and returns a ``DirectPlan``, or
``None`` (the assembled ``GraphModule`` then runs as usual). ``FlatInputs``
flattens ``(args, kwargs)`` without torch's general pytree machinery when the
example inputs were plain tensors and keywords.

When the cluster is a native library whose own prologue checks everything the
model prologue does (every input, the same dims, ranges and guards),
``native_call`` makes the same call entirely in C (``plugin/torchcall.c``),
which hands any call off its common path back to the Python one.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .compiled_cluster import CompiledCluster
from .report import ModelPrologue


class FlatInputs:
    """Flattens calls structured like ``in_spec`` when every input is a leaf."""

    def __init__(self, in_spec):
        self.ok = in_spec is not None and in_spec.num_children == 2
        if self.ok:
            args_spec, kwargs_spec = in_spec.children()
            self.num_args = args_spec.num_children
            self.keys = list(kwargs_spec.context) if kwargs_spec.num_children else []
            self.key_set = set(self.keys)
            self.ok = all(c.is_leaf() for c in args_spec.children()) and all(
                c.is_leaf() for c in kwargs_spec.children()
            )

    def __call__(self, args, kwargs) -> list | None:
        """The flat inputs, or ``None`` when the call is not structured like the example."""
        if not self.ok or len(args) != self.num_args or kwargs.keys() != self.key_set:
            return None
        return [*args, *(kwargs[k] for k in self.keys)]


class DirectPlan:
    """Prologue (checks every input, tensors included) -> cluster -> output structure."""

    def __init__(self, prologue, cluster: CompiledCluster, order, outputs, out_spec):
        self.prologue = prologue
        self.cluster = cluster
        self.order = order  # flat input index for each cluster input
        self.outputs = outputs  # per flat output: ("cluster", k) | ("input", i) | ("const", v)
        self.out_spec = out_spec

    def __call__(self, flat: list):
        self.prologue(*flat)
        results = self.cluster(*[flat[i] for i in self.order])
        values = []
        for kind, v in self.outputs:
            values.append(results[v] if kind == "cluster" else flat[v] if kind == "input" else v)
        return pytree.tree_unflatten(values, self.out_spec)


def plan_direct(gm: fx.GraphModule) -> DirectPlan | None:
    out_spec = getattr(gm, "_out_spec", None)
    if out_spec is None:
        return None
    placeholders: dict[fx.Node, int] = {}
    prologue, cluster, call = None, None, None
    items: dict[fx.Node, int] = {}
    output = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if not isinstance(n.meta.get("val"), torch.Tensor):
                return None  # a constant input: the checked general path compares it
            placeholders[n] = len(placeholders)
        elif n.op == "call_function" and isinstance(n.target, ModelPrologue):
            if prologue is not None or list(n.args) != list(placeholders):
                return None  # the prologue must check every input, in order
            prologue = n.target
        elif n.op == "call_function" and isinstance(n.target, CompiledCluster):
            if cluster is not None or any(a not in placeholders for a in n.args):
                return None
            cluster, call = n.target, n
        elif n.op == "call_function" and n.target is operator.getitem and n.args[0] is call:
            items[n] = n.args[1]
        elif n.op == "output":
            output = n
        else:
            return None
    if prologue is None or cluster is None or output is None:
        return None
    flat_out = pytree.tree_leaves(output.args[0])
    outputs = []
    for o in flat_out:
        if isinstance(o, fx.Node):
            if o in items:
                outputs.append(("cluster", items[o]))
            elif o in placeholders:
                outputs.append(("input", placeholders[o]))
            else:
                return None
        else:
            outputs.append(("const", o))
    order = [placeholders[a] for a in call.args]
    return DirectPlan(prologue, cluster, order, outputs, out_spec)


def native_call(plan: DirectPlan, flat_inputs: FlatInputs):
    """``plan`` as one ``TorchCall`` taking the model's ``(*args, **kwargs)``, or ``None``.

    ``None`` unless the inputs are plain leaves, the cluster is a native library
    with no run-time symbols and no pass-through outputs, its prologue checks all
    the model prologue does (every input, with the same dims, ranges and guards),
    and the model has at most ``torchcall_max`` (64) inputs and outputs.
    """
    from ..frontends.torch.symbols import DTYPE_TO_TORCH
    from ..runtime.fastcall import fastcall
    from ..runtime.native import KernelError

    cluster, executable = plan.cluster, plan.cluster.native
    module = fastcall()
    if not flat_inputs.ok or module is None or executable is None or cluster.extra_symbols:
        return None
    library = executable.native
    if library._fast is None or any(s < 0 for s in executable.output_slots):
        return None
    model, unit = plan.prologue.binder, cluster.binder
    if sorted(plan.order) != list(range(len(model.specs))):
        return None  # an input the cluster does not read: only the model prologue checks it
    for k, i in enumerate(plan.order):
        a, b = model.specs[i], unit.specs[k]
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            return None
    if not set(model.ranges) <= set(unit.ranges):
        return None
    if not {str(g) for g in model.store.guards} <= {str(g) for g in unit.store.guards}:
        return None
    kinds = {"cluster": 0, "input": 1, "const": 2}
    outputs = tuple(
        (0, executable.output_slots[v]) if kind == "cluster" else (kinds[kind], v)
        for kind, v in plan.outputs
    )
    flat = flat_inputs.num_args + len(flat_inputs.keys)
    counts = (flat, len(plan.order), len(library._out_types), len(outputs))
    if max(counts) > module.torchcall_max:
        return None  # (a model of more inputs or outputs than TorchCall holds: the general path)
    spec = plan.out_spec
    if spec.is_leaf():
        form = 0
    elif spec.type is tuple and all(c.is_leaf() for c in spec.children()):
        form = 1
    else:
        form = 2
    main, free, params = library._fast_args
    return module.TorchCall(
        main,
        free,
        params,
        flat_inputs.num_args,
        tuple(flat_inputs.keys),
        tuple(plan.order),
        tuple(DTYPE_TO_TORCH[s.dtype] for s in unit.specs),
        library._out_types,
        outputs,
        form,
        lambda values: pytree.tree_unflatten(values, spec),
        (torch.Tensor, torch.nn.Parameter),
        torch.from_numpy,
        KernelError,
        library,  # owns main, free and params
    )


def graph_module_of(plan: DirectPlan, in_spec, orig_args: list[str], state) -> fx.GraphModule:
    """The ``GraphModule`` a cold compile assembles for ``plan`` (prologue, cluster,
    outputs), holding ``state``: ``(qualified name, tensor, is parameter, persistent)``
    in ``state_dict`` order, so ``parameters()`` and ``state_dict()`` list the same."""
    graph = fx.Graph()
    graph._codegen = fx.graph._PyTreeCodeGen(
        fx.graph._PyTreeInfo(list(orig_args), in_spec, plan.out_spec)
    )
    inputs = [graph.placeholder(name) for name in plan.prologue.names]
    graph.call_function(plan.prologue, tuple(inputs))
    call = graph.call_function(plan.cluster, tuple(inputs[i] for i in plan.order))
    call.name = plan.cluster.graph.name
    values = [
        graph.call_function(operator.getitem, (call, v))
        if kind == "cluster"
        else inputs[v]
        if kind == "input"
        else v
        for kind, v in plan.outputs
    ]
    graph.output(tuple(values))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    for name, tensor, is_parameter, persistent in state:
        *path, leaf = name.split(".")
        owner = gm
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if is_parameter:
            owner.register_parameter(leaf, tensor)
        else:
            owner.register_buffer(leaf, tensor, persistent=persistent)
    return gm
