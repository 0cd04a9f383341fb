"""The fast path of a native call: a small CPython extension, installed with the package.

Sits under ``native`` and plugin mode's direct call path. ``fastcall()`` returns
the ``_anyshape_fastcall`` module -- ``call`` for NumPy arrays (``fastcall.c``),
and plugin mode's C beside it in ``anyshape/plugin/``: ``TorchCall``, a whole
model call on torch tensors (``torchcall.c``), and ``ModuleCall``,
``OptimizedModule.__call__`` without a Python frame (``modulecall.c``); the module
definition is ``fastcall_module.c``, the one unit listing them ``fastcall_ext.c``
(no torch headers: the plugin's C reaches torch through Python attributes).

``setup.py`` builds that unit when the package is installed, so no compile pays
for it. Where that module is missing (no compiler at install) or was built from
other sources than the ones beside it now (``fastcall_sources.digest``), the unit is
built on first use with the system compiler against this Python's and NumPy's
headers, through the content-addressed build cache of ``anyshape.native_build``;
``fastcall()`` is ``None`` when it cannot be built (no Python headers): callers
then use the ctypes path, which does the same work at a few more microseconds per
call. ``ANYSHAPE_FASTCALL=0`` forces the ctypes path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import sysconfig
import warnings

import numpy as np

from ..errors import AnyshapeError
from ..native_build import build_cached
from . import fastcall_sources

_NAME = "_anyshape_fastcall"


@functools.lru_cache(maxsize=1)
def fastcall():
    from ..config import Options

    if not Options.from_env().fastcall:
        return None
    digest = fastcall_sources.digest()
    installed = _installed()
    if installed is not None and getattr(installed, "source_digest", None) == digest:
        return installed
    return _built_on_first_use(digest)


def _installed():
    """The extension ``setup.py`` built with the package, or None."""
    try:
        return importlib.import_module(f"{__package__}.{_NAME}")
    except ImportError:
        return None


def _built_on_first_use(digest: str):
    source = "\n".join(path.read_text() for path in fastcall_sources.files())
    flags = [
        "-O2",
        "-fPIC",
        "-shared",
        "-w",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{np.get_include()}",
        f"-DANYSHAPE_PY={sys.version_info[0]}{sys.version_info[1]}",
        f"-DANYSHAPE_NP={np.__version__.replace('.', '_').replace('+', '_')}",
        f'-DANYSHAPE_FASTCALL_DIGEST="{digest}"',
    ]
    try:
        path = build_cached(source, "fastcall", flags, language="c")
        loader = importlib.machinery.ExtensionFileLoader(_NAME, str(path))
        spec = importlib.util.spec_from_file_location(_NAME, str(path), loader=loader)
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
