"""2-D float convolutions through oneDNN (plugin mode): geometry, shapes, weights, threads.

Every check compares with eager. oneDNN makes one primitive per input size, so
these tests run many sizes through one compiled model (more than a call site
keeps), change weights in place after the first calls, and call one model from
several threads at once.
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


SITE = "as_dnnl_conv2d(&dnnl_site"
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


GEOMETRIES = [  # cin, cout, kernel, stride, padding, dilation, bias
    (3, 16, 7, 2, 3, 1, False),  # a stem: odd sizes leave less right padding than left
    (8, 8, 3, 1, 1, 1, True),
    (8, 12, 3, 2, 1, 1, False),
    (6, 4, (3, 1), 1, (1, 0), 1, True),  # rectangular kernel
    (4, 8, 5, 1, 0, 1, True),  # no padding
    (4, 4, 3, 1, 2, 2, False),  # dilated
]


@pytest.mark.parametrize("cin,cout,k,s,p,d,bias", GEOMETRIES)
def test_convolution_geometries_at_many_sizes(cin, cout, k, s, p, d, bias):
    torch.manual_seed(0)
    model = torch.nn.Conv2d(cin, cout, k, s, p, d, bias=bias).eval()
    opt = anyshape.optimize(model, (torch.randn(2, cin, 11, 12),), backend="cpu")
    Checker(_source(opt)).check(KERNEL).check(SITE).check(MAIN)
    with torch.no_grad():
        for n, h, w in [(2, 11, 12), (1, 9, 9), (3, 16, 7), (1, 23, 31), (2, 11, 12)]:
            x = torch.randn(n, cin, h, w)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


class ConvBnRelu(torch.nn.Module):
    """Two 3x3 layers with batch norm, ReLU and a skip add as each image's epilogue."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.a = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn_a = torch.nn.BatchNorm2d(c)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn_b = torch.nn.BatchNorm2d(c)
        for bn in (self.bn_a, self.bn_b):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.bn_a(self.a(x)))
        return torch.relu(self.bn_b(self.b(y)) + x)


def test_more_sizes_than_a_call_site_keeps_and_sizes_seen_again():
    """A call site keeps 32 sizes; 40 sizes, then the first ones again, stay exact."""
    torch.manual_seed(1)
    model = ConvBnRelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 8, 6, 6),), backend="cpu")
    sizes = [(1 + k % 3, 4 + k, 5 + (k * 7) % 11) for k in range(40)] + [(2, 4, 5), (1, 5, 12)]
    with torch.no_grad():
        for n, h, w in sizes:
            x = torch.randn(n, 8, h, w)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    assert anyshape.stats()["compilations"] >= 1
    Checker(_source(opt)).check(KERNEL).check(SITE).check(MAIN)


def test_weights_changed_in_place_are_seen():
    """Packed weights follow ``mul_`` and ``load_state_dict`` on the live model."""
    torch.manual_seed(2)
    model = ConvBnRelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 8, 6, 6),), backend="cpu")
    x = torch.randn(2, 8, 9, 7)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
        before = opt(x).clone()
        model.a.weight.mul_(-2.0)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
        assert not torch.allclose(opt(x), before)
        fresh = ConvBnRelu()
        model.load_state_dict(fresh.state_dict())
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


def test_the_watch_is_what_keeps_packed_weights_current():
    torch.manual_seed(3)
    model = ConvBnRelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 8, 6, 6),), backend="cpu")
    (cluster,) = opt.report.clusters
    assert cluster.compiled.native.packed_params == ["a.weight", "b.weight"]
    watch, opt._weights_watch = opt._weights_watch, None  # registered, versions unchecked
    x = torch.randn(1, 8, 10, 10)
    # Models of earlier tests share this library: one freed here would unregister its
    # weights, which makes the library pack every weight again (the copy is then fresh).
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            opt(x)  # (the weights' first use packed them per call, the second once)
            model.b.weight.mul_(3.0)
            assert not torch.allclose(opt(x), model(x), rtol=1e-4, atol=1e-4)  # stale copy
            del watch  # its owner gone, the weights are unregistered: packed per call
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    finally:
        gc.enable()


