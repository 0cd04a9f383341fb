"""The channels-last layout pass: convolutions on [N, H, W, C], transposes that cancel.

With oneDNN installed, plugin-mode graphs for the CPU backend run their float32
convolutions channels last. These tests check that the layout flows through what a
CNN puts between convolutions (only the model's input and output are transposed),
that results match eager at many sizes, that each sinking rule keeps values exact
(elementwise with a value in the model's layout, slices, pools, reductions whose kept
axes come out reordered), and that the im2col + GEMM path a channels-last
convolution falls back to is exact where oneDNN does not run it.
"""

from __future__ import annotations

import pytest
import torch

import anyshape
from anyshape.codegen.cpu.executable import CpuExecutable
from anyshape.config import Options
from anyshape.ir.graph import Graph
from anyshape.passes import channels_last

pytest.importorskip("importlib.metadata").distribution("onednn-cpu-gomp")  # a dependency


class Block(torch.nn.Module):
    """A ResNet stem and bottleneck block: the pool's output is both the next convolution's
    input and the skip add's operand; then a strided 1x1 projection and a global pool."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 7, 2, 3, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.a = torch.nn.Conv2d(c, c, 1, bias=False)
        self.bn_a = torch.nn.BatchNorm2d(c)
        self.b = torch.nn.Conv2d(c, c, 3, padding=1)
        self.bn_b = torch.nn.BatchNorm2d(c)
        self.proj = torch.nn.Conv2d(c, 2 * c, 1, stride=2)
        for bn in (self.bn0, self.bn_a, self.bn_b):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn0(self.stem(x))))
        y = torch.relu(self.bn_a(self.a(x)))
        y = torch.relu(self.bn_b(self.b(y)) + x)
        z = self.proj(y)
        return z, z.mean((2, 3))


def _graph(opt) -> Graph:
    (cluster,) = opt.report.clusters
    return cluster.compiled.graph


def _ops(graph: Graph, op: str):
    return [n for n in graph.nodes() if n.op == op]


def test_a_block_runs_channels_last_between_its_input_and_output():
    torch.manual_seed(0)
    model = Block().eval()
    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, (torch.randn(2, 3, 32, 30),), backend="cpu")
    graph = _graph(opt)
    assert all(n.attr("channels_last", False) for n in _ops(graph, "convolution"))
    assert [n.attr("channels_last", False) for n in _ops(graph, "pool")] == [True]
    # The model's input goes in, its [N, C, H, W] output comes out: nothing else moves.
    assert sorted(n.attr("perm") for n in _ops(graph, "transpose")) == [(0, 2, 3, 1), (0, 3, 1, 2)]
    # Batch norm and ReLU still run inside the stem's and the first 1x1 convolution (the
    # 3x3 one's only reader is the projection's strided slice, which computes them for the
    # pixels it keeps); the 1x1 ones are GEMMs through oneDNN's matmul.
    (cluster,) = opt.report.clusters
    convs = [d for d in cluster.compiled.native.kernel_descriptions if "convolution" in d]
    assert ["+ epilogue" in d for d in convs] == [True, True, False, False], convs
    assert ["oneDNN matmul" in d for d in convs] == [False, True, False, True], convs
    with torch.no_grad():
        for shape in [(2, 3, 32, 30), (1, 3, 17, 23), (3, 3, 40, 41), (1, 3, 9, 8)]:
            x = torch.randn(*shape)
            for got, want in zip(opt(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert anyshape.stats()["compilations"] - before == 1


def test_the_reference_interpreter_agrees_with_the_rewritten_graph():
    """The rewritten graph, evaluated by the NumPy interpreter, matches eager."""
    torch.manual_seed(1)
    model = Block().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 20, 22),), backend="cpu")
    graph = _graph(opt)
    reference = anyshape.optimize(model, (torch.randn(2, 3, 20, 22),), backend="interpreter")
    assert not any(n.attr("channels_last", False) for n in _ops(_graph(reference), "convolution"))
    x = torch.randn(2, 3, 21, 19)
    with torch.no_grad():
        want = model(x)
        for got in (reference(x), opt(x)):
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert any(n.attr("channels_last", False) for n in _ops(graph, "convolution"))


class Rules(torch.nn.Module):
    """One output per sinking rule past a convolution."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.next = torch.nn.Conv2d(6, 6, 1)
        self.avg = torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False)
        self.avg_pad = torch.nn.AvgPool2d(2, 2, 1)

    def forward(self, x, skip):
        y = torch.sigmoid(self.conv(x)) * 2.0
        return (
            y.sum(0),  # kept axes [C, H, W] come out of [H, W, C]: one transpose back
            y[:, 1:5, 1:, ::2],  # a slice
            self.next(y + skip),  # a value in the model's layout joins
            self.avg(y),
            self.avg_pad(y),
            y.permute(0, 2, 3, 1),  # the model's own transpose
            torch.amax(y, dim=1),
        )


