"""A large generated program built as several translation units in parallel.

``codegen/cpu/build.py`` splits one emitted program into units (each repeats the
prelude, takes a share of the kernels; one holds the host function and the C API)
and links them into one library. These tests force the split on small models and
check that the split library computes what eager does and that the state the
runtime headers share (oneDNN's call sites, the watched weights, the GEMM counter)
is one state across its units.
"""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

import anyshape
from anyshape import native_build
from anyshape.codegen.cpu import build as cpu_build
from anyshape.codegen.cpu.host import HOST_MARK, KERNEL_MARK
from anyshape.native_build import BuildError

KERNEL_DEF = re.compile(r"^AS_KERNEL int (?:__attribute__\(\(.*\)\) )?(\w+)\(.*\{$", re.M)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(37, 53)
        self.down = torch.nn.Linear(53, 29)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        return torch.softmax(self.down(torch.layer_norm(h, (53,))), -1), h.sum(-1)


@pytest.fixture
def split_builds(monkeypatch, tmp_path):
    """Every build splits into up to 6 units (a fresh cache); yields the unit counts built."""
    monkeypatch.setattr(cpu_build, "UNIT_CHARS", 1)
    monkeypatch.setattr(cpu_build, "build_jobs", lambda: 6)
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path))
    built: list[int] = []
    real = native_build._compile_and_link

    def counting(cxx, language, units, *rest):
        built.append(len(units))
        return real(cxx, language, units, *rest)

    monkeypatch.setattr(native_build, "_compile_and_link", counting)
    return built


def _source(opt) -> str:
    (cluster,) = opt.report.clusters
    return cluster.compiled.native.source


def test_units_share_the_kernels_and_one_holds_the_host(split_builds):
    torch.manual_seed(0)
    opt = anyshape.optimize(Mlp().eval(), (torch.randn(2, 5, 37),), backend="cpu")
    source = _source(opt)
    units = cpu_build.split_units(source, 3)
    assert split_builds == [6] and len(units) == 3
    kernels = KERNEL_DEF.findall(source)
    assert len(kernels) >= 3
    defined = [name for unit in units for name in KERNEL_DEF.findall(unit)]
    assert sorted(defined) == sorted(kernels)  # each kernel in exactly one unit
    hosts = [u for u in units if "#define AS_HOST_UNIT" in u]
    assert len(hosts) == 1 and all(u.startswith("#define AS_SPLIT_UNIT\n") for u in units)
    assert all(("int anyshape_main(" in u) == (u in hosts) for u in units)