def test_unwatched_weights_are_packed_on_every_call():
    """A library nobody registered weights with (here: the same library loaded again for
    copies of the weights) packs them per call, so in-place changes are always seen."""
    torch.manual_seed(5)
    model = ConvBnRelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 8, 6, 6),), backend="cpu")
    g = opt.report.clusters[0].compiled.graph
    copies = {name: value.copy() for name, value in g.params.items()}
    exe = CpuExecutable(Graph(g.inputs, g.outputs, copies, g.constraints, g.name), [])
    x = torch.randn(2, 8, 7, 11)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(exe([x.numpy()], [])[0]), model(x))
        copies["b.weight"] *= -0.5
        model.b.weight.mul_(-0.5)
        torch.testing.assert_close(
            torch.from_numpy(exe([x.numpy()], [])[0]), model(x), rtol=1e-4, atol=1e-4
        )


def test_weights_computed_in_the_graph_take_im2col():
    """Only model weights are packed: a weight computed per call goes through im2col + GEMM."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

        def forward(self, x, s):
            return torch.nn.functional.conv2d(x, self.w * s, padding=1)

    model = Scaled().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 8, 8), torch.tensor(2.0)), backend="cpu")
    (
        Checker(_source(opt))
        .check_count(SITE, 0)
        .check(KERNEL)
        .check("as_conv_gemm<float>(")  # im2col + GEMM
        .check(MAIN)
    )
    with torch.no_grad():
        for s in (2.0, -1.5):
            x, scale = torch.randn(1, 3, 7, 9), torch.tensor(s)
            torch.testing.assert_close(opt(x, scale), model(x, scale), rtol=1e-4, atol=1e-4)


def test_one_model_called_from_several_threads_at_different_sizes():
    torch.manual_seed(4)
    model = ConvBnRelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 8, 6, 6),), backend="cpu")
    inputs = [torch.randn(1 + k % 2, 8, 5 + k, 6 + 2 * k) for k in range(6)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    assert mismatches_from_threads(opt, inputs, expected) == []


def _lib(opt):
    return opt.report.clusters[0].compiled.native.native.lib


@pytest.mark.parametrize("cin, cout", [(48, 40), (16, 64)])
def test_a_1x1_convolution_takes_the_matmul_where_it_pays(cin, cout):
    """A channels-last 1x1 convolution is one GEMM of the batch's pixels by the weight:
    the rule of linear layers routes it by its row count (N x H x W): up to 32 rows the
    few-rows kernel; above, oneDNN's matmul where ``as_matmul_pays`` says it beats the
    BLAS path on the ISA oneDNN runs (from 33 rows, with AVX2 on weights at most 3x
    wider than deep or cut into such panels, which 16 -> 64 is too narrow for), else
    BLAS."""
    from test_dnnl_matmul import _panels

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1), torch.nn.ReLU()).eval()
    opt = anyshape.optimize(model, (torch.randn(2, cin, 6, 5),), backend="cpu")
    assert "as_dnnl_matmul(&dnnl_site" in _source(opt)
    runs, few = _lib(opt).anyshape_dnnl_matmul_runs, _lib(opt).anyshape_few_rows_runs
    runs.restype = few.restype = ctypes.c_int64
    avx512 = bool(_lib(opt).dnnl_get_effective_cpu_isa() & 0x20)
    wide = cout > 3 * cin and _panels(cin, cout) == 1
    with torch.no_grad():
        for h, w in [(1, 1), (8, 8)]:  # each route's first use of the weight: BLAS, no copy
            opt(torch.randn(2, cin, h, w))
        for (h, w), on_few, on_avx512, on_avx2 in [
            ((1, 1), 1, 0, 0),  # 2 rows
            ((4, 4), 1, 0, 0),  # 32 rows
            ((3, 6), 0, 1, 1),  # 36 rows
            ((8, 7), 0, 1, 1),  # 112 rows
            ((8, 8), 0, 1, 1),  # 128 rows
            ((16, 16), 0, 1, 1),  # 512 rows
        ]:
            x = torch.randn(2, cin, h, w)
            before, few_before = runs(), few()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            want = on_avx512 if avx512 else on_avx2 and not wide
            assert runs() - before == want, ((h, w), avx512)  # one GEMM for the batch
            assert few() - few_before == on_few, ((h, w), avx512)


@pytest.mark.parametrize(
    "route", [{"dnnl_matmul": "always"}, {"dnnl_conv": "off"}, {"dnnl_matmul": "off"}]
)
def test_a_1x1_convolution_is_one_gemm_for_the_batch_then_each_images_epilogue(route):
    """The batch's pixels are one GEMM's rows (the weight read once per call, not once per
    image), then each image's epilogue (batch norm and a sigmoid: not oneDNN post-ops)
    runs: right for empty batches, one-pixel images and batches of one and five."""
    torch.manual_seed(5)

    class Bottleneck(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(12, 12, 1, bias=False)
            self.bn = torch.nn.BatchNorm2d(12)
            self.bn.running_mean.uniform_(-1, 1)
            self.next = torch.nn.Conv2d(12, 8, 3, padding=1)

        def forward(self, x):
            return self.next(torch.sigmoid(self.bn(self.conv(x))))

    model = Bottleneck().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 12, 6, 5),), backend="cpu", **route)
    descs = opt.report.clusters[0].compiled.native.kernel_descriptions
    assert "+ epilogue" in [d for d in descs if "convolution" in d][0], descs
    if "always" not in route.values():  # no oneDNN matmul in the build: BLAS
        assert "as_dnnl_matmul(&" not in _source(opt)  # (no call; the header declares it)
        runs = lambda: 0  # noqa: E731
    else:
        runs = _lib(opt).anyshape_dnnl_matmul_runs
        runs.restype = ctypes.c_int64
    with torch.no_grad():
        for shape in [(0, 12, 4, 4), (1, 12, 1, 1), (5, 12, 3, 7), (1, 12, 9, 2)]:
            x = torch.randn(*shape)
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            want = int("always" in route.values() and shape[0] > 0)
            assert runs() - before == want, shape


@pytest.mark.parametrize("route", [{"dnnl_matmul": "always"}, {}])
def test_a_large_1x1_convolution_runs_gemm_and_epilogue_in_row_blocks(route):
    """From 1 M output floats (512 K with AVX2: ``as_conv_rows_fused``) a 1x1 convolution
    runs its GEMM and its epilogue (batch norm, a residual block's skip add, ReLU) in
    row blocks, each thread's blocks through oneDNN's matmul (once per block) or its
    sgemm: right on both sides of that bound, at row counts no multiple of a block's."""
    torch.manual_seed(6)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 64, 1, bias=False)
            self.bn = torch.nn.BatchNorm2d(64)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.skip = torch.nn.Conv2d(16, 64, 1)
            self.next = torch.nn.Conv2d(64, 8, 3, padding=1)

        def forward(self, x):
            return self.next(torch.relu(self.bn(self.conv(x)) + self.skip(x)))

    model = Block().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 16, 6, 5),), backend="cpu", **route)
    descs = opt.report.clusters[0].compiled.native.kernel_descriptions
    assert any("convolution" in d and "+ epilogue" in d for d in descs), descs
    runs = _lib(opt).anyshape_dnnl_matmul_runs
    runs.restype = ctypes.c_int64
    avx512 = bool(_lib(opt).dnnl_get_effective_cpu_isa() & 0x20)
    with torch.no_grad():
        for n, h, w in [(1, 128, 130), (2, 64, 67), (3, 5, 7), (0, 4, 4)]:
            x = torch.randn(n, 16, h, w)
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            blocks = n * h * w * 64 >= (1 << 20 if avx512 else 1 << 19)
            if "dnnl_matmul" in route and n > 0:  # the epilogue's convolution once per block
                assert runs() - before > 2 if blocks else runs() - before == 2, (n, h, w)


