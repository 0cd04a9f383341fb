"""The compiler's order in one screen: the named pipeline of every mode, and the one
compile path they all share.

Every mode and frontend ends in ``compile_graph(graph, options, target)``: the
shared IR passes, the layout passes the chosen backend asks for, then that
backend (``codegen/registry.py``), for this process (an ``Executable``) or for
a standalone artifact (a library for a named ISA level). What differs between
modes is only how a graph is produced and what wraps the result, and that is
listed below, stage by stage, as ``(stage, "module:function", what it does)``;
``tests/test_structure.py`` checks every name resolves.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codegen.backend import Executable, ExportedLibrary
from .codegen.registry import backend_named
from .config import Options
from .errors import UnsupportedError
from .ir.graph import Graph, graph_symbols
from .passes.pipeline import run_pipeline
from .runtime.binder import InputSpec, ShapeBinder

# anyshape.optimize(model, examples): a torch model; what cannot compile runs in PyTorch
PLUGIN = [
    (
        "pytree types",
        "anyshape.plugin.pytree_types:exportable_caches",
        "KV-cache outputs capturable",
    ),
    ("model cache", "anyshape.plugin.model_cache:restore", "same model compiled before: skip all"),
    ("capture", "anyshape.frontends.torch.capture:capture_export", "torch.export, dims Dim.AUTO"),
    (
        "decompose",
        "anyshape.frontends.torch.capture:capture_program",
        "core ATen unless every op lowers as exported; guards kept",
    ),
    ("size rewrites", "anyshape.frontends.torch.size_rewrites:register_size_rewrites", "exact"),
    ("dropout", "anyshape.frontends.torch.random_ops:seed_dropout", "training: a seeded hash"),
    ("input sizes", "anyshape.plugin.sizes_from_inputs:read_sizes_from_inputs", "no size edges"),
    ("partition", "anyshape.plugin.partition:plan_partitions", "which FX nodes lower: clusters"),
    ("lower", "anyshape.frontends.torch.lowering:lower_cluster", "ATen -> IR, one rule table"),
    ("compile", "anyshape.pipelines:compile_graph", "passes, layouts, backend (below)"),
    ("assemble", "anyshape.plugin.assemble:assemble", "FX graph calls the compiled units"),
    ("direct call", "anyshape.plugin.direct:plan_direct", "one cluster: called without FX"),
    ("guard variants", "anyshape.plugin.guard_variants:GuardVariants", "other cases on demand"),
]

# what torch.export cannot capture (.item() feeding Python): TorchDynamo, graph by graph
DYNAMO_CAPTURE = [
    ("trace", "anyshape.plugin.dynamo_capture:DynamoModule", "Dynamo runs Python; breaks in torch"),
    ("each graph", "anyshape.plugin.dynamo_backend:compile_forward", "AOTAutograd, then PLUGIN"),
]

# torch.compile(model, backend="anyshape"): Dynamo's graphs, forward and backward compiled
TORCH_COMPILE = [
    ("backend", "anyshape.plugin.dynamo_backend:anyshape_backend", "Dynamo hands over graphs"),
    ("partition", "anyshape.plugin.dynamo_backend:partition_fn", "AOTAutograd: min-cut joint"),
    (
        "forward",
        "anyshape.plugin.dynamo_backend:compile_forward",
        "partition/lower/compile/assemble",
    ),
    ("backward", "anyshape.plugin.dynamo_backend:compile_backward", "the same, on first use"),
]

# anyshape.optimize(model, examples, training=True): one forward and one backward
TRAINING = [
    (
        "capture",
        "anyshape.frontends.torch.capture:capture_export_for_training",
        "torch.export, autograd on",
    ),
    ("joint", "anyshape.plugin.training:optimize_for_training", "AOTAutograd over export's dims"),
    ("forward", "anyshape.plugin.compile:compile_graph", "as in PLUGIN, with the prologue"),
    ("backward", "anyshape.plugin.dynamo_backend:compile_backward", "on the first backward"),
    ("module", "anyshape.plugin.training:TrainingModule", "the model's parameters, live"),
]

# anyshape.export / anyshape compile: one graph, nothing falls back, a portable library
STANDALONE = [
    ("capture", "anyshape.frontends.torch.capture:capture_export", "as in PLUGIN"),
    ("lower", "anyshape.frontends.torch.lowering:lower_cluster", "the whole graph, or an error"),
    ("compile", "anyshape.pipelines:compile_graph", "target 'portable' (x86-64-v3) or 'native'"),
    ("write", "anyshape.standalone.format:write_artifact", "header, manifest, library, weights"),
    ("load", "anyshape.standalone.loader:load", "checks, weights mapped, library from memory"),
]

# anyshape.onnx.compile(model): an ONNX model, one graph, nothing falls back
ONNX = [
    ("read", "anyshape.frontends.onnx.reader:read_model", "external weights, shape inference"),
    ("lower", "anyshape.frontends.onnx.lower:lower_model", "rules by (op, opset); shapes folded"),
    ("compile", "anyshape.pipelines:compile_graph", "as every mode, built for this process"),
    ("call", "anyshape.frontends.onnx.compile:OnnxModule", "inputs by position or name"),
]

# anyshape.stablehlo.compile(text) / anyshape.jax.compile(exported): one graph, nothing falls back
STABLEHLO = [
    ("read", "anyshape.frontends.stablehlo.reader:read_program", "jaxlib's MLIR bindings parse"),
    ("lower", "anyshape.frontends.stablehlo.lower:lower_program", "calls inlined; shapes folded"),
    ("compile", "anyshape.pipelines:compile_graph", "as every mode, built for this process"),
    ("call", "anyshape.frontends.stablehlo.compile:StableHLOModule", "inputs by position or name"),
]

# anyshape.to_stablehlo(model, examples) / anyshape export-stablehlo: StableHLO out
TO_STABLEHLO = [
    ("capture", "anyshape.frontends.torch.capture:capture_export", "as in STANDALONE"),
    ("lower", "anyshape.standalone.export:lower_whole_graph", "the whole graph, or an error"),
    ("passes", "anyshape.passes.pipeline:run_pipeline", "canonical shapes, simplify; no layouts"),
    ("print", "anyshape.codegen.stablehlo:graph_to_stablehlo", "? dims, dynamic ops, assertions"),
]

# compile_graph: the same for every mode
COMPILE = [
    ("passes", "anyshape.passes.pipeline:run_pipeline", "canonical shapes, simplify; layouts"),
    ("backend", "anyshape.codegen.registry:backend_named", "cpu or interpreter (Backend)"),
]

# inside the cpu backend (codegen/cpu/backend.py), per graph
CPU_BACKEND = [
    ("plan", "anyshape.schedule.plan:plan_schedule", "buffers, loop/input/stitch/epilogue fusion"),
    ("memory", "anyshape.schedule.memory:plan_memory", "workspace slots by lifetime (in plan)"),
    ("routes", "anyshape.codegen.cpu.routes:plan_routes", "what oneDNN runs, from the options"),
    ("plan hooks", "anyshape.schedule.hooks:after_planning", "plan verifier; <graph>.plan dump"),
    ("emit", "anyshape.codegen.cpu.host:emit_translation_unit", "kernels, host program: C++"),
    (
        "families",
        "anyshape.codegen.cpu.families:bind_family_constants",
        "(in emit) kernels differing only in static sizes: one function",
    ),
    ("build", "anyshape.codegen.cpu.build:build_library", "g++ for -march=native or an ISA"),
    ("load", "anyshape.runtime.native:NativeGraph", "dlopen; one native call per call"),
]

PIPELINES = {
    "plugin": PLUGIN,
    "dynamo_capture": DYNAMO_CAPTURE,
    "torch_compile": TORCH_COMPILE,
    "training": TRAINING,
    "standalone": STANDALONE,
    "onnx": ONNX,
    "stablehlo": STABLEHLO,
    "to_stablehlo": TO_STABLEHLO,
    "compile": COMPILE,
    "cpu_backend": CPU_BACKEND,
}


@dataclass
class CompiledGraph:
    """A graph through the compile path: what runs, how its calls are checked."""

    graph: Graph  # after the passes: what the backend compiled
    binder: ShapeBinder  # binds symbols from input shapes, checks ranges and guards
    extra_symbols: list[str]  # symbols no input dim carries: passed with each call
    executable: Executable | None = None  # built for this process (target None)
    library: ExportedLibrary | None = None  # built for an artifact (a named target)


def compile_graph(
    graph: Graph,
    options: Options,
    target: str | None = None,
    *,
    passes_ran: bool = False,
    saved: dict | None = None,
) -> CompiledGraph:
    """``graph`` through the shared passes and ``options.backend``.

    ``target`` None builds for this process; ``"portable"`` or ``"native"`` builds
    a library for a standalone artifact. ``passes_ran``: the graph already went
    through the passes (the model cache keeps it so), and ``saved`` is what the
    backend's executable kept for it then.
    """
    backend = backend_named(options.backend)
    if not passes_ran:
        graph = run_pipeline(graph, options, backend.layouts(options, target))
    specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in graph.inputs]
    binder = ShapeBinder(specs, graph.constraints, what=f"cluster @{graph.name}")
    extra = sorted(graph_symbols(graph) - binder.origin.keys())
    compiled = CompiledGraph(graph, binder, extra)
    if target is not None and extra:
        raise UnsupportedError(
            f"needs sizes that no input dim carries ({', '.join(extra)}): data-dependent "
            "shapes cannot be built into an artifact"
        )
    if target is None:
        compiled.executable = backend.compile(graph, extra, options, saved)
    else:
        compiled.library = backend.export(graph, options, target)
    return compiled
