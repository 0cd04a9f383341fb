"""Convolutions traced as one opaque op while capturing (``opaque_ops.opaque_conv``): the
program after the export is the one torch records, op, arguments and output strides
alike, the guards the compiled graph keeps are torch's, and eager's refusals stay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from traced_graphs import compiled_matches_eager, recorded_through

import anyshape
from anyshape.frontends.torch import opaque_ops
from anyshape.frontends.torch.capture import _export
from anyshape.frontends.torch.export_guards import export_guards


class Convolved(torch.nn.Module):
    """Each way a model passes a convolution its arguments, in 1, 2 and 3 dims, and
    inputs that make eager's output channels-last."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
        self.b = torch.nn.Parameter(torch.randn(4))
        self.w1 = torch.nn.Parameter(torch.randn(4, 3, 3))
        self.w3 = torch.nn.Parameter(torch.randn(2, 3, 1, 2, 2))
        self.depthwise = torch.nn.Conv2d(3, 3, 3, 1, 1, groups=3)
        self.cl = torch.nn.Conv2d(3, 4, 1).to(memory_format=torch.channels_last)

    def forward(self, x):
        flat = x.flatten(2)
        return (
            F.conv2d(x, self.w),
            F.conv2d(x, self.w, self.b, 2),
            F.conv2d(x, self.w, None, (1, 1), 0, 1, 1),  # (every default: none recorded)
            F.conv2d(x, self.w, self.b, 1, [1], dilation=2),  # (a one-element list stays)
            F.conv2d(x, self.w, self.b, stride=[1], padding=(0, 0), dilation=[1]),
            F.conv2d(x, self.w, None, (2, 1), (0, 0), (1, 1), 1),
            F.conv1d(flat, self.w1, self.b, 1, 1),
            F.conv3d(x.unsqueeze(2), self.w3, None, 1, (0, 1, 1)),
            self.depthwise(x.contiguous(memory_format=torch.channels_last)),
            self.depthwise(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)),
            self.cl(x),  # (a channels-last weight: eager's output is channels-last)
            F.conv2d(x, self.w, padding="same"),  # (a string: torch's own trace)
        )


def test_convolutions_are_recorded_as_torch_records_them():
    model = Convolved().eval()
    x = torch.randn(2, 3, 7, 6)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    assert recorded_through(opaque_ops, ("conv_opaque",), model, x, dims) == [11]
    compiled_matches_eager(model, x, [(1, 3, 5, 4), (3, 3, 9, 11), (0, 3, 6, 6), (2, 3, 3, 5)])


def test_a_convolution_of_no_input_channels_is_traced_as_torch_traces_it():
    """Eager convolves an input of no channels into an output of no channels, whatever
    the weight's output channels: torch's own trace says so, and the opaque form leaves
    such a convolution to it."""
    model = torch.nn.Conv2d(0, 4, 3, padding=1).eval()
    x = torch.randn(2, 0, 5, 6)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    assert recorded_through(opaque_ops, ("conv_opaque",), model, x, dims) == [0]
    compiled_matches_eager(model, x, [(1, 0, 3, 3), (3, 0, 7, 1), (0, 0, 4, 4)])
    compiled = anyshape.optimize(model, (x,))  # (compiled whole, no part left to PyTorch)
    assert "fallbacks: none" in str(compiled.explain())


class Reduced(torch.nn.Module):
    """SegFormer's stage: a strided patch embedding, a sequence reduction whose kernel
    bounds the image size from below, and a depthwise convolution of a channels-last
    view, between flattening views."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 8, 7, 4, 3)
        self.reduce = torch.nn.Conv2d(8, 8, 4, 4)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, 1, 1, groups=8)

    def forward(self, x):
        y = self.embed(x)
        b, c, h, w = y.shape
        tokens = y.flatten(2).transpose(1, 2)
        z = self.reduce(tokens.transpose(1, 2).reshape(b, c, h, w))
        mixed = self.depthwise(tokens.transpose(1, 2).view(b, c, h, w)).flatten(2)
        return tokens.mean(1) + z.reshape(b, c, -1).transpose(1, 2).mean(1) + mixed.mean(-1)


def test_the_guards_kept_are_those_of_torchs_own_trace():
    """The opaque form's fake asks its questions in torch's order, so the guards the
    compiled graph keeps (``export_guards``) are torch's: the kernel's lower bound on
    the image, not the strides and views' questions about sizes of 1 (SegFormer's small
    images recompiled when the fake laid out a channels-last output itself)."""
    model = Reduced().eval()
    x = torch.randn(2, 3, 40, 36)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    with torch.no_grad():
        ours = _export(model, (x,), {}, dims)
        torch_own = torch.export.export(model, (x,), dynamic_shapes=dims, strict=False)
    kept = [sorted(str(g) for g in export_guards(ep)) for ep in (ours, torch_own)]
    assert kept[0] == kept[1]
    assert any(g.startswith("4 <= ") for g in kept[0])  # (the kernel: 4 x 4 on a quarter)
    compiled_matches_eager(model, x, [(1, 3, 32, 32), (3, 3, 61, 45), (1, 3, 32, 40)])


@pytest.mark.parametrize(
    "call, error, reason",
    [
        (lambda x, w: F.conv2d(x.double(), w), RuntimeError, "Double"),
        (lambda x, w: F.conv2d(x[:, :2], w), RuntimeError, "channels"),
        (lambda x, w: F.conv2d(x, w, stride=0), RuntimeError, "non-positive stride"),
        (lambda x, w: F.conv2d(x, w, padding=-1), RuntimeError, "negative padding"),
        (lambda x, w: F.conv2d(x, w, torch.zeros(3)), RuntimeError, "bias"),
    ],
)
def test_what_eager_refuses_the_capture_refuses(call, error, reason):
    """Arguments eager refuses keep torch's own trace, or meet eager's check in the
    opaque form's shape function: the capture or the compiled call fails as eager does."""

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

        def forward(self, x):
            return call(x, self.w)

    x = torch.randn(2, 3, 6, 6)
    with pytest.raises(error, match=reason):
        Bad()(x)
    with pytest.raises(Exception, match=reason):  # (from the capture, or else the call)
        anyshape.optimize(Bad(), (x,), model_cache=False)(x)


def test_an_input_smaller_than_the_kernel_is_refused_by_the_compiled_model():
    model = torch.nn.Conv2d(3, 4, 5).eval()
    compiled = anyshape.optimize(model, (torch.randn(1, 3, 9, 8),))
    with pytest.raises(RuntimeError):
        model(torch.randn(1, 3, 4, 8))
    with pytest.raises(anyshape.InputError, match="Kernel size can't be greater"):
        compiled(torch.randn(1, 3, 4, 8))
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
