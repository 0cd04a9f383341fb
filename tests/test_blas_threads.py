"""OpenBLAS's idle server threads do not spin beside the work (config.quiet_blas_server_threads):
the runtime's OpenBLAS runs its parallel work on anyshape's OpenMP pool, so a server
thread spinning while it waits for work only takes a core from whatever runs beside it."""

from __future__ import annotations

import os
import subprocess
import sys

# Loads the runtime's OpenBLAS as the runtime does and reports the CPU seconds the process
# spent in the 0.3 s after (its server threads start then), then compiles and runs a model
# whose library links OpenBLAS and reports the timeout the process holds.
SCRIPT = """
import os, time
from anyshape.runtime.native import import_openblas
start = time.process_time()
import_openblas()
time.sleep(0.3)
cpu = time.process_time() - start
import torch, anyshape
m = torch.nn.Linear(64, 32).eval()
opt = anyshape.optimize(m, (torch.randn(8, 64),), model_cache=False, small_gemm="openblas")
x = torch.randn(16, 64)
assert torch.allclose(opt(x), m(x), atol=1e-5)
assert "libscipy_openblas" in open("/proc/self/maps").read(), "OpenBLAS is not loaded"
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), cpu)
"""


def _run() -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    timeout, cpu = out.stdout.split()[-2:]
    return timeout, float(cpu)


def test_the_server_threads_sleep_at_once():
    timeout, cpu_after_load = _run()
    assert timeout == "4"
    # (with OpenBLAS's default timeout, 2**28 cycles, loading took 0.12 s of CPU here)
    assert cpu_after_load < 0.08


def test_a_timeout_the_user_set_is_kept():
    env = {**os.environ, "OPENBLAS_THREAD_TIMEOUT": "28"}  # OpenBLAS's default
    script = (
        "import os\n"
        "from anyshape.runtime.native import import_openblas\n"
        "import_openblas()\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "28"
