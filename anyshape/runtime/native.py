"""Load a compiled graph library and call it: one native call per graph call.

Sits at the end of the CPU backend. Inputs and weights cross as ``AsTensor``
descriptors (pointer, rank, shape, dtype) pointing at the caller's memory
(C-contiguous; a non-contiguous input is made contiguous first). Output buffers
are allocated by the host program and adopted by NumPy arrays that free them
when the last reference goes, so ``torch.from_numpy`` gets them without a copy.
The library keeps no per-call state: one ``NativeGraph`` serves many threads.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from ..config import quiet_blas_server_threads
from ..errors import InputError
from ..ir.dtypes import DType
from .fastcall import fastcall

# The ctypes mirror of anyshape_abi.h (tests/test_abi.py holds the two equal).
MAX_RANK = 8  # ANYSHAPE_MAX_RANK


class AsTensor(ctypes.Structure):
    """``anyshape_tensor``: a tensor crossing the ABI of ``anyshape_main``."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("ndim", ctypes.c_int64),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("dtype", ctypes.c_int64),
    ]


class KernelError(RuntimeError):
    """A generated kernel hit a run-time error (an index out of range, division by zero).

    An index out of range is a ``KernelIndexError``, an ``IndexError`` as eager raises; the
    choice is made here, on the message, because the C callers raise this class by name."""

    def __new__(cls, *args):
        if cls is KernelError and args and str(args[0]).startswith(_INDEX_MESSAGE):
            cls = KernelIndexError
        return super().__new__(cls, *args)


class KernelIndexError(KernelError, IndexError):
    """A generated kernel read or wrote with an index outside its dim (as eager's IndexError)."""


_INDEX_MESSAGE = "an index is out of range"


_init_lock = threading.Lock()


def import_openblas():
    """The ``scipy_openblas32`` module (``ImportError`` if absent), its library loaded
    (importing it loads it) with idle server threads that do not spin."""
    quiet_blas_server_threads()
    import scipy_openblas32

    return scipy_openblas32


class _Owner:
    """Owns one malloc'd output buffer; frees it when the last array using it is gone."""

    __slots__ = ("ptr", "free")

    def __init__(self, ptr: int, free):
        self.ptr, self.free = ptr, free

    def __del__(self):
        self.free(self.ptr)