HARNESS = r"""
extern "C" int refusals() {
  // A 4 -> 4 channel 3x3 convolution, channels last; sizes of -3 rows oneDNN refuses.
  static float w[4 * 4 * 9];
  for (int k = 0; k < 4 * 4 * 9; ++k) w[k] = 0.01f * k;
  static AsConvSite site = {4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, {PTHREAD_MUTEX_INITIALIZER}};
  const float* packed = nullptr;
  int failed = 0;
  auto take = [&](int64_t h, int64_t wd) {
    AsConvShape* e = as_conv_acquire(&site, h, wd, w, &packed);
    if (e) as_conv_release(&site, e);
    return e != nullptr;
  };
  auto refused = [&]() {
    int n = 0;
    for (const AsConvShape& e : site.shapes) n += e.refused;
    return n;
  };
  if (!take(8, 8)) failed |= 1;                   // a size oneDNN runs
  if (take(-3, 8)) failed |= 2;                   // one it refuses...
  if (site.broken || refused() != 1) failed |= 4;  // ...refuses that size alone
  if (!take(8, 8) || !take(5, 7)) failed |= 8;    // the others still run on oneDNN
  if (take(-3, 8) || refused() != 1) failed |= 16;  // asked again: remembered, not retried
  // A geometry refused at its first size is refused as a whole.
  static AsConvSite first = {4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, {PTHREAD_MUTEX_INITIALIZER}};
  if (as_conv_acquire(&first, -3, 8, w, &packed) || !first.broken) failed |= 32;
  // Post-ops oneDNN takes (x * v + u, then ReLU) are made into the size's primitive; ones
  // it cannot take (an op code dnnl.h does not know) leave a primitive without them.
  static AsConvSite fused = {4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0x421, {PTHREAD_MUTEX_INITIALIZER}};
  static AsConvSite plain = {4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0x7, {PTHREAD_MUTEX_INITIALIZER}};
  AsConvShape* e = as_conv_acquire(&fused, 8, 8, w, &packed);
  if (!e || !e->vector) failed |= 64;
  if (e) as_conv_release(&fused, e);
  e = as_conv_acquire(&plain, 8, 8, w, &packed);
  if (!e || e->vector || plain.broken) failed |= 128;
  if (e) as_conv_release(&plain, e);
  return failed;
}
"""


