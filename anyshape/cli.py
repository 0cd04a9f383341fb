"""The ``anyshape`` command line: ``bench`` runs the benchmarks in ``benchmarks/``
(``bench --training``: the training benchmark, ``benchmarks/training.py``);
``compile``, ``info`` and ``run`` make and use standalone artifacts
(``standalone.commands``).

Sits outside the compiler; importing this module imports neither torch nor
the benchmarks (both load when a subcommand runs). ``benchmarks`` lives at
the repository root, not inside the package: when it is not importable, the
checkout this ``anyshape`` was installed from (editable install) is put on
``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .errors import AnyshapeError
from .runtime.native import KernelError
from .standalone.commands import add_parsers as add_standalone_parsers
from .standalone.commands import dispatch as standalone_command

QUICK_REQUESTS = 6
FULL_REQUESTS = 30


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="anyshape", description="anyshape command line tools.")
    sub = ap.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="benchmark anyshape against eager, torch.compile and ONNX Runtime",
        description="Run every backend on seeded request streams of different shapes, "
        "interleaved per request, and write results.json, results.md and PNG plots. With "
        "--training: every backend fine-tunes its own copy of one model on the same seeded "
        "batches, interleaved per step; results.json and results.md.",
    )
    bench.add_argument("--quick", action="store_true", help="small configs and few requests")
    bench.add_argument("--out", default="bench-results", help="output folder (default %(default)s)")
    bench.add_argument(
        "--workloads",
        type=_names,
        help="comma-separated, or 'all' (default: all; with --quick a smaller selection)",
    )
    bench.add_argument(
        "--backends",
        type=_names,
        help="comma-separated (default: all but the ONNX mode's openvino_onnx, anyshape_onnx "
        "and anyshape_compile, anyshape as torch.compile's backend)",
    )
    bench.add_argument(
        "--onnx",
        action="store_true",
        help="ONNX mode: one exported .onnx file per model through onnxruntime, "
        "openvino_onnx and anyshape_onnx (anyshape's ONNX frontend), beside eager",
    )
    bench.add_argument(
        "--training",
        action="store_true",
        help="training mode: each backend fine-tunes its own copy of BERT with AdamW on the "
        "same batches, a step timed as forward, loss, backward and optimizer step; workloads: "
        "bert; backends: eager, inductor_dynamic, anyshape (torch.compile), anyshape_optimize",
    )
    bench.add_argument(
        "--dropout",
        type=float,
        help="training mode: dropout probability (default 0, so losses compare across backends)",
    )
    bench.add_argument(
        "--requests",
        type=int,
        help=f"requests (training: steps) per workload (default {QUICK_REQUESTS} with --quick, "
        f"else {FULL_REQUESTS})",
    )
    bench.add_argument(
        "--passes",
        type=int,
        default=1,
        help="serve each stream this many times, the same shapes in the same order; the "
        "steady state is then the last pass, every shape seen before (default 1)",
    )
    bench.add_argument("--seed", type=int, default=0, help="weights and request shapes")
    bench.add_argument(
        "--shapes",
        action="append",
        default=[],
        metavar="KIND=LO-HI,...",
        help="request-shape ranges per kind, e.g. text=1-8,8-256 (batch, sequence) or "
        "image=1-4,160-224 (batch, pixels) or audio=1-4,16000-80000 (batch, samples); repeatable (training: text only, default "
        "text=1-16,8-256)",
    )
    bench.add_argument(
        "--anyshape-backend", choices=["cpu", "interpreter"], default="cpu", help="default cpu"
    )
    bench.add_argument(
        "--fresh-caches",
        action="store_true",
        help="empty Inductor and anyshape compile caches (cold compile times)",
    )
    bench.add_argument(
        "--threads",
        type=int,
        help="threads for torch, Inductor, anyshape and ONNX Runtime (default: torch's)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--no-set-up",
        action="store_true",
        help="skip each backend's one-time set-up on a one-op model before the streams, so "
        "the first workload's compile times include imports and first use",
    )
    add_standalone_parsers(sub)
    return ap


def _import_benchmarks():
    try:
        import benchmarks  # noqa: F401
    except ImportError:
        root = Path(__file__).resolve().parent.parent
        if not (root / "benchmarks" / "runner.py").exists():
            raise SystemExit(
                "anyshape bench needs the benchmarks/ folder of an anyshape checkout "
                "(install with pip install -e .)"
            ) from None
        sys.path.insert(0, str(root))
    from benchmarks import backends, report, runner, workloads

    return backends, report, runner, workloads


def _import_training():
    _import_benchmarks()  # (puts the checkout on sys.path when it has to)
    from benchmarks import training

    return training


def _shape_ranges(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text=1-8,8-256`` -> ("text", [(1, 8), (8, 256)])."""
    kind, sep, spec = text.partition("=")
    try:
        pairs = [tuple(int(v) for v in part.split("-")) for part in spec.split(",")]
    except ValueError:
        pairs = []
    if not sep or not pairs or any(len(p) != 2 or not 0 < p[0] <= p[1] for p in pairs):
        raise ValueError(f"--shapes {text!r}: expected KIND=LO-HI,LO-HI with 0 < LO <= HI")
    return kind, pairs


def _check(ap: argparse.ArgumentParser, kind: str, chosen: list[str], known) -> None:
    unknown = [n for n in chosen if n not in known]
    if unknown:
        ap.error(f"unknown {kind} {unknown}; choose from {', '.join(known)}")


