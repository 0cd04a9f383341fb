"""Build generated C++ into a shared library for a CPU target.

Sits after ``host``. Adds what the CPU backend links and compiles with (the g++ flags,
the target's ISA flags, OpenBLAS and, in plugin mode, oneDNN and the object of the glue
around it, ``dnnl_glue_object``) to the content-addressed build cache of
``anyshape.native_build``, which owns the cache directory and the key.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import threading
from importlib import resources
from pathlib import Path

from ...config import Options
from ...native_build import BuildError, build_cached
from ...runtime.native import import_openblas
from .program import HOST_MARK, KERNEL_MARK
from .target import NATIVE, Target

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


DNNL_DEFINE = "-DANYSHAPE_DNNL"  # in a library's flags when it links oneDNN


@functools.lru_cache(maxsize=1)
def blas_flags() -> list[str]:
    try:
        ob = import_openblas()
    except ImportError as e:
        raise BuildError(
            "the CPU backend needs the scipy-openblas32 package (pip install scipy-openblas32)"
        ) from e
    lib = ob.get_lib_dir()
    return [f"-I{ob.get_include_dir()}", f"-L{lib}", f"-Wl,-rpath,{lib}", f"-l{ob.get_library()}"]


@functools.cache
def small_gemm_flags(small_gemm: str = "onednn") -> list[str]:
    """oneDNN's ``dnnl_sgemm`` for GEMMs of few rows (see ``as_gemm_batch``), if installed.

    The ``onednn-cpu-gomp`` wheel runs on GNU OpenMP, the same thread pool as the
    generated code. Plugin mode only: artifacts keep OpenBLAS as their one library.
    ``small_gemm="openblas"`` (the option) turns it off, and with it every oneDNN route.
    """
    if small_gemm == "openblas":
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
                DNNL_DEFINE,
                f"-DAS_L3_BYTES={l3_cache_bytes()}",
                f"-DAS_L2_BYTES={l2_cache_bytes()}",
                f"-L{lib}",
                f"-Wl,-rpath,{lib}",
                "-l:libdnnl.so.3",
            ]
    return []


def l3_cache_bytes() -> int:
    """The last-level cache as sysfs states it (a VM's cpuid may claim the host's); 8 MB if unknown."""
    return _sysfs_cache_bytes(3, 8 << 20)


def l2_cache_bytes() -> int:
    """A core's L2 cache as sysfs states it; 1 MB if unknown."""
    return _sysfs_cache_bytes(2, 1 << 20)