def test_a_split_library_matches_eager_and_shares_the_runtime_state(split_builds):
    """Kernels in the other units run oneDNN's matmul: its counter, read through the C
    API in the host unit, counts them, and weights changed in place are seen through
    the watch list the host unit registers."""
    torch.manual_seed(1)
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 37),), backend="cpu", dnnl_matmul="always")
    assert split_builds == [6]
    units = cpu_build.split_units(_source(opt), 6)
    assert any("as_dnnl_matmul(&dnnl_site" in u for u in units if "#define AS_HOST_UNIT" not in u)
    native = opt.report.clusters[0].compiled.native.native
    assert native.packs_weights  # the build links oneDNN (a dependency)
    runs = native.lib.anyshape_dnnl_matmul_runs
    runs.restype = ctypes.c_int64
    compilations = anyshape.stats()["compilations"]
    before = runs()
    shapes = [(1, 1), (2, 5), (3, 64), (0, 4), (1, 7)]
    with torch.no_grad():
        for b, s in shapes:
            x = torch.randn(b, s, 37)
            for got, want in zip(opt(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        gemms = runs() - before
        assert gemms == 2 * sum(1 for b, s in shapes if b * s)  # both linears, every call
        model.up.weight.mul_(-2.0)
        x = torch.randn(2, 9, 37)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert anyshape.stats()["compilations"] == compilations


def test_a_small_program_stays_one_unit():
    source = "prelude\n" + KERNEL_MARK + "\nAS_KERNEL int k_a() {}\n" + HOST_MARK + "\nmain\n"
    assert cpu_build.split_units(source, 4) == [source]


def test_a_lone_unit_linking_the_glue_object_is_one_unit_of_several():
    """A program that links the oneDNN glue object (``whole=False``) compiles even as one
    unit the way each of several units is compiled (AS_SPLIT_UNIT, and the C API with
    AS_HOST_UNIT), so that what the unit and the object share is one copy."""
    source = "prelude\n" + KERNEL_MARK + "\nAS_KERNEL int k_a() {}\n" + HOST_MARK + "\nmain\n"
    (unit,) = cpu_build.split_units(source, 4, whole=False)
    assert unit == "#define AS_SPLIT_UNIT\n#define AS_HOST_UNIT\n" + source


def test_the_helpers_a_program_calls_count_toward_its_split():
    """The runtime helpers its kernels call are compile work too: a program of two small
    kernels calling the im2col convolution builds in two units at once (ResNet-50's C++
    build took 0.96 s in one unit, 0.56 s in two)."""
    kernels = "".join(
        f"{KERNEL_MARK}\nAS_KERNEL int k_{k}() {{ as_conv2d_nhwc<float>(s); {'x' * 700} }}\n"
        for k in range(2)
    )
    source = "prelude\n" + kernels + HOST_MARK + "\nmain\n"
    assert len(cpu_build.split_units(source, 2)) == 2
    plain = source.replace("as_conv2d_nhwc<float>(s);", "")
    assert cpu_build.split_units(plain, 2) == [plain]


def test_kernels_calling_one_helper_share_a_unit(monkeypatch):
    """A unit compiles each runtime helper its kernels call (the im2col convolution, the
    BLAS GEMM) once: kernels calling the same helpers go together while that keeps the
    units even, the rest balance the load."""
    monkeypatch.setattr(cpu_build, "UNIT_CHARS", 1)

    def kernel(name: str, body: str) -> str:
        return f"{KERNEL_MARK}\nAS_KERNEL int {name}() {{ {body} }}\n"

    gemms = [
        kernel(f"k_g{k}", f"as_conv2d_nhwc<float>(s{k}); as_gemm_batch<float>({k});")
        for k in range(3)
    ]
    loops = [kernel(f"k_l{k}", "x" * 3000) for k in range(4)]
    source = "prelude\n" + "".join(gemms + loops) + HOST_MARK + "\nmain\n"
    units = cpu_build.split_units(source, 2)
    assert len(units) == 2
    with_gemm = [u for u in units if "as_conv2d_nhwc" in u]
    assert len(with_gemm) == 1 and all(f"k_g{k}" in with_gemm[0] for k in range(3))
    assert all(any(f"k_l{k}" in u for u in units) for k in range(4))


def test_no_unit_is_left_without_kernels(monkeypatch):
    """Kernels gathered onto the unit that compiles their helpers leave no unit holding
    the prelude alone (a compiler run for nothing)."""
    monkeypatch.setattr(cpu_build, "UNIT_CHARS", 1)
    kernels = "".join(
        f"{KERNEL_MARK}\nAS_KERNEL int k_m{k}() {{ as_gemm_batch<float>(s); {'x' * 5000} }}\n"
        for k in range(6)
    )
    source = "prelude\n" + kernels + HOST_MARK + "\n" + "m" * 600_000 + "\n"
    units = cpu_build.split_units(source, 4)
    assert all("AS_KERNEL int k_m" in u for u in units if "#define AS_HOST_UNIT" not in u)
    assert sum(u.count("AS_KERNEL int k_m") for u in units) == 6


def test_a_unit_the_compiler_rejects_is_kept_and_named(tmp_path):
    source = "int ok() { return 0; }\nint broken( {\n"
    with pytest.raises(BuildError, match="source kept at") as e:
        native_build.build_cached(
            source,
            "probe",
            ["-O1", "-fPIC", "-shared"],
            options=anyshape.config.Options(cache_dir=str(tmp_path)),
            split=lambda text: text.splitlines(keepends=True),  # two units
        )
    assert "broken" in str(e.value)
    kept = re.search(r"source kept at (\S+)\)", str(e.value)).group(1)
    assert open(kept).read() == "int broken( {\n"  # the unit the error's lines refer to


def test_the_cache_key_does_not_depend_on_the_split(split_builds, monkeypatch):
    """A library built in 6 units serves a machine that would build it in 2 (a model
    cache shared between machines of different core counts rebuilds nothing)."""
    torch.manual_seed(2)
    opt = anyshape.optimize(Mlp().eval(), (torch.randn(2, 5, 37),), backend="cpu")
    source = _source(opt)
    first = cpu_build.build_library(source, "cluster0")
    builds = anyshape.stats()["native_builds"]
    monkeypatch.setattr(cpu_build, "build_jobs", lambda: 2)
    assert len(cpu_build.split_units(source, 2)) == 2
    assert cpu_build.build_library(source, "cluster0") == first
    assert anyshape.stats()["native_builds"] == builds and split_builds == [6]


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


def test_one_glue_object_serves_every_library(tmp_path, monkeypatch):
    """oneDNN's glue is compiled once into an object of the cache, which each library
    with oneDNN call sites links (no unit compiles it): each model builds its own
    library, the cache holds one object, both export the weight-watch API from it, and
    both match eager over shapes, weights changed in place included. A library without
    oneDNN call sites does not link it."""
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(3)
    models = [
        (Mlp().eval(), lambda b, s: torch.randn(b, s, 37), (2, 5)),
        (ConvNet().eval(), lambda b, s: torch.randn(b, 3, s, s + 1), (2, 6)),
    ]
    builds = []
    for model, make, example in models:
        before = anyshape.stats()["native_builds"]
        opt = anyshape.optimize(model, (make(*example),), backend="cpu", dnnl_matmul="always")
        builds.append(anyshape.stats()["native_builds"] - before)
        source = _source(opt)
        assert cpu_build.GLUE_MARK in source and "as_dnnl_matmul(AsMatmulSite* s" in source
        native = opt.report.clusters[0].compiled.native.native
        assert native.packs_weights and hasattr(native.lib, "anyshape_watch_weights")
        with torch.no_grad():
            for b, s in [(1, 1), (3, 4), (0, 2), (2, 9)]:
                x = make(b, s)
                torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            next(model.parameters()).mul_(-0.5)
            x = make(2, 3)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    assert builds == [1, 1]  # each its library (the object is no model's library)
    assert len(list(tmp_path.glob("dnnl-glue-*.o"))) == 1
    plain = anyshape.optimize(torch.nn.Softmax(-1).eval(), (torch.randn(2, 7),), backend="cpu")
    assert cpu_build.GLUE_MARK not in _source(plain)


def test_the_glue_object_is_built_while_a_compile_captures(tmp_path):
    """A compile's warm-up starts the glue object's build on a thread, once per cache:
    by the library's build it is there (or under way, and waited for)."""
    options = anyshape.config.Options(cache_dir=str(tmp_path))
    thread = cpu_build.start_glue_object(options)
    assert thread is not None
    assert cpu_build.start_glue_object(options) is None  # once per process and cache
    thread.join(60)
    (glue,) = tmp_path.glob("dnnl-glue-*.o")
    flags = cpu_build.library_flags(cpu_build.NATIVE, options)
    assert cpu_build.dnnl_glue_object(flags, options) == glue
    unlinked = anyshape.config.Options(cache_dir=str(tmp_path / "b"), small_gemm="openblas")
    assert cpu_build.start_glue_object(unlinked) is None  # no oneDNN, no glue


def test_a_child_forked_during_the_glue_build_builds_its_own(tmp_path):
    """A process forked while the warm-up thread holds the glue object's lock (a server
    forking its workers after a compile) does not wait forever on it in the child."""
    import os

    options = anyshape.config.Options(cache_dir=str(tmp_path))
    flags = cpu_build.library_flags(cpu_build.NATIVE, options)
    with cpu_build._glue_lock:  # (as the warm-up thread holds it while it builds)
        pid = os.fork()
        if pid == 0:  # the child: builds the object itself, then leaves at once
            try:
                cpu_build.dnnl_glue_object(flags, options)
                os._exit(0)
            except BaseException:
                os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert list(tmp_path.glob("dnnl-glue-*.o"))


def test_libraries_link_with_gold_where_the_system_has_it(tmp_path):
    """GNU gold links a library in a third of the default linker's time; a library built
    for this machine is linked by it when ``ld.gold`` is installed (its ELF then carries
    gold's version note), and by the default linker otherwise."""
    import shutil

    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 37),), cache_dir=str(tmp_path), backend="cpu")
    library = opt.report.clusters[0].compiled.native.library
    with torch.no_grad():
        x = torch.randn(5, 37)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-5)
    gold = shutil.which("ld.gold") is not None
    assert ("-fuse-ld=gold" in cpu_build.linker_flags()) == gold
    assert (b".note.gnu.gold-version" in library.read_bytes()) == gold
