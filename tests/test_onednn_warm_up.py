"""oneDNN's GEMM kernels generated on a background thread when a compile starts, once per
process (codegen/cpu/onednn_warm_up.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from anyshape.codegen.cpu import build, onednn_warm_up
from anyshape.config import Options

pytest.importorskip("importlib.metadata").distribution("onednn-cpu-gomp")  # a dependency


def test_it_runs_one_gemm_in_the_library_the_builds_link_once(monkeypatch):
    ran = []
    monkeypatch.setattr(onednn_warm_up, "_started", False)
    monkeypatch.setattr(onednn_warm_up, "_run_gemm", ran.append)
    first = onednn_warm_up.warm_up(Options())
    assert first is not None and first.daemon
    first.join(10)
    assert onednn_warm_up.warm_up(Options()) is None  # once per process
    (path,) = ran
    linked = next(f[2:] for f in build.small_gemm_flags("onednn") if f.startswith("-L"))
    assert path.name == "libdnnl.so.3" and str(path.parent) == linked and path.exists()


def test_nothing_starts_without_onednn(monkeypatch):
    monkeypatch.setattr(onednn_warm_up, "_started", False)
    assert onednn_warm_up.warm_up(Options(small_gemm="openblas")) is None
    assert onednn_warm_up._started is False


def test_the_gemm_itself_runs_in_a_fresh_process():
    """The real call (ctypes, the library's dnnl_sgemm), then a compiled model's GEMMs."""
    script = (
        "import torch, anyshape\n"
        "from anyshape.codegen.cpu import onednn_warm_up\n"
        "from anyshape.config import Options\n"
        "t = onednn_warm_up.warm_up(Options()); t.join(60); assert not t.is_alive()\n"
        "m = torch.nn.Linear(64, 32).eval()\n"
        "opt = anyshape.optimize(m, (torch.randn(8, 64),), model_cache=False)\n"
        "x = torch.randn(16, 64)\n"
        "assert torch.allclose(opt(x), m(x), atol=1e-5)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_a_process_leaving_at_once_exits_cleanly():
    """Exiting while the thread is inside oneDNN crashed oneDNN's teardown (status 139):
    the exit waits for the GEMM."""
    script = (
        "from anyshape.codegen.cpu import onednn_warm_up\n"
        "from anyshape.config import Options\n"
        "onednn_warm_up.warm_up(Options())\n"
    )
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