def _sysfs_cache_bytes(index: int, unknown: int) -> int:
    """The size of cpu0's cache ``index`` (sysfs: ``2048K``), or ``unknown``."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    except (OSError, ValueError, IndexError):
        return unknown


def build_library(
    source: str, name: str = "graph", target: Target = NATIVE, options: Options | None = None
) -> Path:
    """The path of a shared library built from ``source`` (from the cache when present);
    a large one is compiled as several translation units in parallel (``split_units``)."""
    options = options or Options.from_env()
    flags = library_flags(target, options)
    linked = DNNL_DEFINE in flags and GLUE_MARK in source
    objects = [dnnl_glue_object(flags, options)] if linked else []
    return build_cached(
        source,
        name,
        flags,
        options=options,
        split=lambda s: split_units(s, build_jobs(), whole=not objects),
        objects=objects,
    )


def library_flags(target: Target, options: Options) -> list[str]:
    """The compiler flags of a library for ``target``: oneDNN's and the faster linker for
    this machine only."""
    if target is not NATIVE:
        return FLAGS + list(target.flags) + blas_flags()
    return (
        FLAGS
        + list(target.flags)
        + blas_flags()
        + small_gemm_flags(options.small_gemm)
        + linker_flags()
    )


@functools.cache
def linker_flags() -> list[str]:
    """GNU gold where the system has it: it links a library in a third of the time of
    the default linker (a lone kernel with OpenBLAS and OpenMP, 2-core AMD EPYC: 0.10-0.11
    against 0.03-0.04 s), which every cold build pays once."""
    return ["-fuse-ld=gold"] if shutil.which("ld.gold") else []


# What a unit with oneDNN call sites holds (dnnl.h): it then links the glue object.
GLUE_MARK = "#define AS_GLUE_ENTRY"
GLUE_NAME = "dnnl-glue"  # the object's name in the cache folder: <name>-<key>.o
_glue_lock = threading.Lock()  # one build of the glue object at a time in a process
_glue_started: set[tuple] = set()  # the (flags, cache, compiler) warm-ups started for
_started_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A child forked while a warm-up thread built the object inherits its lock held and
    no thread to release it: it starts with fresh locks (and builds for itself)."""
    global _glue_lock, _started_lock
    _glue_lock, _started_lock = threading.Lock(), threading.Lock()
    _glue_started.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def dnnl_glue_object(flags: list[str], options: Options) -> Path:
    """The object file of the oneDNN glue (``dnnl.h``, ``dnnl_conv.h``, ``dnnl_matmul.h``,
    ``winograd.h`` with AS_DNNL_GLUE_OBJECT), built once per compiler and ``flags`` (the target's ISA
    among them) into the cache: the units of a library declare what they call of it.
    A build under way (``start_glue_object``'s) is waited for, not repeated."""
    with _glue_lock:
        return build_cached(_glue_source(), GLUE_NAME, flags, options=options, compile_only=True)


@functools.cache
def _glue_source() -> str:
    """The glue object's one translation unit (read once: every library build asks)."""
    here = resources.files(__package__)
    headers = ("prelude.h", "gemm.h", "dnnl.h", "dnnl_conv.h", "dnnl_matmul.h", "winograd.h")
    return "\n".join(
        ["#define AS_SPLIT_UNIT", "#define AS_DNNL_GLUE_OBJECT"]
        + [here.joinpath(h).read_text() for h in headers]
    )


def start_glue_object(options: Options) -> threading.Thread | None:
    """The glue object for this machine built on a daemon thread, when the build links
    oneDNN: a compile starts it before its capture, whose Python leaves a core free, so
    the first compile on a machine (0.4 s for the object on a 2-core AMD EPYC) does
    not wait for it. A failure there is left to the library's build, which raises it.
    Once per process and cache; None when oneDNN is not linked or it started before."""
    try:
        flags = library_flags(NATIVE, options)
    except BuildError:  # (no BLAS: the library's build says so)
        return None
    wanted = (tuple(flags), options.cache_dir, options.cxx)
    with _started_lock:
        if DNNL_DEFINE not in flags or wanted in _glue_started:
            return None
        _glue_started.add(wanted)

    def build() -> None:
        try:
            dnnl_glue_object(flags, options)
        except Exception:  # (the library's own build meets it again and reports it)
            pass

    thread = threading.Thread(target=build, daemon=True)
    try:
        thread.start()
    except RuntimeError:  # (no thread to be had: the library's build does the work)
        return None
    atexit.register(thread.join, 30)  # (an exit mid-build would leave its temporary folder)
    return thread


