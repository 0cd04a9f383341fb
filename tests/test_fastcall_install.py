"""The fast-call extension comes with the package, and a stale one is never used."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

from anyshape.runtime import fastcall as fastcall_module
from anyshape.runtime import fastcall_sources


@pytest.fixture
def fresh_fastcall():
    """``fastcall()`` looked up again in the test, and the process's one module (and the C
    ``OptimizedModule.__call__`` made from it) back after it."""
    from anyshape import api

    installed_call = api.OptimizedModule.__dict__["__call__"]
    fastcall_module.fastcall.cache_clear()
    api.OptimizedModule.__call__ = api._PYTHON_CALL
    yield fastcall_module.fastcall
    fastcall_module.fastcall.cache_clear()
    api.OptimizedModule.__call__ = installed_call


def test_installed_extension_is_used_without_a_build(fresh_fastcall, tmp_path, monkeypatch):
    # setup.py built it when the package was installed: no compile, even with an empty cache.
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path))
    module = fresh_fastcall()
    assert module.__name__ == "anyshape.runtime._anyshape_fastcall"
    assert module.source_digest == fastcall_sources.digest()
    assert not list(tmp_path.glob("fastcall-*"))


def test_setup_and_runtime_hash_the_same_sources():
    root = Path(fastcall_sources.__file__).resolve().parents[2]
    loaded = runpy.run_path(str(root / "anyshape/runtime/fastcall_sources.py"))
    assert loaded["digest"]() == fastcall_sources.digest()
    names = [p.name for p in fastcall_sources.files()]
    assert names == ["fastcall.c", "torchcall.c", "modulecall.c", "fastcall_module.c"]


def test_stale_installed_extension_is_rebuilt_from_the_sources(
    fresh_fastcall, tmp_path, monkeypatch
):
    # Sources edited since the install: the module is built from them on first use.
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fastcall_sources, "digest", lambda: "edited")
    module = fresh_fastcall()
    assert module.__name__ == "_anyshape_fastcall"
    assert module.source_digest == "edited"
    assert len(list(tmp_path.glob("fastcall-*.so"))) == 1
    with pytest.raises(TypeError):  # its NumPy entry point checks its arguments
        module.call(np.zeros(1))
    # and a compiled model calls through it
    import torch

    import anyshape

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).eval()
    compiled = anyshape.optimize(model, (torch.randn(3, 8),), model_cache=False)
    assert compiled.report.clusters[0].compiled.native.native._fast is module
    for rows in (0, 1, 6):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), model(x))