def test_each_rule_keeps_values_exact():
    torch.manual_seed(2)
    model = Rules().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 4, 9, 10), torch.randn(2, 6, 9, 10)))
    pools = _ops(_graph(opt), "pool")
    assert len(pools) == 2 and all(n.attr("channels_last") for n in pools)
    with torch.no_grad():
        for n, h, w in [(2, 9, 10), (1, 5, 7), (3, 12, 3), (1, 1, 1)]:
            args = (torch.randn(n, 4, h, w), torch.randn(n, 6, h, w))
            for got, want in zip(opt(*args), model(*args)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    x = torch.randn(1, 4, 6, 6)
    x[0, :, 2, 3] = float("nan")
    with torch.no_grad():
        got, want = opt(x, torch.zeros(1, 6, 6, 6))[6], model(x, torch.zeros(1, 6, 6, 6))[6]
    torch.testing.assert_close(got, want, equal_nan=True)  # max: NaN wins


class Views(torch.nn.Module):
    """Views of a channels-last convolution's output: a maxout splits the channels in two
    groups (the layout moves through), the image's tokens are viewed as an image again
    for a second convolution (the transposes cancel with the model's own), and a view
    merging channels with rows (which the layout cannot pass) is an output."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).amax(1)
        tokens = y.flatten(2).transpose(1, 2) * 2.0  # [N, HW, C]
        z = self.conv2(tokens.transpose(1, 2).reshape(n, c // 2, h, w))
        return y.reshape(n, c // 2 * h, w), z


def test_the_layout_moves_through_views_that_keep_channels_together():
    torch.manual_seed(4)
    model = Views().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 10, 12),), backend="cpu")
    graph = _graph(opt)
    assert all(n.attr("channels_last", False) for n in _ops(graph, "convolution"))
    # In: the image. Out: both outputs back to channels first. The tokens' round trip
    # and the views cost no transpose.
    assert len([n for n in _ops(graph, "transpose") if n.inputs[0].op != "param"]) == 3
    with torch.no_grad():
        for shape in [(2, 3, 10, 12), (1, 3, 1, 1), (3, 3, 7, 5), (0, 3, 4, 4)]:
            x = torch.randn(*shape)
            for got, want in zip(opt(x), model(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_other_graphs_are_left_alone():
    """Grouped convolutions and models without convolutions keep their layout; the pass
    only moves transposes it made."""
    torch.manual_seed(3)
    grouped = torch.nn.Conv2d(4, 4, 3, groups=2).eval()
    opt = anyshape.optimize(grouped, (torch.randn(1, 4, 6, 6),), backend="cpu")
    assert not any(n.attr("channels_last", False) for n in _ops(_graph(opt), "convolution"))
    assert _ops(_graph(opt), "transpose") == []

    class Permuted(torch.nn.Module):
        def forward(self, x):
            return (x.permute(0, 3, 1, 2) + 1.0).sum(1)

    opt = anyshape.optimize(Permuted(), (torch.randn(2, 3, 4, 5),), backend="cpu")
    graph = _graph(opt)
    assert channels_last.run(graph, Options()) is graph


@pytest.mark.parametrize(
    "cin,cout,k,s,p,d",
    [
        (3, 8, 7, 2, 3, 1),  # a stem
        (6, 5, 3, 1, 1, 1),
        (4, 6, (3, 1), (2, 1), (1, 0), 1),  # rectangular, strided one way
        (4, 4, 3, 1, 2, 2),  # dilated
        (5, 7, 1, 1, 0, 1),  # 1x1: the image is the GEMM operand
        (5, 7, 1, 2, 0, 1),  # strided 1x1
    ],
)
def test_without_onednn_a_channels_last_convolution_takes_im2col(
    cin, cout, k, s, p, d, monkeypatch
):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, k, s, p, d), torch.nn.ReLU()).eval()
    opt = anyshape.optimize(model, (torch.randn(2, cin, 11, 12),), backend="cpu")
    graph = _graph(opt)
    assert _ops(graph, "convolution")[0].attr("channels_last")
    exe = CpuExecutable(graph, [], options=Options(dnnl_conv="off"))
    assert "as_dnnl_conv2d" not in exe.source and "as_conv2d_nhwc(xn" in exe.source
    with torch.no_grad():
        for shape in [(2, cin, 11, 12), (1, cin, 9, 16), (3, cin, 7, 7)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(
                torch.from_numpy(exe([x.numpy()], [])[0]), model(x), rtol=1e-4, atol=1e-4
            )


def test_spatial_mode_keeps_channels_first(monkeypatch):
    monkeypatch.setenv("ANYSHAPE_DNNL_CONV", "spatial")
    model = Block().eval()
    opt = anyshape.optimize(model, (torch.randn(1, 3, 16, 16),), backend="cpu", model_cache=False)
    assert not any(n.attr("channels_last", False) for n in _ops(_graph(opt), "convolution"))
    x = torch.randn(2, 3, 18, 15)
    with torch.no_grad():
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
