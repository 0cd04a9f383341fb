"""``benchmarks.avx2_only``: a library whose ``cpuid`` is patched sees no AVX-512 and no AMX.

A small library asks ``cpuid`` leaf 7 and leaf 0 itself. Its copy, patched, under the
preloaded handler, answers as the CPU does with the AVX-512 and AMX bits cleared and the
rest (the vendor string of leaf 0, the AVX2 bit) unchanged; the library as built answers
with the CPU's own bits. A ``ud2`` outside the patched folder still traps.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import avx2_only

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not shutil.which("objdump") or not shutil.which("gcc"),
    reason="needs Linux on x86-64 with objdump and gcc",
)

ASKS_CPUID = r"""
#include <cpuid.h>
unsigned leaf(unsigned l, unsigned s, int reg) {
  unsigned r[4];
  __cpuid_count(l, s, r[0], r[1], r[2], r[3]);
  return r[reg];
}
void trap(void) { __builtin_trap(); }
"""

READS = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.leaf.restype = ctypes.c_uint
print(lib.leaf(7, 0, 1), lib.leaf(7, 0, 2), lib.leaf(7, 0, 3), lib.leaf(7, 1, 0),
      lib.leaf(0, 0, 1), lib.leaf(0, 0, 2), lib.leaf(0, 0, 3))
if len(sys.argv) > 2:
    lib.trap()
"""

