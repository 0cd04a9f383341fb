"""The benchmark runner: every backend on the same seeded request stream, interleaved per request.

Sits on top of ``workloads``, ``backends`` and ``probes``; ``anyshape bench``
calls ``run(settings)`` and hands the result to ``report.write``. Per request,
eager runs first (its output is the reference for the error column), then the
other backends in an order rotated by one every request, all on the same
input tensors in one process. A backend's first call includes its
ahead-of-time work (export, ``optimize``) and its compilation. A failure is
recorded with its message and that backend sits out the rest of the stream.

Before the first stream, each backend sets itself up once on a tiny model of its
own (``set_up``): imports, the exporter's and the runtime's first use. That cost
is paid once per process whatever the models, so it is reported on its own
(``setup`` in the results, a line under the table) rather than landing in the
first workload's compile time of whichever backend happens to go first.

With ``passes`` > 1 the stream is served again, the same shapes in the same order:
the steady state is then the last pass, where every backend has seen every shape
(per-shape work such as oneDNN's primitives for a new image size is done), and the
first pass's median, every shape new, is reported beside it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from . import probes, workloads
from .backends import Backend, backends

WARMUP = 1  # requests excluded from the steady state (the first call compiles)
CACHE_VARIABLES = ["TORCHINDUCTOR_CACHE_DIR", "ANYSHAPE_CACHE_DIR"]


@dataclass(frozen=True)
class Settings:
    """What to run; eager always runs (it is the reference) whether listed or not."""

    workloads: list[str]
    backends: list[str]
    requests: int
    seed: int = 0
    quick: bool = False
    anyshape_backend: str = "cpu"
    fresh_caches: bool = False
    threads: int | None = None  # torch (and so Inductor, anyshape, ONNX Runtime) threads
    probe: bool = True
    progress: bool = True
    set_up: bool = True  # each backend's one-time process set-up before the streams
    ranges: dict = field(default_factory=dict)  # kind -> [(lo, hi) per dim]: overrides
    passes: int = 1  # the stream served this many times; the last pass is the steady state


@dataclass
class Track:
    """One backend's measurements on one workload."""

    backend: Backend
    run: object = None
    seconds: list[float] = field(default_factory=list)
    graphs_first_call: int | None = None
    recompiles: int | None = None
    max_abs_err: float | None = None
    rss_growth_kb: int = 0
    rss_peak_kb: int = 0
    error: str | None = None


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def first_tensor(out) -> torch.Tensor | None:
    """The first tensor leaf of a model output (``last_hidden_state``, ``logits``, ...)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict without None fields
        out = list(out.values())
    if isinstance(out, list | tuple):
        for item in out:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def _describe(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 300 else text[:297] + "..."


def _call(track: Track, model, example, inputs, index: int, shape) -> torch.Tensor | None:
    """Time one request on one backend (its first also prepares it); None when it fails."""
    before, rss_before = track.backend.compilations(), peak_rss_kb()
    try:
        t0 = time.perf_counter()
        if track.run is None:
            track.run = track.backend.prepare(model, example)
        out = track.run(inputs)
        seconds = time.perf_counter() - t0
    except Exception as e:  # any backend failure is a result, not a crash
        where = "compile/first call" if index == 0 else f"request {index} {tuple(shape)}"
        track.error = f"{where}: {_describe(e)}"
        return None
    track.seconds.append(seconds)
    track.rss_peak_kb = peak_rss_kb()
    track.rss_growth_kb += track.rss_peak_kb - rss_before
    _count_compilations(track, before, index)
    return first_tensor(out)


def _count_compilations(track: Track, before: int | None, index: int) -> None:
    after = track.backend.compilations()
    if before is None or after is None:
        return
    if index == 0:
        track.graphs_first_call, track.recompiles = after - before, 0
    else:
        track.recompiles += after - before


def _compare(track: Track, got: torch.Tensor | None, ref: torch.Tensor | None, index: int) -> None:
    if got is None or ref is None:
        return
    if got.shape != ref.shape:
        track.error = (
            f"request {index}: output shape {tuple(got.shape)} != eager {tuple(ref.shape)}"
        )
        return
    err = (got.double() - ref.double()).abs().nan_to_num(nan=float("inf")).max().item()
    track.max_abs_err = max(err, track.max_abs_err or 0.0)


def _work(bound: str, model, inputs: dict, ref: torch.Tensor | None) -> float | None:
    """FLOPs (compute-bound workloads, counted on eager) or minimal bytes moved (memory-bound)."""
    if bound == "compute":
        with FlopCounterMode(display=False) as counter:
            model(**inputs)
        return float(counter.get_total_flops())
    if ref is None:
        return None
    return float(sum(t.nbytes for t in inputs.values()) + ref.nbytes)


def run_workload(name: str, settings: Settings, bar) -> dict:
    """Every selected backend over one workload's stream; the workload's section of the results."""
    spec = workloads.WORKLOADS[name]
    built = workloads.build(name, settings.quick, settings.seed)
    shapes = workloads.stream(
        spec.kind, settings.requests, settings.seed, settings.quick, settings.ranges.get(spec.kind)
    )
    example = built.inputs(built.example)
    table = backends(settings.anyshape_backend)
    eager = Track(table["eager"])
    others = [Track(table[b]) for b in settings.backends if b != "eager"]
    work = []
    with torch.no_grad():
        for i, shape in enumerate(shapes * settings.passes):
            inputs = built.inputs(shape)
            ref = _step(eager, built.model, example, inputs, i, shape, bar, name)
            for k in range(len(others)):
                track = others[(i + k) % len(others)]
                got = _step(track, built.model, example, inputs, i, shape, bar, name)
                _compare(track, got, ref, i)
            if i < len(shapes):
                work.append(_work(spec.bound, built.model, inputs, ref))
    return {
        "kind": spec.kind,
        "bound": spec.bound,
        "description": spec.description,
        "example_shape": list(built.example),
        "shapes": [list(s) for s in shapes],
        "sizes": [workloads.size(spec.kind, s) for s in shapes],
        "work": work,
        "work_unit": "flop" if spec.bound == "compute" else "byte",
        "passes": settings.passes,
        "results": [_summary(t, eager, work, spec.bound) for t in [eager, *others]],
    }


def _step(track: Track, model, example, inputs, index: int, shape, bar, name: str):
    if bar is not None:
        bar.set_description(f"{name}/{track.backend.name}")
        bar.update(1)
    if track.error is not None:
        return None
    return _call(track, model, example, inputs, index, shape)


def steady_indices(count: int, per_pass: int | None = None) -> range:
    """The requests that make the steady state: after the first (it compiles), or with
    several passes of ``per_pass`` requests, the last pass."""
    if per_pass and count > per_pass:
        return range((count - 1) // per_pass * per_pass, count)
    return range(min(WARMUP, count), count)


def timings(
    seconds: list[float], eager_seconds: list[float], failed: bool, per_pass: int | None = None
) -> dict:
    """The time columns of a backend's summary: first call, total (the stream served once,
    compile included), steady-state median, p90, the median of its per-request ratios
    to eager and, with several passes, the first pass's median."""
    steady_at = steady_indices(len(seconds), per_pass)
    steady = [seconds[i] for i in steady_at]
    ratios = [eager_seconds[i] / seconds[i] for i in steady_at if i < len(eager_seconds)]
    first_pass = seconds[:per_pass] if per_pass else seconds
    first_new = first_pass[WARMUP:]
    return {
        "compile_s": seconds[0] if seconds else None,
        "total_s": sum(first_pass) if not failed else None,
        "median_ms": statistics.median(steady) * 1e3 if steady else None,
        "p90_ms": float(np.percentile(steady, 90)) * 1e3 if steady else None,
        "ratio_vs_eager": statistics.median(ratios) if ratios else None,
        "first_pass_median_ms": statistics.median(first_new) * 1e3
        if per_pass and len(seconds) > per_pass and first_new
        else None,
    }


