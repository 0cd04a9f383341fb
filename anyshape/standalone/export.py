"""Export: compile a whole PyTorch model into one standalone artifact.

Sits at the top of standalone mode, beside plugin mode's ``compile``: the same
capture (torch.export, every dim dynamic), lowering and pass pipeline, then
the one compile path (``pipelines.compile_graph``) built for a portable ISA, and the
library, weights and signature written as one file (``format``). Unlike plugin
mode nothing may fall back: an op anyshape cannot compile is an error naming
the op, the reason and the model's source line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..codegen.registry import backend_named
from ..config import Options
from ..errors import UnsupportedError
from ..ir.graph import Graph
from ..ir.symbolic import format_dim
from ..pipelines import compile_graph
from ..runtime.binder import ShapeBinder
from ..stats import bump
from .format import Manifest, TensorRecord, write_artifact


class Artifact:
    """A compiled model in memory: the library, the weights and the signature."""

    def __init__(self, manifest: Manifest, library: bytes, weights: list[np.ndarray]):
        self.manifest = manifest
        self.library = library
        self.weights = weights

    def save(self, path: str | Path) -> Path:
        """Write the artifact file (atomically); returns its path."""
        write_artifact(path, self.manifest, self.library, self.weights)
        return Path(path)

    def load(self, num_threads: int = 0):
        """This artifact, ready to run in this process (no file needed)."""
        from .loader import StandaloneModel

        return StandaloneModel(
            self.manifest, self.library, self.weights, "exported model", num_threads
        )

    def signature(self) -> str:
        from .loader import describe_manifest

        return describe_manifest(self.manifest)

    def __repr__(self) -> str:
        return f"Artifact({len(self.manifest.inputs)} inputs, {self.manifest.isa})"


def export(
    model, example_inputs, *, dynamic_shapes=None, target: str = "portable", **options
) -> Artifact:
    """Compile ``model`` for every shape of the examples' ranks and dtypes into an ``Artifact``.

    ``example_inputs`` is a tuple of positional inputs, a dict of keyword inputs
    or ``(args, kwargs)``, of tensors only. ``target`` is ``"portable"`` (the
    widest ISA level this machine supports, e.g. ``x86-64-v3``) or ``"native"``.
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
    tgt = _checked_target(target)
    if isinstance(model, torch.nn.Module):
        model.eval()
    args, kwargs = split_inputs(example_inputs)

    def build(captured):
        return _build(captured, opts, tgt, type(model).__name__)

    if dynamic_shapes is None and needs_widening((args, kwargs)):
        # As in plugin mode: trace with dims of 0/1 widened, keep it if it agrees with eager.
        wide_args, wide_kwargs = widen_example(args), widen_example(kwargs)
        artifact = with_source_lines(
            build,
            lambda **how: capture_export(
                model, wide_args, wide_kwargs, repeats=opts.trace_repeats, **how
            ),
        )
        if _agrees_with_eager(artifact, model, args, kwargs):
            return artifact
    return with_source_lines(
        build,
        lambda **how: capture_export(
            model, args, kwargs, dynamic_shapes, repeats=opts.trace_repeats, **how
        ),
    )


def export_program(program, *, target: str = "portable", **options) -> Artifact:
    """Compile a ``torch.export.ExportedProgram`` (e.g. from ``torch.export.load``) as it is.

    Its dims are dynamic where the program says so (``dynamic_shapes`` at its export).
    """
    from ..frontends.torch.capture import capture_program

    captured = capture_program(program)
    return _build(captured, Options.from_env(**options), _checked_target(target), "the program")


def _checked_target(target: str) -> str:
    if target not in ("portable", "native"):
        raise ValueError(f"unknown target {target!r}: 'portable' (default) or 'native'")
    return target


def _agrees_with_eager(artifact: Artifact, model, args, kwargs) -> bool:
    """Plugin mode's check of a widened capture, run on the artifact itself."""
    import torch
    import torch.utils._pytree as pytree

    from ..frontends.torch.examples import agrees_with_eager as plugin_check

    def run(*a, **k):
        flat = [t.detach().numpy() for t in pytree.tree_leaves((a, k))]
        return tuple(torch.from_numpy(o) for o in artifact.load()(*flat))

    return plugin_check(model, run, args, kwargs)


def _build(captured, options: Options, target: str, model_name: str) -> Artifact:
    graph, names = lower_whole_graph(captured, model_name)
    return artifact_of_graph(graph, options, target, model_name, names)


