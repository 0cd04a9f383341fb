"""Trace a repeated block once and stamp out its copies: the capture of a deep model.

Part of the torch frontend's capture (``capture.py``), around ``torch.export``.
Transformers and ResNets repeat one block many times (BERT-base: 12 encoder
layers; ResNet-50: 16 bottlenecks, 12 of them alike), and torch.export traces every
call again with fake tensors and symbolic sizes, about 0.05 s per BERT layer.
Here siblings of one class with the same parameter shapes and the same state
(``find_repeated_blocks``) form a group. During the export, the first call of a
group's member is traced as usual between two marker ops (``block_enter`` and
``block_exit``); every later call whose inputs have the same structure, types and
symbolic shapes becomes one ``block_copy`` op whose outputs are shaped like the
first call's. After the export, ``splice`` replaces each copy op by the first
call's nodes, rewired to the copy's inputs and weights, and drops the markers:
the program is the one a full trace gives, node for node.

Blocks alike in class, state, weights' shapes and inputs run the same Python, so
they trace alike; the one difference let through is a layer's index in its stack
(``POSITION_ATTRIBUTES``: transformers keep it to address a KV cache). A copy
reads only its inputs and its own weights (a first call reading any other tensor,
a hook inside it, inputs passed twice or written to: traced per call). What no
comparison of state sees (an index steering ops, a tensor or value left on a shared
object, a side effect in Python) is why every capture with copies is compared with
the model on the example: plugin mode compares the compiled model (``api.py``),
other callers the captured program (``capture.py``); where they disagree the model
is captured again with every call traced.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

# Attributes that say where a block sits in its stack. Transformers' layers keep their
# index to address a KV cache, which is an input here: a cache as input refuses stamping
# (only plain containers may hold a block's inputs), so the index reaches no op.
POSITION_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})

# Attributes that only steer training: a stochastic-depth rate (``drop_prob``, which timm's
# and transformers' drop-path modules keep, rising with a block's depth) changes nothing a
# module computes in eval mode, nor does a dropout's ``p``; blocks that differ only there
# trace alike when captured for inference. The names are ignored on any module in eval
# mode (a block may keep its rate itself); one that steers eval-mode computation after
# all is caught by the stamped capture's check against eager.
TRAINING_ATTRIBUTES = frozenset({"drop_prob", "scale_by_keep"})
# Likewise a drop-path module (timm's ``DropPath``, transformers' ``<Model>DropPath``) and
# a dropout return their input in eval mode, as ``nn.Identity``, which a model builds in
# their place where the rate is 0 (SegFormer's first layer of each stage): in eval mode
# the three are alike, their training-only state (a dropout's ``p`` and ``inplace``)
# aside; any other state still tells them apart. (A stamped capture is checked against
# eager on random inputs: a module so named that computes something in eval mode is
# caught, not copied.)
IDENTITY_IN_EVAL = "identity in eval mode"

# Types a block's inputs and outputs may be built of, besides tensors (pytree containers
# aside): values the copy can take from the first call because they are equal.
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.SymInt)
_PLAIN_CONTAINERS = (tuple, list, dict)

_groups: dict[int, Group] = {}  # live groups by id, for the fake kernel of block_copy
_ids = itertools.count()
_lock = threading.Lock()


@dataclass
class Call:
    """What the first call of a group saw and returned (fake tensors, symbolic sizes)."""

    in_spec: pytree.TreeSpec
    in_leaves: list  # the leaves passed, each tensor as its metadata (``_meta``)
    out_spec: pytree.TreeSpec
    out_leaves: list  # the leaves returned, each tensor as _TENSOR
    out_tensors: list[torch.Tensor]  # the fake outputs, whose metadata copies take


_TENSOR = object()  # a tensor's place among a call's leaves


@dataclass
class Group:
    """Sibling blocks alike: one traced (``first``), the rest stamped from it."""

    gid: int
    members: list[tuple[str, torch.nn.Module]]  # (qualified name, module)
    first: Call | None = None
    first_name: str | None = None
    dead: bool = False  # the first call could not be a template: every call is traced
    copies: int = 0


@dataclass
class Stamping:
    groups: list[Group] = field(default_factory=list)

    @property
    def copies(self) -> int:
        return sum(g.copies for g in self.groups)


def _register_ops() -> None:
    lib = "anyshape"

    def marker(name: str) -> None:
        """An op returning copies of its tensors: where a first call begins or ends."""

        @torch.library.custom_op(f"{lib}::{name}", mutates_args=())
        def op(xs: list[torch.Tensor], gid: int) -> list[torch.Tensor]:
            return [x.clone() for x in xs]

        op.register_fake(lambda xs, gid: [torch.empty_like(x) for x in xs])

    marker("block_enter")
    marker("block_exit")

    @torch.library.custom_op(f"{lib}::block_copy", mutates_args=())
    def block_copy(
        xs: list[torch.Tensor], weights: list[torch.Tensor], gid: int
    ) -> list[torch.Tensor]:
        raise RuntimeError("anyshape::block_copy only exists while a model is captured")

    @block_copy.register_fake
    def _(xs, weights, gid):
        first = _groups[gid].first
        return [
            torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            for t in first.out_tensors
        ]


_register_ops()
_ENTER = torch.ops.anyshape.block_enter.default
_EXIT = torch.ops.anyshape.block_exit.default
_COPY = torch.ops.anyshape.block_copy.default


def stamped_capture(model, export, to_captured, agrees=None):
    """``to_captured(export())`` with repeated blocks stamped; None where nothing repeats,
    anything fails, or copies were made and ``agrees(captured)`` (the program against
    the model on the example) is false. ``agrees=None``: the caller compares (plugin
    mode compares its compiled model, ``api.py``)."""
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        with stamping(model) as stamp:
            if not stamp.groups:
                return None
            ep = export()
        copies = splice(ep, stamp, model)
        captured = to_captured(ep)
    except Exception:  # any failure (a model torch cannot export, too): trace it all
        return None
    if copies and agrees is not None and not agrees(captured):
        return None
    captured.stamped = copies
    return captured


def find_repeated_blocks(model: torch.nn.Module) -> list[list[tuple[str, torch.nn.Module]]]:
    """Groups of two or more sibling modules alike (``_signature``), outermost first;
    the inside of a grouped module is not searched (its copies are never traced)."""
    groups = []

    def visit(prefix: str, module: torch.nn.Module) -> None:
        by_signature: dict = {}
        for name, child in module.named_children():
            # (a module without submodules, a Linear, costs a copy about what it saves)
            sig = _signature(child) if next(child.children(), None) is not None else None
            if sig is not None:
                by_signature.setdefault(sig, []).append((f"{prefix}{name}", child))
        grouped = set()
        for members in by_signature.values():
            if len(members) > 1 and len({id(m) for _, m in members}) == len(members):
                groups.append(members)
                grouped.update(id(m) for _, m in members)
        for name, child in module.named_children():
            if id(child) not in grouped:
                visit(f"{prefix}{name}.", child)

    visit("", model)
    return groups


# What every nn.Module keeps in its __dict__ (weights, submodules, hooks: compared apart);
# anything else, private names included, is the module's own state.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"_compiled_call_impl"}


def _signature(module: torch.nn.Module):
    """What two blocks must share to trace alike: every submodule's class and state
    (position attributes aside), every weight's name, shape, dtype and requires_grad,
    and no hooks. None for a module that cannot be stamped (hooks, state not comparable)."""
    parts = []
    for name, sub in module.named_modules():
        if _has_hooks(sub, lambda hook: _recorder_key(hook) is not None):  # (per call)
            return None
        identity = not sub.training and _identity_in_eval(sub)
        state = []
        for key, value in sorted(vars(sub).items()):
            if key in _MODULE_INTERNALS or key in POSITION_ATTRIBUTES:
                continue
            if not sub.training and _steers_training_only(sub, key):
                continue
            if isinstance(value, torch.Tensor):
                return None  # a tensor attribute outside the state dict: values may differ
            state.append((key, _comparable(value)))
        parts.append(
            (name, IDENTITY_IN_EVAL if identity else type(sub), sub.training, tuple(state))
        )
    for name, t in itertools.chain(module.named_parameters(), module.named_buffers()):
        parts.append((name, tuple(t.shape), t.dtype, t.requires_grad, t.device.type))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


def _comparable(value):
    """``value`` as something hashable that is equal exactly when the values are, or
    its identity (a config object shared by every layer is the same object)."""
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device)):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_comparable(v) for v in value))
    return ("id", id(value))


def _identity_in_eval(module: torch.nn.Module) -> bool:
    """Whether ``module`` returns its input in eval mode: an ``nn.Identity``, a dropout, a
    drop-path module (``IDENTITY_IN_EVAL``); none with submodules."""
    if next(module.children(), None) is not None:
        return False
    if isinstance(module, (torch.nn.Identity, torch.nn.modules.dropout._DropoutNd)):
        return True
    return type(module).__name__.endswith("DropPath") and hasattr(module, "drop_prob")


def _steers_training_only(module: torch.nn.Module, key: str) -> bool:
    """Whether attribute ``key`` of ``module`` only matters while it trains."""
    if key in TRAINING_ATTRIBUTES:
        return True
    return key in ("p", "inplace") and isinstance(module, torch.nn.modules.dropout._DropoutNd)


def _hooked_inside(module: torch.nn.Module) -> bool:
    """Whether a hook would run inside ``module``'s call: on a submodule, or on every
    module (torch's global hooks). A copy would skip what such a hook does; an idle
    transformers recorder (``_idle_recorder``) does nothing."""
    from torch.nn.modules import module as torch_module

    global_hooks = ("_global_forward_hooks", "_global_forward_pre_hooks")
    if any(getattr(torch_module, name, None) for name in global_hooks):
        return True
    return any(_has_hooks(sub, _idle_recorder) for sub in module.modules() if sub is not module)


def _has_hooks(module: torch.nn.Module, ignored=lambda hook: False) -> bool:
    """Whether ``module`` has a hook, forward hooks for which ``ignored(hook)`` holds aside."""
    if any(not ignored(h) for h in getattr(module, "_forward_hooks", {}).values()):
        return True
    return any(
        getattr(module, name, None)
        for name in ("_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    )


def _recorder_key(hook):
    """The output a transformers recorder hook collects (``attentions``, say), or None for
    any other hook. transformers installs one on each module whose outputs a model can
    return (``output_attentions=True``), the first time a call asks for any of them."""
    code = getattr(hook, "__code__", None)
    module = getattr(hook, "__module__", None) or ""
    if code is None or code.co_name != "output_capturing_hook":
        return None
    if not module.startswith("transformers.") or "key" not in code.co_freevars:
        return None
    key = hook.__closure__[code.co_freevars.index("key")].cell_contents
    return key if isinstance(key, str) else None


def _idle_recorder(hook) -> bool:
    """Whether ``hook`` is a transformers recorder with nothing to record in this call: the
    call's collector (a context variable of its module) does not ask for its output."""
    key = _recorder_key(hook)
    if key is None:
        return False
    collector = getattr(sys.modules.get(hook.__module__), "_active_collector", None)
    if collector is None:
        return False
    try:
        asked = collector.get()
    except Exception:  # (another transformers: a real hook, as any other)
        return False
    return asked is None or key not in asked


@contextlib.contextmanager
def stamping(model: torch.nn.Module):
    """While capturing ``model``: each repeated block's first call traced between markers,
    later calls as ``block_copy`` ops. Yields the ``Stamping`` that ``splice`` takes."""
    result = Stamping()
    originals = []
    thread = threading.get_ident()  # (another thread running the model meanwhile runs it as is)
    try:
        for members in find_repeated_blocks(model):
            with _lock:
                group = Group(next(_ids), members)
                _groups[group.gid] = group
            result.groups.append(group)
            for name, module in members:
                originals.append((module, module.__dict__.get("forward")))
                module.forward = _stamped_forward(group, name, module, module.forward, thread)
        yield result
    finally:
        for module, before in reversed(originals):
            if before is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = before
        with _lock:
            for group in result.groups:
                _groups.pop(group.gid, None)


def _stamped_forward(group: Group, name: str, module: torch.nn.Module, forward, thread: int):
    def stamped(*args, **kwargs):
        if group.dead or threading.get_ident() != thread:
            return forward(*args, **kwargs)
        if _hooked_inside(module):  # (hooks installed while capturing: transformers' recorders)
            group.dead = group.dead or group.first is None
            return forward(*args, **kwargs)
        flat, spec = pytree.tree_flatten((args, kwargs))
        if not _plain_spec(spec) or not all(
            isinstance(x, torch.Tensor) or isinstance(x, _PLAIN) for x in flat
        ):
            return _traced(group, forward, args, kwargs)
        if group.first is None:
            return _first_call(group, name, forward, flat, spec)
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        if not _same_call(group.first, flat, spec) or _repeats_a_tensor(tensors):
            return forward(*args, **kwargs)  # traced as usual; the copies of the group go on
        weights = [t for _, t in _weights(module)]
        outs = iter(_COPY(tensors, weights, group.gid))
        group.copies += 1
        leaves = [next(outs) if v is _TENSOR else v for v in group.first.out_leaves]
        return pytree.tree_unflatten(leaves, group.first.out_spec)

    return stamped


def _traced(group: Group, forward, args, kwargs):
    if group.first is None:
        group.dead = True
    return forward(*args, **kwargs)


def _first_call(group: Group, name: str, forward, flat: list, spec):
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    if not tensors or _repeats_a_tensor(tensors):  # (`q is k` would read False inside)
        group.dead = True
        args, kwargs = pytree.tree_unflatten(flat, spec)
        return forward(*args, **kwargs)
    entered = _ENTER(tensors, group.gid)
    versions = [t._version for t in entered]
    inner = iter(entered)
    inner = [next(inner) if isinstance(x, torch.Tensor) else x for x in flat]
    args, kwargs = pytree.tree_unflatten(inner, spec)
    out = forward(*args, **kwargs)
    out_flat, out_spec = pytree.tree_flatten(out)
    out_tensors = [x for x in out_flat if isinstance(x, torch.Tensor)]
    ok = (
        versions == [t._version for t in entered]  # a block writing to its inputs: no
        and all(isinstance(x, torch.Tensor) or isinstance(x, _PLAIN) for x in out_flat)
        and _sizes_from(out_flat, flat)
    )
    if not ok:
        group.dead = True
        return out
    exited = iter(_EXIT(out_tensors, group.gid))
    out_flat = [next(exited) if isinstance(x, torch.Tensor) else x for x in out_flat]
    group.first = Call(
        spec,
        [_meta(x) if isinstance(x, torch.Tensor) else x for x in flat],
        out_spec,
        [_TENSOR if isinstance(x, torch.Tensor) else x for x in out_flat],
        [x for x in out_flat if isinstance(x, torch.Tensor)],
    )
    group.first_name = name
    return pytree.tree_unflatten(out_flat, out_spec)


def _repeats_a_tensor(tensors: list) -> bool:
    return len({id(t) for t in tensors}) < len(tensors)


def _plain_spec(spec: pytree.TreeSpec) -> bool:
    """Whether a call's inputs are built of tuples, lists and dicts only (a cache object or
    other mutable container would carry state the first call changes and a copy would not)."""
    if spec.is_leaf():
        return True
    return spec.type in _PLAIN_CONTAINERS and all(_plain_spec(c) for c in spec.children())


def _same_call(first: Call, flat: list, spec) -> bool:
    if spec != first.in_spec:
        return False
    for x, want in zip(flat, first.in_leaves):
        if isinstance(x, torch.Tensor):
            if not isinstance(want, _Meta) or _meta(x) != want:
                return False
        elif isinstance(want, _Meta) or not _same_scalar(x, want):
            return False
    return True


def _same_scalar(a, b) -> bool:
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return (
            isinstance(a, torch.SymInt)
            and isinstance(b, torch.SymInt)
            and (a.node.expr == b.node.expr)
        )
    return type(a) is type(b) and a == b


class _Meta(tuple):
    """A tensor's metadata among a call's leaves (``_meta``)."""


def _meta(t: torch.Tensor) -> _Meta:
    """A tensor's metadata in terms that compare symbolic sizes by expression."""
    return _Meta(
        (
            tuple(_size_key(s) for s in t.shape),
            # (a dim of size 1 is never stepped over: its stride is no difference)
            tuple(
                None if type(n) is int and n == 1 else _size_key(s)
                for n, s in zip(t.shape, t.stride())
            ),
            t.dtype,
            t.device,
            t.requires_grad,
        )
    )


def _size_key(s):
    if not isinstance(s, torch.SymInt):
        return s
    expr = s.node.expr  # (a marked dim torch fixed is a SymInt of a number: the number)
    return int(expr) if expr.is_number else ("sym", expr)


def _free_symbols(leaves) -> set:
    """The size symbols in tensors' shapes and strides, and in SymInt leaves."""
    out = set()
    for v in leaves:
        sizes = itertools.chain(v.shape, v.stride()) if isinstance(v, torch.Tensor) else (v,)
        for s in sizes:
            if isinstance(s, torch.SymInt):
                out |= s.node.expr.free_symbols
    return out


def _sizes_from(outputs, inputs) -> bool:
    """Whether the outputs' sizes (and sizes returned as numbers) are expressions of the
    inputs' alone, not of a size a data-dependent op made up inside the block, which each
    copy would have its own of."""
    return _free_symbols(outputs) <= _free_symbols(inputs)


def _weights(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A block's parameters and buffers in a fixed order (the same in every copy)."""
    return list(
        itertools.chain(
            module.named_parameters(remove_duplicate=False),
            module.named_buffers(remove_duplicate=False),
        )
    )


def splice(ep, stamp: Stamping, model: torch.nn.Module) -> int:
    """Replace every ``block_copy`` in ``ep``'s graph by its group's first call's nodes and
    drop the markers; the number of copies spliced."""
    graph = ep.graph
    holders = _weight_holders(ep, model)
    regions = _regions(graph)
    spliced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _COPY:
            continue
        xs, weights, gid = node.args
        enter, exit_, body = regions[gid]
        group = next(g for g in stamp.groups if g.gid == gid)
        template = dict(group.members)[group.first_name]
        env: dict[fx.Node, object] = {item: xs[k] for item, k in _items(enter).items()}
        for (_, t), w in zip(_weights(template), weights):
            for placeholder in holders.get(id(t), ()):
                if env.setdefault(placeholder, w) is not w:  # tied in the first, not here
                    raise Unstampable(f"{placeholder.name} is two weights of a copy")
        _check_closed(gid, body, env)
        _copy_nodes(graph, body, env, before=node)
        results = [env.get(a, a) for a in exit_.args[0]]
        for user in list(node.users):
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        spliced += 1
    markers = [n for n in graph.nodes if n.op == "call_function" and n.target in (_ENTER, _EXIT)]
    for marker in reversed(markers):
        for user in list(marker.users):
            user.replace_all_uses_with(marker.args[0][user.args[1]])
            graph.erase_node(user)
        graph.erase_node(marker)
    graph.eliminate_dead_code()  # (its Python is generated where it runs: capture_program)
    return spliced


def _copy_nodes(graph: fx.Graph, body: list[fx.Node], env: dict, before: fx.Node) -> None:
    """``body``'s nodes copied in order before ``before``, reading ``env``'s replacements
    (and adding each copy to it)."""
    with graph.inserting_before(before):
        for n in body:
            env[n] = graph.node_copy(n, lambda a: env.get(a, a))


class Unstampable(Exception):
    """A first call's nodes read a tensor that is neither its input nor a weight."""


def _regions(graph: fx.Graph) -> dict[int, tuple[fx.Node, fx.Node, list[fx.Node]]]:
    """Per group with a template: its enter and exit markers and the nodes traced between."""
    out, open_ = {}, {}
    for n in graph.nodes:
        if n.op == "call_function" and n.target is _ENTER:
            open_[n.args[1]] = (n, [])
        elif n.op == "call_function" and n.target is _EXIT and n.args[1] in open_:
            enter, body = open_.pop(n.args[1])
            items = _items(enter)
            out[n.args[1]] = (enter, n, [b for b in body if b not in items])
        else:
            for _, body in open_.values():
                body.append(n)
    return out


def _check_closed(gid: int, body: list[fx.Node], env: dict) -> None:
    """Whether the first call's nodes read nothing but its inputs, its own weights (both
    replaced by the copy's in ``env``), its own nodes and sizes. A placeholder or tensor
    from elsewhere (a parent's weight or a model input left on a shared object) could
    be another one for each call."""
    inside = set(body)
    for n in body:
        for a in n.all_input_nodes:
            if a in inside or a in env:
                continue
            if a.op == "placeholder" or isinstance(a.meta.get("val"), torch.Tensor):
                raise Unstampable(f"block {gid} reads {a.name}, not its input or own weight")


def _items(marker: fx.Node) -> dict[fx.Node, int]:
    """The ``getitem`` nodes that unpack a marker's list, by index."""
    return {u: u.args[1] for u in marker.users}


def _weight_holders(ep, model: torch.nn.Module) -> dict[int, list[fx.Node]]:
    """Each weight tensor (by identity) -> the placeholders that hold it: torch gives a
    weight tied under several names one placeholder per name, and a block's nodes may
    read any of them."""
    sig = ep.graph_signature
    fqns = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    out: dict[int, list[fx.Node]] = {}
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in fqns:
            name = fqns[n.name]
            try:
                t = model.get_parameter(name)
            except AttributeError:
                t = model.get_buffer(name)
            out.setdefault(id(t), []).append(n)
    return out
