"""The TorchDynamo backend: ``torch.compile(model, backend="anyshape")``.

Sits beside ``api.optimize`` as the second entry into plugin mode. Dynamo hands
over FX graphs with symbolic sizes; AOTAutograd decomposes them to core ATen
(the same op set torch.export produces), and each forward graph is compiled by
``compile_graph`` (one compilation per graph Dynamo hands over). When gradients
are needed AOTAutograd partitions the joint graph: the forward returns what the
backward reads (saved activations, sizes), and the backward graph is compiled
the same way, with the same symbolic sizes (``stats()["backward_compilations"]``).
A graph without gradients goes to AOTAutograd's inference compiler, which compiles
the module's parameters in as the model's weights (``dynamo_weights.py``).

Sizes 0 and 1: Dynamo specializes them (a graph traced at batch 4 guards
``batch != 1``), so a stream that later sends batch 1 gets a second graph from
Dynamo, and each graph Dynamo hands over is one anyshape compilation. Tracing
size-oblivious (``torch.fx.experimental._config.backed_size_oblivious``) would
avoid that, but with torch 2.13 it breaks transformers' SDPA attention
(``is_causal`` becomes a SymBool; mask broadcasting fails in fake tensors) and
views still guard ``64*s0 != 64``; so this backend leaves Dynamo's defaults
alone. ``anyshape.optimize`` captures once for every size, 0 and 1 included.
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from ..codegen.registry import backend_named
from ..config import Options
from ..stats import bump
from .compile import compile_graph
from .dynamo_weights import frozen_candidates


def _symbol_ranges(example_inputs) -> dict[str, tuple[int, int | None]]:
    from torch._guards import detect_fake_mode

    from ..frontends.torch.export_guards import finite_int

    fake_mode = detect_fake_mode(example_inputs)
    env = getattr(fake_mode, "shape_env", None) if fake_mode is not None else None
    if env is None:
        return {}
    return {str(s): (0, finite_int(vr.upper)) for s, vr in env.var_to_range.items()}


def compile_forward(gm: torch.fx.GraphModule, example_inputs, options: Options):
    """One AOTAutograd forward graph compiled in place: ``(gm, CompileReport)``."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd may call this with its fake mode still active; the graph's real
    # constants (GPT-2's ``tensor([])``) are read as weights, outside that mode.
    with unset_fake_temporarily():
        return compile_graph(gm, _symbol_ranges(example_inputs), options, with_prologue=False)


def _make_forward_compiler(options: Options):
    def fw_compiler(gm: torch.fx.GraphModule, example_inputs):
        gm, _ = compile_forward(gm, example_inputs, options)
        return make_boxed_func(gm.forward)

    return fw_compiler


def _make_inference_compiler(options: Options, weights: dict, dynamo_inputs: int):
    """AOTAutograd's compiler for a graph without gradients: the forward compiler, with
    ``weights`` (Dynamo's parameter inputs, ``dynamo_weights.frozen_candidates``) compiled
    in as constants where they line up with the graph's inputs."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .dynamo_weights import FrozenCall, aligned, freeze
    from .weights_watch import WeightsWatch

    forward = _make_forward_compiler(options)

    def inference_compiler(gm: torch.fx.GraphModule, example_inputs):
        frozen = aligned(weights, example_inputs, dynamo_inputs)
        if not frozen:
            return forward(gm, example_inputs)
        ranges = _symbol_ranges(example_inputs)
        rest = [e for k, e in enumerate(example_inputs) if k not in frozen]
        with unset_fake_temporarily():  # (the parameters are real tensors)
            constant = freeze(gm, frozen)  # (a copy: ``gm`` stays for the general compile)
        compiled, report = compile_forward(constant, rest, options)
        watch = WeightsWatch.attach(compiled, report.clusters, compiled)
        if watch is not None and watch.unresolved:
            return forward(gm, example_inputs)  # (a packed weight it cannot watch)

        def unfrozen():
            with unset_fake_temporarily():
                general, _ = compile_graph(gm, ranges, options, with_prologue=False)
            return make_boxed_func(general.forward)

        return FrozenCall(make_boxed_func(compiled.forward), frozen, watch, unfrozen)

    return inference_compiler


def compile_backward(gm: torch.fx.GraphModule, example_inputs, options: Options):
    """One AOTAutograd backward graph compiled in place: ``(gm, CompileReport)``.

    Its inputs are the forward's saved tensors and sizes and the output gradients;
    its sizes are the forward's symbols, so one backward serves every shape the
    forward serves. Counted in ``backward_compilations``, not ``compilations``.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        gm, report = compile_graph(
            gm, _symbol_ranges(example_inputs), options, with_prologue=False, count=False
        )
    bump("backward_compilations")
    return gm, report


def _make_backward_compiler(options: Options):
    def bw_compiler(gm: torch.fx.GraphModule, example_inputs):
        gm, _ = compile_backward(gm, example_inputs, options)
        return make_boxed_func(gm.forward)

    return bw_compiler


# Fused ops whose torch decomposition changes what their outputs mean. AOTAutograd
# decomposes below autograd: the backward graph still calls the fused op's own backward,
# fed with the forward's saved outputs. torch decomposes the CPU flash attention op (which
# ``F.scaled_dot_product_attention`` becomes) into the math attention and returns the
# attention weights where the op returns its logsumexp; its backward
# (``_scaled_dot_product_flash_attention_for_cpu_backward``) then reads those weights as
# the logsumexp and every gradient through attention is wrong. Kept whole, the forward
# graph holds the fused op, which anyshape lowers with both outputs as torch computes them.
_KEEP_FUSED = ("_scaled_dot_product_flash_attention_for_cpu.default",)


def decomposition_table() -> dict:
    """Core-ATen decompositions for AOTAutograd, minus the fused ops kept whole."""
    from torch._decomp import core_aten_decompositions

    from ..frontends.torch.capture import without_ops

    return without_ops(core_aten_decompositions(), _KEEP_FUSED)


def partition_fn(options: Options):
    """How AOTAutograd splits a joint graph into forward and backward (``partition`` option).

    ``min_cut`` (as Inductor) recomputes views and cheap elementwise ops in the
    backward and saves the fewest bytes; ``default`` saves what the backward reads,
    so the forward materializes each weight's transpose as an output.
    """
    from torch._functorch import partitioners

    if options.partition == "default":
        return partitioners.default_partition
    return partitioners.min_cut_rematerialization_partition


def anyshape_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    """Compile a Dynamo graph with anyshape; ``options`` as for ``anyshape.optimize``."""
    opts = Options.from_env(**(options or {}))
    backend_named(opts.backend).warm_up(opts)  # (one-time library work, on a free core)
    weights = frozen_candidates(example_inputs) if opts.dynamo_weights else {}
    inner = aot_autograd(
        fw_compiler=_make_forward_compiler(opts),
        bw_compiler=_make_backward_compiler(opts),
        inference_compiler=_make_inference_compiler(opts, weights, len(example_inputs)),
        decompositions=decomposition_table(),
        partition_fn=partition_fn(opts),
    )
    return inner(gm, example_inputs)


def register() -> None:
    """Register under the name "anyshape" (also found through the package entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "anyshape" not in _BACKENDS or _BACKENDS.get("anyshape") is None:
        register_backend(name="anyshape")(anyshape_backend)


register()
