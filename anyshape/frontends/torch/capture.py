"""Capture a PyTorch model as an FX graph of core ATen ops with symbolic sizes.

First stage of the torch frontend (plugin and standalone modes): ``torch.export``
with every dim of every tensor input marked ``Dim.AUTO`` (or the user's
``dynamic_shapes``), then ``run_decompositions()`` to core ATen. The result is
the unlifted GraphModule (weights as ``get_attr``), the flat input names, and
the symbol ranges torch inferred, with lower bounds relaxed to 0: export
records ``[2, inf]`` for a dim it saw at 2 or more, yet sizes 0 and 1 are valid
values of a symbolic dim (a run-time broadcast decision, not a new graph).
Of torch's guards only those the graph depends on are kept (``export_guards.py``),
and sizes torch derived under a guard are read as exact expressions
(``size_rewrites.py``); ``slice_size_guards`` adds the conditions of slice sizes
torch fixed by assuming dims of 2 or more.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import operator
import time
import warnings
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.fx.config

from ...errors import CaptureError, UnsupportedError, first_line
from ...ir.constraints import Guard
from .eager_checks import eager_checks
from .eager_checks import guards as eager_guards
from .export_guards import export_guards, finite_int, shape_env_of, slice_size_guards
from .fake_cache_off import fake_tensor_cache_off
from .fresh_writes import rewrite_fresh_writes
from .lean_metadata import lean_tensor_metadata
from .size_rewrites import register_size_rewrites
from .symbols import to_dim
from .traced_forms import restore_traced_forms, traced_forms


@dataclass
class Captured:
    gm: fx.GraphModule
    symbol_ranges: dict[str, tuple[int, int | None]]
    exported: object  # the ExportedProgram
    guards: list[Guard]  # shape guards torch.export relied on, checked on every call
    decomposed: bool = True  # False: lowered as exported, run_decompositions skipped
    seconds: float = 0.0  # how long capture_export took (explain()'s compile time)
    stamped: int = 0  # calls of repeated blocks copied from a first call (repeated_blocks.py)
    # the capture of a grown example refused this one's example (example_growth.serves)
    refused_growth: bool = False


# Composite ops kept whole: anyshape lowers them itself (one fused attention
# later), and torch 2.13's own decomposition of SDPA under symbolic sizes makes
# fake strides that later views reject (GPT-2 fails to capture with it). The
# upsampling ops (``aten/resample.py``): their decompositions under symbolic sizes
# take seconds to trace (bicubic: 16 gathers and 34 clamps). Pixel (un)shuffle: traced
# opaque (``opaque_ops.py``), lowered as a reshape, a transpose and a reshape.
KEEP_WHOLE = (
    "scaled_dot_product_attention.default",
    "pixel_shuffle.default",
    "pixel_unshuffle.default",
)


def decomposition_table() -> dict:
    """torch.export's core-ATen decompositions minus the composites anyshape keeps whole
    (``KEEP_WHOLE`` and the upsampling ops ``aten/resample.py`` lowers)."""
    from .aten.resample import UPSAMPLE_OPS  # (the lowering table: imported to capture)

    upsampling = tuple(
        str(getattr(packet, overload)).removeprefix("aten.")
        for packet, _, _ in UPSAMPLE_OPS
        for overload in ("default", "vec")
    )
    return without_ops(torch.export.default_decompositions(), KEEP_WHOLE + upsampling)


def without_ops(table: dict, names: tuple[str, ...]) -> dict:
    """``table`` (a decomposition table) with the ATen overloads ``names`` kept whole."""
    for name in names:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return table


def _auto_dynamic(value):
    from torch.export import Dim

    if isinstance(value, torch.Tensor):
        return {i: Dim.AUTO for i in range(value.dim())} if value.dim() else None
    if isinstance(value, (list, tuple)):
        return type(value)(_auto_dynamic(v) for v in value)
    if isinstance(value, dict):
        return {k: _auto_dynamic(v) for k, v in value.items()}
    node = torch.utils._pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:  # a registered type (a transformers cache): its children's dims
        children, _ = node.flatten_fn(value)
        return [_auto_dynamic(c) for c in children]
    return None


def default_dynamic_shapes(model, args: tuple, kwargs: dict):
    """Every dim of every tensor input dynamic, keyed the way torch.export expects."""
    try:
        sig = inspect.signature(getattr(model, "forward", model))
    except (TypeError, ValueError):  # no signature to read: positions as given
        return tuple(_auto_dynamic(a) for a in args)
    variadic = {p.kind for p in sig.parameters.values()} & {
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    }
    if not kwargs and not variadic:
        return tuple(_auto_dynamic(a) for a in args)
    bound = sig.bind_partial(*args, **kwargs)
    # torch.export wants `*rest` as a tuple and `**extra` as a dict, as forward receives them
    return {name: _auto_dynamic(v) for name, v in bound.arguments.items()}


def widen_example(value):
    """The example with every dim of size 0 or 1 grown to 2 (by repetition, or zeros).

    torch.export specializes parts of a graph on example dims of 1 (e.g. a view
    guarded ``64*s0 == 64``) even when they are marked dynamic, so anyshape
    traces with widened examples; ``optimize`` then checks the compiled model
    against eager on the user's own example and recaptures from it if they differ.
    """
    if isinstance(value, torch.Tensor):
        for d, n in enumerate(value.shape):
            if n == 0:
                shape = list(value.shape)
                shape[d] = 2
                value = value.new_zeros(shape)
            elif n == 1:
                value = torch.cat([value, value], dim=d)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(widen_example(v) for v in value)
    if isinstance(value, dict):
        return {k: widen_example(v) for k, v in value.items()}
    return value


def needs_widening(value) -> bool:
    leaves = torch.utils._pytree.tree_leaves(value)
    return any(isinstance(t, torch.Tensor) and any(n < 2 for n in t.shape) for t in leaves)


class _SizeOneSpecialization(logging.Filter):
    """Drops torch.export's warning for each example dim of size 1 that it keeps static
    though marked ``Dim.AUTO`` (an attention mask's [b, 1, 1, s]). When anyshape marked
    the dims itself, the message would blame the user; the graph's types and
    ``explain()`` show which dims are static."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "0/1 specialized" not in record.getMessage()


@contextlib.contextmanager
def _quiet_specialization_log(quiet: bool):
    logger = logging.getLogger("torch._export.non_strict_utils")
    dropped = _SizeOneSpecialization()
    if quiet:
        logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def capture_export(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    dynamic_shapes=None,
    *,
    stack_traces: bool = False,
    repeats: bool = True,
    check_repeats: bool = True,
) -> Captured:
    """torch.export + decomposition to core ATen, with actionable errors.

    ``repeats``: trace one call of each repeated block and copy it to the others
    (``repeated_blocks.py``; the ``trace_repeats`` option). A capture with copies is
    compared with the model on the example unless ``check_repeats=False`` (then
    ``Captured.stamped`` tells the caller to compare what it compiled).

    ``stack_traces``: record each node's Python stack (``node.meta["stack_trace"]``),
    which names the model's source line of an op anyshape cannot lower. Recording
    costs a tenth to a fifth of the capture (T5-small: 0.5 of 2.9 s), so it is off
    unless asked for; ``source_lines`` and ``with_source_lines`` capture again with
    it where a line is reported.
    """
    start = time.perf_counter()
    with _recording_stack_traces(stack_traces), _python_code_when_run():
        captured = (
            _stamped_capture(model, args, kwargs, dynamic_shapes, check_repeats)
            if repeats
            else None
        )
        if captured is None:  # nothing repeats, or the stamped program is not the model's
            captured = capture_program(_export(model, args, kwargs, dynamic_shapes), _name(model))
    captured.seconds = time.perf_counter() - start
    return captured


def _name(model) -> str:
    return type(model).__name__


def _stamped_capture(
    model, args: tuple, kwargs: dict | None, dynamic_shapes, check: bool
) -> Captured | None:
    """The capture with each repeated block traced once (``repeated_blocks.py``); None where
    no block repeats or (``check``) the program is not the model's on the example."""
    from .examples import agrees_on_random_floats
    from .repeated_blocks import stamped_capture

    def agrees(captured: Captured) -> bool:
        # The same ATen ops as the model ran, so a tight tolerance: a copy that should
        # have differed (a layer's index steering its ops) differs by far more.
        return agrees_on_random_floats(model, captured.gm, args, kwargs or {}, 1e-5)

    return stamped_capture(
        model,
        lambda: _export(model, args, kwargs, dynamic_shapes),
        lambda ep: capture_program(ep, _name(model)),
        agrees if check else None,
    )


def _python_code_when_run():
    """torch.fx's lazy graph modules for the capture's own graphs: the Python code of a
    graph module the tracers make along the way is generated when it is first run, not
    each time its graph is set (ResNet-50: 11 generations, 0.10 s, down to 6, 0.06 s).
    Inductor compiles under the same switch; where a torch lacks it, a plain context."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


@contextlib.contextmanager
def _recording_stack_traces(record: bool):
    """torch's tracers record stack traces or not, for this capture (a capture in another
    thread meanwhile records the same way: only its error messages differ)."""
    config = torch.fx.config
    before = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = not record
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def source_lines(
    model, args: tuple, kwargs: dict | None = None, dynamic_shapes=None, repeats: bool = True
) -> dict:
    """Node name -> the model's source line that made it, from a capture recording stack
    traces (the same model, inputs and ``repeats`` capture to the same node names)."""
    from .lowering import source_location

    gm = capture_export(model, args, kwargs, dynamic_shapes, stack_traces=True, repeats=repeats).gm
    return {n.name: source_location(n) for n in gm.graph.nodes}


def with_source_lines(build, capture):
    """``build(capture(stack_traces=False))``; when that raises ``UnsupportedError``,
    ``build`` runs again on a capture with stack traces, so the error raised names
    the model's source lines (the recording is paid on that path only)."""
    try:
        return build(capture(stack_traces=False))
    except UnsupportedError:
        return build(capture(stack_traces=True))


