"""The backend interface: what every target offers the one compile path.

Sits between the pass pipeline (``passes/pipeline.py``) and execution. Every
frontend and mode reaches a backend the same way, through ``compile_graph`` in
``anyshape/pipelines.py``, which finds it by name in ``codegen/registry.py``:

- ``layouts(options, target)``: the layout passes this target wants after the shared
  passes (the CPU backend asks for ``channels_last`` when oneDNN runs its
  convolutions);
- ``compile(graph, extra_symbols, options, saved)``: an ``Executable`` for a
  graph the passes ran on; ``saved`` is what an earlier ``Executable.saved()``
  returned for the same graph (the model cache keeps it), letting a backend skip
  work it did before;
- ``export(graph, options, target)``: a library for a standalone artifact
  (backends that cannot build one say so).

An ``Executable`` is called with NumPy arrays, one per graph input, and the
values of the symbols no input carries; it returns one array per graph output,
or ``None`` where the output is an input or weight the caller passes through
itself. It holds no per-call state: one serves many threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import Options
from ..errors import UnsupportedError
from ..ir.graph import Graph


class Executable(Protocol):
    kernel_descriptions: list[str]  # one line per kernel call, for explain()
    packed_params: list[str]  # weights the backend packed: watched for in-place changes

    def __call__(self, arrays: list[np.ndarray], extra: list[int]) -> list[np.ndarray | None]: ...

    def set_profiling(self, on: bool) -> None: ...

    def read_profile(self) -> list[tuple[str, int, float]]: ...

    def saved(self) -> dict | None: ...


@dataclass
class ExportedLibrary:
    """A graph built for a standalone artifact: the library and how it calls."""

    library: bytes
    isa: str
    cpu_flags: list[str]
    param_names: list[str]  # the weights the library takes, in order
    output_slots: list[int] = field(default_factory=list)  # -1: an input or weight returned


class Backend:
    """One target. Subclasses live in their own folder under ``codegen/``."""

    name = ""
    description = ""
    builds_artifacts = False  # export() builds libraries for standalone artifacts

    def layouts(self, options: Options, target: str | None = None) -> tuple[str, ...]:
        """Layout passes (``passes/pipeline.LAYOUT_PASSES``) run after the shared passes,
        for this process (``target`` None) or an artifact's target."""
        return ()

    def warm_up(self, options: Options) -> None:
        """Start, in the background, one-time work of this process that the first compiled
        call would otherwise do (a compile calls it first; default: nothing)."""

    def compile(
        self, graph: Graph, extra_symbols: list[str], options: Options, saved: dict | None = None
    ) -> Executable:
        raise NotImplementedError

    def export(self, graph: Graph, options: Options, target: str) -> ExportedLibrary:
        raise UnsupportedError(f"the {self.name} backend builds no standalone artifacts")
