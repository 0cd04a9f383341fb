"""Run a command as on an AVX2-only machine, peers included: ``python -m benchmarks.avx2_only -- CMD``.

Sits beside the benchmarks it wraps (``anyshape bench``, ``benchmarks.gemm_routes``):
an AVX-512 machine stands in for an AVX2 one (AMD Zen 3, Intel client cores)
when every library in the process picks its AVX2 kernels.

- anyshape's generated code is built for ``x86-64-v3`` by a compiler wrapper (the
  build asks for ``-march=native``); oneDNN, OpenBLAS, ATen and MKL are capped by
  their own variables (``ONEDNN_MAX_CPU_ISA`` and the rest, ``CAPS``), glibc's string
  functions by ``GLIBC_TUNABLES``.
- ONNX Runtime's MLAS and OpenVINO choose their kernels from ``cpuid`` and have no
  such variable: the packages are copied into the folder with every ``cpuid``
  instruction of their shared libraries (found by ``objdump``) replaced by ``ud0``, an
  undefined opcode no compiler emits (a library holding one is refused), and
  ``avx2_only.c``, preloaded, answers each one as the CPU would with the AVX-512, AVX10
  and AMX feature bits cleared. The copies come first on ``PYTHONPATH`` (so not with
  ``python -I`` or ``-E``).

The folder (default ``/tmp/anyshape-avx2``) keeps the copies, the preloaded library,
the compiler wrapper and anyshape's cache for such builds; a copy is made again when
its package changes. ``ANYSHAPE_ISA_CAP=AVX2`` tells the benchmark's report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PEERS = ("onnxruntime", "openvino")  # packages that pick their kernels from cpuid alone
CAPS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512CD,-AVX512DQ",
    "ANYSHAPE_ISA_CAP": "AVX2",
}
CPUID, UD0 = b"\x0f\xa2", b"\x0f\xff"
_CPUID_LINE = re.compile(r"^\s*([0-9a-f]+):\s+cpuid\s*$", re.M)
_UD0_LINE = re.compile(r"^\s*[0-9a-f]+:\s+ud0\b", re.M)
_SECTION_LINE = re.compile(
    r"^\s*\d+\s+(\S+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s", re.M
)


def cpuid_offsets(library: Path) -> list[int]:
    """File offsets of the ``cpuid`` instructions in ``library``'s code, as ``objdump``
    disassembles it (a byte pair 0f a2 inside another instruction is not one)."""
    dump = subprocess.run(
        ["objdump", "-d", "-w", "--no-show-raw-insn", str(library)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if _UD0_LINE.search(dump):  # (the handler would take it for a patched cpuid)
        raise RuntimeError(f"{library} holds a ud0 instruction: it cannot be patched")
    addresses = [int(a, 16) for a in _CPUID_LINE.findall(dump)]
    if not addresses:
        return []
    headers = subprocess.run(
        ["objdump", "-h", "-w", str(library)], capture_output=True, text=True, check=True
    ).stdout
    sections = [
        (int(vma, 16), int(size, 16), int(off, 16))
        for _, size, vma, off in _SECTION_LINE.findall(headers)
    ]
    offsets = []
    for a in addresses:
        vma, _, off = next(s for s in sections if s[0] <= a < s[0] + s[1])
        offsets.append(a - vma + off)
    return offsets


def patch_library(library: Path) -> int:
    """Replace each ``cpuid`` in ``library`` (a copy) by ``ud0``; how many."""
    offsets = cpuid_offsets(library)
    if not offsets:
        return 0
    data = bytearray(library.read_bytes())
    for o in offsets:
        if data[o : o + 2] != CPUID:
            raise RuntimeError(f"{library}: no cpuid at offset {o:#x}")
        data[o : o + 2] = UD0
    library.write_bytes(bytes(data))
    return len(offsets)


def _stamp(source: Path) -> str:
    files = sorted(p for p in source.rglob("*.so*") if p.is_file())
    return json.dumps([[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in files])


def patched_copy(package: str, folder: Path) -> tuple[Path, int] | None:
    """``folder/patched/<package>``, a copy of the installed package with its libraries'
    cpuid patched (made once per installed version), and the count patched; None when
    the package is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0])
    target = folder / "patched" / package
    stamp_file = folder / "patched" / f"{package}.stamp"
    stamp = _stamp(source)
    if stamp_file.exists() and target.exists():
        recorded = json.loads(stamp_file.read_text())
        if recorded["source"] == stamp and recorded.get("with") == UD0.hex():
            return target, recorded["patched"]
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, symlinks=True)
    libraries = [p for p in target.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        patched = sum(pool.map(patch_library, libraries))
    stamp_file.write_text(json.dumps({"source": stamp, "patched": patched, "with": UD0.hex()}))
    return target, patched


def preload_library(folder: Path) -> Path:
    """The SIGILL handler (``avx2_only.c``) built into ``folder``."""
    source = Path(__file__).with_suffix(".c")
    built = folder / "avx2_only.so"
    if not built.exists() or built.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", str(source), "-o", str(built), "-ldl"], check=True
        )
    return built


def compiler_wrapper(folder: Path) -> Path:
    """A ``g++`` that builds for ``x86-64-v3`` where it is asked for ``-march=native``."""
    wrapper = folder / "g++-x86-64-v3"
    wrapper.write_text(
        "#!/bin/bash\n"
        'args=(); for a in "$@"; do [ "$a" = -march=native ] && a=-march=x86-64-v3; '
        'args+=("$a"); done\n'
        f'exec {shutil.which("g++") or "g++"} "${{args[@]}}"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def environment(folder: Path) -> dict[str, str]:
    """The environment of a command run as on an AVX2-only machine."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    copies = []
    for package in PEERS:
        made = patched_copy(package, folder)
        if made is not None:
            copies.append(made[0].parent)
            print(f"avx2_only: {package}: {made[1]} cpuid instructions patched", file=sys.stderr)
    path = [str(p) for p in dict.fromkeys(copies)] + [str(Path(__file__).resolve().parent.parent)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["LD_PRELOAD"] = " ".join(
        filter(None, [str(preload_library(folder)), env.get("LD_PRELOAD")])
    )
    env["ANYSHAPE_AVX2_PATCHED"] = str(folder / "patched") + os.sep
    env["CXX"] = str(compiler_wrapper(folder))
    env["ANYSHAPE_CACHE_DIR"] = str(folder / "cache")
    env.update(CAPS)
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/anyshape-avx2", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: python -m benchmarks.avx2_only -- CMD ...")
    env = environment(args.folder.resolve())
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