def lower_whole_graph(captured, model_name: str) -> tuple[Graph, list[str]]:
    """A captured program as one IR graph and its output names; an op anyshape cannot
    lower is an error naming it (nothing may fall back)."""
    import torch

    from ..frontends.torch.lowering import lower_cluster
    from ..plugin.partition import is_op_node, plan_partitions

    gm = captured.gm
    plan = plan_partitions(gm, 1)
    # getitem nodes that pick from an unsupported op only repeat its error
    failed = [f for f in plan.fallbacks if not f.reason.startswith("selects from")]
    if plan.fallbacks:
        lines = [f"  {f.target}: {f.reason}  ({f.location})" for f in failed[:20]]
        more = len(failed) - 20
        raise UnsupportedError(
            f"{model_name} cannot be exported: {len(failed)} ops are not supported "
            "in standalone mode (no PyTorch to run them in):\n"
            + "\n".join(lines)
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\n  anyshape.optimize(model, ...) runs such ops in PyTorch instead."
        )
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p in placeholders:
        if not isinstance(p.meta.get("val"), torch.Tensor):
            raise UnsupportedError(
                f"input {p.name!r} is not a tensor ({type(p.meta.get('val')).__name__}); "
                "standalone models take tensors only"
            )
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    flat_out = _flat_outputs(output.args[0])
    nodes = [n for n in gm.graph.nodes if is_op_node(n)]
    lowered = lower_cluster(
        nodes,
        gm,
        "model",
        captured.symbol_ranges,
        inputs=placeholders,
        outputs=flat_out,
        guards=captured.guards,
    )
    return lowered.graph, _output_names(gm, len(flat_out))


def artifact_of_graph(
    graph: Graph,
    options: Options,
    target: str,
    model_name: str,
    output_names: list[str],
    input_names: list[str] | None = None,
) -> Artifact:
    """A frontend's IR graph compiled for ``target`` into an artifact (any frontend's last step).

    ``input_names``: the names the manifest gives the inputs (default: the graph's).
    """
    if not backend_named(options.backend).builds_artifacts:
        options = dataclasses.replace(options, backend="cpu")  # (the interpreter runs in-process)
    try:
        compiled = compile_graph(graph, options, _checked_target(target))
    except UnsupportedError as e:
        raise UnsupportedError(f"{model_name} cannot be exported: {e}") from e
    if compiled.extra_symbols:
        raise UnsupportedError(
            f"{model_name} cannot be exported: it needs sizes no input dim carries "
            f"({', '.join(compiled.extra_symbols)})"
        )
    graph, binder, built = compiled.graph, compiled.binder, compiled.library
    bump("compilations")
    names = output_names
    in_names = input_names or [n.attr("name") for n in graph.inputs]
    manifest = Manifest(
        version=_version(),
        isa=built.isa,
        cpu_flags=list(built.cpu_flags),
        inputs=[_record(name, n.dtype, n.shape) for name, n in zip(in_names, graph.inputs)],
        outputs=[
            _record(name, o.dtype, o.shape, _source(graph, o, slot, built.param_names))
            for name, o, slot in zip(names, graph.outputs, built.output_slots)
        ],
        params=[
            _record(_word(p), _dtype_of(graph.params[p]), graph.params[p].shape)
            for p in built.param_names
        ],
        constraints=_constraints(binder),
    )
    weights = [np.ascontiguousarray(graph.params[p]) for p in built.param_names]
    for rec, w in zip(manifest.params, weights):
        rec.nbytes = w.nbytes  # offsets are laid out when the file is written
    return Artifact(manifest, built.library, weights)


def _flat_outputs(value) -> list:
    import torch.fx as fx
    import torch.utils._pytree as pytree

    flat = pytree.tree_leaves(value)
    for o in flat:
        if not isinstance(o, fx.Node):
            raise UnsupportedError(
                f"the model returns a constant ({o!r}); standalone models return tensors only"
            )
    return flat


def _output_names(gm, count: int) -> list[str]:
    """Names from the output structure (``last_hidden_state``), else ``output<k>``."""
    import torch.utils._pytree as pytree

    spec = getattr(gm, "_out_spec", None)
    names = [f"output{k}" if count > 1 else "output" for k in range(count)]
    if spec is None:
        return names
    try:
        tree = pytree.tree_unflatten(list(range(count)), spec)
        paths = pytree.tree_flatten_with_path(tree)[0]
    except Exception:  # an output type pytree cannot rebuild: positional names
        return names
    out = []
    for k, (path, _) in enumerate(paths):
        keys = [str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", "")))) for p in path]
        name = _word(".".join(keys)) if keys and not all(x.isdigit() for x in keys) else names[k]
        out.append(name if name not in out else f"{name}_{k}")
    return out if len(out) == count else names


def _word(text: str) -> str:
    """A manifest name: no whitespace."""
    return "".join(c if not c.isspace() else "_" for c in text) or "_"


def _dims(shape) -> list[str]:
    return [format_dim(d).replace(" ", "") for d in shape]


def _record(name, dtype, shape, source: str = "") -> TensorRecord:
    return TensorRecord(_word(name), str(dtype), _dims(shape), source)


def _dtype_of(array: np.ndarray):
    from ..ir.dtypes import DType

    return DType.from_numpy(array.dtype)


def _source(graph: Graph, node, slot: int, param_names: list[str]) -> str:
    if slot >= 0:
        return f"slot:{slot}"
    if node in graph.inputs:
        return f"input:{graph.inputs.index(node)}"
    return f"param:{param_names.index(node.attr('name'))}"


def _constraints(binder: ShapeBinder) -> list[str]:
    out = [f"{s} in [{lo}, {'inf' if hi is None else hi}]" for s, lo, hi in binder.ranges]
    out += [f"{g} ({g.reason})" for g in binder.store.guards]
    return [" ".join(c.split()) for c in out]


def _version() -> str:
    from ..version import __version__

    return __version__
