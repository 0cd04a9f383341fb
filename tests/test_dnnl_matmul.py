"""GEMMs against model weights through oneDNN's matmul (plugin mode): rows, layouts,
weights, threads.

Every check compares with eager. One oneDNN primitive per call site serves every
row count, with the weight packed once, so these tests run many row counts
through one compiled model, change weights in place after the first calls, and
call one model from several threads at once.
"""

from __future__ import annotations

import ctypes
import gc
import re

import pytest
import torch
from concurrency import mismatches_from_threads
from filecheck import Checker

import anyshape
from anyshape.codegen.cpu.executable import CpuExecutable
from anyshape.ir.graph import Graph

pytest.importorskip("importlib.metadata").distribution("onednn-cpu-gomp")  # a dependency

SITE = "as_dnnl_matmul(&dnnl_site"
# A kernel's first line (codegen/cpu/host.py); the runtime headers end before the first one.
KERNEL = re.compile(
    r"^AS_KERNEL int (?:__attribute__\(\(.*\)\) )?\w+\(void\* const\* P, const int64_t\* D\) \{$",
    re.M,
)
# The host function, after every kernel.
MAIN = re.compile(r"^int anyshape_main\(", re.M)


def _source(opt) -> str:
    (cluster,) = opt.report.clusters
    return cluster.compiled.native.source


def _runs(opt) -> int:
    """GEMMs oneDNN has run in ``opt``'s library (shared by every model it serves)."""
    fn = opt.report.clusters[0].compiled.native.native.lib.anyshape_dnnl_matmul_runs
    fn.restype = ctypes.c_int64
    return fn()


def _few(opt) -> int:
    """GEMMs ``as_few_rows_gemm`` has run in ``opt``'s library (up to 32 rows, watched
    weights: its own panels)."""
    fn = opt.report.clusters[0].compiled.native.native.lib.anyshape_few_rows_runs
    fn.restype = ctypes.c_int64
    return fn()


def _first_uses(opt, k: int, *rows: int) -> None:
    """``opt`` called once at each row count (default 1 and 64): a watched weight's first
    use in a layout (the few-rows kernel's panels up to 32 rows, the matmul's above) reads
    it as the model holds it (BLAS), and its second use packs it (``as_packed_weights``),
    so a count of the routes' GEMMs starts after these."""
    with torch.no_grad():
        for r in rows or (1, 64):
            opt(torch.randn(1, r, k))


class Mlp(torch.nn.Module):
    """Both weight layouts: ``nn.Linear`` holds [out, in]; ``x @ w`` reads [in, out]."""

    def __init__(self, k: int = 37, hidden: int = 53, n: int = 29):
        super().__init__()
        self.up = torch.nn.Linear(k, hidden)
        self.down = torch.nn.Linear(hidden, n, bias=False)
        self.w = torch.nn.Parameter(torch.randn(n, 41) / 6)

    def forward(self, x):
        return torch.relu(self.down(torch.nn.functional.gelu(self.up(x)))) @ self.w


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_every_row_count_through_one_primitive_per_site():
    torch.manual_seed(0)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu", dnnl_matmul="always")
    # Three sites: up and down (37 x 29, 29 x 41) are one kernel family, a site per weight.
    Checker(_source(opt)).check_count(SITE, 2).check(MAIN)
    assert _source(opt).count("as_matmul_site(&dnnl_sites") == 2
    compilations = anyshape.stats()["compilations"]
    shapes = [(1, 1), (2, 5), (1, 7), (3, 64), (8, 129), (4, 300), (1, 1), (2, 5)]
    before = _runs(opt)
    with torch.no_grad():
        for b, s in shapes:
            x = torch.randn(b, s, 37)
            _close(opt(x), model(x))
    assert anyshape.stats()["compilations"] == compilations
    assert _runs(opt) - before == 3 * len(shapes)  # every GEMM of every call


def _avx512(opt) -> bool:
    """Whether oneDNN runs AVX-512 kernels here (its ISA, capped by ONEDNN_MAX_CPU_ISA)."""
    isa = opt.report.clusters[0].compiled.native.native.lib.dnnl_get_effective_cpu_isa
    return bool(isa() & 0x20)


