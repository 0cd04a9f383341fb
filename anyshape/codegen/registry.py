"""The backend registry: every target by name, the one door into ``codegen/``.

Sits between the compile path (``anyshape/pipelines.py``) and the backends,
each in its own folder (``codegen/cpu``, ``codegen/interpreter``). Nothing
outside ``codegen/`` imports a backend's modules; it asks here. A backend's
module is imported on first use, so a target's dependencies load only when
that target is chosen.
"""

from __future__ import annotations

import functools
import importlib

from .backend import Backend

# name -> (module, class): a new target is one line here and a folder beside cpu/
BACKENDS = {
    "cpu": ("anyshape.codegen.cpu.backend", "CpuBackend"),  # generated C++, oneDNN/OpenBLAS
    "interpreter": ("anyshape.codegen.interpreter.backend", "InterpreterBackend"),  # NumPy
}


@functools.cache
def backend_named(name: str) -> Backend:
    """The backend called ``name`` (one instance per process)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
