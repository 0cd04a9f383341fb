"""The standalone-mode commands of the ``anyshape`` CLI: compile, export-stablehlo, explain,
info, run.

Sits on top of standalone mode; ``anyshape.cli`` dispatches here. ``compile``
reads an ONNX model (needs ``onnx``), StableHLO text (needs ``jaxlib``) or a
saved ExportedProgram (needs torch);
``explain`` reports on an ONNX model; ``info`` and ``run`` need only NumPy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..errors import AnyshapeError
from ..ir.symbolic import parse_expr


def add_parsers(sub) -> None:
    comp = sub.add_parser(
        "compile",
        help="compile an ONNX model (.onnx), StableHLO text (.mlir) or a saved ExportedProgram "
        "(.pt2) into an artifact",
        description="Read an ONNX model, StableHLO/MHLO text (jax.export, torch-mlir), or a "
        "program saved with torch.export.save, and "
        "compile every op of it into one artifact that runs any shape its dynamic dims "
        "allow, without PyTorch or ONNX Runtime.",
    )
    comp.add_argument(
        "model", help="a .onnx model, a .mlir StableHLO module, or a .pt2 from torch.export.save"
    )
    comp.add_argument("-o", "--output", required=True, help="the artifact file to write")
    comp.add_argument(
        "--target",
        choices=["portable", "native"],
        default="portable",
        help="portable: the widest ISA level this machine supports (default); native: this CPU",
    )
    expl = sub.add_parser(
        "explain",
        help="what anyshape compiles of an ONNX model: ops, unsupported ops, kernels, guards",
    )
    expl.add_argument("model", help="a .onnx model")
    shlo = sub.add_parser(
        "export-stablehlo",
        help="print a saved ExportedProgram (.pt2) as StableHLO text with dynamic dims",
        description="Read a program saved with torch.export.save, lower it as anyshape "
        "compiles it (every op, anyshape's graph passes) and write it as a StableHLO module: "
        "? dims, dynamic_* ops where sizes are symbolic, shape assertions for its guards.",
    )
    shlo.add_argument("model", help="a .pt2 file from torch.export.save")
    shlo.add_argument("-o", "--output", required=True, help="the .mlir file to write")
    shlo.add_argument(
        "--weights",
        choices=["inline", "resource"],
        default="inline",
        help='weights as dense<"0x..."> constants (default) or dense_resource blobs',
    )
    info = sub.add_parser("info", help="print an artifact's signature, target and constraints")
    info.add_argument("artifact")
    run = sub.add_parser(
        "run",
        help="run an artifact on random inputs; print output shapes and timing",
        description="Dims not given with --shape are taken from the inputs that share them; "
        "a dim no input shares takes the size at the same position of a given input of "
        "the same rank.",
    )
    run.add_argument("artifact")
    run.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=2x17",
        help="an input's shape (repeatable); other inputs follow the dims they share",
    )
    run.add_argument("--repeat", type=int, default=10, help="timed calls (default %(default)s)")
    run.add_argument(
        "--int-high",
        type=int,
        default=2,
        help="integer inputs are drawn from [0, INT_HIGH) (default %(default)s)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--threads", type=int, default=0, help="OpenMP threads (default: all cores)")


def _is_onnx(path: str) -> bool:
    return path.lower().endswith(".onnx")


def _is_stablehlo(path: str) -> bool:
    return path.lower().endswith((".mlir", ".stablehlo", ".mhlo"))


def compile_cmd(args) -> int:
    if _is_stablehlo(args.model):
        from ..frontends.stablehlo.api import export as export_stablehlo

        t0 = time.perf_counter()
        artifact = export_stablehlo(args.model, target=args.target)
        return _wrote(artifact, args.output, t0)
    if _is_onnx(args.model):
        from ..frontends.onnx.export import export

        t0 = time.perf_counter()
        artifact = export(args.model, target=args.target)
        return _wrote(artifact, args.output, t0)
    import torch

    from .export import export_program

    try:
        program = torch.export.load(args.model)
    except Exception as e:  # torch raises many types for a bad file
        raise SystemExit(f"anyshape compile: cannot read {args.model}: {e}") from None
    t0 = time.perf_counter()
    artifact = export_program(program, target=args.target)
    return _wrote(artifact, args.output, t0)


def _wrote(artifact, output: str, t0: float) -> int:
    path = artifact.save(output)
    print(artifact.signature())
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    return 0


def export_stablehlo_cmd(args) -> int:
    import torch

    from .stablehlo import program_to_stablehlo

    try:
        program = torch.export.load(args.model)
    except Exception as e:  # torch raises many types for a bad file
        raise SystemExit(f"anyshape export-stablehlo: cannot read {args.model}: {e}") from None
    t0 = time.perf_counter()
    text = program_to_stablehlo(program, weights=args.weights, path=args.output)
    print(f"wrote {args.output} ({len(text) / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


def explain_cmd(args) -> int:
    if not _is_onnx(args.model):
        raise SystemExit(
            f"anyshape explain: {args.model}: expected a .onnx model (for a PyTorch model, "
            "print(anyshape.explain(model, example_inputs)) in Python)"
        )
    from ..frontends.onnx.explain import explain

    report = explain(args.model)
    print(report)
    return 0 if report.compiles else 1


def info_cmd(args) -> int:
    from .format import read_artifact
    from .loader import describe_manifest

    art = read_artifact(args.artifact)
    print(describe_manifest(art.manifest))
    return 0


def run_cmd(args) -> int:
    from .loader import load

    model = load(args.artifact, num_threads=args.threads)
    given: dict[str, tuple[int, ...]] = {}
    for text in args.shape:
        name, sep, dims = text.partition("=")
        try:
            given[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise SystemExit(f"anyshape run: --shape {text!r}: expected NAME=2x17") from None
        if not sep or name not in model.input_names:
            raise SystemExit(
                f"anyshape run: --shape {text!r}: the inputs are {', '.join(model.input_names)}"
            )
    notes: list[str] = []
    shapes = input_shapes(model.manifest, given, notes)
    for note in notes:
        print(f"note: {note}")
    rng = np.random.default_rng(args.seed)
    arrays = []
    for dt, shape in zip(model.input_dtypes, shapes):
        if dt.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(dt))
        else:
            arrays.append(rng.integers(0, args.int_high, shape).astype(dt))
    outs = model(*arrays)  # the first call grows the workspace
    times = []
    for _ in range(max(args.repeat, 1)):
        t0 = time.perf_counter()
        model(*arrays)
        times.append(time.perf_counter() - t0)
    for rec, a in zip(model.manifest.inputs, arrays):
        print(f"input  {rec.name}: {a.dtype}{list(a.shape)}")
    for name, o in zip(model.output_names, outs):
        print(f"output {name}: {o.dtype}{list(o.shape)}")
    print(
        f"median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
        f"over {len(times)} calls"
    )
    return 0


def input_shapes(manifest, given: dict[str, tuple[int, ...]], notes=None) -> list[tuple[int, ...]]:
    """Every input's shape: given ones as they are, the rest from the symbols they share.

    A symbol that no given shape carries (a mask's batch dim, free to be 1 or to
    broadcast) takes the size at the same position of a given input of the same
    rank; each such choice is appended to ``notes``.
    """
    env: dict[str, int] = {}
    for rec in manifest.inputs:
        if rec.name in given:
            shape = given[rec.name]
            if len(shape) != len(rec.dims):
                raise SystemExit(
                    f"anyshape run: input {rec.name!r} has rank {len(rec.dims)} "
                    f"({' x '.join(rec.dims)}), --shape gave {len(shape)} dims"
                )
            for dim, n in zip(rec.dims, shape):
                if dim.isidentifier():
                    env.setdefault(dim, n)
    for rec in manifest.inputs:
        if rec.name not in given:
            _assume_untied_dims(manifest, given, rec, env, notes)
    out = []
    for rec in manifest.inputs:
        if rec.name in given:
            out.append(given[rec.name])
            continue
        try:
            out.append(tuple(parse_expr(d).evaluate(env) for d in rec.dims))
        except (KeyError, ValueError, AnyshapeError):
            raise SystemExit(
                f"anyshape run: give --shape {rec.name}=...: its dims "
                f"[{', '.join(rec.dims)}] are not all known from the other shapes"
            ) from None
    return out


def _assume_untied_dims(manifest, given, rec, env: dict[str, int], notes) -> None:
    """Bind ``rec``'s bare symbols no shape gave to a same-rank given input's sizes."""
    like = [r for r in manifest.inputs if r.name in given and len(r.dims) == len(rec.dims)]
    if not like:
        return
    for d, dim in enumerate(rec.dims):
        if dim.isidentifier() and dim not in env:
            env[dim] = given[like[0].name][d]
            if notes is not None:
                notes.append(
                    f"{rec.name} dim {d} ({dim}) is not tied to a given shape: "
                    f"{env[dim]}, as {like[0].name} dim {d}"
                )


def dispatch(args: argparse.Namespace) -> int:
    commands = {"compile": compile_cmd, "explain": explain_cmd, "info": info_cmd, "run": run_cmd}
    commands["export-stablehlo"] = export_stablehlo_cmd
    return commands[args.command](args)
