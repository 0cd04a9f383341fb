"""Depthwise convolutions: direct loops (codegen/cpu/depthwise_emit.py), not im2col + GEMM.

Channels first (float64, or any float convolution outside the channels-last layout)
each output row sums one tap at a time; channels last (float32 in plugin mode) each
pixel sums a block of channels per tap. Every geometry is checked against eager at
sizes 0 and 1 and with one compilation per model, the generated kernel is asserted to
be the direct loop, and a SegFormer-style Mix-FFN block ([N, H * W, C] tokens viewed as
an image around the convolution) runs with no transpose left: the layout pass moves its
transposes through the views until they meet the model's own and cancel.
"""

from __future__ import annotations

import pytest
import torch

import anyshape

DIRECT = "as_conv_gemm<"  # the im2col + GEMM call a depthwise kernel must not make


def _kernels(opt) -> str:
    source = opt.report.clusters[0].compiled.native.source
    return source.split("// anyshape: host")[0].split("// anyshape: kernel", 1)[-1]


def _graph(opt):
    (cluster,) = opt.report.clusters
    return cluster.compiled.graph


GEOMETRIES = [
    # spatial dims, kernel, stride, padding, dilation, channel multiplier
    (2, 3, 1, 1, 1, 1),
    (2, 3, 2, 1, 1, 1),  # strided (MobileNet's downsampling)
    (2, 5, 1, 4, 2, 2),  # dilated, two outputs per channel
    (2, (3, 1), (2, 1), (1, 0), 1, 1),  # rectangular, strided one way
    (2, 4, 3, 0, 1, 1),  # even kernel, stride over it: columns left over
    (1, 7, 1, 3, 1, 1),  # speech models' 1-D depthwise
    (1, 3, 2, 0, 1, 3),
    (3, 3, 1, 1, 1, 1),
]


def _conv(nsp, k, s, p, d, mult, channels, dtype):
    conv = [None, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d][nsp]
    m = conv(channels, channels * mult, k, stride=s, padding=p, dilation=d, groups=channels)
    return torch.nn.Sequential(m, torch.nn.GELU()).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_matches_eager_at_every_size(geometry, dtype):
    """float32 2-D convolutions run channels last, everything else channels first."""
    torch.manual_seed(0)
    nsp, k, s, p, d, mult = geometry
    channels = 70  # a full block of 64 float32 channels and a part block
    model = _conv(nsp, k, s, p, d, mult, channels, dtype)
    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, (torch.randn(2, channels, *[9] * nsp, dtype=dtype),))
    assert DIRECT not in _kernels(opt)
    (conv,) = [n for n in _graph(opt).nodes() if n.op == "convolution"]
    assert conv.attr("channels_last", False) == (dtype == torch.float32 and nsp == 2)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    with torch.no_grad():
        for n, size in [(1, 9), (3, 17), (2, 6), (1, 12)]:
            x = torch.randn(n, channels, *[size + j for j in range(nsp)], dtype=dtype)
            torch.testing.assert_close(opt(x), model(x), **tol)
        for shape in [(0, channels, *[9] * nsp), (2, channels, *[1] * nsp)]:
            x = torch.randn(*shape, dtype=dtype)
            try:
                want = model(x)
            except RuntimeError:  # (eager refuses a window larger than the padded input)
                with pytest.raises(Exception, match="(?i)size|kernel|input"):
                    opt(x)
                continue
            torch.testing.assert_close(opt(x), want, **tol)
    assert anyshape.stats()["compilations"] - before == 1


class MixFfn(torch.nn.Module):
    """SegFormer's Mix-FFN: a linear layer, a 3x3 depthwise convolution over the tokens
    viewed as an image, GELU, a linear layer."""

    def __init__(self, c: int = 24, hidden: int = 96):
        super().__init__()
        self.dense1 = torch.nn.Linear(c, hidden)
        self.dwconv = torch.nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.dense2 = torch.nn.Linear(hidden, c)

    def forward(self, tokens, h: int, w: int):
        x = self.dense1(tokens)
        b, n, c = x.shape
        x = self.dwconv(x.transpose(1, 2).view(b, c, h, w)).flatten(2).transpose(1, 2)
        return self.dense2(torch.nn.functional.gelu(x))


class Tokens(torch.nn.Module):
    """Patches as tokens, as SegFormer's encoder makes them: [N, C, H, W] -> [N, HW, C]."""

    def __init__(self):
        super().__init__()
        self.ffn = MixFfn()

    def forward(self, image):
        _, _, h, w = image.shape
        return self.ffn(image.flatten(2).transpose(1, 2), h, w)


def test_mix_ffn_runs_without_transposes():
    torch.manual_seed(1)
    model = Tokens().eval()
    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, (torch.randn(2, 24, 12, 10),))
    graph = _graph(opt)
    (conv,) = [n for n in graph.nodes() if n.op == "convolution"]
    assert conv.attr("channels_last")
    transposes = [n for n in graph.nodes() if n.op == "transpose" and n.inputs[0].op != "param"]
    # The image's own [N, C, HW] -> [N, HW, C] stays (the first linear layer reads it);
    # the views around the convolution move no data.
    assert len(transposes) == 1 and transposes[0].inputs[0].op in ("reshape", "input")
    kernels = _kernels(opt)
    assert DIRECT not in kernels
    with torch.no_grad():
        for n, h, w in [(1, 7, 9), (3, 16, 5), (2, 1, 1), (1, 1, 13), (0, 4, 4)]:
            x = torch.randn(n, 24, h, w)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-5)
    assert anyshape.stats()["compilations"] - before == 1
