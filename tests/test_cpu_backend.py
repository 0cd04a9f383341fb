"""The C++ CPU backend itself: generated code, build cache, workspace, threads, math, profile.

Checks on the generated source are ordered (tests/filecheck.py): a call a kernel makes is
looked for after the first kernel definition, past the runtime headers (which define the
same helpers), and kernels come before the host function that calls them.
"""

import re
import subprocess
import threading

import numpy as np
import pytest
import torch
from filecheck import Checker
from tiny_models import Fn

import anyshape
from anyshape.codegen.cpu import build as cpu_build


class Mlp(torch.nn.Module):
    def __init__(self, layers=3, width=32):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        for lin in self.layers:
            x = torch.nn.functional.gelu(lin(self.norm(x))) + x
        return x.softmax(-1)


# A kernel's first line (host.py; some carry float options); the runtime headers end
# before the first one.
KERNEL = re.compile(
    r"^AS_KERNEL int (?:__attribute__\(\(.*\)\) )?(\w+)\(void\* const\* P, const int64_t\* D\) \{$",
    re.M,
)
# The host function, after every kernel, and its table of the kernel each call site runs.
MAIN = re.compile(r"^int anyshape_main\(", re.M)
SITE_FNS = re.compile(r"as_site_fns\[\] = \{(.*)\};")
SITE_OPS = re.compile(r"as_site_ops\[\] = \{(.*)\};")


def _cluster_source(opt) -> str:
    (cluster,) = opt.report.clusters
    return cluster.compiled.native.source


def test_repeated_layers_emit_each_kernel_once_and_gemm_folds_the_transpose():
    opt = anyshape.optimize(Mlp().eval(), (torch.randn(4, 32),), backend="cpu")
    src = _cluster_source(opt)
    kernels, calls = KERNEL.findall(src), SITE_FNS.search(src).group(1).split(", ")
    assert len(set(kernels)) == len(kernels) and set(calls) == set(kernels), (kernels, calls)
    assert len(kernels) < len(calls), "identical kernels of repeated layers are emitted once"
    Checker(src).check_count(KERNEL, len(kernels)).check(MAIN).check(SITE_FNS)
    # x @ W.T goes to BLAS with the transpose folded into the call, never copied.
    assert '"transpose"' not in SITE_OPS.search(src).group(1)
    (Checker(src).check(KERNEL).check("as_gemm_batch<float>(CblasNoTrans, CblasTrans").check(MAIN))


def test_stream_of_shapes_one_library_no_rebuild_and_workspace_growth():
    model = Mlp().eval()
    anyshape.reset_stats()
    opt = anyshape.optimize(model, (torch.randn(4, 32),), backend="cpu")
    assert anyshape.stats()["native_libraries"] == 1
    # grow, shrink, grow again: the per-thread workspace is reused and regrown
    for rows in [1, 300, 2, 0, 1000, 7, 1000]:
        x = torch.randn(rows, 32)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-5)
    assert anyshape.stats()["native_libraries"] == 1
    assert anyshape.stats()["compilations"] == 1


def test_outputs_reach_torch_without_a_copy_and_stay_valid():
    model = Mlp(layers=1).eval()
    opt = anyshape.optimize(model, (torch.randn(4, 32),), backend="cpu")
    first = opt(torch.ones(5, 32))
    keep = first.clone()
    for _ in range(3):  # later calls reuse the workspace; returned outputs are not in it
        opt(torch.randn(50, 32))
    torch.testing.assert_close(first, keep)
    assert first.is_contiguous()


