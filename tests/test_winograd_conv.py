"""3x3 convolutions by Winograd's F(4x4, 3x3) or F(2x2, 3x3) (``as_winograd_conv``,
plugin mode; F(4x4, 3x3) up to 128 x 128 channels).

Every check compares with eager: sizes whose 4 x 4 or 2 x 2 output blocks hang over the
image's edge, channel counts off the vector width, both paddings, weights changed in
place, calls from several threads, and inputs that make an output infinite or NaN,
which Winograd's transforms would spread across a block (those calls run again on
oneDNN's convolution). A counter in the library tells whether the Winograd kernel ran.
"""

from __future__ import annotations

import ctypes
import re

import pytest
import torch
from concurrency import mismatches_from_threads

import anyshape

pytest.importorskip("importlib.metadata").distribution("onednn-cpu-gomp")  # a dependency


class _Block(torch.nn.Module):
    """A 1x1 convolution into the 3x3 one (so its input is channels-last), a batch norm
    and ReLU after it (its epilogue), a 1x1 convolution out."""

    def __init__(self, cin, cout, padding, epilogue=True):
        super().__init__()
        self.into = torch.nn.Conv2d(3, cin, 1)
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=padding, bias=not epilogue)
        self.bn = torch.nn.BatchNorm2d(cout)
        self.bn.running_mean.uniform_(-1, 1)
        self.out = torch.nn.Conv2d(cout, 4, 1)
        self.epilogue = epilogue

    def forward(self, x):
        y = self.conv(self.into(x))
        return self.out(torch.relu(self.bn(y)) if self.epilogue else y)


def _compiled(model, **options):
    opt = anyshape.optimize(model, (torch.randn(2, 3, 12, 11),), backend="cpu", **options)
    (cluster,) = opt.report.clusters
    runs = cluster.compiled.native.native.lib.anyshape_winograd_runs
    runs.restype = ctypes.c_int64
    return opt, cluster.compiled.native.source, runs


@pytest.mark.parametrize(
    "cin, cout, padding, epilogue",
    [
        (8, 8, 1, True),  # F(4x4, 3x3) to 128 x 128 channels, blocks of tiles in cache
        (20, 70, 1, True),  # channels off the vector width, a part panel
        (64, 40, 0, False),  # no padding: every tile's input inside the image
        (5, 33, (1, 0), True),  # padding in height alone
        (48, 256, 1, False),  # over 1 MB of transformed weight: all tiles' inputs at once
        (160, 200, 1, True),  # F(2x2, 3x3) above 128 x 128 channels
        (256, 256, (0, 1), True),
    ],
)
def test_a_3x3_convolution_runs_winograd_from_its_weights_second_call(cin, cout, padding, epilogue):
    """From the watched weight's second call on, a 3x3 convolution with unit stride runs
    Winograd's minimal filtering: right at sizes not a multiple of the block (blocks over
    the edge), one output pixel, an empty batch, a larger image; again after the weight
    changes in place; from four threads at once."""
    torch.manual_seed(3)
    model = _Block(cin, cout, padding, epilogue).eval()
    opt, source, runs = _compiled(model)
    assert "as_winograd_conv(winograd_geometry" in source
    ph = padding if isinstance(padding, int) else padding[0]
    pw = padding if isinstance(padding, int) else padding[1]
    sizes = [(2, 12, 11), (1, 17, 9), (3, 3 - 2 * ph, 3 - 2 * pw), (0, 8, 8), (1, 41, 38)]
    with torch.no_grad():
        for i, (n, h, w) in enumerate(sizes):
            x = torch.randn(n, 3, h, w)
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            # (the first call after optimize's check is the watched weight's first use)
            assert runs() - before == int(n > 0 and i > 0), (n, h, w)
        model.conv.weight.mul_(-0.5)  # the transformed weight is made again
        inputs = [torch.randn(n, 3, h, w) for n, h, w in sizes]
        expected = [model(x) for x in inputs]
        before = runs()
        torch.testing.assert_close(opt(inputs[4]), expected[4], rtol=1e-4, atol=1e-4)
        assert runs() - before == 1
    assert mismatches_from_threads(opt, inputs, expected) == []


