"""``compile(model_or_path, **options)``: an ONNX model compiled once, callable on any shape.

The ONNX frontend's entry and its last stage: ``reader.read_model`` (load,
external data, shape inference), ``lower.lower_model`` (one IR graph), then the
shared ``pipelines.compile_graph`` with ``config.Options`` built from the keyword
options (and ``ANYSHAPE_*`` variables). The result, an ``OnnxModule`` (the
shared ``frontends/program_module.ProgramModule``), takes the graph's inputs
positionally (graph-input order) or by name and returns the outputs as a list in
graph-output order.
"""

from __future__ import annotations

from ...config import Options
from ..program_module import ProgramModule
from .context import NeedsInputValue
from .lower import lower_model
from .reader import read_model
from .specialize import ValueSpecializedModule


class OnnxModule(ProgramModule):
    """A compiled ONNX model: ``module(*arrays)`` or ``module(**named)`` -> list of outputs."""

    kind = "ONNX model"


def compile(model_or_path, *, base_dir: str | None = None, **options):
    """Compile an ONNX model (a ``ModelProto``, a path or bytes) once for every input shape.

    ``base_dir``: where external weight files are, for a ``ModelProto`` whose
    weights were not loaded (a path finds them beside the model). ``options``
    are ``anyshape.config.Options`` fields (``backend``, ``threads``...).
    Returns an ``OnnxModule``; a model with a graph input that sets a shape
    returns a ``ValueSpecializedModule`` (``specialize.py``).
    """
    opts = Options.from_env(**options)
    model = read_model(model_or_path, base_dir)
    try:
        return _compile_model(model, opts)
    except NeedsInputValue as e:
        first = e.input_name

    def compile_with(values: dict):
        try:
            return _compile_model(read_model(model_or_path, base_dir, values), opts), None
        except NeedsInputValue as e:
            return None, e.input_name

    names = [n for n, _ in model.inputs]
    return ValueSpecializedModule(
        compile_with, dict(model.inputs), names, model.output_names, first
    )


def _compile_model(model, opts: Options) -> OnnxModule:
    lowered = lower_model(model)
    return OnnxModule.compile(lowered.graph, lowered.input_names, lowered.output_names, opts)