def test_concurrent_calls_from_threads_match_eager():
    model = Mlp().eval()
    opt = anyshape.optimize(model, (torch.randn(4, 32),), backend="cpu")
    failures = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        for k in range(20):
            x = torch.randn(1 + (seed * 7 + k * 13) % 97, 32, generator=g)
            got, want = opt(x), model(x)
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                failures.append((seed, k, tuple(x.shape)))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_corrupt_cache_entry_is_detected_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path))
    source = 'extern "C" int anyshape_probe() { return 7; }\n'
    lib = cpu_build.build_library(source, "probe")
    good = lib.read_bytes()
    anyshape.reset_stats()
    assert cpu_build.build_library(source, "probe") == lib
    assert anyshape.stats()["native_builds"] == 0  # served from the cache
    lib.write_bytes(good[: len(good) // 2])  # truncated
    assert cpu_build.build_library(source, "probe") == lib
    assert anyshape.stats()["native_builds"] == 1
    assert lib.read_bytes() == good


def test_dump_dir_shows_generated_source(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANYSHAPE_DUMP_DIR", str(tmp_path / "dump"))
    anyshape.optimize(Mlp(layers=1).eval(), (torch.randn(4, 32),), backend="cpu")
    sources = list((tmp_path / "dump").glob("*.cpp"))
    assert sources
    Checker(sources[0].read_text()).check(KERNEL).check(MAIN)


# Bounds stated in anyshape/codegen/cpu/vmath.h, against float64 references.
MATH = [
    ("exp", torch.exp, np.exp, (-87.0, 88.0), "rel", 1.0e-7),
    ("erf", torch.erf, None, (-6.0, 6.0), "abs", 5.0e-7),
    ("tanh", torch.tanh, np.tanh, (-10.0, 10.0), "rel", 4.0e-7),
    ("sigmoid", torch.sigmoid, None, (-30.0, 30.0), "rel", 3.0e-7),
]


@pytest.mark.parametrize("name,fn,ref,span,kind,bound", MATH, ids=[m[0] for m in MATH])
def test_vectorized_math_accuracy(name, fn, ref, span, kind, bound):
    opt = anyshape.optimize(Fn(fn).eval(), (torch.randn(16),), backend="cpu")
    x = torch.linspace(*span, 200_003, dtype=torch.float32)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3e-4, -3e-4])])
    got = opt(x).double()
    want = fn(x.double())
    err = (got - want).abs()
    if kind == "rel":
        err = err / want.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert float(err.max()) <= bound, f"{name}: max {kind} error {float(err.max()):.3g}"
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    torch.testing.assert_close(opt(special), fn(special), equal_nan=True)


def test_exact_gelu_runs_as_one_vector_function_within_erf_bound():
    """0.5 x (1 + erf(x / sqrt 2)) as the lowering builds it becomes vmath's as_gelu_erff
    (3 ops fewer per element); its error is erf's bound scaled by 0.5 |x|."""
    opt = anyshape.optimize(Fn(torch.nn.functional.gelu).eval(), (torch.randn(16),))
    Checker(_cluster_source(opt)).check(KERNEL).check("as_gelu_erff(").check(MAIN)
    x = torch.linspace(-12.0, 12.0, 200_003, dtype=torch.float32)
    got = opt(x).double()
    want = torch.nn.functional.gelu(x.double())
    bound = 0.5 * x.double().abs().clamp_max(6.0) * 4.3e-7 + 1e-7  # erf bound + rounding
    assert bool(((got - want).abs() <= bound).all()), float(((got - want).abs() - bound).max())
    big = torch.finfo(torch.float32).max  # (eager overflows to inf at +big; this gives big)
    special = torch.tensor([float("nan"), -float("inf"), 0.0, -0.0, -6.0, 1e30, -1e30, -big])
    torch.testing.assert_close(
        opt(special), torch.nn.functional.gelu(special), equal_nan=True, rtol=1e-6, atol=1e-7
    )


