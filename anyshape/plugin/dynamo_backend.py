"""The TorchDynamo backend: ``torch.compile(model, backend="anyshape")``.

Sits beside ``api.optimize`` as the second entry into plugin mode. Dynamo hands
over FX graphs with symbolic sizes; AOTAutograd decomposes them to core ATen
(the same op set torch.export produces), and each forward graph is compiled by
``compile_graph`` (one compilation per graph Dynamo hands over). Backward
graphs, when gradients are needed, run in PyTorch.

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

from ..config import Options
from .compile import compile_graph


def _symbol_ranges(example_inputs) -> dict[str, tuple[int, int | None]]:
    from torch._guards import detect_fake_mode

    from ..frontends.torch.capture import _finite_int

    fake_mode = detect_fake_mode(example_inputs)
    env = getattr(fake_mode, "shape_env", None) if fake_mode is not None else None
    if env is None:
        return {}
    return {str(s): (0, _finite_int(vr.upper)) for s, vr in env.var_to_range.items()}


def _make_forward_compiler(options: Options):
    def fw_compiler(gm: torch.fx.GraphModule, example_inputs):
        gm, _ = compile_graph(gm, _symbol_ranges(example_inputs), options, with_prologue=False)
        return make_boxed_func(gm.forward)

    return fw_compiler


def _backward_in_torch(gm: torch.fx.GraphModule, example_inputs):
    return make_boxed_func(gm.forward)


def anyshape_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    """Compile a Dynamo graph with anyshape; ``options`` as for ``anyshape.optimize``."""
    from torch._decomp import core_aten_decompositions

    opts = Options.from_env(**(options or {}))
    inner = aot_autograd(
        fw_compiler=_make_forward_compiler(opts),
        bw_compiler=_backward_in_torch,
        decompositions=core_aten_decompositions(),
    )
    return inner(gm, example_inputs)


def register() -> None:
    """Register under the name "anyshape" (also found through the package entry point)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "anyshape" not in _BACKENDS or _BACKENDS.get("anyshape") is None:
        register_backend(name="anyshape")(anyshape_backend)


register()
