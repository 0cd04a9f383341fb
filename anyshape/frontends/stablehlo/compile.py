"""``compile(text_or_path, **options)``: a StableHLO program compiled once, callable on any shape.

The StableHLO frontend's entry and its last stage: ``reader.read_program``
(parse with jaxlib's MLIR bindings), ``lower.lower_program`` (one IR graph),
then the shared ``pipelines.compile_graph``. The result, a ``StableHLOModule``
(the shared ``frontends/program_module.ProgramModule``), takes the entry
function's arguments positionally or by name (``arg0``..., or the names the
producer recorded) and returns its results as a list.
"""

from __future__ import annotations

from ...config import Options
from ..program_module import ProgramModule
from .lower import lower_program
from .reader import read_program


class StableHLOModule(ProgramModule):
    """A compiled StableHLO program: ``module(*arrays)`` -> list of results."""

    kind = "StableHLO program"


def lower_text(text_or_path, entry: str = "main"):
    """The program as one IR graph (``lower.LoweredProgram``), before the compile path."""
    return lower_program(read_program(text_or_path, entry))


def compile(text_or_path, *, entry: str = "main", **options) -> StableHLOModule:
    """Compile StableHLO/MHLO text (a string, bytes or a ``.mlir`` path) for every shape.

    ``entry``: the function to compile (default ``main``, or the module's only
    public function). ``options`` are ``anyshape.config.Options`` fields.
    """
    lowered = lower_text(text_or_path, entry)
    opts = Options.from_env(**options)
    return StableHLOModule.compile(lowered.graph, lowered.input_names, lowered.output_names, opts)
