"""The ``cpu`` backend: generated C++ kernels and a host program, built by the system compiler.

Sits behind ``codegen/registry.py``; the rest of this folder is its inside
(``__init__.py`` gives the order). ``compile`` emits the translation unit (or
takes the one the model cache kept), builds it for this machine and loads it;
``export`` builds one for a portable ISA level for a standalone artifact.
"""

from __future__ import annotations

from ...config import Options
from ...ir.graph import Graph
from ..backend import Backend, ExportedLibrary
from .build import build_library, links_onednn
from .executable import CpuExecutable
from .program import HostProgram
from .target import target_named


class CpuBackend(Backend):
    name = "cpu"
    builds_artifacts = True
    description = "generated C++ kernels (OpenMP), GEMMs and convolutions on oneDNN/OpenBLAS"

    def layouts(self, options: Options, target: str | None = None) -> tuple[str, ...]:
        """Channels last between convolutions when oneDNN runs them that way (the
        ``dnnl_conv`` option's default, when the build links oneDNN: plugin mode only,
        artifacts link OpenBLAS alone)."""
        from .routes import CpuSettings

        wanted = CpuSettings.from_options(options).dnnl_conv == "channels_last"
        return ("channels_last",) if wanted and target is None and links_onednn(options) else ()

    def warm_up(self, options: Options) -> None:
        """oneDNN's GEMM kernels generated, and the oneDNN glue object built if new, on a
        free core while the compile runs (``onednn_warm_up``, ``build.start_glue_object``)."""
        from .build import start_glue_object
        from .onednn_warm_up import warm_up

        warm_up(options)
        start_glue_object(options)

    def compile(
        self, graph: Graph, extra_symbols: list[str], options: Options, saved: dict | None = None
    ) -> CpuExecutable:
        program = HostProgram(**saved) if saved else None
        executable = CpuExecutable(graph, extra_symbols, options.threads, program, options)
        executable.set_profiling(options.profile)
        return executable

    def export(self, graph: Graph, options: Options, target: str) -> ExportedLibrary:
        from .host import emit_translation_unit
        from .routes import plan_kernels

        isa = target_named(target)
        program = emit_translation_unit(
            graph, [], plan_kernels(graph, options), options.kernel_families
        )
        library = build_library(program.source, "export", isa, options).read_bytes()
        return ExportedLibrary(
            library=library,
            isa=isa.isa,
            cpu_flags=list(isa.cpu_flags),
            param_names=list(program.param_names),
            output_slots=list(program.output_slots),
        )