@pytest.mark.parametrize("k, n", [(48, 40), (16, 64)])
def test_auto_routes_each_call_by_its_row_count_and_the_isa(k, n):
    """``dnnl_matmul="auto"``: up to 32 rows the few-rows kernel on its own panels, on
    every ISA; from 33 rows the matmul, with AVX2 for weights at most 3x wider than deep
    or cut into such panels of 256 columns or more (``as_matmul_pays``,
    ``as_matmul_panels``, measured per ISA): 16 x 64 has no such cut and takes BLAS;
    wide weights cut into panels run in a test of their own below."""
    torch.manual_seed(7)
    model = torch.nn.Linear(k, n).eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, k),), backend="cpu")
    wide = n > 3 * k and _panels(k, n) == 1
    _first_uses(opt, k)
    rows_on = [(1, 1, 0, 0), (3, 1, 0, 0), (8, 1, 0, 0), (32, 1, 0, 0)]
    rows_on += [(33, 0, 1, 1), (511, 0, 1, 1), (512, 0, 1, 1), (1100, 0, 1, 1)]
    with torch.no_grad():
        for rows, few, avx512, avx2 in rows_on:
            x = torch.randn(1, rows, k)
            before, few_before = _runs(opt), _few(opt)
            _close(opt(x), model(x))
            want = avx512 if _avx512(opt) else avx2 and not wide
            assert _runs(opt) - before == want, (rows, _avx512(opt))
            assert _few(opt) - few_before == few, (rows, _avx512(opt))


def test_a_restored_model_packs_no_weight_before_a_call_needs_it(tmp_path):
    """The model cache checks a restored model against eager before its weights are
    watched, as a cold capture is checked: that call, at the example's 10 rows, reads
    the weights as the model holds them (BLAS), as the user's first call does (a
    weight's first use in a layout), and leaves the few-rows kernel's copy, and the
    memory it takes, to the second call that needs it."""
    x = torch.randn(2, 5, 37)
    first = anyshape.optimize(Mlp().eval(), (x,), backend="cpu", cache_dir=str(tmp_path))
    model = Mlp().eval()  # other weights: none of them watched or packed yet
    anyshape.reset_stats()
    few = _few(first)
    opt = anyshape.optimize(model, (x,), backend="cpu", cache_dir=str(tmp_path))
    assert anyshape.stats()["model_cache_hits"] == 1
    assert _few(opt) == few  # (one library serves both models: its counter is shared)
    with torch.no_grad():
        _close(opt(x), model(x))
        assert _few(opt) == few
        _close(opt(x), model(x))
    assert _few(opt) - few == 3  # every GEMM of the call, on the copies made for it


def test_a_weight_is_copied_on_its_second_use_in_a_layout():
    """A watched weight's first use in a layout runs as a weight nobody watches (BLAS, or
    the matmul where it reads the weight in place), with no copy made; its second use
    packs it. Each route counts its own uses: the few-rows kernel's panels (up to 32 rows)
    and the matmul's (above). A change between the two uses is packed; a copy made
    follows in-place changes at once: the next use packs again."""
    torch.manual_seed(13)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    # rows, then GEMMs on the few-rows kernel's copies and on the matmul (3 weights; the
    # matmul reads ``w``, [k, n] as the model holds it, in place: nothing to defer)
    steps = [(5, 0, 1), (7, 3, 0), (40, 0, 1), (1, 3, 0), (50, 0, 3), (64, 0, 3)]
    with torch.no_grad():
        for step, (rows, few, matmul) in enumerate([*steps, (6, 3, 0), (33, 0, 3)]):
            if step == 1:
                model.down.weight.mul_(0.5)  # (between the first use and the second)
            if step == len(steps):
                model.up.weight.mul_(-1.0)
                model.w.mul_(2.0)
            x = torch.randn(1, rows, 37)
            before, few_before = _runs(opt), _few(opt)
            _close(opt(x), model(x))
            assert (_few(opt) - few_before, _runs(opt) - before) == (few, matmul), rows


