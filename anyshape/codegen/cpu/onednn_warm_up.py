"""oneDNN's one-time GEMM kernel generation, started in the background when a compile starts.

Sits beside ``build`` and loads the libdnnl the built libraries link (its path from
``small_gemm_flags``; one copy in the process). oneDNN generates its GEMM kernels
(JIT) on the process's first GEMM: 23-26 ms inside the first matmul a compiled model
runs (BERT-base's first call 0.165 -> 0.137 s with it done before; AVX-512 Zen 5).
A compile first spends longer than that in Python (the capture, or a model-cache
restore) with a core free, so ``warm_up`` runs one 64x64 ``dnnl_sgemm`` on a daemon
thread there, once per process; ctypes lets the call run without the GIL. Whatever
fails there is left to the compiled model's first GEMM, which does the same work.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from pathlib import Path

from ...config import Options
from .build import small_gemm_flags

_lock = threading.Lock()
_started = False
_GEMM = 64  # rows, columns and depth of the warming GEMM (smaller ones skip the JIT)


def warm_up(options: Options) -> threading.Thread | None:
    """Start oneDNN's kernel generation on a daemon thread, the first time only (the
    thread, or None when oneDNN is not linked or it started before)."""
    global _started
    flags = small_gemm_flags(options.small_gemm)
    lib_dir = next((f[2:] for f in flags if f.startswith("-L")), None)
    if lib_dir is None:
        return None
    with _lock:
        if _started:
            return None
        _started = True
    thread = threading.Thread(target=_run_gemm, args=(Path(lib_dir) / "libdnnl.so.3",), daemon=True)
    try:
        thread.start()
    except RuntimeError:  # (no thread to be had: the first GEMM does the work)
        return None
    # A process leaving while the thread is inside oneDNN crashed in its teardown
    # (exit status 139): exits wait for the GEMM (tens of ms) first.
    atexit.register(thread.join, 5)
    return thread


def _run_gemm(path: Path) -> None:
    try:
        sgemm = ctypes.CDLL(str(path)).dnnl_sgemm
    except (OSError, AttributeError):
        return
    n = _GEMM
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, f32, ptr, i64, ptr, i64, f32,
                      ptr, i64]  # fmt: skip
    sgemm.restype = ctypes.c_int
    a = (ctypes.c_float * (n * n))()
    c = (ctypes.c_float * (n * n))()
    sgemm(b"N", b"N", n, n, n, 1.0, a, n, a, n, 0.0, c, n)