class NativeGraph:
    def __init__(
        self,
        path: Path,
        output_slots: list[int],
        out_dtypes: list[DType],
        params: list[np.ndarray],
        num_threads: int = 0,
        inputs: list[tuple[str, DType]] | None = None,
        use_fastcall: bool = True,
    ):
        """``inputs`` (names, dtypes) and ``use_fastcall`` let calls go through the fast-call
        extension instead of ctypes."""
        try:
            import_openblas()  # (before the library, which links it, loads it)
        except ImportError:
            pass
        self.lib = ctypes.CDLL(str(path))
        self.main = self.lib.anyshape_main
        self.main.restype = ctypes.c_int
        self.main.argtypes = [
            ctypes.POINTER(AsTensor),
            ctypes.POINTER(AsTensor),
            ctypes.POINTER(AsTensor),
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_char_p,
            ctypes.c_int64,
        ]
        self.free = self.lib.anyshape_free
        self.free.argtypes = [ctypes.c_void_p]
        with _init_lock:
            self.lib.anyshape_init(ctypes.c_int(num_threads))
        self.lib.anyshape_num_sites.restype = ctypes.c_int64
        self.num_sites = int(self.lib.anyshape_num_sites())
        self.output_slots = output_slots
        self.num_outputs = max(output_slots, default=-1) + 1
        self.out_dtypes = out_dtypes  # per slot
        # A weight that is not contiguous (a transposed view) is held as a contiguous copy;
        # refresh_copies() copies it again after the caller saw it change in place.
        self._copied = {k: p for k, p in enumerate(params) if not p.flags.c_contiguous}
        self.params = [np.ascontiguousarray(p) for p in params]
        self.param_desc = (AsTensor * max(len(params), 1))()
        for k, p in enumerate(self.params):
            _describe(self.param_desc[k], p)
        self._fast = fastcall() if inputs is not None and use_fastcall else None
        if self._fast is not None:
            self._fast_args = (
                ctypes.cast(self.main, ctypes.c_void_p).value,
                ctypes.cast(self.free, ctypes.c_void_p).value,
                ctypes.addressof(self.param_desc),
            )
            self._in_types = tuple(dt.to_numpy().num for _, dt in inputs)
            self._in_names = tuple(name for name, _ in inputs)
            self._out_types = tuple(dt.to_numpy().num for dt in out_dtypes)

    def __call__(self, arrays: list[np.ndarray], extra: list[int]) -> list[np.ndarray | None]:
        if self._fast is not None:
            main, free, params = self._fast_args
            return self._fast.call(
                main,
                free,
                params,
                arrays if type(arrays) is list else list(arrays),
                tuple(extra),
                self._in_types,
                self._in_names,
                self._out_types,
                InputError,
                KernelError,
            )
        n = len(arrays)
        ins = (AsTensor * max(n, 1))()
        keep = []
        for k, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            keep.append(a)
            if a.ndim > MAX_RANK:
                raise InputError(f"input {k} has rank {a.ndim}; at most {MAX_RANK} is supported")
            _describe(ins[k], a)
        outs = (AsTensor * max(self.num_outputs, 1))()
        ext = (ctypes.c_int64 * max(len(extra), 1))(*extra)
        err = ctypes.create_string_buffer(1024)
        code = self.main(ins, self.param_desc, outs, ext, err, 1024)
        if code == 1:
            raise InputError(err.value.decode())
        if code:
            raise KernelError(err.value.decode())
        result = []
        for slot in range(self.num_outputs):
            result.append(self._adopt(outs[slot], self.out_dtypes[slot]))
        return result

    @property
    def packs_weights(self) -> bool:
        """Whether the library can keep packed copies of weights (oneDNN convolutions and matmuls)."""
        return hasattr(self.lib, "anyshape_watch_weights")

    def watch_weights(self, indices: list[int]) -> None:
        """The library may pack the weights at these indices of ``params`` once: the caller
        reports every in-place change with ``weights_changed()``. Unwatched weights are
        packed on every call."""
        if not self.lib.anyshape_watch_weights(*self._weight_pointers(indices)):
            raise MemoryError("no memory to register watched weights")

    def unwatch_weights(self, indices: list[int]) -> None:
        """Nobody watches these weights any more: their packed copies are dropped."""
        self.lib.anyshape_unwatch_weights(*self._weight_pointers(indices))

    def _weight_pointers(self, indices: list[int]):
        ptrs = [self.params[k].ctypes.data for k in indices]
        return (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs), ctypes.c_int64(len(ptrs))

    def weights_changed(self) -> None:
        """Weights changed in place: packed copies are made again on their next use."""
        self.lib.anyshape_weights_changed()

    @property
    def copied_indices(self) -> list[int]:
        """The indices of ``params`` held as contiguous copies of non-contiguous weights."""
        return sorted(self._copied)

    def refresh_copies(self) -> None:
        """Copy the non-contiguous weights again (they changed in place)."""
        for k, source in self._copied.items():
            np.copyto(self.params[k], source)

    def set_profiling(self, on: bool) -> None:
        """Time every kernel call site from now on (``on``) or stop timing."""
        self.lib.anyshape_profile_enable(ctypes.c_int(1 if on else 0))

    def read_profile(self) -> list[tuple[int, float]]:
        """(calls, seconds) per call site since the last read; resets the counters."""
        n = max(self.num_sites, 1)
        seconds, calls = (ctypes.c_double * n)(), (ctypes.c_int64 * n)()
        self.lib.anyshape_profile_read(seconds, calls)
        return [(int(calls[k]), float(seconds[k])) for k in range(self.num_sites)]

    def _adopt(self, desc: AsTensor, dtype: DType) -> np.ndarray:
        shape = tuple(desc.shape[k] for k in range(desc.ndim))
        npdt = dtype.to_numpy()
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        owner = _Owner(desc.data, self.free)
        buf = (ctypes.c_char * max(count * npdt.itemsize, 1)).from_address(desc.data)
        buf._anyshape_owner = owner  # freed with the last array viewing it
        arr = np.frombuffer(buf, dtype=npdt, count=count).reshape(shape)
        return arr


def _describe(desc: AsTensor, a: np.ndarray) -> None:
    desc.data = a.ctypes.data if a.size else None
    desc.ndim = a.ndim
    for k, s in enumerate(a.shape):
        desc.shape[k] = s
