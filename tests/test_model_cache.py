"""The model cache of plugin mode: the second optimize() of a model skips capture.

A model that compiled into one directly-called cluster is stored (its IR after
the passes, prologue and output structure; never its weights). Optimizing the
same model again, in this process or a new one, restores it without
torch.export, reads the current weights, and checks it against eager on the
example first. Changed models miss; corrupt or stale entries are dropped and
the model compiles from scratch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import Fn, tiny_bert

import anyshape
from anyshape.frontends.torch import capture

TOL = dict(rtol=1e-4, atol=1e-4)
# What a compile from scratch loads and a restore from the model cache does not.
CAPTURE_MODULES = (
    "anyshape.plugin.compile",
    "anyshape.plugin.partition",
    "anyshape.frontends.torch.capture",
    "anyshape.frontends.torch.aten",
    # the CPU backend's emitters: a restore builds (or finds) the kept translation unit
    "anyshape.codegen.cpu.host",
    "anyshape.codegen.cpu.kernels",
    "anyshape.codegen.cpu.routes",
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path / "cache"))
    anyshape.reset_stats()


def _bert(eps=1e-12, seed=0):
    torch.manual_seed(seed)
    return tiny_bert(layer_norm_eps=eps, add_pooling_layer=False)


def _inputs(b, s):
    g = torch.Generator().manual_seed(b * 100 + s)
    return {
        "input_ids": torch.randint(0, 50, (b, s), generator=g),
        "attention_mask": torch.ones(b, s, dtype=torch.long),
    }


def _entries(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / "models").glob("*.json"))


def _check(opt, model):
    for b, s in [(1, 1), (3, 7), (2, 19)]:
        x = _inputs(b, s)
        torch.testing.assert_close(opt(**x).last_hidden_state, model(**x).last_hidden_state, **TOL)


def test_second_optimize_restores_without_capture(tmp_path, monkeypatch):
    anyshape.optimize(_bert(), _inputs(2, 8))
    assert len(_entries(tmp_path)) == 1
    assert anyshape.stats()["model_cache_hits"] == 0

    def no_capture(*a, **k):
        raise AssertionError("capture ran on a cache hit")

    monkeypatch.setattr(capture, "capture_export", no_capture)
    other = _bert(seed=1)  # same model, other weights: read live, not from the entry
    anyshape.reset_stats()
    opt = anyshape.optimize(other, _inputs(2, 8))
    assert anyshape.stats()["model_cache_hits"] == 1
    assert anyshape.stats()["compilations"] == 1
    assert anyshape.stats()["native_builds"] == 0
    _check(opt, other)
    assert "restored from the model cache" in str(opt.explain())
    assert list(opt.report.timings) == ["model cache restore"]


def test_new_process_hits_the_cache(tmp_path):
    script = tmp_path / "run.py"
    # (the script imports no test module: this one loads capture to patch it)
    script.write_text(
        "import sys, torch, anyshape\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from tiny_models import tiny_bert\n"
        "torch.manual_seed(0)\n"
        "model = tiny_bert(layer_norm_eps=1e-12, add_pooling_layer=False)\n"
        "def inputs(b, s):\n"
        "    return {'input_ids': torch.randint(0, 50, (b, s)),\n"
        "            'attention_mask': torch.ones(b, s, dtype=torch.long)}\n"
        "opt = anyshape.optimize(model, inputs(2, 8))\n"
        "x = inputs(3, 11)\n"
        "err = (opt(**x).last_hidden_state - model(**x).last_hidden_state).abs().max().item()\n"
        f"capture = [m for m in {CAPTURE_MODULES!r} if m in sys.modules]\n"
        "print(anyshape.stats()['model_cache_hits'], err, len(capture))\n"
    )
    env = {**__import__("os").environ, "ANYSHAPE_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
        hits, err, loaded = done.stdout.split()
        runs.append((int(hits), float(err), int(loaded)))
    assert [h for h, _, _ in runs] == [0, 1]
    assert all(e < 1e-4 for _, e, _ in runs)
    # A restored model starts without loading capture, lowering rules, partitioning or
    # the CPU backend's emitters.
    assert runs[0][2] > 0 and runs[1][2] == 0


def test_changed_model_misses(tmp_path):
    anyshape.optimize(_bert(), _inputs(2, 8))
    opt = anyshape.optimize(_bert(eps=1e-5), _inputs(2, 8))  # a config value changed
    assert anyshape.stats()["model_cache_hits"] == 0
    assert len(_entries(tmp_path)) == 2
    anyshape.optimize(_bert(), _inputs(2, 9))  # another example shape
    assert anyshape.stats()["model_cache_hits"] == 0
    _check(opt, _bert(eps=1e-5))


def test_corrupt_entry_is_dropped_and_recompiled(tmp_path):
    model = _bert()
    anyshape.optimize(model, _inputs(2, 8))
    (entry,) = _entries(tmp_path)
    entry.write_text(entry.read_text()[:100])  # truncated
    opt = anyshape.optimize(model, _inputs(2, 8))
    assert anyshape.stats()["model_cache_hits"] == 0
    _check(opt, model)
    assert anyshape.optimize(model, _inputs(2, 8)) is not None  # rewritten: hits again
    assert anyshape.stats()["model_cache_hits"] == 1


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


class Triple(torch.nn.Module):
    def forward(self, x):
        return x * 3


def test_stale_entry_is_caught_by_the_eager_check(tmp_path, monkeypatch):
    from anyshape import api
    from anyshape.config import Options
    from anyshape.plugin import model_cache

    x = torch.randn(3, 4)
    anyshape.optimize(Double(), (x,))
    (entry,) = _entries(tmp_path)
    # (the key of the model as optimize sees it: in eval mode)
    key = model_cache.fingerprint(Triple().eval(), (x,), {}, None, Options.from_env())
    entry.rename(entry.with_name(f"{key}.json"))  # Double's graph under Triple's key
    verdicts, real = [], api.agrees_with_eager

    def spy(*a, **k):
        verdicts.append(real(*a, **k))
        return verdicts[-1]

    monkeypatch.setattr(api, "agrees_with_eager", spy)
    opt = anyshape.optimize(Triple(), (x,))
    assert verdicts[0] is False  # the entry was restored, and the check refused it
    assert anyshape.stats()["model_cache_hits"] == 0
    torch.testing.assert_close(opt(torch.ones(2, 5)), torch.full((2, 5), 3.0))


def test_a_functions_key_is_the_same_in_every_process(tmp_path):
    """A set literal's order follows the string hash seed, which differs per process."""
    script = (
        "import torch, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from tiny_models import Fn\n"
        "from anyshape.config import Options\n"
        "from anyshape.plugin.model_cache import fingerprint\n"
        "fn = lambda t: t * 2 if t.dtype.is_floating_point in {'alpha', 'beta', 'gamma'} else t\n"
        "print(fingerprint(Fn(fn).eval(), (torch.ones(2),), {}, None, Options.from_env()))\n"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**__import__("os").environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        keys.add(done.stdout.split()[-1])
    assert len(keys) == 1


def test_functions_a_model_holds_are_keyed_by_their_code(tmp_path):
    """Two lambdas (one qualified name) that agree on the example but not elsewhere: the
    key tells them apart, so the second model is compiled, not restored from the
    first's entry (which the check on the example could not refuse)."""
    x = torch.rand(3, 4)  # under 5: both clamps return it as it is
    anyshape.optimize(Fn(lambda t: t.clamp(max=5.0)), (x,))
    at_six = Fn(lambda t: t.clamp(max=6.0))
    opt = anyshape.optimize(at_six, (x,))
    assert anyshape.stats()["model_cache_hits"] == 0
    big = torch.full((2, 5), 10.0)
    torch.testing.assert_close(opt(big), at_six(big))

    # a function closing over a value: keyed by the value too
    def clamp_at(limit):
        return lambda t: t.clamp(max=limit)

    limits = [Fn(clamp_at(7.0)), Fn(clamp_at(8.0))]
    for model in limits:
        torch.testing.assert_close(anyshape.optimize(model, (x,))(big), model(big))
    assert anyshape.stats()["model_cache_hits"] == 0
    anyshape.optimize(Fn(lambda t: t.clamp(max=5.0)), (x,))  # the first's code again: a hit
    assert anyshape.stats()["model_cache_hits"] == 1


def test_model_cache_off_writes_nothing(tmp_path):
    anyshape.optimize(_bert(), _inputs(2, 8), model_cache=False)
    assert _entries(tmp_path) == []


def test_the_key_changes_with_anyshape_source(monkeypatch):
    """An entry written by other anyshape code (a development build of the same
    version) is never restored: the package's own source is part of the key."""
    from anyshape.config import Options
    from anyshape.plugin import model_cache

    model = torch.nn.Linear(4, 4).eval()
    args = (torch.randn(2, 4),)
    before = model_cache.fingerprint(model, args, {}, None, Options())
    monkeypatch.setattr(model_cache, "package_digest", lambda: "other source")
    assert model_cache.fingerprint(model, args, {}, None, Options()) != before


def test_the_key_changes_with_what_steers_the_emitted_source(monkeypatch):
    """A restored model reuses the translation unit kept in its entry, so the options
    that change the emitted source are part of the key, however they are set."""
    from anyshape.config import Options
    from anyshape.plugin import model_cache

    model = torch.nn.Linear(4, 4).eval()
    args = (torch.randn(2, 4),)
    before = model_cache.fingerprint(model, args, {}, None, Options.from_env())
    assert model_cache.fingerprint(model, args, {}, None, Options(dnnl_matmul=False)) != before
    monkeypatch.setenv("ANYSHAPE_DNNL_CONV", "off")
    assert model_cache.fingerprint(model, args, {}, None, Options.from_env()) != before


def test_a_restored_model_reuses_its_kept_translation_unit(tmp_path, monkeypatch):
    from anyshape.codegen.cpu import host

    first = anyshape.optimize(_bert(), _inputs(2, 8))
    source = first.report.clusters[0].compiled.native.source

    def no_emission(*a, **k):
        raise AssertionError("the translation unit was emitted again on a cache hit")

    monkeypatch.setattr(host, "emit_translation_unit", no_emission)
    model = _bert(seed=2)
    opt = anyshape.optimize(model, _inputs(2, 8))
    assert anyshape.stats()["model_cache_hits"] == 1
    assert opt.report.clusters[0].compiled.native.source == source
    _check(opt, model)


def test_the_key_follows_the_file_defining_the_model_class(tmp_path, monkeypatch):
    """A model class is keyed by a digest of its file: an edit there misses; a class
    with no source at all has no key (never a stale hit)."""
    import importlib
    import os

    from anyshape.config import Options
    from anyshape.plugin import model_cache

    src = tmp_path / "edited_model.py"
    src.write_text(
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("edited_model")
    args = (torch.randn(2, 4),)
    key = model_cache.fingerprint(mod.M(), args, {}, None, Options())
    assert key is not None
    assert model_cache.fingerprint(mod.M(), args, {}, None, Options()) == key
    src.write_text(src.read_text().replace("x + 1", "x + 2"))
    os.utime(src, ns=(0, 10**18))  # a new modification time, whatever the clock
    assert model_cache.fingerprint(mod.M(), args, {}, None, Options()) != key
    namespace: dict = {}
    exec(
        "import torch\nclass N(torch.nn.Module):\n    def forward(self, x):\n        return x\n",
        namespace,
    )
    assert model_cache.fingerprint(namespace["N"](), args, {}, None, Options()) is None


def test_outputs_torch_cannot_serialize_compile_without_an_entry(tmp_path, monkeypatch):
    """A model class defined at module level returning ``torch.return_types.max`` (whose
    pytree spec has no serialized name) compiles and runs; it only gets no cache entry."""
    import importlib

    src = tmp_path / "returns_max.py"
    src.write_text(
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x.max(dim=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("returns_max").M()
    cache = tmp_path / "cache"
    compiled = anyshape.optimize(model, (torch.randn(3, 4),), cache_dir=str(cache))
    x = torch.randn(2, 5)
    got, want = compiled(x), model(x)
    torch.testing.assert_close(got.values, want.values)
    torch.testing.assert_close(got.indices, want.indices)
    assert not list((cache / "models").glob("*.json"))