def _summary(track: Track, eager: Track, work: list, bound: str) -> dict:
    n = len(work)
    steady_at = steady_indices(len(track.seconds), n)
    rates = [work[i % n] / track.seconds[i] for i in steady_at if work[i % n] is not None]
    return {
        "backend": track.backend.name,
        "description": track.backend.description,
        "error": track.error,
        "requests_done": len(track.seconds),
        **timings(track.seconds, eager.seconds, track.error is not None, n),
        "graphs_first_call": track.graphs_first_call,
        "recompiles": track.recompiles,
        "peak_rss_mb": track.rss_peak_kb / 1024 if track.seconds else None,
        "rss_growth_mb": track.rss_growth_kb / 1024,
        "max_abs_err": track.max_abs_err,
        "median_rate": statistics.median(rates) if rates else None,
        "rate_unit": "flop/s" if bound == "compute" else "byte/s",
        "request_ms": [s * 1e3 for s in track.seconds],
    }


class TinyModel(torch.nn.Module):
    """The set-up model: one elementwise expression, sharing no GEMM or reduction with
    any workload."""

    def forward(self, x):
        return torch.relu(x * 2.0 + 1.0)


def set_up(settings: Settings) -> dict[str, float | str]:
    """Each backend's one-time process set-up: prepared and called once on ``TinyModel``,
    in ``settings.backends`` order; its seconds, or the error it failed with (the
    stream then records its own)."""
    table = backends(settings.anyshape_backend)
    model, example = TinyModel(), {"x": torch.randn(2, 3)}
    setup: dict[str, float | str] = {}
    with torch.no_grad():
        for name in settings.backends:
            try:
                t0 = time.perf_counter()
                table[name].prepare(model, example)(example)
                setup[name] = time.perf_counter() - t0
            except Exception as e:  # reported with the results, never fatal
                setup[name] = _describe(e)
    torch._dynamo.reset()
    return setup


