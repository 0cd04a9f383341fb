"""Builds anyshape's one C extension, the native call fast path, with the package.

The extension is optional: where no C compiler or Python headers are at hand the
install goes on without it, and ``anyshape.runtime.fastcall`` builds it on first
use instead (or falls back to ctypes). Everything else is in pyproject.toml.
"""

import runpy
from pathlib import Path

from setuptools import Extension, setup

sources = runpy.run_path(str(Path(__file__).parent / "anyshape/runtime/fastcall_sources.py"))


def fastcall_extension() -> list[Extension]:
    """The extension, or none where NumPy's headers are missing from the build (a build
    without isolation and without NumPy): it is then built on first use."""
    try:
        import numpy
    except ImportError:
        return []
    return [
        Extension(
            "anyshape.runtime._anyshape_fastcall",
            sources=["anyshape/runtime/fastcall_ext.c"],
            include_dirs=["anyshape/runtime", numpy.get_include()],
            define_macros=[("ANYSHAPE_FASTCALL_DIGEST", f'"{sources["digest"]()}"')],
            extra_compile_args=["-O2", "-w"],
            optional=True,
        )
    ]


setup(ext_modules=fastcall_extension())
