"""Compile time of one workload: ``anyshape.optimize`` plus its first call, cold or warm.

Run: ``python -m benchmarks.compile_time [--workload bert] [--cache DIR]``. The
first run with an empty ``--cache`` folder is the cold compile (capture,
passes, C++ build); a second run with the same folder is warm (the model cache
restores the compiled model). Each run is its own process, as a user's would
be. Prints seconds and the largest difference from eager at a shape other than
the example's, so a fast wrong compile cannot pass unnoticed, then the time of each
stage of the compile (``explain()``'s compile time).

``--runs N`` measures N times, each in new processes over a new empty cache folder:
cold with the folder empty (the first compile on a machine also builds the objects
every later library links, the oneDNN glue: ``codegen/cpu/build.py``), warm, and
cold again with the compiled model removed and those objects kept (a model new to
a machine that compiled before). It prints the median, least and most of each:
one process's figure moves by a fifth or more on a shared 2-core host.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bert")
    parser.add_argument("--cache", help="anyshape's cache folder (default: its usual one)")
    parser.add_argument("--quick", action="store_true", help="the small config of the workload")
    parser.add_argument(
        "--runs", type=int, help="N cold and warm compiles, each in a new process (see above)"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (--runs' child)
    args = parser.parse_args(argv)
    if args.runs is not None:
        if args.runs < 1 or args.cache:
            parser.error("--runs takes N >= 1 and no --cache (each run has its own folder)")
        return _runs(args.workload, args.quick, args.runs)
    seconds, err, timings = _measure(args.workload, args.quick, args.cache)
    if args.json:
        print(json.dumps({"seconds": seconds, "err": err, "timings": timings}))
        return
    print(f"{args.workload}: optimize + first call {seconds:.2f} s (max err {err:.1e})")
    if timings:  # where optimize's time went (explain() prints the same)
        print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def _measure(workload: str, quick: bool, cache: str | None) -> tuple[float, float, dict]:
    """Seconds of optimize plus a first call at a shape other than the example's, the
    largest difference from eager there, and the compile's stages."""
    import torch

    import anyshape
    from benchmarks.workloads import WORKLOADS

    torch.manual_seed(0)
    built = WORKLOADS[workload].factory(quick)
    model = built.model.eval()
    example = built.inputs(built.example)
    other = built.inputs(tuple(d + 1 for d in built.example))
    start = time.perf_counter()
    options = {"cache_dir": cache} if cache else {}
    compiled = anyshape.optimize(model, example, **options)
    with torch.no_grad():
        got = compiled(**other)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        want = model(**other)
    err = (_first(got) - _first(want)).abs().max().item()
    timings = getattr(getattr(compiled, "report", None), "timings", {})
    return seconds, err, dict(timings)


KINDS = ("cold, empty cache", "warm", "cold, the machine's objects kept")


def _runs(workload: str, quick: bool, runs: int) -> None:
    """``runs`` times each of ``KINDS`` in new processes; the median and range of each."""
    results: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="anyshape-compile-time-") as cache:
            for kind in KINDS:
                if kind == KINDS[2]:
                    _drop_compiled_models(Path(cache))
                cmd = [sys.executable, "-m", "benchmarks.compile_time", "--workload", workload]
                cmd += ["--cache", cache, "--json"] + (["--quick"] if quick else [])
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                results[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for kind, rows in results.items():
        secs = [r["seconds"] for r in rows]
        err = max(r["err"] for r in rows)
        print(
            f"{workload} {kind}: optimize + first call median {statistics.median(secs):.2f} s "
            f"(least {min(secs):.2f}, most {max(secs):.2f}; {runs} processes; max err {err:.1e})"
        )
        stages = {k for r in rows for k in r["timings"]}
        medians = {k: statistics.median(r["timings"].get(k, 0.0) for r in rows) for k in stages}
        order = list(rows[0]["timings"]) + sorted(stages - set(rows[0]["timings"]))
        print("  median " + ", ".join(f"{k} {medians[k]:.2f} s" for k in order))


def _drop_compiled_models(cache: Path) -> None:
    """The cache folder without its compiled models (their entries and libraries): what
    stays is what any library on this machine links, built by the first compile (the
    oneDNN glue object, ``dnnl_glue_object``)."""
    from anyshape.codegen.cpu.build import GLUE_NAME

    shutil.rmtree(cache / "models", ignore_errors=True)
    for f in cache.iterdir():
        if f.is_file() and not f.name.startswith(f"{GLUE_NAME}-"):
            f.unlink()


def _first(out):
    """The first output of a model: the tensor itself, a tuple's first item or a model
    output's first field."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, (tuple, list)) else next(iter(out.values()))


if __name__ == "__main__":
    main()
