"""Build generated C++ into a shared library, through a content-addressed disk cache.

Sits after ``host``. The cache key hashes the source, the compiler's identity,
the flags and anyshape's version; the library lands in ``~/.cache/anyshape``
(or ``$ANYSHAPE_CACHE_DIR``) under that key. Writes are atomic (build into a
temporary file in the same folder, then rename), and each entry carries a
SHA-256 of its bytes, so a truncated or corrupt entry is detected and rebuilt
instead of loaded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ...errors import AnyshapeError
from ...stats import bump
from .target import NATIVE, Target

VERSION = "0.1.0"
FLAGS = [
    "-O3",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-std=c++17",
    "-fwrapv",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-w",
]


class BuildError(AnyshapeError, RuntimeError):
    """The system C++ compiler rejected generated code (an anyshape bug); says where."""


def cache_dir() -> Path:
    root = os.environ.get("ANYSHAPE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "anyshape"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX", "g++")
    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"no working C++ compiler ({cxx}): {e}; install g++ or set CXX") from e
    return cxx, version


@functools.lru_cache(maxsize=1)
def blas_flags() -> list[str]:
    try:
        import scipy_openblas32 as ob
    except ImportError as e:
        raise BuildError(
            "the CPU backend needs the scipy-openblas32 package (pip install scipy-openblas32)"
        ) from e
    lib = ob.get_lib_dir()
    return [f"-I{ob.get_include_dir()}", f"-L{lib}", f"-Wl,-rpath,{lib}", f"-l{ob.get_library()}"]


@functools.lru_cache(maxsize=1)
def small_gemm_flags() -> list[str]:
    """oneDNN's ``dnnl_sgemm`` for GEMMs of few rows (see ``as_gemm_batch``), if installed.

    The ``onednn-cpu-gomp`` wheel runs on GNU OpenMP, the same thread pool as the
    generated code. Plugin mode only: artifacts keep OpenBLAS as their one library.
    ``ANYSHAPE_SMALL_GEMM=openblas`` turns it off.
    """
    if os.environ.get("ANYSHAPE_SMALL_GEMM", "onednn").lower() == "openblas":
        return []
    try:
        from importlib import metadata

        dist = metadata.distribution("onednn-cpu-gomp")
    except metadata.PackageNotFoundError:
        return []
    for f in dist.files or ():
        if f.name == "libdnnl.so.3":
            lib = Path(dist.locate_file(f)).resolve().parent
            return [
                "-DANYSHAPE_DNNL",
                f"-DAS_L3_BYTES={l3_cache_bytes()}",
                f"-L{lib}",
                f"-Wl,-rpath,{lib}",
                "-l:libdnnl.so.3",
            ]
    return []


def l3_cache_bytes() -> int:
    """The last-level cache as sysfs states it (a VM's cpuid may claim the host's); 8 MB if unknown."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    except (OSError, ValueError, IndexError):
        return 8 << 20


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_library(source: str, name: str = "graph", target: Target = NATIVE) -> Path:
    """The path of a shared library built from ``source`` (from the cache when present)."""
    libraries = blas_flags() + (small_gemm_flags() if target is NATIVE else [])
    return build_cached(source, name, FLAGS + list(target.flags) + libraries)


def build_cached(source: str, name: str, flags: list[str], language: str = "c++") -> Path:
    """Build ``source`` with ``flags`` into a cached shared library; ``language`` c or c++."""
    cxx, version = compiler()
    key = hashlib.sha256("\0".join([source, version, " ".join(flags), VERSION]).encode())
    key = key.hexdigest()[:32]
    root = cache_dir()
    lib, stamp = root / f"{name}-{key}.so", root / f"{name}-{key}.sha256"
    if lib.exists() and stamp.exists() and stamp.read_text().strip() == _digest(lib):
        return lib
    ext = ".cpp" if language == "c++" else ".c"
    dump = os.environ.get("ANYSHAPE_DUMP_DIR")
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{name}-{key}{ext}").write_text(source)
    bump("native_builds")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        src = Path(tmp) / f"graph{ext}"
        src.write_text(source)
        out = Path(tmp) / "graph.so"
        proc = subprocess.run(
            [cxx, "-x", language, str(src), "-o", str(out), *flags], capture_output=True, text=True
        )
        if proc.returncode != 0:
            kept = root / f"{name}-{key}.failed{ext}"
            kept.write_text(source)
            raise BuildError(f"C++ build failed (source kept at {kept}):\n{proc.stderr[-4000:]}")
        digest = _digest(out)
        os.replace(out, lib)
        tmp_stamp = Path(tmp) / "stamp"
        tmp_stamp.write_text(digest)
        os.replace(tmp_stamp, stamp)
    return lib