def test_a_size_onednn_refuses_falls_back_alone(tmp_path):
    """A convolution site whose primitive oneDNN refuses for one input size runs that
    size on im2col + GEMM and keeps oneDNN for every other size; a geometry refused at
    its first size is refused as a whole (its calls stop asking). Post-ops oneDNN cannot
    take leave the convolution on oneDNN without them (the kernel's epilogue runs)."""
    import subprocess
    from importlib import resources

    from anyshape.codegen.cpu import build
    from anyshape.native_build import with_abi_header

    here = resources.files("anyshape.codegen.cpu")
    names = ("prelude.h", "gemm.h", "vmath.h", "dnnl.h", "dnnl_conv.h")
    headers = [here.joinpath(h).read_text() for h in names]
    source = tmp_path / "refusals.cpp"
    glue = "#define AS_SPLIT_UNIT\n#define AS_DNNL_GLUE_OBJECT\n"  # (the glue object's own)
    source.write_text(glue + with_abi_header("\n".join(headers)) + HARNESS)
    flags = build.FLAGS + build.blas_flags() + build.small_gemm_flags("onednn")  # (ANYSHAPE_DNNL)
    lib = tmp_path / "refusals.so"
    subprocess.run(["g++", str(source), "-o", str(lib), *flags], check=True)
    assert ctypes.CDLL(str(lib)).refusals() == 0


