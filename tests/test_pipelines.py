"""The one compile path: named pipelines, the backend registry, compile_graph for every mode."""

import importlib

import numpy as np
import pytest

from anyshape.codegen.backend import Backend
from anyshape.codegen.registry import BACKENDS, backend_named
from anyshape.config import Options, describe_options
from anyshape.errors import UnsupportedError
from anyshape.ir.constraints import ConstraintStore
from anyshape.ir.dtypes import DType
from anyshape.ir.graph import GraphBuilder
from anyshape.ir.symbolic import SymExpr
from anyshape.ir.types import TensorType
from anyshape.pipelines import PIPELINES, compile_graph


def _resolve(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("mode", sorted(PIPELINES))
def test_every_named_stage_is_real_code(mode):
    stages = PIPELINES[mode]
    assert stages, mode
    names = [stage for stage, _, _ in stages]
    assert len(names) == len(set(names)), f"{mode}: a stage named twice"
    for stage, ref, what in stages:
        assert callable(_resolve(ref)), f"{mode}/{stage}: {ref}"
        assert what, f"{mode}/{stage} says nothing about what it does"


def test_registry_names_every_backend_and_refuses_others():
    for name in BACKENDS:
        backend = backend_named(name)
        assert isinstance(backend, Backend) and backend.name == name
        assert backend_named(name) is backend  # one instance per process
    with pytest.raises(ValueError, match=r"unknown backend 'tpu' \(known: cpu, interpreter\)"):
        backend_named("tpu")


def _softmax_graph():
    """softmax over the last dim of an [s0, s1] float32 input."""
    s0, s1 = SymExpr.symbol("s0"), SymExpr.symbol("s1")
    store = ConstraintStore()
    store.add_symbol("s0", 0, None)
    store.add_symbol("s1", 0, None)
    b = GraphBuilder(store, name="softmax")
    x = b.input("x", TensorType(DType.f32, (s0, s1)))

    def rows(v):
        return b.op("broadcast_in_dim", v, shape=(s0, s1), dims=(0,))

    e = b.op("exp", b.op("sub", x, rows(b.op("reduce", x, kind="max", axes=(1,)))))
    return b.build([b.op("div", e, rows(b.op("reduce", e, kind="sum", axes=(1,))))])


def _softmax(x):
    if x.size == 0:
        return x.copy()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_compile_graph_runs_any_shape_on_every_backend(backend):
    compiled = compile_graph(_softmax_graph(), Options(backend=backend, verify=True))
    assert compiled.extra_symbols == [] and compiled.library is None
    for shape in [(3, 5), (1, 1), (0, 4), (7, 33)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (got,) = compiled.executable([x], [])
        np.testing.assert_allclose(got, _softmax(x), rtol=1e-5, atol=1e-6)


def test_compile_graph_for_an_artifact_builds_a_library_on_cpu_only():
    compiled = compile_graph(_softmax_graph(), Options(), "portable")
    assert compiled.executable is None
    assert compiled.library.library[:4] == b"\x7fELF"
    assert compiled.library.output_slots == [0]
    with pytest.raises(UnsupportedError, match="interpreter backend builds no standalone"):
        compile_graph(_softmax_graph(), Options(backend="interpreter"), "portable")


def test_every_option_has_help_and_an_environment_variable(monkeypatch):
    text = describe_options()
    for line in text.splitlines():
        name, _, rest = line.partition(" / ")
        assert rest.startswith(f"ANYSHAPE_{name.upper()} "), line
        assert len(rest.split(": ", 1)[1]) > 10, f"{name} has no real help text"
    monkeypatch.setenv("ANYSHAPE_DNNL_MATMUL", "off")
    monkeypatch.setenv("ANYSHAPE_THREADS", "3")
    monkeypatch.setenv("CXX", "my-g++")
    opts = Options.from_env(dnnl_conv="off")
    assert (opts.dnnl_matmul, opts.threads, opts.cxx, opts.dnnl_conv) == ("off", 3, "my-g++", "off")
    with pytest.raises(TypeError, match="unknown anyshape option"):
        Options.from_env(dnnl_matmull=False)


def test_artifacts_take_no_layout_pass_for_a_library_they_do_not_link():
    cpu = backend_named("cpu")
    assert cpu.layouts(Options()) == ("channels_last",)  # plugin mode links oneDNN (x86-64)
    assert cpu.layouts(Options(), "portable") == () == cpu.layouts(Options(), "native")
    assert cpu.layouts(Options(dnnl_conv="spatial")) == ()


def test_option_values_are_parsed_and_checked_as_the_variables_are(monkeypatch):
    assert Options.from_env(dnnl_matmul="off", threads="2").dnnl_matmul == "off"
    # dnnl_matmul was a switch: True/False and 1/0 still read as auto/off
    assert (
        Options(dnnl_matmul=False).dnnl_matmul
        == "off"
        == Options.from_env(dnnl_matmul="0").dnnl_matmul
    )
    assert (
        Options(dnnl_matmul=True).dnnl_matmul
        == "auto"
        == Options.from_env(dnnl_matmul="1").dnnl_matmul
    )
    with pytest.raises(ValueError, match=r"option dnnl_matmul must be one of auto, always, off"):
        Options(dnnl_matmul="sometimes")
    with pytest.raises(ValueError, match=r"option dnnl_conv must be one of .* got '1' \(keyword\)"):
        Options.from_env(dnnl_conv="1")
    monkeypatch.setenv("ANYSHAPE_SMALL_GEMM", "mkl")
    with pytest.raises(ValueError, match=r"small_gemm .* got 'mkl' \(ANYSHAPE_SMALL_GEMM\)"):
        Options.from_env()


def test_fastcall_off_keeps_calls_on_ctypes():
    import torch

    import anyshape

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    fast = anyshape.optimize(model, (x,), model_cache=False)
    slow = anyshape.optimize(model, (x,), model_cache=False, fastcall=False)
    assert fast._native_call is not None and slow._native_call is None
    assert slow.report.clusters[0].compiled.native.native._fast is None
    for rows in (0, 1, 5):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(slow(x), model(x))


def test_export_builds_with_the_cpu_backend_whatever_runs_in_process():
    import torch

    import anyshape

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    artifact = anyshape.export(model, (torch.randn(2, 4),), backend="interpreter")
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    (got,) = artifact.load()(x)
    want = model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