def test_a_model_freed_after_first_uses_leaves_the_library_serving_others():
    """Weights unregistered between their first use and their second (the model freed)
    drop entries that hold no copy yet; a second model of the same library, its own
    weights, packs and runs as eager."""
    torch.manual_seed(14)
    gone = anyshape.optimize(Mlp().eval(), (torch.randn(2, 5, 37),), backend="cpu")
    _first_uses(gone, 37)
    del gone
    gc.collect()
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    with torch.no_grad():
        for rows in (3, 3, 40, 40):
            x = torch.randn(1, rows, 37)
            _close(opt(x), model(x))


def test_a_restored_model_is_checked_on_weights_packed_again(tmp_path):
    """A model optimized twice: the first module packed its weights, which then changed
    in place with no call of it since to notice. The second optimize's check must not
    read those stale copies (the library is the same): it is a cache hit, not a
    disagreement that drops the entry and compiles again."""
    x = torch.randn(2, 5, 37)
    model = Mlp().eval()
    first = anyshape.optimize(model, (x,), backend="cpu", cache_dir=str(tmp_path))
    with torch.no_grad():
        first(x)
        first(x)  # packs the few-rows copies (the weights' second use)
        model.up.weight.mul_(2)
    anyshape.reset_stats()
    opt = anyshape.optimize(model, (x,), backend="cpu", cache_dir=str(tmp_path))
    assert anyshape.stats()["model_cache_hits"] == 1
    assert anyshape.stats().get("native_builds", 0) == 0
    with torch.no_grad():
        _close(opt(x), model(x))
        _close(first(x), model(x))


class _OneWeight(torch.nn.Module):
    """One weight, [n, k] read by ``linear`` (``transposed``) or [k, n] by ``x @ w``."""

    def __init__(self, k: int, n: int, transposed: bool):
        super().__init__()
        self.transposed = transposed
        shape = (n, k) if transposed else (k, n)
        self.w = torch.nn.Parameter(torch.randn(shape) / 4)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w) if self.transposed else x @ self.w


@pytest.mark.parametrize("transposed", [True, False])
def test_the_few_rows_kernel_matches_eager_at_every_row_count(transposed):
    """Every row count to 32 (each remainder of a 4- or 8-row tile), a width that leaves a
    part panel, a depth of 1 and an odd one, both weight layouts: as eager; the packed
    panels follow the weight after it changes in place; one more row takes the matmul."""
    torch.manual_seed(11)
    for k, n in [(1, 5), (37, 53), (130, 100)]:
        model = _OneWeight(k, n, transposed).eval()
        opt = anyshape.optimize(model, (torch.randn(2, 3, k),), backend="cpu")
        _first_uses(opt, k, 2)
        with torch.no_grad():
            for rows in [*range(1, 34), 0]:
                x = torch.randn(1, rows, k)
                before = _few(opt)
                _close(opt(x), model(x))
                assert _few(opt) - before == (1 if 0 < rows <= 32 else 0), (k, n, rows)
            model.w.mul_(-3.0)
            x = torch.randn(2, 5, k)
            _close(opt(x), model(x))


def test_a_k_by_n_weight_takes_the_matmul_from_33_rows_on_every_isa():
    """A weight the model holds as [k, n] (``x @ W``: GPT-2's Conv1D) runs on the matmul
    from 33 rows with AVX-512 too (below, the few-rows kernel): read in place by the
    sgemm path it was slower there."""
    torch.manual_seed(8)

    class KByN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(48, 40) / 8)

        def forward(self, x):
            return x @ self.w

    model = KByN().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 48),), backend="cpu")
    with torch.no_grad():
        for rows, want in [(3, 0), (32, 0), (33, 1), (64, 1)]:
            x = torch.randn(1, rows, 48)
            before = _runs(opt)
            _close(opt(x), model(x))
            assert _runs(opt) - before == want, (rows, _avx512(opt))