class _ConvThen(torch.nn.Module):
    """A convolution (``k`` x ``k``), an epilogue ``then``, and another convolution reading
    it; a 1x1 convolution before makes the skip connection's tensor."""

    def __init__(self, then, k):
        super().__init__()
        self.pre = torch.nn.Conv2d(6, 10, 1, bias=False)
        self.conv = torch.nn.Conv2d(10, 10, k, padding=k // 2, bias=False)
        self.bn = torch.nn.BatchNorm2d(10)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)
        self.shift = torch.nn.Parameter(torch.randn(10))
        self.next = torch.nn.Conv2d(10, 4, 1)
        self.then = then

    def forward(self, x):
        r = self.pre(x)
        y = self.conv(r)
        if self.then == "bn_relu":
            y = torch.relu(self.bn(y))
        elif self.then == "minus_relu":
            y = torch.relu(y - self.shift.view(1, -1, 1, 1))
        elif self.then == "skip":  # a residual block's end
            y = torch.relu(self.bn(y) + r)
        elif self.then == "sigmoid":
            y = torch.sigmoid(self.bn(y))
        elif self.then == "times_tensor":  # a tensor multiplied: no post-op
            y = torch.relu(y * r)
        elif self.then == "minus_tensor":
            y = torch.relu(y - r)
        return self.next(y)


@pytest.mark.parametrize("k", [3, 1])
@pytest.mark.parametrize(
    "then, code",
    [
        ("bn_relu", 0x421),  # x * scale + shift, then max(x, 0): post-ops
        ("minus_relu", 0x43),  # x - v, then max(x, 0)
        ("skip", 0x4521),  # x * scale + shift + r, then max(x, 0)
        ("sigmoid", 0),  # not a post-op anyshape sends: the kernel's epilogue loop
        ("times_tensor", 0),
        ("minus_tensor", 0),
    ],
)
def test_a_convolution_epilogue_runs_as_onednn_post_ops(then, code, k):
    """With ``conv_post_ops``, batch norm, a skip add and ReLU after a channels-last
    convolution run inside oneDNN's convolution as post-ops (the site's code in ``dnnl.h``'s spelling; a 1x1
    convolution with them runs there rather than on the matmul); other epilogues stay the
    kernel's loop. Either way every size agrees with eager: empty batches, one image,
    several, sizes never seen."""
    torch.manual_seed(7)
    model = _ConvThen(then, k).eval()
    opt = anyshape.optimize(model, (torch.randn(2, 6, 9, 8),), backend="cpu", conv_post_ops=True)
    source = _source(opt)
    codes = re.findall(r"as_conv_site\(&dnnl_sites, [^;]*, (\d+)\);", source)
    codes += re.findall(r"static AsConvSite dnnl_site = \{[^}]*, (\d+), \{", source)
    assert [int(c) for c in codes if int(c)] == ([code] if code else []), codes
    described = opt.report.clusters[0].compiled.native.kernel_descriptions
    assert any("as post-ops" in d for d in described) == bool(code), described
    with torch.no_grad():
        for shape in [(2, 6, 9, 8), (0, 6, 5, 5), (1, 6, 1, 1), (3, 6, 13, 7), (1, 6, 32, 30)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [3, 1])
def test_nan_through_relu_stays_nan_unless_post_ops_are_asked_for(k):
    """oneDNN's ReLU post-op turns NaN into 0 where torch keeps it: by default no
    epilogue runs as post-ops and a NaN pixel stays NaN as in eager; ``conv_post_ops``
    trades that for speed (what it computes on finite inputs is eager's)."""
    torch.manual_seed(8)
    model = _ConvThen("bn_relu", k).eval()
    x = torch.randn(2, 6, 9, 8)
    x[0, :, 4, 4] = float("nan")
    with torch.no_grad():
        want = model(x)
        exact = anyshape.optimize(model, (torch.randn(2, 6, 9, 8),), backend="cpu")
        assert "post_operands" not in _source(exact)
        got = exact(x)
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want).any()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        fast = anyshape.optimize(model, (torch.randn(2, 6, 9, 8),), conv_post_ops=True)
        assert "post_operands" in _source(fast)
        finite = torch.randn(3, 6, 11, 7)
        torch.testing.assert_close(fast(finite), model(finite), rtol=1e-4, atol=1e-4)


def _rows_runs(opt):
    fn = _lib(opt).anyshape_rows_gemm_runs
    fn.restype = ctypes.c_int64
    return fn


@pytest.mark.parametrize("cout, route, own", [(40, {}, True), (192, {}, False),
                                              (40, {"dnnl_matmul": "always"}, False)])  # fmt: skip