def test_gelu_like_expressions_with_other_constants_are_not_taken_for_gelu():
    class NearGelu(torch.nn.Module):
        def forward(self, x):
            return x * 0.5 * (1 + torch.erf(x * 0.7)), (x * 0.5) * (
                2 + torch.erf(x * 0.7071067811865476)
            )

    model = NearGelu().eval()
    opt = anyshape.optimize(model, (torch.randn(16),))
    Checker(_cluster_source(opt)).check(KERNEL).check_not("as_gelu_erff(").end()
    x = torch.linspace(-8.0, 8.0, 1001)
    for got, want in zip(opt(x), model(x)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_reduction_kernels_inline_their_element_helpers():
    """Float-sum kernels compile with their own float options; helpers such as as_max must
    still be inlined (a call per element stopped a sum over relu from vectorizing)."""

    class ReluSum(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).sum(-1), torch.clamp(x, -1, 1).sum(-1)

    model = ReluSum().eval()
    opt = anyshape.optimize(model, (torch.randn(4, 16),))
    (cluster,) = opt.report.clusters
    Checker(cluster.compiled.native.source).check(KERNEL).check("reduction(+:").check(MAIN)
    symbols = subprocess.run(
        ["nm", "-C", str(cluster.compiled.native.library)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert not [ln for ln in symbols.splitlines() if " as_max<" in ln or " as_min<" in ln]
    x = torch.randn(33, 70)
    for got, want in zip(opt(x), model(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_exp_ends_overflow_and_subnormal_like_torch():
    opt = anyshape.optimize(Fn(torch.exp).eval(), (torch.randn(16),), backend="cpu")
    big = torch.tensor([88.0, 88.5, 88.72, 88.7228, 88.73, 88.8, 89.0, 100.0, 1e30])
    got, want = opt(big), torch.exp(big)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = ~torch.isinf(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-7, atol=0)
    small = torch.linspace(-110.0, -87.0, 20_001)  # subnormal results, then 0
    got, want = opt(small).double(), torch.exp(small.double())
    assert float((got - want).abs().max()) <= 1.5e-45  # within one subnormal step
    assert float(opt(torch.tensor([-104.5, -200.0, -1e30])).abs().max()) == 0.0


def test_reductions_propagate_nan_like_torch():
    class Reds(torch.nn.Module):
        def forward(self, x):
            return x.amax(-1), x.amin(-1), x.sum(-1)

    model = Reds().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 40),), backend="cpu")
    x = torch.randn(4, 37)
    x[1, 5] = float("nan")
    x[2, 36] = float("inf")
    for got, want in zip(opt(x), model(x)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_profile_reports_every_kernel_call_site():
    opt = anyshape.optimize(Mlp().eval(), (torch.randn(4, 32),), backend="cpu", profile=True)
    opt.profile()  # reset
    for _ in range(3):
        opt(torch.randn(64, 32))
    report = opt.profile()
    assert report.total_seconds > 0
    assert "dot" in report.by_op()
    assert all(s.calls == 3 for s in report.sites)
    assert "top call sites" in str(report)
    assert opt.profile().total_seconds == 0  # read resets


def test_kernel_error_is_an_exception_not_a_crash():
    emb = torch.nn.Embedding(10, 4)
    opt = anyshape.optimize(Fn(emb).eval(), (torch.tensor([[1, 2]]),), backend="cpu")
    with pytest.raises(RuntimeError, match=r"index is out of range .* in gather$"):
        opt(torch.tensor([[3, 12]]))  # (the message names the call site's op)
    torch.testing.assert_close(opt(torch.tensor([[3, 9]])), emb(torch.tensor([[3, 9]])))


CONVS = [  # cin, cout, kernel, stride, padding, dilation, groups, example shape
    (3, 8, 7, 2, 3, 1, 1, (2, 3, 31, 29)),  # ResNet stem: im2col + GEMM
    (8, 8, 3, 1, 1, 1, 2, (1, 8, 9, 10)),  # grouped
    (4, 6, 1, 1, 0, 1, 1, (2, 4, 5, 7)),  # 1x1: the input is the GEMM operand
    (4, 6, 1, 2, 0, 1, 1, (2, 4, 5, 7)),  # strided 1x1
    (4, 4, 3, 2, 2, 2, 4, (1, 4, 12, 11)),  # depthwise, dilated
]


@pytest.mark.parametrize("dnnl", ["spatial", "off"])
@pytest.mark.parametrize("cin,cout,k,s,p,d,g,shape", CONVS)
def test_convolution_through_gemm_at_any_size(cin, cout, k, s, p, d, g, shape, dnnl, monkeypatch):
    """im2col + GEMM (``off``), and oneDNN for kernels over 1x1 without groups (``spatial``);
    a depthwise one is a direct loop either way."""
    monkeypatch.setenv("ANYSHAPE_DNNL_CONV", dnnl)
    model = torch.nn.Conv2d(cin, cout, k, s, p, d, g).eval()
    opt = anyshape.optimize(model, (torch.randn(*shape),), backend="cpu", model_cache=False)
    n, c, h, w = shape
    for size in [shape, (n + 1, c, h + 3, w + 1), (1, c, k * d + 1, k * d)]:
        x = torch.randn(*size)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    site = "as_dnnl_conv2d(&dnnl_site"
    check = Checker(_cluster_source(opt))
    if dnnl == "spatial" and k > 1 and g == 1:
        check.check(KERNEL).check(site)  # oneDNN first; im2col + GEMM where it refuses
    else:
        check.check_count(site, 0).check(KERNEL)
    if g == cin and g > 1:  # depthwise: a direct loop (depthwise_emit.py), no GEMM
        check.check_count("as_conv_gemm<float>(", 0).check("d[o] += wv *").check(MAIN)
    else:
        check.check("as_conv_gemm<float>(").check(MAIN)


class Head(torch.nn.Module):
    """GPT-2's tail: gelu_new (a cube via pow) and logits reshaped to [batch, seq, vocab]."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 40)

    def forward(self, x):
        h = 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * torch.pow(x, 3.0))))
        logits = self.proj(h.reshape(-1, 16))
        return logits.reshape(x.shape[0], x.shape[1], 40), logits.sum()


def test_output_reshape_hands_out_the_gemm_buffer_and_constant_pow_is_a_product():
    model = Head().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5, 16),), backend="cpu")
    src = _cluster_source(opt)
    assert '"reshape"' not in SITE_OPS.search(src).group(1)  # no copy kernel for the reshape
    (
        Checker(src)
        .check(KERNEL)
        .check_not("as_pow")  # x ** 3 multiplies
        .end()
    )
    for shape in [(1, 2, 16), (3, 7, 16), (2, 0, 16)]:
        x = torch.randn(*shape)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "k,s,p,d,ceil",
    [
        (3, 2, 1, 1, False),
        (2, 2, 0, 1, False),
        (3, 1, 1, 1, False),
        (3, 2, 1, 2, True),
        (5, 3, 2, 1, True),
        (1, 1, 0, 1, False),
    ],
)
def test_max_pool_rows_match_torch(k, s, p, d, ceil):
    """Float max pooling runs row by row with per-tap column ranges (codegen/cpu/pool_emit.py)."""

    class Pool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode=ceil)

    model = Pool()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 11, 12),), backend="cpu")
    for shape in [(1, 1, 9, 9), (2, 5, 16, 23), (3, 2, 7, 40)]:
        x = torch.randn(*shape)
        x[0, 0, 1, 2] = float("nan")
        x[-1, -1, -1, -1] = float("inf")
        torch.testing.assert_close(opt(x), model(x), equal_nan=True)
    x = torch.randn(2, 3, 2 * k, 2 * k, dtype=torch.float64)
    opt64 = anyshape.optimize(model, (x,), backend="cpu")
    torch.testing.assert_close(opt64(x), model(x))


@pytest.mark.parametrize(
    "conv,shape",
    [
        (torch.nn.Conv1d(3, 5, 4, stride=3, padding=2, dilation=2), (2, 3, 17)),
        (torch.nn.Conv1d(2, 4, 3, padding=5), (1, 2, 4)),  # padding wider than the input
        (torch.nn.Conv3d(2, 3, (3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 2)), (1, 2, 5, 6, 7)),
    ],
    ids=["conv1d", "conv1d_wide_pad", "conv3d"],
)
def test_im2col_rows_in_one_and_three_spatial_dims(conv, shape):
    """im2col copies each row between two zero fills (kernels._im2col_row) at any rank."""
    model = conv.eval()
    opt = anyshape.optimize(model, (torch.randn(*shape),), backend="cpu")
    for grow in (0, 1, 5):
        size = shape[:2] + tuple(s + grow for s in shape[2:])
        x = torch.randn(*size)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


def test_few_row_gemms_through_onednn_match_torch_at_every_row_count():
    """GEMMs of up to 64 rows go through oneDNN in 8-row blocks (gemm.h as_small_sgemm);
    every remainder, both weight layouts, and the OpenBLAS path above it agree with torch."""
    from anyshape.codegen.cpu.build import small_gemm_flags

    assert "-DANYSHAPE_DNNL" in small_gemm_flags()  # installed with anyshape on x86-64 Linux

    class TwoLayouts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(48, 40)  # x @ W^T
            self.w = torch.nn.Parameter(torch.randn(40, 24))  # x @ W (GPT-2's Conv1D)

        def forward(self, x):
            return self.linear(x) @ self.w

    model = TwoLayouts().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 48),), backend="cpu")
    (cluster,) = opt.report.clusters
    assert b"dnnl_sgemm" in cluster.compiled.native.library.read_bytes()
    for rows in [1, 7, 8, 9, 16, 17, 63, 64, 65, 130]:
        x = torch.randn(rows, 48)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


def test_reduction_keeping_the_innermost_dim_runs_column_blocks_for_every_size():
    """A sum over leading dims (a bias gradient) reads rows contiguously in blocks of
    columns; every block size edge (0, 1, one short of a block, a block and one more)."""
    from anyshape.codegen.cpu.reduce_emit import COLUMN_BLOCK
    from anyshape.config import Options
    from anyshape.ir import DType, GraphBuilder, SymExpr, TensorType
    from anyshape.ir.constraints import ConstraintStore
    from anyshape.pipelines import compile_graph

    s = [SymExpr.symbol(f"s{i}") for i in range(3)]
    store = ConstraintStore()
    for i in range(3):
        store.add_symbol(f"s{i}", 0, None)
    b = GraphBuilder(store, name="column_sums")
    x = b.input("x", TensorType(DType.f32, tuple(s)))
    i = b.input("i", TensorType(DType.i64, (s[1], s[2])))
    sums = b.op("reduce", b.op("mul", x, x), kind="sum", axes=(0, 1))
    prods = b.op("reduce", i, kind="prod", axes=(0,))
    compiled = compile_graph(b.build([sums, prods]), Options(backend="cpu", verify=True))
    rng = np.random.default_rng(0)
    for c in (0, 1, COLUMN_BLOCK - 1, COLUMN_BLOCK, COLUMN_BLOCK + 1, 3 * COLUMN_BLOCK + 5):
        for rows in ((0, 3), (1, 1), (3, 17)):
            a = rng.standard_normal((*rows, c)).astype(np.float32)
            n = rng.integers(-2, 3, (rows[1], c))
            got_sums, got_prods = compiled.executable([a, n], [])
            want = (a.astype(np.float64) ** 2).sum((0, 1))
            np.testing.assert_allclose(got_sums, want, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(got_prods, n.prod(0))


def test_channels_last_convolution_with_groups_is_refused_not_miscomputed():
    # The channels-last kernel (im2col + one GEMM per image) has no groups: a graph with
    # such a convolution (a frontend reading NHWC) gets an error naming it.
    from anyshape.config import Options
    from anyshape.errors import UnsupportedError
    from anyshape.ir.dtypes import DType
    from anyshape.ir.graph import GraphBuilder
    from anyshape.ir.symbolic import SymExpr
    from anyshape.ir.types import TensorType
    from anyshape.pipelines import compile_graph

    b = GraphBuilder()
    x = b.input("x", TensorType(DType.f32, (SymExpr.symbol("n"), 6, 7, 4)))
    k = b.param("k", np.ones((6, 2, 3, 3), np.float32))
    conv = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=2, channels_last=True)
    graph = b.build([b.op("convolution", x, k, **conv)])
    with pytest.raises(UnsupportedError, match="channels-last convolution with 2 groups"):
        compile_graph(graph, Options(backend="cpu"))