def capture_export_for_training(
    model: torch.nn.Module, args: tuple, kwargs: dict | None = None, dynamic_shapes=None
) -> Captured:
    """torch.export with autograd on, not decomposed: the graph AOTAutograd differentiates
    (and decomposes) for ``plugin/training.py``; symbol ranges and guards as for inference."""
    ep = _export(model, args, kwargs, dynamic_shapes, grad=True)
    return capture_program(ep, type(model).__name__, decompose=False)


def _export(model, args: tuple, kwargs: dict | None, dynamic_shapes, grad: bool = False):
    kwargs = kwargs or {}
    ours = dynamic_shapes is None
    if ours:
        dynamic_shapes = default_dynamic_shapes(model, args, kwargs)
    grad_mode = contextlib.nullcontext() if grad else torch.no_grad()
    try:
        with (
            grad_mode,
            _quiet_specialization_log(ours),
            traced_forms(opaque=not grad),
            eager_checks() as checks,
            fake_tensor_cache_off(),
            lean_tensor_metadata() if not grad else contextlib.nullcontext(),
        ):
            ep = torch.export.export(
                model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False
            )
        restore_traced_forms(ep)
        ep._anyshape_eager_checks = checks  # (``capture_program`` makes them guards)
    except Exception as e:  # torch raises many types here; all mean "could not capture"
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(e).__name__}: "
            f"{first_line(e)}\n  Try: make Python control flow independent of tensor values and "
            f"sizes, pass example inputs of a shape you serve, give explicit dynamic_shapes=, "
            f"or use torch.compile(model, backend='anyshape'), which runs uncapturable Python "
            f"in PyTorch and compiles the rest."
        ) from e
    return ep