# (F(4x4, 3x3) in blocks of tiles and over every tile, F(2x2, 3x3) over every tile: the
# only way it runs)
@pytest.mark.parametrize("cin, cout", [(16, 24), (96, 128), (144, 160)])
def test_an_output_not_finite_is_computed_again_as_eager_does(cin, cout):
    """An infinite input pixel makes NaN across a block in Winograd's transforms
    where eager has infinities and finite values: such a call runs again on oneDNN's
    convolution and its epilogue, so which outputs are NaN, infinite or finite is eager's
    (one image of two poisoned)."""
    torch.manual_seed(4)
    model = _Block(cin, cout, 1, epilogue=False).eval()
    model.out = torch.nn.Identity()
    opt, _, runs = _compiled(model)
    with torch.no_grad():
        x = torch.randn(2, 3, 12, 11)
        opt(x)
        opt(x)  # (the transformed weight exists from here on)
        for poison in (float("inf"), float("nan")):
            x = torch.randn(2, 3, 14, 13)
            x[1, :, 6, 7] = poison
            before = runs()
            got, want = opt(x), model(x)
            assert runs() == before  # (not counted: the call ran again on oneDNN)
            assert torch.equal(torch.isnan(got), torch.isnan(want))
            assert torch.equal(torch.isinf(got), torch.isinf(want))
            assert not torch.isfinite(want).all() and torch.isfinite(want).any()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        x = torch.randn(2, 3, 14, 13)
        before = runs()
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
        assert runs() - before == 1


@pytest.mark.parametrize(
    "conv, options",
    [
        (torch.nn.Conv2d(8, 8, 3, stride=2, padding=1), {}),
        (torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2), {}),
        (torch.nn.Conv2d(8, 8, 5, padding=2), {}),
        (torch.nn.Conv2d(8, 8, 3, padding=1), {"winograd": False}),
    ],
)
def test_winograd_is_only_for_unit_stride_and_dilation_3x3_kernels(conv, options):
    """Strided, dilated and larger kernels stay on oneDNN's convolution, as every 3x3 one
    does with ``winograd=False``: no Winograd call in the library."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), conv).eval()
    opt, source, runs = _compiled(model, **options)
    kernels = source[re.search(r"^AS_KERNEL int ", source, re.M).start() :]
    assert "as_winograd_conv(" not in kernels
    with torch.no_grad():
        for n, h, w in [(2, 12, 11), (1, 19, 23)]:
            x = torch.randn(n, 3, h, w)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    assert runs() == 0


def test_wide_3x3_convolutions_stay_on_onednn():
    """Over 256 x 256 channels the transformed weight (16 floats a channel pair with
    F(2x2, 3x3)) is read
    again for each block of tiles and Winograd ran level or slower: the kernel checks the
    channel counts where it runs and leaves such a call to oneDNN."""
    torch.manual_seed(6)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 512, 1), torch.nn.Conv2d(512, 160, 3, padding=1)
    ).eval()  # 512 x 160 > 256 x 256
    opt, source, runs = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 3, 9, 10)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    assert runs() == 0


def test_a_kernel_family_runs_winograd_for_each_of_its_output_widths():
    """Two 3x3 convolutions alike but for their output channels may share one compiled
    function (``kernel_families``), the output width a run-time value: each runs
    Winograd with its own transformed weight, here of each tile size (64 x 96 channels
    F(4x4, 3x3), 64 x 320 F(2x2, 3x3))."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 1),
        torch.nn.Conv2d(64, 96, 3, padding=1),
        torch.nn.Conv2d(96, 64, 1),
        torch.nn.Conv2d(64, 320, 3, padding=1),
    ).eval()
    opt, _, runs = _compiled(model, kernel_families=True)
    with torch.no_grad():
        for i, (n, h, w) in enumerate([(2, 12, 11), (1, 9, 14), (2, 15, 15)]):
            x = torch.randn(n, 3, h, w)
            before = runs()
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            assert runs() - before == (2 if i > 0 else 0)


@pytest.mark.parametrize("channels, bound", [(64, 3e-5), (128, 3e-5), (256, 1e-5)])
def test_winograds_rounding_error_stays_near_the_direct_convolutions(channels, bound):
    """Against the convolution in float64, the largest error relative to the largest output:
    F(4x4, 3x3) (64 and 128 channels) measured 5.5e-6 and 9.9e-6, F(2x2, 3x3) (256) 7e-7,
    the direct convolution 1-2e-6. A transform with a wrong or badly scaled constant lands
    far above these bounds."""
    torch.manual_seed(8)
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 1), conv).eval()
    opt, _, runs = _compiled(model)
    with torch.no_grad():
        x = torch.randn(2, 3, 28, 27)
        opt(x)
        before = runs()
        got = opt(x).double()
        assert runs() - before == 1
        want = model.double()(x.double())
    assert ((got - want).abs().max() / want.abs().max()).item() < bound