# Compile work per unit, in characters of kernel text (about 22 us each at -O3): each unit
# parses the prelude again and runs its own compiler, 0.04 s for the prelude alone (what a
# unit does not call is not compiled), so a split pays from a few thousand characters.
# Measured with two units against one (AVX-512 Zen 5, counting the helpers below): one
# BertLayer, 22 k characters, 0.60 -> 0.33 s; BERT-base and ResNet-50, 48 k, 1.05 -> 0.58 s
# and 0.96 -> 0.56 s; T5-small, 80 k, 1.67 -> 0.90 s; a lone softmax kernel and the host
# function, 7 k, 0.27 -> 0.22 s. (The host function is built at -O0, about a tenth the
# work per character; with its call sites in tables, BERT-base's is 20 k characters.)
UNIT_CHARS = 2_000
HOST_WORK = 0.1  # compile work per character of the host function, against a kernel's
# Runtime helpers a kernel may call, with the work a unit pays once to compile each, in
# characters of kernel work (about 22 us each at -O3): measured alone on top of the
# prelude (AVX-512 Zen 5), the channels-last im2col convolution 0.057 s, the BLAS GEMM
# 0.03 s. Kernels calling the same helpers go to the same unit where the load allows.
# (oneDNN's glue, 0.06-0.075 s there and 0.16 s each on a slower AVX-512 host, is no
# unit's work: the library links it, built once, ``dnnl_glue_object``; with it linked, a
# float convolution calls the im2col convolution compiled there, so only its double one
# matches here.)
HELPER_WORK = {
    "as_conv2d_nhwc<": 2600,
    "as_gemm_batch<": 1400,
}


def build_jobs() -> int:
    """Compilers to run at once: the cores this process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


def split_units(source: str, jobs: int, whole: bool = True) -> list[str]:
    """``source`` (one translation unit from ``emit_translation_unit``) as up to ``jobs``
    units of about equal compile work: each repeats the prelude and takes a share of the
    kernels, the host unit (``AS_HOST_UNIT``) also the host function and the C API.
    ``whole=False``: the units link with an object of the library's own (the oneDNN
    glue), so even a single unit is compiled as one unit of several."""
    head, _, host = source.partition(f"\n{HOST_MARK}\n")
    common, *kernels = head.split(f"\n{KERNEL_MARK}\n")
    host_work = int(len(host) * HOST_WORK)
    calls = [frozenset(h for h in HELPER_WORK if h in k) for k in kernels]
    every = set().union(*calls)
    work = host_work + sum(map(len, kernels)) + sum(HELPER_WORK[h] for h in every)
    parts = max(1, min(jobs, work // UNIT_CHARS, len(kernels) + 1))
    if parts == 1:
        return [source] if whole else [f"#define AS_SPLIT_UNIT\n#define AS_HOST_UNIT\n{source}"]
    # Largest first (counting the helpers it calls) onto a unit that already compiles
    # its helpers while that unit stays within an even share, else onto the unit where it
    # ends least loaded; unit 0 also holds the host function.
    share = work / parts
    shares: list[list[str]] = [[] for _ in range(parts)]
    load = [host_work] + [0] * (parts - 1)
    helpers: list[set[str]] = [set() for _ in range(parts)]

    def cost(i: int, compiled: set[str]) -> int:
        """The work of kernel ``i`` in a unit that already compiles the helpers ``compiled``."""
        return len(kernels[i]) + sum(HELPER_WORK[h] for h in calls[i] - compiled)

    for i in sorted(range(len(kernels)), key=lambda i: cost(i, set()), reverse=True):
        after = [load[u] + cost(i, helpers[u]) for u in range(parts)]
        ready = [u for u in range(parts) if calls[i] and calls[i] <= helpers[u]]
        fits = [u for u in ready if after[u] <= share]
        k = min(fits or range(parts), key=after.__getitem__)
        shares[k].append(kernels[i])
        load[k] = after[k]
        helpers[k] |= calls[i]
    shares[0].append(f"{HOST_MARK}\n{host}")
    defines = ["#define AS_HOST_UNIT\n"] + [""] * (parts - 1)
    return [
        f"#define AS_SPLIT_UNIT\n{d}{common}\n" + "\n".join(s)
        for d, s in zip(defines, shares)
        if s  # (a unit the helpers left without kernels would compile the prelude alone)
    ]


def links_onednn(options: Options) -> bool:
    """Whether a library built for this machine links oneDNN (the package is installed and
    the ``small_gemm`` option does not turn it off): oneDNN routes then run."""
    return DNNL_DEFINE in small_gemm_flags(options.small_gemm)