def test_a_vocabulary_head_takes_the_matmul_on_every_isa():
    """A weight over 3x wider than deep that no panel cut fits and over half the L3 (a
    vocabulary head: GPT-2's 768 x 50257) runs oneDNN's matmul whole above the few-rows
    kernel's 32 rows (``as_matmul_pays``): with AVX2 too."""
    from anyshape.codegen.cpu.build import l3_cache_bytes

    k = 256
    n = max(3 * k + 1, l3_cache_bytes() // 2 // (4 * k) + 1) | 1  # odd: no panel cut fits
    assert _panels(k, n) == 1 and n * k * 4 > l3_cache_bytes() // 2
    torch.manual_seed(9)
    head = torch.nn.Linear(k, n, bias=False).eval()
    opt = anyshape.optimize(head, (torch.randn(2, 3, k),), backend="cpu")
    rows_on = [(1, 0, 0), (32, 0, 0), (33, 1, 1), (511, 1, 1), (512, 1, 1)]
    _first_uses(opt, k, 1, 40)
    with torch.no_grad():
        for rows, avx512, avx2 in rows_on:
            x = torch.randn(1, rows, k)
            before = _runs(opt)
            _close(opt(x), head(x))
            assert _runs(opt) - before == (avx512 if _avx512(opt) else avx2), (rows, n)


def _panels(k: int, n: int) -> int:
    """``as_matmul_panels`` with AVX2: the fewest equal panels of a weight over 3x wider
    than deep, each at most as wide as deep, 256 columns or more and a multiple of 8, at
    most 16 of them; 1 without."""
    if n <= 3 * k:
        return 1
    cuts = range(-(-n // k), min(n // 256, 16) + 1)
    return next((p for p in cuts if n % p == 0 and n // p % 8 == 0), 1)


PANELS_UNDER_AVX2 = """
import torch, anyshape
from test_dnnl_matmul import _avx512, _runs


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)  # [n, k] as the model holds it: 4 panels of 256
        self.w = torch.nn.Parameter(torch.randn(256, 1280) / 16)  # [k, n]: 5 panels of 256

    def forward(self, x):
        return self.up(x), x @ self.w


torch.manual_seed(3)
model = Wide().eval()
opt = anyshape.optimize(model, (torch.randn(2, 5, 256),), dnnl_matmul="always")
assert not _avx512(opt)
with torch.no_grad():
    for step, (b, s) in enumerate([(1, 1), (2, 5), (3, 64), (1, 130), (0, 4), (2, 7)]):
        if step == 4:
            model.up.weight.mul_(-0.5)  # packed panels follow the live weights
            model.w.mul_(2.0)
        x = torch.randn(b, s, 256)
        before = _runs(opt)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert _runs(opt) - before == (2 if b * s else 0), (b, s)
# ``auto``: panels of 256 run from 33 rows; a weight too narrow to cut takes BLAS.
for k, n, rows, want in [
    (256, 1024, 40, 1), (256, 1024, 200, 1), (256, 1024, 600, 1), (128, 512, 40, 0)
]:
    layer = torch.nn.Linear(k, n).eval()
    auto = anyshape.optimize(layer, (torch.randn(3, k),))
    x = torch.randn(rows, k)
    with torch.no_grad():
        auto(torch.randn(rows + 1, k))  # (the weight's first use: BLAS, no copy yet)
        before = _runs(auto)
        torch.testing.assert_close(auto(x), layer(x), rtol=1e-4, atol=1e-4)
    assert _runs(auto) - before == want, (k, n, rows)
print("panels ok")
"""


def test_wide_weights_run_as_panels_with_avx2(tmp_path):
    """With oneDNN capped to AVX2 (a new process: the cap is read once), wide weights in
    both layouts run as one matmul per column panel, strided into the output: results as
    eager's at every row count, and after the weights change in place."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    cuts = [(256, 1024), (256, 1280), (768, 3072), (128, 512), (768, 50272), (16, 68)]
    assert [_panels(k, n) for k, n in cuts] == [4, 5, 4, 1, 1, 1]
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ANYSHAPE_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PANELS_UNDER_AVX2], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and "panels ok" in done.stdout, done.stderr[-3000:]


def test_weights_changed_in_place_are_seen():
    """Packed weights follow ``mul_`` and ``load_state_dict`` on the live model."""
    torch.manual_seed(1)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    x = torch.randn(3, 9, 37)
    with torch.no_grad():
        _close(opt(x), model(x))
        before = opt(x).clone()
        model.up.weight.mul_(-2.0)
        model.w.mul_(0.5)
        _close(opt(x), model(x))
        assert not torch.allclose(opt(x), before)
        model.load_state_dict(Mlp().state_dict())
        _close(opt(x), model(x))


def test_the_watch_is_what_keeps_packed_weights_current():
    torch.manual_seed(2)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    (cluster,) = opt.report.clusters
    assert cluster.compiled.native.packed_params == ["down.weight", "up.weight", "w"]
    watch, opt._weights_watch = opt._weights_watch, None  # registered, versions unchecked
    x = torch.randn(2, 11, 37)
    # Models of earlier tests share this library: one freed here would unregister its
    # weights, which makes the library pack every weight again (the copy is then fresh).
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            _close(opt(x), model(x))
            _close(opt(x), model(x))  # (the weights' second use: packed)
            model.down.weight.mul_(3.0)
            assert not torch.allclose(opt(x), model(x), rtol=1e-4, atol=1e-4)  # stale copy
            del watch  # its owner gone, the weights are unregistered: BLAS reads them live
            _close(opt(x), model(x))
    finally:
        gc.enable()


def test_unwatched_weights_take_blas():
    """A library nobody registered weights with (here: the same library loaded again for
    copies of the weights) reads them live through BLAS, so in-place changes are seen."""
    torch.manual_seed(3)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    g = opt.report.clusters[0].compiled.graph
    copies = {name: value.copy() for name, value in g.params.items()}
    exe = CpuExecutable(Graph(g.inputs, g.outputs, copies, g.constraints, g.name), [])
    x = torch.randn(2, 7, 37)
    with torch.no_grad():
        before = _runs(opt)
        _close(torch.from_numpy(exe([x.numpy()], [])[0]), model(x))
        # the nn.Linear weights need packing: BLAS; ``x @ w`` reads w in place: oneDNN
        assert _runs(opt) - before == 1
        copies["up.weight"] *= -0.5
        model.up.weight.mul_(-0.5)
        _close(torch.from_numpy(exe([x.numpy()], [])[0]), model(x))


def test_gemms_of_two_activations_and_other_dtypes_take_blas():
    """Attention's batched GEMMs, a GEMM of two inputs and float64 have no weight to pack."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 16, dtype=torch.float64))

        def forward(self, q, k, a, b, d):
            return torch.softmax(q @ k.transpose(-1, -2), -1), a @ b, d @ self.w

    model = Attention().eval()
    q, k = torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
    a, b, d = torch.randn(5, 16), torch.randn(16, 9), torch.randn(4, 16, dtype=torch.float64)
    opt = anyshape.optimize(model, (q, k, a, b, d), backend="cpu")
    (  # the three GEMMs, each one BLAS call in its kernel
        Checker(_source(opt))
        .check_count(SITE, 0)
        .check(KERNEL)
        .check_count(re.compile(r"as_gemm_batch<(?:float|double)>\("), 3)
        .check(MAIN)
    )
    assert not hasattr(
        opt.report.clusters[0].compiled.native.native.lib, "anyshape_dnnl_matmul_runs"
    )
    with torch.no_grad():
        for got, want in zip(opt(q, k, a, b, d), model(q, k, a, b, d)):
            _close(got, want)


def test_off_switch_keeps_blas(monkeypatch):
    monkeypatch.setenv("ANYSHAPE_DNNL_MATMUL", "off")
    torch.manual_seed(4)
    model = Mlp(k=23).eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 23),), backend="cpu")
    (  # the three GEMMs, each one BLAS call: up and down in one kernel family
        Checker(_source(opt))
        .check_count(SITE, 0)
        .check(KERNEL)
        .check_count("as_gemm_batch<float>(", 2)
        .check(MAIN)
    )
    x = torch.randn(4, 33, 23)
    with torch.no_grad():
        _close(opt(x), model(x))


def test_one_model_called_from_several_threads_at_different_row_counts():
    torch.manual_seed(5)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu")
    inputs = [torch.randn(1 + k % 3, 3 + 17 * k, 37) for k in range(6)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    assert mismatches_from_threads(opt, inputs, expected) == []


def test_a_constant_weight_does_not_switch_the_watch_off():
    """A packed weight the model does not name (a tensor captured as a constant) does not
    switch the watch off: the model's own weights stay packed and watched, and so is the
    constant, through the compiled graph that holds it. (Compiled cold: a model restored
    from the model cache holds the constant's saved value, architecture.md.)"""
    constant = torch.randn(41, 17)

    class WithConstant(Mlp):
        def forward(self, x):
            return super().forward(x) @ constant

    torch.manual_seed(6)
    model = WithConstant().eval()
    example = (torch.randn(2, 5, 37),)
    opt = anyshape.optimize(model, example, backend="cpu", model_cache=False)
    assert opt._weights_watch is not None
    assert len(opt.report.clusters[0].compiled.native.packed_params) == 4
    x = torch.randn(3, 12, 37)  # (36 rows: the matmul, above the few-rows kernel's 32)
    _first_uses(opt, 37, 2, 40)
    with torch.no_grad():
        before = _runs(opt)
        _close(opt(x), model(x))
        assert _runs(opt) - before == 4
        model.up.weight.mul_(0.25)
        _close(opt(x), model(x))
        # the graph holds the captured tensor itself: its in-place changes are seen too,
        # by the matmul's packed copy and by the few-rows kernel's
        constant.mul_(-2.0)
        for rows in (36, 2):
            x = torch.randn(1, rows, 37)
            _close(opt(x), model(x))


def test_few_rows_gemm_off_keeps_few_rows_on_onednn_and_blas():
    """``few_rows_gemm=False``: no copy of the weight for few rows; the routes of more
    rows run them (AVX-512: the matmul at 9-32 rows of an nn.Linear weight), as eager."""
    torch.manual_seed(12)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), few_rows_gemm=False)
    assert "where it wins" in str(opt.explain()) and "own GEMM" not in str(opt.explain())
    with torch.no_grad():
        for rows in (1, 8, 20, 32):
            x = torch.randn(1, rows, 37)
            before = _few(opt)
            _close(opt(x), model(x))
            assert _few(opt) == before, rows


def test_explain_names_the_gemms_onednn_runs():
    opt = anyshape.optimize(Mlp().eval(), (torch.randn(2, 5, 37),), backend="cpu")
    text = str(opt.explain())
    for name in ("up.weight", "down.weight", "w"):
        assert f"[own GEMM up to 32 rows, oneDNN matmul where it wins, weight {name}]" in text


class StridedWeights(torch.nn.Module):
    """Weights whose plain row strides oneDNN reads slowly: a [k, n] weight 1024 wide
    (packed, not read in place) and a linear layer 1008 wide (packed rows 1040 apart,
    not 1024: ``as_packed_ld``)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(40, 1024) / 8)
        self.lin = torch.nn.Linear(40, 1008)

    def forward(self, x):
        return x @ self.w, self.lin(x)


def test_weights_with_slow_strides_are_packed_and_follow_changes():
    torch.manual_seed(4)
    model = StridedWeights().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 40),), dnnl_matmul="always")
    with torch.no_grad():
        for step, rows in enumerate([1, 5, 64, 0, 300]):
            if step == 3:
                model.w.mul_(-1.5)  # the packed copy follows the live weight
                model.lin.weight.mul_(0.5)
            x = torch.randn(rows, 40)
            before = _runs(opt)
            for got, want in zip(opt(x), model(x)):
                _close(got, want)
            assert _runs(opt) - before == (2 if rows else 0), rows
