"""The fast path of a native call: a small CPython extension, built on first use.

Sits under ``native`` and plugin mode's direct call path. ``fastcall()`` returns
the ``_anyshape_fastcall`` module -- ``call`` for NumPy arrays (``fastcall.c``),
and plugin mode's C beside it in ``anyshape/plugin/``: ``TorchCall``, a whole
model call on torch tensors (``torchcall.c``), and ``ModuleCall``,
``OptimizedModule.__call__`` without a Python frame (``modulecall.c``); the module
definition is ``fastcall_module.c``. The one unit is built with the system compiler
against this Python's and NumPy's headers (no torch headers: the plugin's C reaches
torch through Python attributes) through the content-addressed build cache of
``anyshape.native_build``, or ``fastcall()`` is ``None`` when it cannot be built (no
Python headers): callers then use the ctypes path, which does the same work at a few
more microseconds per call. ``ANYSHAPE_FASTCALL=0`` forces the ctypes path.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import sysconfig
import warnings
from importlib import resources

import numpy as np

from ..errors import AnyshapeError
from ..native_build import build_cached

_PACKAGE = resources.files("anyshape")
# The extension's one translation unit, in this order: the plugin's types use the helpers
# of fastcall.c, and the module definition registers those types.
_UNIT = (
    ("runtime", "fastcall.c"),
    ("plugin", "torchcall.c"),
    ("plugin", "modulecall.c"),
    ("runtime", "fastcall_module.c"),
)


@functools.lru_cache(maxsize=1)
def fastcall():
    from ..config import Options

    if not Options.from_env().fastcall:
        return None
    source = "\n".join((_PACKAGE / folder / name).read_text() for folder, name in _UNIT)
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