@contextlib.contextmanager
def _fresh_caches(enabled: bool):
    """Point Inductor's and anyshape's disk caches at an empty folder (cold compile times)."""
    if not enabled:
        yield
        return
    saved = {k: os.environ.get(k) for k in CACHE_VARIABLES}
    root = tempfile.mkdtemp(prefix="anyshape-bench-cache-")
    for k in CACHE_VARIABLES:
        os.environ[k] = os.path.join(root, k.lower())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


def _fraction(result: dict, limits: dict | None) -> float | None:
    """A median rate as a fraction of the machine limit that bounds its workload."""
    if limits is None or not result["median_rate"]:
        return None
    if result["rate_unit"] == "flop/s":
        return result["median_rate"] / (limits["gemm"]["gflops"] * 1e9)
    return result["median_rate"] / (limits["copy"]["gb_per_s"] * 1e9)


def run(settings: Settings, command: str = "") -> dict:
    """Probe the machine, run every workload, and return the results document."""
    started = time.time()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    machine = probes.machine()
    limits = probes.probe(settings.quick) if settings.probe else None
    with _fresh_caches(settings.fresh_caches):
        setup = set_up(settings) if settings.set_up else None
        sections = _run_all(settings, limits)
    machine["load_average_end"] = probes.load_average()
    machine["capped_cpuid_calls"] = probes.capped_cpuid_calls()
    return {
        "command": command,
        "settings": asdict(settings),
        "machine": machine,
        "probes": limits,
        "wall_s": time.time() - started,
        "setup": setup,
        "workloads": sections,
    }


def _run_all(settings: Settings, limits: dict | None) -> dict:
    bar = _progress(settings)
    sections = {}
    for name in settings.workloads:
        try:
            sections[name] = run_workload(name, settings, bar)
        except Exception as e:  # a workload that cannot even be built is reported, not fatal
            sections[name] = {"error": _describe(e), "results": []}
        for result in sections[name]["results"]:
            result["fraction_of_limit"] = _fraction(result, limits)
        torch._dynamo.reset()  # no compiled code or recompile budget carried into the next one
    if bar is not None:
        bar.close()
    return sections


def _progress(settings: Settings):
    if not settings.progress:
        return None
    from tqdm import tqdm

    total = len(settings.workloads) * settings.requests * settings.passes * len(settings.backends)
    return tqdm(total=total, unit="call", file=sys.stderr, dynamic_ncols=True)
