"""The content-addressed cache of compiled native code, shared by every backend and the runtime.

Sits below the backends (``codegen/cpu/build.py`` adds the CPU flags and libraries) and
the runtime (``runtime/fastcall.py`` builds its CPython extension here): the one place,
outside any backend, that names the cache directory and anyshape's build version. The
cache key hashes the source, the compiler's identity, the flags and that version; the
library lands in ``~/.cache/anyshape`` (or ``$ANYSHAPE_CACHE_DIR``) under that key.
Writes are atomic (build into a temporary file in the same folder, then rename), and
each entry carries a SHA-256 of its bytes, so a truncated or corrupt entry is detected
and rebuilt instead of loaded. A program given as several translation units is compiled
one compiler per unit, all at once, and linked. An object file (``compile_only``) is
cached the same way, for libraries that link it.

A unit may ``#include "anyshape_abi.h"`` (the tensor descriptor of every compiled
library, ``runtime/anyshape_abi.h``): the header's text is pasted in place of that line
before hashing, so the key covers the ABI and the build needs no include path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

from .config import Options
from .errors import AnyshapeError
from .stats import bump
from .version import __version__ as VERSION

_ABI_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"anyshape_abi\.h".*$', re.MULTILINE)


class BuildError(AnyshapeError, RuntimeError):
    """The system C++ compiler rejected generated code (an anyshape bug); says where."""


def cache_dir(root: str = "") -> Path:
    """The cache folder: ``root`` (the ``cache_dir`` option), else ``~/.cache/anyshape``."""
    path = Path(root or os.path.join(os.path.expanduser("~"), ".cache", "anyshape"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def compiler(cxx: str = "") -> tuple[str, str]:
    """The C/C++ compiler (``cxx``, else the ``cxx`` option: ``$CXX``, else g++) and the
    first line of its ``--version``, which is part of every cache key."""
    cxx = cxx or Options.from_env().cxx or "g++"
    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"no working C++ compiler ({cxx}): {e}; install g++ or set CXX") from e
    return cxx, version


@functools.lru_cache(maxsize=1)
def abi_header() -> str:
    """The text of ``runtime/anyshape_abi.h``."""
    return (resources.files(__package__) / "runtime" / "anyshape_abi.h").read_text()


def with_abi_header(source: str) -> str:
    """``source`` with each ``#include "anyshape_abi.h"`` line replaced by the header's text."""
    return _ABI_INCLUDE.sub(lambda _: abi_header(), source)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_cached(
    source: str,
    name: str,
    flags: list[str],
    language: str = "c++",
    options: Options | None = None,
    split: Callable[[str], list[str]] | None = None,
    objects: Sequence[Path] = (),
    compile_only: bool = False,
) -> Path:
    """Build ``source`` with ``flags`` into a cached shared library (or object file, with
    ``compile_only``); ``language`` c or c++.

    ``split``: on a miss, the same program as translation units to compile in parallel
    and link (the CPU backend splits a large one; one unit: built whole). The key is
    ``source``'s: how many units a machine splits it into does not change what the
    library computes. ``objects``: object files this cache built (``compile_only``) that
    the library links; their names, which carry their keys, are part of this key.
    ``compile_only``: an object file (``.o``) instead of a library. ``options``
    (default: as the environment sets them) give the compiler, the cache folder and
    ``dump_dir``, where each newly built ``source`` is written too."""
    options = options or Options.from_env()
    source = with_abi_header(source)
    cxx, version = compiler(options.cxx)
    linked = [Path(o).name for o in objects]
    key = hashlib.sha256("\0".join([source, version, " ".join(flags), VERSION, *linked]).encode())
    key = key.hexdigest()[:32]
    root = cache_dir(options.cache_dir)
    suffix = ".o" if compile_only else ".so"
    lib, stamp = root / f"{name}-{key}{suffix}", root / f"{name}-{key}.sha256"
    if lib.exists() and stamp.exists() and stamp.read_text().strip() == _digest(lib):
        return lib
    ext = ".cpp" if language == "c++" else ".c"
    dump = options.dump_dir
    if dump and not compile_only:  # (an object is the runtime's own code, not generated)
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{name}-{key}{ext}").write_text(source)
    if not compile_only:  # (libraries only: an object is built once per machine, maybe
        bump("native_builds")  # on a warm-up thread while another compile counts its own)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        out = Path(tmp) / f"graph{suffix}"
        failed = source
        units = split(source) if split and not compile_only else [source]
        if len(units) > 1:
            error, failed = _compile_and_link(
                cxx, language, units, Path(tmp), out, flags, [str(o) for o in objects]
            )
        else:
            src, failed = Path(tmp) / f"graph{ext}", units[0]
            src.write_text(units[0])
            step = ["-c"] if compile_only else ["-x", "none", *map(str, objects)]
            error = _run([cxx, "-x", language, str(src), *step, "-o", str(out), *flags])
        if error is not None:  # (the unit the error's line numbers refer to)
            kept = root / f"{name}-{key}.failed{ext}"
            kept.write_text(failed)
            raise BuildError(f"C++ build failed (source kept at {kept}):\n{error[-4000:]}")
        digest = _digest(out)
        os.replace(out, lib)
        tmp_stamp = Path(tmp) / "stamp"
        tmp_stamp.write_text(digest)
        os.replace(tmp_stamp, stamp)
    return lib


def _run(command: list[str]) -> str | None:
    """Run a compiler command: None, or its error output when it fails."""
    proc = subprocess.run(command, capture_output=True, text=True)
    return None if proc.returncode == 0 else proc.stderr


def _compile_and_link(
    cxx: str,
    language: str,
    units: list[str],
    tmp: Path,
    out: Path,
    flags: list[str],
    objects: list[str],
) -> tuple[str | None, str]:
    """Compile each unit to an object file, all at once, then link them and ``objects``
    into ``out``. Returns the error output (None when built) and the text it is about: a
    unit the compiler rejected, else every unit."""
    ext = ".cpp" if language == "c++" else ".c"
    procs: list[subprocess.Popen] = []
    compiled = []
    try:
        for k, text in enumerate(units):
            src, obj = tmp / f"unit{k}{ext}", tmp / f"unit{k}.o"
            src.write_text(text)
            compiled.append(str(obj))
            command = [cxx, "-x", language, str(src), "-c", "-o", str(obj), *flags]
            procs.append(
                subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
            )
        errors = [p.communicate()[1] for p in procs]
    except BaseException:  # none may outlive the folder they write into
        for p in procs:
            p.kill()
            p.wait()
        raise
    for p, err, text in zip(procs, errors, units):
        if p.returncode != 0:
            return err or f"{cxx} exited with {p.returncode}", text
    return _run([cxx, *compiled, *objects, "-o", str(out), *flags]), "\n".join(units)