def _requests(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    requests = args.requests or (QUICK_REQUESTS if args.quick else FULL_REQUESTS)
    if requests < 2:
        ap.error("--requests must be at least 2 (the first call compiles)")
    return requests


def _ranges(ap: argparse.ArgumentParser, args: argparse.Namespace, kinds: dict) -> dict:
    """``--shapes`` per kind, each with as many ranges as ``kinds`` says its shapes have."""
    try:
        ranges = {kind: r for kind, r in map(_shape_ranges, args.shapes)}
    except ValueError as e:
        ap.error(str(e))
    unknown_kinds = set(ranges) - set(kinds)
    if unknown_kinds:
        ap.error(f"--shapes: unknown kind(s) {sorted(unknown_kinds)}; one of {', '.join(kinds)}")
    for kind, r in ranges.items():
        if len(r) != kinds[kind]:
            ap.error(f"--shapes {kind}: {len(r)} range(s), its shapes have {kinds[kind]} dims")
    return ranges


def _workloads(ap, args, default: list[str], known: list[str], kind: str) -> list[str]:
    """``--workloads`` as chosen (``all``: every known one), checked against ``known``."""
    chosen = args.workloads or default
    chosen = known if chosen == ["all"] else chosen
    _check(ap, kind, chosen, known)
    return chosen


def _write(report, results: dict, out: str, t0: float, table=None) -> int:
    paths = report.write(results, out)
    print((table or report.table)(results))
    print(f"wrote {', '.join(str(p) for p in paths)} in {time.perf_counter() - t0:.0f} s")
    return 0


# Backends run only when named: the ONNX mode's two (they read the exported file) and
# anyshape through torch.compile (the same compiler as `anyshape`, its first call paying
# Dynamo's and AOTAutograd's trace: 15-26 s on the full-size models).
OPT_IN_BACKENDS = ("openvino_onnx", "anyshape_onnx", "anyshape_compile")


def bench(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    if args.training:
        return bench_training(ap, args, command)
    if args.dropout is not None:
        ap.error("--dropout applies to the training mode (--training)")
    backends, report, runner, workloads = _import_benchmarks()
    known_backends = list(backends.backends())
    default = workloads.QUICK_WORKLOADS if args.quick else list(workloads.WORKLOADS)
    chosen_workloads = _workloads(ap, args, default, list(workloads.WORKLOADS), "workloads")
    onnx_mode = ["onnxruntime", "openvino_onnx", "anyshape_onnx"]
    if args.onnx and args.backends:
        ap.error("--onnx picks the backends itself; give --backends or --onnx, not both")
    chosen_backends = args.backends or (
        onnx_mode if args.onnx else [b for b in known_backends if b not in OPT_IN_BACKENDS]
    )
    _check(ap, "backends", chosen_backends, known_backends)
    requests = _requests(ap, args)
    if args.passes < 1:
        ap.error("--passes must be at least 1")
    ranges = _ranges(ap, args, {k: len(r) for k, r in workloads.FULL_RANGES.items()})
    settings = runner.Settings(
        workloads=chosen_workloads,
        backends=["eager", *[b for b in chosen_backends if b != "eager"]],
        requests=requests,
        seed=args.seed,
        quick=args.quick,
        anyshape_backend=args.anyshape_backend,
        fresh_caches=args.fresh_caches,
        threads=args.threads,
        progress=not args.no_progress,
        set_up=not args.no_set_up,
        ranges=ranges,
        passes=args.passes,
    )
    t0 = time.perf_counter()
    return _write(report, runner.run(settings, command), args.out, t0, report.stream_table)


def bench_training(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    """``anyshape bench --training``: its own workloads and backends (``benchmarks/training.py``)."""
    if args.onnx:
        ap.error("--onnx is an inference mode; give --training or --onnx, not both")
    if args.anyshape_backend != "cpu":
        ap.error("--training compiles with anyshape's cpu backend; --anyshape-backend must be cpu")
    if args.passes != 1:
        ap.error("--passes applies to inference streams; a training run takes --requests steps")
    training = _import_training()
    known = list(training.WORKLOADS)
    workloads = _workloads(ap, args, known, known, "training workloads")
    chosen_backends = args.backends or list(training.backends())
    _check(ap, "training backends", chosen_backends, list(training.backends()))
    dropout = 0.0 if args.dropout is None else args.dropout
    if not 0.0 <= dropout < 1.0:
        ap.error(f"--dropout {dropout}: expected 0 <= P < 1")
    ranges = _ranges(ap, args, {"text": 2})
    settings = training.Settings(
        workloads=workloads,
        backends=["eager", *[b for b in chosen_backends if b != "eager"]],
        requests=_requests(ap, args),
        seed=args.seed,
        quick=args.quick,
        dropout=dropout,
        fresh_caches=args.fresh_caches,
        threads=args.threads,
        progress=not args.no_progress,
        ranges=ranges,
    )
    t0 = time.perf_counter()
    return _write(training, training.run(settings, command), args.out, t0)


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.command == "bench":
        return bench(ap, args, " ".join(["anyshape", *argv]))
    try:
        return standalone_command(args)
    except (AnyshapeError, KernelError) as e:  # one line: the message says it all
        print(f"anyshape {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