AVX2 = 1 << 5  # leaf 7 EBX
AVX512F, AVX512BW, AVX512VL = 1 << 16, 1 << 30, 1 << 31


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the library as built, its patched copy, the patched folder)."""
    root = tmp_path_factory.mktemp("avx2_only")
    (root / "asks.c").write_text(ASKS_CPUID)
    built = root / "asks.so"
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", str(root / "asks.c"), "-o", str(built)], check=True
    )
    patched_dir = root / "patched"
    patched_dir.mkdir()
    patched = patched_dir / "asks.so"
    shutil.copy(built, patched)
    assert avx2_only.patch_library(patched) == 1  # one cpuid in leaf()
    return built, patched, patched_dir


@pytest.fixture(scope="module")
def preload(tmp_path_factory) -> Path:
    """The handler library, built once for the module."""
    return avx2_only.preload_library(tmp_path_factory.mktemp("preload"))


def _env(patched_dir: Path, preload: Path | None, **more: str) -> dict[str, str]:
    """A small environment with the handler preloaded (unless None) for ``patched_dir``."""
    env = {"ANYSHAPE_AVX2_PATCHED": f"{patched_dir}/", "PATH": "/usr/bin:/bin", **more}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    return env


def _read(
    library: Path, patched_dir: Path, preload: Path, *extra: str, python: tuple = ()
) -> subprocess.CompletedProcess:
    env = _env(patched_dir, preload)
    return subprocess.run(
        [sys.executable, *python, "-c", textwrap.dedent(READS), str(library), *extra],
        capture_output=True,
        text=True,
        env=env,
    )


def test_patched_library_sees_no_avx512(libraries, preload):
    built, patched, patched_dir = libraries
    real = _read(built, patched_dir, preload)
    seen = _read(patched, patched_dir, preload)
    assert real.returncode == 0 and seen.returncode == 0, real.stderr + seen.stderr
    r_ebx, r_ecx, r_edx, r_eax1, *r_vendor = map(int, real.stdout.split())
    ebx, ecx, edx, eax1, *vendor = map(int, seen.stdout.split())
    assert vendor == r_vendor  # leaf 0 passes through
    assert ebx & AVX2 == r_ebx & AVX2
    assert ebx & (AVX512F | AVX512BW | AVX512VL) == 0
    assert ebx & ~avx2_only_masks()[0] == r_ebx & ~avx2_only_masks()[0]
    assert ecx & avx2_only_masks()[1] == 0 and edx & avx2_only_masks()[2] == 0
    assert eax1 & (1 << 5) == 0  # AVX512_BF16
    cpu_flags = Path("/proc/cpuinfo").read_text()
    assert bool(r_ebx & AVX512F) == (" avx512f" in cpu_flags)  # the unpatched one sees the CPU


def avx2_only_masks() -> tuple[int, int, int]:
    """The leaf-7 masks of avx2_only.c, read from its source."""
    text = Path(avx2_only.__file__).with_suffix(".c").read_text()
    masks = []
    for name in ("EBX_AVX512", "ECX_AVX512", "EDX_AVX512"):
        body = text.split(f"#define {name} ", 1)[1].split("\n\n", 1)[0].split("//")[0]
        bits = [int(b) for b in re.findall(r"1u << (\d+)", body)]
        masks.append(sum(1 << b for b in bits))
    return tuple(masks)


def test_real_traps_still_trap(libraries, preload):
    """A trap (``ud2``) outside the patched folder, or inside a patched library, is not
    taken for a patched cpuid: SIGILL, as without the handler."""
    built, patched, patched_dir = libraries
    for library in (built, patched):
        done = _read(library, patched_dir, preload, "trap")
        assert done.returncode == -4, (library, done.stdout, done.stderr)


def test_a_handler_installed_with_signal_keeps_the_patched_cpuid(libraries, preload):
    """libc's ``signal()`` (which reaches ``sigaction`` inside glibc, past the wrapper)
    records the program's handler too: patched cpuid still answers, bits cleared."""
    built, patched, patched_dir = libraries
    installs = (
        "import ctypes, sys; libc = ctypes.CDLL(None); "
        "H = ctypes.CFUNCTYPE(None, ctypes.c_int); h = H(lambda s: None); "
        "libc.signal.restype = ctypes.c_void_p; libc.signal(4, h); "
        "lib = ctypes.CDLL(sys.argv[1]); lib.leaf.restype = ctypes.c_uint; "
        "print(lib.leaf(7, 0, 1))"
    )
    env = _env(patched_dir, preload)
    done = subprocess.run(
        [sys.executable, "-c", installs, str(patched)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # (without the wrapper the handler returns to the same ud0 forever)
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) & AVX512F == 0


def test_faulthandler_keeps_the_patched_cpuid_and_sees_real_traps(libraries, preload):
    """Python's faulthandler (pytest enables it) installs its own SIGILL handler after the
    preloaded one: patched cpuid still answers, and a real trap reaches faulthandler."""
    built, patched, patched_dir = libraries
    with_handler = ("-X", "faulthandler")
    seen = _read(patched, patched_dir, preload, python=with_handler)
    assert seen.returncode == 0, seen.stderr
    assert int(seen.stdout.split()[0]) & AVX512F == 0
    trapped = _read(built, patched_dir, preload, "trap", python=with_handler)
    assert trapped.returncode == -4
    assert "Fatal Python error" in trapped.stderr and "Illegal instruction" in trapped.stderr


def test_the_report_counts_the_capped_cpuid_calls(libraries, preload):
    """``probes.capped_cpuid_calls``, which the benchmark's report prints: the patched
    calls made so far under the tool, None without it."""
    built, patched, patched_dir = libraries
    ask = (
        "import ctypes, sys; from benchmarks import probes; "
        "ctypes.CDLL(sys.argv[1]).leaf(7, 0, 1); print(probes.capped_cpuid_calls())"
    )
    root = Path(avx2_only.__file__).resolve().parent.parent
    env = _env(patched_dir, preload, PYTHONPATH=str(root))
    capped = subprocess.run(
        [sys.executable, "-c", ask, str(patched)], capture_output=True, text=True, env=env
    )
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.split() == ["1"]
    env = _env(patched_dir, None, PYTHONPATH=str(root))
    plain = subprocess.run(
        [sys.executable, "-c", ask, str(built)], capture_output=True, text=True, env=env
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["None"]
