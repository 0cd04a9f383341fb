"""A graph compiled by the CPU backend, ready to call: codegen, build, load.

Sits on top of the CPU backend: ``CpuExecutable(graph, extra_symbols)`` emits
the translation unit, builds it through the cache and loads it. Calling it
with NumPy arrays (and the values of symbols the inputs do not carry) returns
one array per graph output, or ``None`` where the output is an input or weight
that the caller passes through itself.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ...config import Options
from ...ir.graph import Graph
from ...runtime.native import NativeGraph
from ...stats import bump
from .build import build_library
from .program import KERNEL_MARK, HostProgram


class CpuExecutable:
    def __init__(
        self,
        graph: Graph,
        extra_symbols: list[str],
        num_threads: int = 0,
        program: HostProgram | None = None,
        options: Options | None = None,
    ):
        """``program``: the translation unit emitted for this graph before (the model
        cache keeps it), so a restored model skips emitting it again. ``options``
        (default: as the environment sets them) steer routes, build and dumps."""
        options = options or Options.from_env()
        if program is None:  # (the emitters load here: a restored program needs none)
            from .host import emit_translation_unit
            from .routes import plan_kernels

            program = emit_translation_unit(
                graph, extra_symbols, plan_kernels(graph, options), options.kernel_families
            )
        self.program = program
        self.source = program.source
        start = time.perf_counter()
        path = build_library(program.source, graph.name, options=options)
        self.build_seconds = time.perf_counter() - start  # (a cache hit: finding it)
        self.library = path  # in the build cache
        bump("native_libraries")
        slot_dtypes: dict[int, object] = {}
        for out, slot in zip(graph.outputs, program.output_slots):
            if slot >= 0:
                slot_dtypes[slot] = out.dtype
        params = [graph.params[name] for name in program.param_names]
        self.native = NativeGraph(
            path,
            program.output_slots,
            [slot_dtypes[k] for k in sorted(slot_dtypes)],
            params,
            num_threads,
            inputs=[(n.attr("name"), n.dtype) for n in graph.inputs],
            use_fastcall=options.fastcall,
        )
        self.output_slots = program.output_slots
        self.kernel_labels = program.kernel_labels
        linked = self.native.packs_weights  # the build links oneDNN: say which kernels it runs
        self.kernel_descriptions = [
            d + (f" [{route}]" if route and linked else "")
            for d, route in zip(program.kernel_descriptions, program.dnnl_routes)
        ]
        self.param_names = program.param_names
        self.packed_params = program.packed_params if self.native.packs_weights else []
        # non-contiguous weights the library holds as copies (runtime/native.py)
        self.copied_params = [self.param_names[k] for k in self.native.copied_indices]
        # C++ functions the calls run (kernel families share one: families.py)
        self.compiled_functions = program.source.count(f"\n{KERNEL_MARK}\n")

    def watch_weights(self) -> None:
        """The caller watches ``packed_params`` and ``copied_params`` for in-place changes
        (``weights_changed``)."""
        if self.packed_params:
            self.native.watch_weights(self._packed_indices())

    def unwatch_weights(self) -> None:
        if self.packed_params:
            self.native.unwatch_weights(self._packed_indices())

    def _packed_indices(self) -> list[int]:
        return [self.param_names.index(n) for n in self.packed_params]

    def weights_changed(self) -> None:
        self.native.refresh_copies()  # (before packing: a packed weight may be a copy)
        if self.packed_params:
            self.native.weights_changed()

    def set_profiling(self, on: bool) -> None:
        self.native.set_profiling(on)

    def read_profile(self) -> list[tuple[str, int, float]]:
        """(label, calls, seconds) per kernel call site since the last read."""
        return [(lbl, *cs) for lbl, cs in zip(self.kernel_labels, self.native.read_profile())]

    def saved(self) -> dict:
        """What a later compile of the same graph needs to skip emitting it (the model cache)."""
        return dataclasses.asdict(self.program)

    def __call__(self, arrays: list[np.ndarray], extra: list[int]) -> list[np.ndarray | None]:
        results = self.native(arrays, extra)
        return [results[s] if s >= 0 else None for s in self.output_slots]
