"""The public entry points of plugin mode: optimize() and explain().

Sits on top of everything: capture (torch.export), plugin compilation, and the
returned ``nn.Module``. The TorchDynamo backend lives in ``plugin.dynamo_backend``.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import warnings

import torch
import torch.utils._pytree as pytree
from torch.nn.modules import module as _nn_module

from .config import Options
from .errors import AnyshapeError, CaptureError, InputError
from .frontends.torch.examples import (
    agrees_on_random_floats,
    agrees_with_eager,
    flatten_like,
    split_inputs,
    structure_error,
)
from .plugin.direct import FlatInputs, native_call, plan_direct
from .plugin.explain import ExplainReport
from .plugin.profile import ProfileReport
from .plugin.report import CompileReport
from .plugin.weights_watch import WeightsWatch, packs_repacked
from .stats import bump

# nn.Module's call path as torch defines it; torch.fx tracing patches it to record calls.
_MODULE_CALL = torch.nn.Module.__call__


def _user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the caller of this that names the
    first frame outside anyshape and torch.nn: the user's call, on any call path."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


_INTERNAL_DIRS = tuple(os.path.dirname(f) + os.sep for f in (__file__, torch.nn.__file__))


def _install_module_call() -> None:
    """``OptimizedModule.__call__`` in C (``plugin/modulecall.c``), once per process:
    a call without hooks or tracing then runs no Python frame (x + 1 on 16 elements:
    2.9 -> 2.1 us). The Python ``__call__`` stays as its general path."""
    if OptimizedModule.__dict__["__call__"] is not _PYTHON_CALL:
        return
    from .runtime.fastcall import fastcall

    module = fastcall()
    if module is None:
        return
    OptimizedModule.__call__ = module.ModuleCall(
        OptimizedModule,
        _PYTHON_CALL,
        OptimizedModule._forward_python,
        vars(_nn_module),
        torch.nn.Module,
        _MODULE_CALL,
        torch._C._get_tracing_state,
    )


class OptimizedModule(torch.nn.Module):
    """A model compiled by anyshape: call it with any shapes of the example's ranks and dtypes."""

    def __init__(
        self,
        graph_module: torch.fx.GraphModule,
        report: CompileReport,
        name: str,
        fastcall: bool = True,
    ):
        """``fastcall``: calls may take the C path of the fast-call extension (the option)."""
        super().__init__()
        self.graph_module = graph_module
        self.report = report
        self._name = name
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        self._names = [n.name for n in placeholders]
        self._examples = [n.meta.get("val") for n in placeholders]
        self._in_spec = getattr(graph_module, "_in_spec", None)
        self._flat_inputs = FlatInputs(self._in_spec)
        self._direct = plan_direct(graph_module)
        use = self._direct is not None and fastcall
        self._native_call = native_call(self._direct, self._flat_inputs) if use else None
        self._weights_watch = None
        if self._native_call is not None:
            _install_module_call()

    def watch_weights_of(self, model) -> None:
        """Keep packed weights (oneDNN convolutions) in step with ``model``'s in-place changes."""
        if isinstance(model, torch.nn.Module):
            self._weights_watch = WeightsWatch.attach(
                model, self.report.clusters, self.graph_module
            )

    @classmethod
    def restored(
        cls, direct, in_spec, report: CompileReport, graph_module, name: str, fastcall: bool = True
    ) -> OptimizedModule:
        """A module from the model cache: the direct call path, and the ``graph_module``
        (holding the model's tensors) a cold compile would have."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.graph_module = graph_module
        module.report = report
        module._name = name
        module._names = list(direct.prologue.names)
        module._examples = [torch.empty(0)] * len(module._names)  # every input is a tensor
        module._in_spec = in_spec
        module._flat_inputs = FlatInputs(in_spec)
        module._direct = direct
        module._native_call = native_call(direct, module._flat_inputs) if fastcall else None
        module._weights_watch = None
        if module._native_call is not None:
            _install_module_call()
        return module

    def __call__(self, *args, **kwargs):
        """``forward`` directly unless a hook, tracing (TorchScript, or torch.fx, which
        patches ``nn.Module.__call__``) or ``Module.compile`` needs ``nn.Module``'s own
        call path, which costs about 1 us: a third of a small model's whole call.
        Once the fast-call extension loads, ``plugin/modulecall.c`` takes these same
        decisions in C and calls this only when the answer is not its native call."""
        if (
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
            or _nn_module._global_forward_hooks
            or _nn_module._global_forward_pre_hooks
            or _nn_module._global_backward_hooks
            or _nn_module._global_backward_pre_hooks
            or self._compiled_call_impl is not None
            or torch._C._get_tracing_state()
            or torch.nn.Module.__call__ is not _MODULE_CALL
        ):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self._weights_watch is not None:
            self._weights_watch()
        if self._native_call is not None:
            result = self._native_call(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return self._forward_python(*args, **kwargs)

    _guard_variants = None  # GuardVariants, once recompiles_on_guard_failure() ran

    def recompiles_on_guard_failure(self, model, dynamic_shapes, options: Options) -> None:
        """Compile ``model`` again for a call that fails a guard of this graph (a case
        its capture did not see) instead of refusing it; see ``plugin/guard_variants.py``."""
        from .plugin.guard_variants import GuardVariants

        def compile_variant(args, kwargs):
            gm, report = _compile(model, args, kwargs, dynamic_shapes, options)
            variant = OptimizedModule(gm, report, self._name, options.fastcall)
            variant.watch_weights_of(model)
            variant.bind_signature_of(model)
            return variant

        self._guard_variants = GuardVariants(compile_variant, self.report.facts)

    def _forward_python(self, *args, **kwargs):
        """``forward`` past the native call (which declined these inputs, or is absent);
        a call outside this graph's guards runs the guard variant for its case."""
        try:
            return self._forward_checked(*args, **kwargs)
        except InputError as e:
            from .plugin.guard_variants import failed_guard

            if self._guard_variants is None or not failed_guard(e):
                raise
            return self._guard_variants(e, args, kwargs)

    def _forward_checked(self, *args, **kwargs):
        flat = self._flat_inputs(args, kwargs) if self._direct is not None else None
        rebound = self._rebind(args, kwargs) if flat is None else None
        if rebound is not None:
            return self.forward(*rebound[0], **rebound[1])
        if not self._warned_grad and torch.is_grad_enabled():
            self._warn_if_grad_wanted(
                flat if flat is not None else pytree.tree_leaves((args, kwargs))
            )
        if flat is not None:
            return self._direct(flat)
        self._check_structure(args, kwargs)
        if self.graph_module is None:
            raise InputError(f"compiled {self._name} cannot take inputs structured like these")
        return self.graph_module(*args, **kwargs)

    _warned_grad = False  # per instance once set
    _positional: tuple[str, ...] | None = None  # forward's positional parameter names

    def _rebind(self, args, kwargs) -> tuple[tuple, dict] | None:
        """The call's inputs passed the way the example passed them, by the model's
        ``forward`` signature: ``m(x)`` for a model compiled from ``{"x": ...}``, or
        ``m(x=x)`` for one compiled from ``(x,)``. ``None`` when they already are (or
        cannot be): then the structure check names what is wrong."""
        if self._positional is None or self._in_spec is None:
            return None
        args_spec, kwargs_spec = self._in_spec.children()
        n, names = args_spec.num_children, kwargs_spec.context
        if len(args) == n and set(kwargs) == set(names):
            return None
        if len(args) > len(self._positional) or n > len(self._positional):
            return None  # (forward(x, *rest): positions without names)
        given = dict(zip(self._positional, args))
        if any(k in given for k in kwargs):
            return None  # one input given twice: the structure check says so
        given.update(kwargs)
        order = self._positional[:n]
        if set(given) != {*order, *names}:
            return None
        return tuple(given[k] for k in order), {k: given[k] for k in names}

    def bind_signature_of(self, model) -> None:
        """Accept calls that pass ``model``'s inputs positionally or by keyword, either way
        (the example's way is the fast one: the other is rearranged in Python, ~3 us)."""
        try:
            params = inspect.signature(getattr(model, "forward", model)).parameters.values()
        except (TypeError, ValueError):  # no signature: calls must match the example
            return
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._positional = tuple(p.name for p in params if p.kind in kinds)

    def _warn_if_grad_wanted(self, leaves) -> None:
        """Compiled code is inference only: say so once when an input asks for gradients
        (the native call declines such inputs, so every one of them comes here)."""
        if any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves):
            self._warned_grad = True
            warnings.warn(
                f"anyshape: compiled {self._name} runs inference only; an input requires "
                "grad, but what anyshape computes carries no gradient (autograd does not "
                "see compiled code). Call it under torch.no_grad() or "
                "torch.inference_mode(), or detach the inputs; for gradients use "
                "anyshape.optimize(model, example_inputs, training=True).",
                stacklevel=_user_stacklevel(),
            )

    def _check_structure(self, args, kwargs) -> None:
        """Inputs must have the example's structure, with a tensor at every leaf."""
        flat = flatten_like(args, kwargs, self._in_spec)
        if flat is None or len(flat) != len(self._names):
            raise structure_error(self._name, self._names, args, kwargs)
        for name, leaf, example in zip(self._names, flat, self._examples):
            if isinstance(example, torch.Tensor):
                if not isinstance(leaf, torch.Tensor):
                    raise InputError(f"input {name!r} must be a tensor, got {type(leaf).__name__}")
            elif leaf != example:
                raise InputError(
                    f"input {name!r} was {example!r} when the model was compiled and is "
                    f"compiled in as a constant; got {leaf!r} (compile again for that value)"
                )

    def explain(self) -> ExplainReport:
        return ExplainReport(self.report)

    def profile(self) -> ProfileReport:
        """Kernel timings since the last ``profile()`` (needs the ``profile`` option)."""
        return ProfileReport([t for c in self.report.clusters for t in c.compiled.read_profile()])