def capture_program(ep, name: str = "the program", decompose: bool | None = None) -> Captured:
    """An ExportedProgram's graph, symbol ranges and guards, in ATen anyshape lowers
    (``decompose=False``: as exported, whatever its ops, for a caller that decomposes).

    When anyshape has a lowering for every op of the program as exported, it is
    lowered as it is; otherwise it is decomposed to core ATen first. Decomposing
    re-traces the whole program (BERT-base: 3.6 s of a 7.7 s cold compile), and
    the ops as exported (``linear``, ``layer_norm``, ``gelu``, ``embedding``,
    ``scaled_dot_product_attention``) are the ones anyshape fuses best anyway.
    """
    checks = eager_guards(ep, getattr(ep, "_anyshape_eager_checks", ()))
    rewritten = decompose is None and rewrite_fresh_writes(ep.graph)
    decomposed = not lowers_as_exported(ep.graph) if decompose is None else decompose
    if rewritten or decomposed:
        # The graph's Python, for a program decomposed (torch runs it) or the caller's
        # own; ``ep.module()`` generates its own from the graph. The capture's edits
        # (markers, copies, batch norm restored) are not regenerated before this.
        ep.graph_module.recompile()
    if decomposed:
        ep = _decompose(ep, name)
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        name = str(sym)
        ranges[name] = (0, finite_int(vr.upper))
    gm = ep.module()
    if not decomposed:
        _drop_metadata_asserts(gm)
    env = shape_env_of(ep)
    exact_pools = register_size_rewrites(env, ep.graph) if env is not None else False
    guards = export_guards(ep, exact_pools)
    known = {str(g) for g in guards}
    guards += [g for g in slice_size_guards(gm) + checks if str(g) not in known]
    return Captured(gm, ranges, ep, guards, decomposed)


