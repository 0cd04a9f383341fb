"""Convolutions traced as one opaque op while capturing (``opaque_ops.opaque_conv``): the
program after the export is the one torch records, op, arguments and output strides
alike, its guards admit the sizes torch's admit, and eager's refusals stay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from traced_graphs import compiled_matches_eager, recorded_through

import anyshape
from anyshape.frontends.torch import opaque_ops
from anyshape.frontends.torch.capture import _export, shape_env_of


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


class Reduced(torch.nn.Module):
    """SegFormer's attention: a strided patch embedding, then a sequence reduction whose
    kernel bounds the image size from below, between flattening views."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 8, 7, 4, 3)
        self.reduce = torch.nn.Conv2d(8, 8, 4, 4)

    def forward(self, x):
        y = self.embed(x)
        b, c, h, w = y.shape
        tokens = y.flatten(2).transpose(1, 2)
        z = self.reduce(tokens.transpose(1, 2).reshape(b, c, h, w))
        return tokens.mean(1) + z.reshape(b, c, -1).transpose(1, 2).mean(1)


def test_the_guards_admit_what_torchs_own_trace_admits():
    """The opaque form records its guards in another order than torch's fake convolution,
    so their text may differ: over a grid of image sizes they hold for the same ones."""
    model = Reduced().eval()
    x = torch.randn(2, 3, 40, 36)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    with torch.no_grad():
        ours = _export(model, (x,), {}, dims)
        torch_own = torch.export.export(model, (x,), dynamic_shapes=dims, strict=False)
    admitted = []
    for ep in (ours, torch_own):
        exprs = [g.expr for g in shape_env_of(ep).guards]
        x_val = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x")
        height, width = (d.node.expr for d in x_val.meta["val"].shape[2:])
        admitted.append(
            {
                (h, w)
                for h in range(1, 80)
                for w in range(1, 80)
                if all(bool(e.xreplace({height: h, width: w})) for e in exprs)
            }
        )
    assert admitted[0] == admitted[1]
    assert (40, 36) in admitted[0] and (13, 13) not in admitted[0]  # (the kernel's bound)
    compiled_matches_eager(model, x, [(1, 3, 16, 16), (3, 3, 61, 45)])


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