_PYTHON_CALL = OptimizedModule.__call__  # the general path of the C __call__


def _compile(model, args: tuple, kwargs: dict, dynamic_shapes, options: Options):
    from .gc_pause import collection_paused
    from .plugin.pytree_types import exportable_caches

    with exportable_caches(), collection_paused():
        return _capture_and_compile(model, args, kwargs, dynamic_shapes, options)


def _capture_and_compile(model, args: tuple, kwargs: dict, dynamic_shapes, options: Options):
    """Capture and compile, checked against eager on the user's example where the capture
    was widened, grown (``example_growth.py``) or copied repeated blocks
    (``repeated_blocks.py``); counted once."""
    from .frontends.torch.capture import capture_export, needs_widening, widen_example
    from .frontends.torch.example_growth import MAX_GROWTH, grown_example, pinned_symbols, serves
    from .plugin.compile import compile_graph  # (not needed by a model the cache restores)

    def capture(cap_args, cap_kwargs, shapes, repeats: bool, grow: bool):
        """The capture and the example it came from, grown while torch fixed a size
        derived from it to 1 (then the third value is True)."""
        captured = capture_export(
            model, cap_args, cap_kwargs, shapes, repeats=repeats, check_repeats=False
        )
        grown = False
        for _ in range(MAX_GROWTH if grow and shapes is None else 0):
            pinned = pinned_symbols(captured.guards)
            more = pinned and grown_example(captured.exported, cap_args, cap_kwargs, pinned)
            if not more:
                break
            try:
                wider = capture_export(model, *more, shapes, repeats=repeats, check_repeats=False)
            except AnyshapeError:  # (the grown example is not one the model takes)
                break
            if not serves(wider, args, kwargs):  # (its ranges or guards refuse the
                captured.refused_growth = True  # user's example: not compiled)
                break
            wider.seconds += captured.seconds
            captured, (cap_args, cap_kwargs), grown = wider, more, True
        return captured, (cap_args, cap_kwargs), grown

    def capture_and_compile(cap_args, cap_kwargs, shapes, repeats: bool, grow: bool = True):
        captured, used, grown = capture(cap_args, cap_kwargs, shapes, repeats, grow)
        gm, report = compile_graph(
            captured.gm,
            captured.symbol_ranges,
            options,
            with_prologue=True,
            count=False,
            guards=captured.guards,
            capture_seconds=captured.seconds,
        )
        _note_repeats(report, captured)
        if grown:
            report.facts.append("capture: example grown where a size derived from it was 1")
        if captured.refused_growth:
            report.facts.append(
                "capture: sizes derived from the example kept (the grown capture's guards"
                " refuse the example)"
            )
        return gm, report, captured.stamped, used, grown

    def checked(gm, report, stamped: bool) -> bool:
        packs_repacked(report.clusters)  # (as a restore's check: copies may be stale)
        return agrees_with_eager(model, gm, args, kwargs) and (
            not stamped or agrees_on_random_floats(model, gm, args, kwargs)
        )

    tries = [True, False] if options.trace_repeats else [False]
    if dynamic_shapes is None and needs_widening((args, kwargs)):
        wide = widen_example(args), widen_example(kwargs)
        try:
            for repeats in tries:  # (copies that disagree: again with every call traced)
                gm, report, stamped, used, _ = capture_and_compile(*wide, None, repeats)
                if checked(gm, report, stamped):
                    bump("compilations")
                    _locate_fallbacks(report, model, *used, None, repeats)
                    return gm, report
                if not stamped:
                    break
        except AnyshapeError:
            pass
        notes = ["example dims of size 0/1 kept specialized (widened capture disagreed)"]
    else:
        notes = []
    grow = dynamic_shapes is None
    for repeats in tries:
        gm, report, stamped, used, grown = capture_and_compile(
            args, kwargs, dynamic_shapes, repeats, grow
        )
        if grown and not checked(gm, report, stamped):
            notes.append("capture: sizes derived from the example kept (grown capture disagreed)")
            grow = False
            gm, report, stamped, used, _ = capture_and_compile(
                args, kwargs, dynamic_shapes, repeats, grow
            )
        if not stamped or agrees_on_random_floats(model, gm, args, kwargs):
            break
        notes.append("capture: every call of repeated blocks traced (copies disagreed with eager)")
    bump("compilations")
    report.facts += notes
    _locate_fallbacks(report, model, *used, dynamic_shapes, repeats)
    return gm, report


