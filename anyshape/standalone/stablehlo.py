"""``anyshape.to_stablehlo(model, example_inputs)``: a PyTorch model as StableHLO text.

Sits beside ``export.py`` at the top of standalone mode and shares its front
half: the same capture (torch.export, every dim dynamic, 0/1 examples widened),
the whole graph lowered (nothing may fall back), anyshape's own graph passes
(canonical shapes, simplify; no layout pass). Then, instead of a library, the
graph is printed by ``codegen/stablehlo`` as a StableHLO module with ``?``
dims and the dynamic ops where sizes are symbolic, for other MLIR compilers
and for anyshape's own StableHLO frontend.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Options
from ..passes.pipeline import run_pipeline


def to_stablehlo(
    model,
    example_inputs,
    *,
    dynamic_shapes=None,
    weights: str = "inline",
    path: str | Path | None = None,
    **options,
) -> str:
    """The captured graph of ``model``, after anyshape's passes, as StableHLO text.

    ``example_inputs`` as for ``anyshape.export`` (a tuple, a dict, or ``(args,
    kwargs)`` of tensors). ``weights``: ``"inline"`` (``dense<"0x...">``
    constants) or ``"resource"`` (``dense_resource`` blobs in the module's
    resource section, as torch-mlir writes them). ``path``: also write the text
    there. ``options`` are ``anyshape.config.Options`` fields.
    """
    import torch

    from ..frontends.torch.capture import (
        capture_export,
        needs_widening,
        widen_example,
        with_source_lines,
    )
    from ..frontends.torch.examples import split_inputs

    opts = Options.from_env(**options)
    if isinstance(model, torch.nn.Module):
        model.eval()
    args, kwargs = split_inputs(example_inputs)
    if dynamic_shapes is None and needs_widening((args, kwargs)):
        args, kwargs = widen_example(args), widen_example(kwargs)
    return with_source_lines(
        lambda captured: _emit(captured, type(model).__name__, opts, weights, path),
        lambda **how: capture_export(
            model, args, kwargs, dynamic_shapes, repeats=opts.trace_repeats, **how
        ),
    )


def program_to_stablehlo(
    program, *, weights: str = "inline", path: str | Path | None = None, **options
) -> str:
    """A ``torch.export.ExportedProgram`` (e.g. from ``torch.export.load``) as StableHLO text;
    its dims are dynamic where the program says so."""
    from ..frontends.torch.capture import capture_program

    return _emit(
        capture_program(program), "the program", Options.from_env(**options), weights, path
    )


def _emit(captured, model_name: str, opts: Options, weights: str, path) -> str:
    from ..codegen.stablehlo import graph_to_stablehlo
    from .export import lower_whole_graph

    graph, output_names = lower_whole_graph(captured, model_name)
    graph = run_pipeline(graph, opts)
    text = graph_to_stablehlo(graph, weights=weights, output_names=output_names)
    if path is not None:
        Path(path).write_text(text)
    return text
