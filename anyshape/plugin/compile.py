"""Plugin-mode compilation of one captured FX graph: partition, lower, compile, assemble.

Sits between capture (export or Dynamo) and the user-facing module. Produces
the rewritten GraphModule plus a ``CompileReport`` that explain() prints.
Counts one compilation per call in ``anyshape.stats()``.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.fx as fx

from ..config import Options
from ..errors import UnsupportedError, first_line
from ..frontends.torch.capture import symbol_sources
from ..frontends.torch.lowering import is_tensor_node, lower_cluster, source_location
from ..frontends.torch.random_ops import seed_dropout
from ..frontends.torch.symbols import TORCH_TO_DTYPE, to_tensor_type
from ..ir.constraints import ConstraintStore
from ..runtime.binder import InputSpec, ShapeBinder
from ..stats import bump
from .assemble import assemble
from .compiled_cluster import CompiledCluster
from .partition import Fallback, PartitionPlan, plan_partitions
from .report import ClusterInfo, CompileReport, ModelPrologue
from .sizes_from_inputs import read_sizes_from_inputs


def _model_prologue(gm: fx.GraphModule, ranges, guards) -> ModelPrologue:
    store = ConstraintStore()
    for sym, (lo, hi) in ranges.items():
        store.add_symbol(sym, lo, hi)
    store.guards.extend(guards)
    names, specs = [], []
    for n in gm.graph.nodes:
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor):
            if n.meta["val"].dtype not in TORCH_TO_DTYPE:
                continue  # (complex, quantized...): only PyTorch ops read it, and check it
            ty = to_tensor_type(n.meta["val"])
            names.append(n.name)
            specs.append(InputSpec(n.name, ty.dtype, ty.shape))
    return ModelPrologue(names, ShapeBinder(specs, store, what="the compiled model"))


def _add_guards(graph, guards) -> None:
    """Guards over symbols the cluster's own inputs carry, checked again in its prologue.

    Harmless where the model prologue already ran, and what lets a whole-model
    cluster be called without it (``plugin/direct.py``). Checked before any kernel
    runs, an equality guard is a fact for the passes (``add_guard``): a size torch
    wrote as ``16 // (s // 2)`` at an example where ``s // 2 == 1`` is 16.
    """
    bound = set()
    for n in graph.inputs:
        for d in n.shape:
            if not isinstance(d, int):
                bound |= d.free_symbols
    known = {str(g) for g in graph.constraints.guards}
    for g in guards:
        if (g.lhs.free_symbols | g.rhs.free_symbols) <= bound and str(g) not in known:
            graph.constraints.add_guard(g)


def _cluster_fallbacks(nodes: list[fx.Node], reason: str) -> list[Fallback]:
    return [Fallback(n, reason, source_location(n)) for n in nodes if is_tensor_node(n)]


def _warn_clusters_in_torch(failures: list[str]) -> None:
    """One warning per compiled graph for clusters that failed to compile for a reason
    other than an unsupported op (those are expected; explain() lists both)."""
    warnings.warn(
        f"anyshape: {len(failures)} cluster(s) failed to compile and run in PyTorch "
        f"instead (first: {failures[0]}); explain() lists them",
        stacklevel=3,
    )


def compile_graph(
    gm: fx.GraphModule,
    ranges: dict,
    options: Options,
    with_prologue: bool,
    count: bool = True,
    guards=(),
    capture_seconds: float | None = None,
) -> tuple[fx.GraphModule, CompileReport]:
    """Compile the supported clusters of ``gm`` in place; return it with a report.

    ``count=False`` leaves ``stats()["compilations"]`` to the caller (which may
    discard this result and compile again). ``capture_seconds``: how long capturing
    ``gm`` took, the first stage of the report's compile time.
    """
    from ..gc_pause import collection_paused

    with collection_paused():
        return _compile_graph(gm, ranges, options, with_prologue, count, guards, capture_seconds)


def _compile_graph(
    gm: fx.GraphModule,
    ranges: dict,
    options: Options,
    with_prologue: bool,
    count: bool,
    guards,
    capture_seconds: float | None,
) -> tuple[fx.GraphModule, CompileReport]:
    # Metadata assertions restate what the prologue checks (input dtypes) or what
    # compiled code guarantees; left in, they keep values alive as extra cluster
    # outputs and force the general FX call path.
    # These edit the graph only: ``assemble`` regenerates the module's Python once at the
    # end (0.02-0.04 s for a large graph each time). Until then the module runs the
    # Python of the graph as captured, which computes the same.
    for n in list(gm.graph.nodes):
        if str(n.target) == "aten._assert_tensor_metadata.default" and not n.users:
            gm.graph.erase_node(n)
    seed_dropout(gm)  # (training graphs: dropout's mask as compiled code)
    read_sizes_from_inputs(gm)
    start = time.perf_counter()
    plan: PartitionPlan = plan_partitions(gm, options.min_cluster_ops)
    report = CompileReport(fallbacks=list(plan.fallbacks))
    if capture_seconds is not None:
        report.add_time("capture", capture_seconds)
    report.add_time("partitioning", time.perf_counter() - start)
    built, failures = [], []
    sources = symbol_sources(gm)
    for nodes in plan.clusters:
        name = f"cluster{len(built)}"
        try:
            start = time.perf_counter()
            lowered = lower_cluster(nodes, gm, name, ranges)
            _add_guards(lowered.graph, guards)
            lowered_at = time.perf_counter()
            report.add_time("lowering", lowered_at - start)
            compiled = CompiledCluster(lowered, options)
            build = getattr(compiled.executable, "build_seconds", None)  # (a native backend)
            report.add_time("passes and codegen", time.perf_counter() - lowered_at - (build or 0))
            if build is not None:
                report.add_time("C++ build", build)
            unbound = [s for s in compiled.extra_symbols if s not in sources]
            if unbound:
                raise UnsupportedError(f"needs data-dependent sizes {unbound}")
        except UnsupportedError as e:
            report.fallbacks += _cluster_fallbacks(nodes, f"cluster failed to compile: {e}")
            continue
        except Exception as e:  # a pass, backend or C++ compiler failure: PyTorch runs it
            why = f"cluster failed to compile ({type(e).__name__}: {first_line(e)})"
            report.fallbacks += _cluster_fallbacks(nodes, why)
            failures.append(why)
            continue
        built.append((nodes, lowered.inputs, lowered.outputs, compiled))
        ops: dict[str, int] = {}
        for n in nodes:
            if is_tensor_node(n):
                ops[str(n.target)] = ops.get(str(n.target), 0) + 1
        report.clusters.append(ClusterInfo(name, ops, compiled))
        if options.debug >= 2:
            print(compiled.graph)
    if failures:
        _warn_clusters_in_torch(failures)
    prologue = None
    if with_prologue:
        prologue = _model_prologue(gm, ranges, list(guards))
        report.input_specs = prologue.binder.specs
        report.facts = [
            f"{s} in [{lo}, {'inf' if hi is None else hi}]" for s, lo, hi in prologue.binder.ranges
        ] + [f"checked per call: {g}" for g in guards]
    assemble(gm, built, sources, prologue)
    if count:
        bump("compilations")
    bump("clusters", len(built))
    bump("compiled_ops", sum(sum(c.aten_ops.values()) for c in report.clusters))
    bump("fallback_ops", len(report.fallbacks))
    if options.debug >= 1:
        print(f"anyshape: compiled {len(built)} clusters, {len(report.fallbacks)} ops fall back")
    return gm, report