def _note_repeats(report, captured) -> None:
    if captured.stamped:
        report.facts.append(
            f"capture: {captured.stamped} calls of repeated blocks copied from the first call "
            f"of their block (trace_repeats)"
        )


def _locate_fallbacks(
    report, model, args: tuple, kwargs: dict, dynamic_shapes, repeats: bool
) -> None:
    """Give the report's fallbacks the model's source lines: the capture recorded no
    stack traces (``capture_export``), so one that does names them, by node name."""
    from dataclasses import replace

    from .frontends.torch.capture import source_lines

    if report.fallbacks:
        lines = source_lines(model, args, kwargs, dynamic_shapes, repeats)
        report.fallbacks = [
            replace(f, location=lines.get(f.node.name, f.location)) for f in report.fallbacks
        ]


def optimize(
    model: torch.nn.Module, example_inputs, *, dynamic_shapes=None, training=False, **options
) -> OptimizedModule:
    """Compile ``model`` once for every input shape of the examples' ranks and dtypes.

    ``example_inputs`` is a tuple of positional inputs, a dict of keyword inputs,
    or ``(args, kwargs)``. Every dim is dynamic unless ``dynamic_shapes`` (as for
    ``torch.export``) says otherwise. Options: see ``anyshape.config.Options``.
    A model torch.export cannot capture runs through TorchDynamo instead
    (``plugin/dynamo_capture.py``): each graph compiled, graph breaks in PyTorch.

    ``training=True`` compiles the forward and the backward (the model stays in
    training mode; dropout is compiled): the returned module's outputs carry
    gradients to the model's own parameters (``plugin/training.py``).
    """
    from .codegen.registry import backend_named
    from .plugin import model_cache
    from .plugin.pytree_types import register_model_types

    register_model_types(model)  # (before the model cache: restored outputs may hold them)
    opts = Options.from_env(**options)
    backend_named(opts.backend).warm_up(opts)  # (one-time library work, on a free core)
    if training:
        from .plugin.pytree_types import exportable_caches
        from .plugin.training import optimize_for_training

        def compile_eval(args, kwargs):
            return optimize(model, (args, kwargs), dynamic_shapes=dynamic_shapes, **options)

        args, kwargs = split_inputs(example_inputs)
        with exportable_caches():
            return optimize_for_training(model, args, kwargs, dynamic_shapes, opts, compile_eval)
    if isinstance(model, torch.nn.Module):
        model.eval()
    name = type(model).__name__
    args, kwargs = split_inputs(example_inputs)
    key = None
    if opts.model_cache:
        key = model_cache.fingerprint(model, args, kwargs, dynamic_shapes, opts)
    if key is not None:
        start = time.perf_counter()
        restored = model_cache.restore(key, model, opts)
        if restored is not None:
            direct, in_spec, report, graph_module = restored
            report.add_time("model cache restore", time.perf_counter() - start)
            module = OptimizedModule.restored(
                direct, in_spec, report, graph_module, name, opts.fastcall
            )
            module.bind_signature_of(model)
            # (Checked before the weights are watched, as a cold compile's capture is: the
            # check's call packs no copy of them for a route no request may take. Copies
            # another module of this library packed are made again, in case they are
            # stale.)
            packs_repacked(report.clusters)
            if agrees_with_eager(model, module, args, kwargs):
                module.watch_weights_of(model)
                module.recompiles_on_guard_failure(model, dynamic_shapes, opts)
                bump("compilations")
                bump("model_cache_hits")
                bump("clusters")
                bump("compiled_ops", sum(module.report.clusters[0].aten_ops.values()))
                return module
            model_cache.drop(key, opts)
    try:
        gm, report = _compile(model, args, kwargs, dynamic_shapes, opts)
    except CaptureError as e:  # what torch.export cannot capture runs through TorchDynamo
        from .plugin.dynamo_capture import DynamoModule

        module = DynamoModule(model, str(e).splitlines()[0], opts, name)
        module.warm_up(args, kwargs)
        return module
    module = OptimizedModule(gm, report, name, opts.fastcall)
    module.watch_weights_of(model)
    module.bind_signature_of(model)
    module.recompiles_on_guard_failure(model, dynamic_shapes, opts)
    if key is not None:
        model_cache.store(key, model, module, opts)
    return module


def explain(
    model: torch.nn.Module, example_inputs, *, dynamic_shapes=None, **options
) -> ExplainReport:
    """What anyshape compiles for ``model``: clusters, fallbacks with reasons, op counts."""
    return optimize(model, example_inputs, dynamic_shapes=dynamic_shapes, **options).explain()
