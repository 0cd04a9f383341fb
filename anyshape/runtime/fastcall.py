"""The fast path of a native call: a small CPython extension, built on first use.

Sits under ``native`` and plugin mode's direct call path. ``fastcall()`` returns
the ``_anyshape_fastcall`` module -- ``call`` for NumPy arrays (``fastcall.c``)
and ``TorchCall``, a whole plugin-mode model call on torch tensors
(``torchcall.c``), and ``ModuleCall``, ``OptimizedModule.__call__`` without a
Python frame (``modulecall.c``; module definition in ``fastcall_module.c``) -- built with the
system compiler against this Python's and NumPy's headers through the
content-addressed build cache, or ``None`` when it cannot be built (no Python
headers): callers then use the ctypes path, which does the same work at a few
more microseconds per call. ``ANYSHAPE_FASTCALL=0`` forces the ctypes path.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import warnings
from importlib import resources

import numpy as np


@functools.lru_cache(maxsize=1)
def fastcall():
    if os.environ.get("ANYSHAPE_FASTCALL", "1") in ("0", "false", "no", "off"):
        return None
    from ..codegen.cpu.build import build_cached
    from ..errors import AnyshapeError

    here = resources.files(__package__)
    parts = (
        "fastcall.c",
        "torchcall.c",
        "modulecall.c",
        "fastcall_module.c",
    )  # one unit, in this order
    source = "\n".join(here.joinpath(p).read_text() for p in parts)
    flags = [
        "-O2",
        "-fPIC",
        "-shared",
        "-w",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{np.get_include()}",
        f"-DANYSHAPE_PY={sys.version_info[0]}{sys.version_info[1]}",
        f"-DANYSHAPE_NP={np.__version__.replace('.', '_').replace('+', '_')}",
    ]
    try:
        path = build_cached(source, "fastcall", flags, language="c")
        name = "_anyshape_fastcall"
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except (AnyshapeError, ImportError, OSError) as e:
        warnings.warn(
            f"anyshape: the native call fast path could not be built ({e}); "
            "falling back to ctypes (a few microseconds more per call)",
            stacklevel=2,
        )
        return None
