"""Load an artifact and run it from NumPy: no PyTorch, no compiler pass, no copy of the weights.

Sits at the end of standalone mode, on top of ``format`` (the file) and
``runtime.native`` (the call). ``load(path)`` checks the file and the CPU,
maps the weights in place, loads the library from memory (a memfd, or a
temporary file where there is none) and returns a ``StandaloneModel``, which
any number of threads may call at once.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..ir.dtypes import DType
from ..runtime.binder import arrange_inputs
from ..runtime.host_cpu import isa_machine, machine, missing_cpu_flags
from ..runtime.native import NativeGraph, import_openblas
from .format import ArtifactError, Manifest, read_artifact


def load(path: str | Path, num_threads: int = 0, verify_weights: bool = True) -> StandaloneModel:
    """Open the artifact at ``path`` for running; ``ArtifactError`` says what is wrong with it.

    ``num_threads`` overrides the artifact's OpenMP thread count (0: the
    recorded count, or every core). ``verify_weights=False`` skips the weights
    checksum (a pass over them at memory speed).
    """
    art = read_artifact(path, verify_weights)
    weights = [art.weight(rec) for rec in art.manifest.params]
    return StandaloneModel(art.manifest, art.library, weights, str(path), num_threads, art)


def check_target(manifest: Manifest, where: str) -> None:
    """The artifact's ISA must be this machine's architecture, with every CPU flag it needs."""
    want = isa_machine(manifest.isa)
    if want != machine():
        raise ArtifactError(
            f"{where} was built for ISA {manifest.isa} ({want}); this machine is {machine()}"
        )
    missing = missing_cpu_flags(manifest.cpu_flags)
    if missing:
        raise ArtifactError(
            f"{where} was built for ISA {manifest.isa}, which needs CPU flags "
            f"{' '.join(missing)} that this CPU lacks (export with the default portable target)"
        )


def _preload_blas() -> None:
    """Make OpenBLAS resolvable by soname for libraries built on another machine."""
    try:
        ob = import_openblas()
    except ImportError:
        return
    lib = Path(ob.get_lib_dir())
    for candidate in sorted(lib.glob(f"lib{ob.get_library()}*.so*")):
        try:
            ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


# The memfds of loaded libraries, never closed: the dynamic loader identifies a
# loaded library by its path, so a closed fd's number (and so its path
# /proc/self/fd/N) reused for another library would hand back the first one.
# ctypes never unloads a library, so neither is its fd ever free to reuse.
_LIBRARY_FDS: list[int] = []


def _library_path(library: bytes) -> tuple[str, str | None]:
    """A path to load ``library`` from: an in-memory file, else a temporary one to unlink."""
    if hasattr(os, "memfd_create"):
        try:
            fd = os.memfd_create("anyshape-artifact", 0)
            view, done = memoryview(library), 0
            while done < len(library):
                done += os.write(fd, view[done:])
            _LIBRARY_FDS.append(fd)
            return f"/proc/self/fd/{fd}", None
        except OSError:
            pass
    tmp = tempfile.NamedTemporaryFile(prefix="anyshape-", suffix=".so", delete=False)
    with tmp:
        tmp.write(library)
    return tmp.name, tmp.name


class StandaloneModel:
    """A loaded artifact: call it with NumPy arrays (or DLPack tensors), get NumPy arrays back."""

    def __init__(
        self,
        manifest: Manifest,
        library: bytes,
        weights: list[np.ndarray],
        where: str,
        num_threads: int = 0,
        keep_alive: object = None,
    ):
        check_target(manifest, where)
        self.manifest = manifest
        self.where = where
        self._keep = keep_alive  # the file mapping the weights live in
        self.input_names = [r.name for r in manifest.inputs]
        self.output_names = [r.name for r in manifest.outputs]
        self.input_dtypes = [DType.parse(r.dtype).to_numpy() for r in manifest.inputs]
        self._index = {name: k for k, name in enumerate(self.input_names)}
        self._weights = weights
        self._sources = [_parse_source(r.source) for r in manifest.outputs]
        slot_dtypes = {
            v: DType.parse(r.dtype)
            for r, (k, v) in zip(manifest.outputs, self._sources)
            if k == "slot"
        }
        _preload_blas()
        path, temporary = _library_path(library)
        try:
            self._native = NativeGraph(
                Path(path),
                [v if k == "slot" else -1 for k, v in self._sources],
                [slot_dtypes[s] for s in sorted(slot_dtypes)],
                weights,
                num_threads or manifest.threads,
                inputs=[(r.name, DType.parse(r.dtype)) for r in manifest.inputs],
            )
        except OSError as e:
            raise ArtifactError(f"{where}: the compiled library does not load: {e}") from e
        finally:
            if temporary:
                os.unlink(temporary)  # the loaded library keeps its own mapping

    def __call__(self, *args, **kwargs) -> tuple[np.ndarray, ...]:
        """Run on inputs given in order, by name, or both; returns the outputs in order."""
        arrays = list(args)
        if kwargs or len(arrays) != len(self.input_names):
            arrays = self._arrange(args, kwargs)
        for k, a in enumerate(arrays):
            if type(a) is not np.ndarray:
                arrays[k] = self._as_array(k, a)
        slots = self._native(arrays, ())
        out = []
        for kind, v in self._sources:
            if kind == "slot":
                out.append(slots[v])
            elif kind == "input":
                out.append(np.array(arrays[v]))
            else:
                out.append(np.array(self._weights[v]))
        return tuple(out)

    def run(self, inputs: dict) -> dict[str, np.ndarray]:
        """Run on inputs by name; returns outputs by name."""
        return dict(zip(self.output_names, self(**inputs)))

    def signature(self) -> str:
        return describe_manifest(self.manifest)

    def _arrange(self, args, kwargs) -> list:
        return arrange_inputs(self.input_names, self._index, args, kwargs)

    def _as_array(self, k: int, value) -> np.ndarray:
        name = self.input_names[k]
        device = getattr(value, "device", None)
        if getattr(device, "type", "cpu") != "cpu":
            raise InputError(f"input {name!r} is on device {device}, expected cpu")
        if hasattr(value, "__dlpack__"):
            try:
                return np.from_dlpack(value)
            except (TypeError, RuntimeError, BufferError) as e:
                raise InputError(f"input {name!r}: cannot read it through DLPack: {e}") from e
        if isinstance(value, np.ndarray):
            return value
        raise InputError(
            f"input {name!r} must be a NumPy array (or a DLPack tensor), got {type(value).__name__}"
        )

    def __repr__(self) -> str:
        return (
            f"StandaloneModel({self.where}, inputs {self.input_names}, outputs {self.output_names})"
        )


def _parse_source(text: str) -> tuple[str, int]:
    kind, _, index = text.partition(":")
    if kind not in ("slot", "input", "param") or not index.isdigit():
        raise ArtifactError(f"corrupt artifact manifest: output source {text!r}")
    return kind, int(index)


def describe_manifest(m: Manifest) -> str:
    """The signature as ``anyshape info`` prints it."""

    def tensor(r) -> str:
        return f"{r.name}: {r.dtype}[{', '.join(r.dims)}]"

    nbytes = sum(r.nbytes for r in m.params)
    lines = [f"anyshape artifact (written by anyshape {m.version}), target {m.isa}"]
    if m.cpu_flags:
        lines.append(f"  needs CPU flags: {' '.join(m.cpu_flags)}")
    lines.append("inputs:")
    lines += [f"  {tensor(r)}" for r in m.inputs]
    lines.append("outputs:")
    lines += [f"  {tensor(r)}" for r in m.outputs]
    lines.append("constraints (checked on every call):")
    lines += [f"  {c}" for c in m.constraints] or ["  none"]
    lines.append(f"weights: {len(m.params)} tensors, {nbytes / 1e6:.1f} MB")
    return "\n".join(lines)