def test_a_narrow_1x1_convolutions_row_blocks_run_the_runtimes_gemm(cout, route, own):
    """A large 1x1 convolution's row blocks (``as_conv_rows_fused``) to at most 128 output
    channels run ``as_rows_gemm`` on the weight in its panels, from the weight's second
    call on (the first runs oneDNN's routes): right at row counts no multiple of its
    tile's, a last panel part zero, NaN kept through the epilogue's ReLU. Wider weights and
    ``dnnl_matmul="always"`` keep oneDNN's matmul."""
    torch.manual_seed(7)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(48, cout, 1, bias=False)
            self.bn = torch.nn.BatchNorm2d(cout)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.next = torch.nn.Conv2d(cout, 4, 3, padding=1)

        def forward(self, x):
            return self.next(torch.relu(self.bn(self.conv(x))))

    model = Block().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 48, 6, 5),), backend="cpu", **route)
    runs = _rows_runs(opt)
    with torch.no_grad():
        # (each large call is above both ISAs' bound; the first packs nothing yet)
        sizes = [(1, 181, 183), (2, 131, 127), (1, 181, 183), (3, 5, 7), (0, 4, 4)]
        for (n, h, w), want in zip(sizes, [0, 1, 1, 0, 0]):
            x = torch.randn(n, 48, h, w)
            if n:
                x[0, 3, 100 % h, 50 % w] = float("nan")
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4, equal_nan=True)
            assert runs() - before == (want if own else 0), (n, h, w)
        model.conv.weight.mul_(-0.5)  # packed panels are packed again
        x = torch.randn(1, 48, 181, 183)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "cin, cout, k, s, p, d, epilogue",
    [
        (3, 64, 7, 2, 3, 1, True),  # an image network's stem
        (1, 20, 3, 1, 1, 1, True),
        (4, 70, 5, 1, 4, 2, False),  # dilated: tap by tap; 70 columns: a part panel
        (2, 8, 3, 3, 0, 1, True),
        (3, 16, 2, 3, 0, 1, True),  # stride over the kernel: input between windows
        (3, 33, 3, 1, 2, (1, 2), True),  # dilated in width alone
    ],
)
def test_a_few_channel_convolution_runs_as_gemms_over_its_windows(cin, cout, k, s, p, d, epilogue):
    """Up to 4 input channels a channels-last convolution copies each output pixel's window
    and runs ``as_rows_gemm`` over a row of pixels at a time (from the watched weight's
    second call on), its epilogue after: right at every size, windows reaching past every edge, images
    smaller than the kernel, one pixel, an empty batch."""
    torch.manual_seed(8)

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d, bias=False)
            self.bn = torch.nn.BatchNorm2d(cout)
            self.bn.running_mean.uniform_(-1, 1)
            self.next = torch.nn.Conv2d(cout, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return self.next(torch.relu(self.bn(y)) if epilogue else y)

    model = Stem().eval()
    reach = (
        (k - 1) * max(d if isinstance(d, tuple) else (d,)) + 1 - 2 * p
    )  # (a side with an output)
    example = torch.randn(2, cin, 16, 13)
    opt = anyshape.optimize(model, (example,), backend="cpu")
    assert "as_taps_panels(&taps_site" in _source(opt)
    runs = _rows_runs(opt)
    sizes = [
        (2, 16, 13),
        (1, 31, 17),
        (3, max(reach, 1), max(reach, 1) + 1),
        (0, 9, 9),
        (1, 40, 41),
    ]
    with torch.no_grad():
        for i, (n, h, w) in enumerate(sizes):
            x = torch.randn(n, cin, h, w)
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            # (the first call after optimize's check is the watched weight's first use)
            assert runs() - before == int(n > 0 and i > 0), (n, h, w)
        model.conv.weight.mul_(-0.5)  # packed panels are packed again
        inputs = [torch.randn(n, cin, h, w) for n, h, w in sizes]
        expected = [model(x) for x in inputs]
        torch.testing.assert_close(opt(inputs[1]), expected[1], rtol=1e-4, atol=1e-4)
    assert mismatches_from_threads(opt, inputs, expected) == []
