"""The TorchDynamo backend: ``torch.compile(model, backend="anyshape")``.

Sits beside ``api.optimize`` as the second entry into plugin mode. Dynamo hands
over FX graphs with symbolic sizes; AOTAutograd decomposes them to core ATen
(the same op set torch.export produces), and each forward graph is compiled by
``compile_graph`` (one compilation per graph Dynamo hands over). Backward
graphs, when gradients are needed, run in PyTorch.

Dynamo specializes sizes 0 and 1 unless tracing is size-oblivious, which would
compile one graph for batch 2+, another for batch 1 and another for batch 0.
Loading this backend therefore turns on
``torch.fx.experimental._config.backed_size_oblivious`` for the process (torch
finds this module through the ``torch_dynamo_backends`` entry point when
``backend="anyshape"`` is first used, before anything is traced), so one graph
serves every size. Guards Dynamo installs for other reasons still apply.
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from ..config import Options
from .compile import compile_graph

torch.fx.experimental._config.backed_size_oblivious = True


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
