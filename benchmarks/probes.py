"""Machine probes: what this CPU can do, measured in the same run as the benchmarks.

Sits beside ``runner``, which calls ``machine()`` and ``probe()`` once per run
so every latency can also be read as a fraction of the machine's limits: peak
fp32 GEMM GFLOP/s (the best of ``torch.mm`` and NumPy over a few sizes) and
copy bandwidth in GB/s (bytes read plus bytes written by a large copy).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict:
    """CPU model, core counts, library versions and the load at the time of asking."""
    import anyshape

    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "anyshape": anyshape.__version__,
        "onnxruntime": _version("onnxruntime"),
        "openvino": _version("openvino"),
        "load_average": load_average(),
        "isa": isa(),
    }


def isa() -> str:
    """The widest x86 vector ISA this process's libraries may use: "AVX-512", "AVX2", or
    "AVX2 (capped)" under ``benchmarks.avx2_only`` on a machine with AVX-512."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    native = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "other"
    if os.environ.get("ANYSHAPE_ISA_CAP") == "AVX2" and native == "AVX-512":
        if capped_cpuid_calls() is None:  # (the preloaded handler is not in this process)
            return "AVX-512 (an AVX2 cap asked for but not in effect)"
        return "AVX2 (capped)"
    return native


def capped_cpuid_calls() -> int | None:
    """How many cpuid instructions of the peers' patched libraries ran so far, each
    answered without AVX-512 (``benchmarks.avx2_only``); None outside that tool."""
    import ctypes

    try:
        return int(ctypes.CDLL(None).anyshape_avx2_cpuid_calls())
    except (AttributeError, OSError):
        return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _best_seconds(fn, args: tuple, repeat: int) -> float:
    fn(*args)  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_gflops(sizes: list[int], repeat: int = 5) -> dict:
    """Best fp32 GFLOP/s of square ``torch.mm`` and NumPy matmul over ``sizes``."""
    found = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        flops = 2.0 * n**3
        found[f"torch.mm n={n}"] = flops / _best_seconds(torch.mm, (a, b), repeat) / 1e9
        found[f"numpy n={n}"] = (
            flops / _best_seconds(np.matmul, (a.numpy(), b.numpy()), repeat) / 1e9
        )
    best = max(found, key=found.get)
    return {"gflops": round(found[best], 1), "best_of": best, "all": _rounded(found)}


def copy_bandwidth(megabytes: int, repeat: int = 5) -> dict:
    """GB/s of a large float32 copy, counting the bytes read and the bytes written."""
    src = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    seconds = _best_seconds(np.copyto, (dst, src), repeat)
    return {"gb_per_s": round(2 * src.nbytes / seconds / 1e9, 2), "megabytes": megabytes}


def probe(quick: bool) -> dict:
    sizes = [256, 512, 1024] if quick else [512, 1024, 2048]
    return {"gemm": gemm_gflops(sizes), "copy": copy_bandwidth(128 if quick else 512)}


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in values.items()}
