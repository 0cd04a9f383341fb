"""Standalone-mode figures: export time, artifact size, load time, per-call overhead, speed.

Run: ``python -m benchmarks.standalone [--quick] [--requests N]``. For BERT-base
and GPT-2 small (random weights): export once, then

* load time in a fresh process where importing torch raises (page cache warm:
  the file is loaded once first), both the ``anyshape.load`` call and the
  whole process (interpreter start + imports + load);
* the artifact's max abs error against eager over a 20-request stream (batch
  1-8, sequence 8-256), and steady-state medians of eager, the artifact
  (portable ``x86-64-v3``) and a ``target="native"`` export, interleaved per
  request in this process;
* per-call overhead from NumPy of a one-op graph (``x + 1`` on 16 elements).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import anyshape
from benchmarks import workloads

LOAD_PROBE = """
import sys, time, json
t0 = time.perf_counter()
sys.modules["torch"] = None
import anyshape
t1 = time.perf_counter()
model = anyshape.load(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
"""


def load_times(path: Path, runs: int = 5) -> dict:
    """Median import and load times over fresh processes (after one warm-up process)."""
    results = []
    for k in range(runs + 1):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", LOAD_PROBE, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - t0
        if k:
            results.append({**json.loads(out.stdout), "process_s": wall})
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def overhead_us(calls: int = 20000) -> float:
    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with tempfile.TemporaryDirectory() as tmp:
        path = anyshape.export(AddOne(), (torch.randn(4, 4),)).save(Path(tmp) / "add.anyshape")
        model = anyshape.load(path)
    x = np.ones(16, np.float32).reshape(4, 4)
    for _ in range(1000):
        model(x)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            model(x)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


TEXT_RANGES = [(1, 8), (8, 256)]  # the request stream the CPU-backend figures use


def measure(name: str, quick: bool, requests: int, seed: int) -> dict:
    built = workloads.build(name, quick, seed)
    shapes = workloads.stream("text", requests, seed, quick, None if quick else TEXT_RANGES)
    shapes[0] = (1, shapes[0][1])  # batch 1 is always in the stream
    example = built.inputs(built.example)
    t0 = time.perf_counter()
    artifact = anyshape.export(built.model, example)
    export_s = time.perf_counter() - t0
    native = anyshape.export(built.model, example, target="native").load()
    with tempfile.TemporaryDirectory() as tmp:
        path = artifact.save(Path(tmp) / f"{name}.anyshape")
        size_mb = path.stat().st_size / 1e6
        loads = load_times(path)
        model = anyshape.load(path)
        times = {"eager": [], "portable": [], "native": []}
        worst = 0.0
        with torch.no_grad():
            for shape in shapes:
                inputs = built.inputs(shape)
                arrays = [v.numpy() for v in inputs.values()]
                t = time.perf_counter()
                want = built.model(**inputs)[0].numpy()
                times["eager"].append(time.perf_counter() - t)
                for label, runner in (("portable", model), ("native", native)):
                    t = time.perf_counter()
                    got = runner(*arrays)[0]
                    times[label].append(time.perf_counter() - t)
                    worst = max(worst, float(np.max(np.abs(got - want))))
    median = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
    return {
        "model": name,
        "export_s": export_s,
        "artifact_mb": size_mb,
        **loads,
        "max_abs_err": worst,
        **{f"{k}_median_ms": v for k, v in median.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one-layer configs")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = [measure(n, args.quick, args.requests, args.seed) for n in ("bert", "gpt2")]
    print(f"machine: {torch.get_num_threads()} threads, torch {torch.__version__}")
    for r in rows:
        e = r["eager_median_ms"]
        print(
            f"{r['model']}: export {r['export_s']:.1f} s, {r['artifact_mb']:.0f} MB; load "
            f"{r['load_s'] * 1e3:.0f} ms (whole process {r['process_s'] * 1e3:.0f} ms); steady "
            f"medians: eager {e:.1f} ms, artifact x86-64-v3 {r['portable_median_ms']:.1f} ms "
            f"({e / r['portable_median_ms']:.2f}x), native {r['native_median_ms']:.1f} ms "
            f"({e / r['native_median_ms']:.2f}x); max abs error vs eager {r['max_abs_err']:.1e}"
        )
    print(f"one-op graph from NumPy: {overhead_us():.1f} us per call")


if __name__ == "__main__":
    main()