# Checks torch.export leaves on a ``.to(dtype)``: a tensor's dtype, device and layout,
# which the traced types already fix. They return nothing and are dropped.
_METADATA_ASSERTS = (torch.ops.aten._assert_tensor_metadata.default,)


def lowers_as_exported(graph: fx.Graph) -> bool:
    """Whether every op of ``graph`` has an anyshape lowering (shape arithmetic on sizes
    and metadata asserts aside) and none writes to its operands (``x.add_(1)``, batch
    norm updating its running statistics), so decomposing the program first (which also
    makes such writes functional) can be skipped."""
    from . import aten  # noqa: F401  (registers the lowering rules)
    from .lowering import LOWERINGS

    for n in graph.nodes:
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return False
        rule = LOWERINGS.get(n.target)
        if rule is not None and (rule.covers_as_exported is None or rule.covers_as_exported(n)):
            continue
        if rule is None and (n.target is operator.getitem or n.target in _METADATA_ASSERTS):
            continue
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        if rule is not None or any(isinstance(v, torch.Tensor) for v in vals):
            return False
    return True


def _drop_metadata_asserts(gm: fx.GraphModule) -> None:
    dropped = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in _METADATA_ASSERTS and not n.users
    ]
    for n in dropped:
        gm.graph.erase_node(n)
    if dropped:
        gm.recompile()


def _decompose(ep, name: str):
    try:
        with torch.no_grad(), warnings.catch_warnings(), fake_tensor_cache_off():
            # torch's own deepcopy of its output spec warns about its own deprecated API
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return ep.run_decompositions(decomposition_table())
    except Exception as e:  # as above: any failure means the program cannot be lowered
        raise CaptureError(
            f"could not decompose {name} to core ATen: {type(e).__name__}: {e}"
        ) from e


def placeholder_shapes(gm: fx.GraphModule) -> list[tuple[fx.Node, object]]:
    """(placeholder, fake value) for every input of ``gm``."""
    return [(n, n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]


def symbol_sources(gm: fx.GraphModule) -> dict[str, tuple[fx.Node, int]]:
    """For each symbol that is a whole input dim: the first (placeholder, dim) carrying it."""
    out: dict[str, tuple[fx.Node, int]] = {}
    for node, val in placeholder_shapes(gm):
        if isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                dim = to_dim(s)
                if not isinstance(dim, int) and dim.is_symbol:
                    out.setdefault(dim.symbol_name, (node, d))
        elif isinstance(val, torch.SymInt):
            dim = to_dim(val)
            if not isinstance(dim, int) and dim.is_symbol:
                out.setdefault(dim.symbol_name, (node, -1))
    return out
