"""Upsampling (``F.interpolate``) compiled whole, against eager over streams of shapes.

torch.export records ``F.interpolate`` as one ``upsample_*`` op; anyshape lowers
it directly (``frontends/torch/aten/resample.py``) instead of decomposing it
under symbolic sizes. Each case compiles once and must match eager at every
shape of a stream, sizes 1 and batch 0 included: the nearest modes exactly
(their indices are computed in float32 as eager's kernels compute them), the
interpolating modes to rounding. Scale factors give symbolic output sizes
(``floor(size * scale)``, ``symbols._scaled_size``); a scale whose double
product could round across an integer, integer data in an interpolating mode
and antialiasing run in PyTorch with their reason, still matching eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import anyshape

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Interpolate(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return F.interpolate(x, **self.kwargs)


STREAM_2D = [(1, 1, 1, 1), (3, 2, 5, 9), (0, 3, 4, 4), (1, 3, 16, 1), (2, 1, 7, 5), (1, 2, 13, 6)]

CASES = [
    (dict(mode="nearest", size=(7, 5)), STREAM_2D),
    (dict(mode="nearest", scale_factor=2), STREAM_2D),
    (dict(mode="nearest", scale_factor=0.5), [(1, 2, 2, 2), (2, 3, 9, 7), (1, 1, 31, 4)]),
    (dict(mode="nearest", scale_factor=(1.7, 0.6)), [(1, 1, 3, 5), (2, 2, 10, 11), (1, 3, 1, 2)]),
    (dict(mode="nearest-exact", scale_factor=1.5), STREAM_2D),
    (dict(mode="nearest-exact", size=(9, 4)), STREAM_2D),
    (dict(mode="bilinear", scale_factor=2, align_corners=False), STREAM_2D),
    (dict(mode="bilinear", scale_factor=2, align_corners=True), STREAM_2D),
    (dict(mode="bilinear", size=(13, 6), align_corners=False), STREAM_2D),
    (dict(mode="bicubic", size=(11, 7), align_corners=False), STREAM_2D),
    (dict(mode="bicubic", scale_factor=2, align_corners=True), STREAM_2D),
    (dict(mode="bicubic", scale_factor=0.6, align_corners=False), [(1, 1, 2, 4), (2, 3, 9, 12)]),
    (dict(mode="linear", scale_factor=1.5, align_corners=False), [(1, 1, 1), (2, 3, 9), (0, 2, 4)]),
    (dict(mode="trilinear", size=(3, 5, 4)), [(1, 1, 1, 1, 1), (2, 2, 4, 6, 3), (1, 3, 3, 5, 4)]),
    (dict(mode="nearest", scale_factor=2), [(1, 1, 1, 1, 1), (2, 2, 4, 6, 3)]),  # 3-D
]


def _example(shape):
    """An example shaped like ``shape`` whose every size and output size is 2 or more
    (torch.export fixes a graph to an output size of 1 it sees)."""
    return torch.randn(*[max(d, 2) + 5 for d in shape])


@pytest.mark.parametrize(
    "kwargs, stream", CASES, ids=lambda v: str(v) if isinstance(v, dict) else ""
)
def test_an_upsampling_compiles_once_and_matches_eager_at_every_shape(kwargs, stream):
    model = Interpolate(**kwargs)
    opt = anyshape.optimize(model, (_example(stream[-1]),))
    assert not opt.report.fallbacks, opt.report.fallbacks
    ops = opt.report.clusters[0].aten_ops
    assert all(k.startswith(("aten.upsample", "aten._upsample")) for k in ops), ops  # kept whole
    before = anyshape.stats()["compilations"]
    for shape in stream:
        x = torch.randn(shape)
        got, want = opt(x), model(x)
        if kwargs["mode"].startswith("nearest"):
            assert torch.equal(got, want), shape
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert anyshape.stats()["compilations"] == before


@pytest.mark.parametrize(
    "kwargs, stream",
    [
        # eager's general path for large 2-D outputs: no copy at the same size
        (dict(mode="nearest", scale_factor=1.004), [(1, 3, 100, 100), (1, 1, 30, 30)]),
        (dict(mode="nearest", scale_factor=2.005), [(1, 1, 100, 100), (1, 2, 20, 30)]),
        # 1-D and 3-D always take it
        (dict(mode="nearest", scale_factor=1.1), [(1, 1, 5), (2, 3, 10), (1, 1, 33)]),
        (dict(mode="nearest", scale_factor=(1.25, 1.1, 0.75)), [(1, 1, 4, 5, 8), (1, 2, 8, 10, 4)]),
        (dict(mode="nearest-exact", scale_factor=1.1), [(1, 1, 5), (2, 3, 62)]),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_nearest_picks_eagers_pixels_on_both_of_its_paths(kwargs, stream, dtype):
    model = Interpolate(**kwargs)

    def sample(shape):  # (distinct values, so a different pixel shows)
        return torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype)

    opt = anyshape.optimize(model, (sample(_example(stream[0]).shape),))
    assert not opt.report.fallbacks, opt.report.fallbacks
    for shape in stream:
        x = sample(shape)
        assert torch.equal(opt(x), model(x)), shape


@pytest.mark.parametrize("size", [100, 7])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_of_float64_data_indexes_in_double_as_eager(mode, size):
    model = Interpolate(mode=mode, size=size)
    opt = anyshape.optimize(model, (torch.randn(1, 2, 30, dtype=torch.float64),))
    for n in (84, 62, 5):
        x = torch.arange(float(n), dtype=torch.float64)[None, None]
        assert torch.equal(opt(x), model(x)), n


def test_an_align_corners_output_of_one_does_not_recompile():
    model = Interpolate(mode="linear", scale_factor=0.75, align_corners=True)
    opt = anyshape.optimize(model, (torch.randn(2, 3, 9),))
    before = anyshape.stats()["compilations"]
    for shape in [(1, 3, 2), (2, 1, 3), (1, 2, 17)]:
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-6, atol=1e-6)
    assert anyshape.stats()["compilations"] == before


def test_nearest_keeps_integer_data_exact():
    model = Interpolate(mode="nearest", scale_factor=3)
    x = torch.randint(0, 256, (1, 3, 4, 5), dtype=torch.uint8)
    opt = anyshape.optimize(model, (x,))
    assert not opt.report.fallbacks, opt.report.fallbacks
    for shape in [(2, 1, 1, 3), (1, 4, 6, 2)]:
        x = torch.randint(0, 256, shape, dtype=torch.uint8)
        got = opt(x)
        assert got.dtype == torch.uint8 and torch.equal(got, model(x))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float16, 2e-3)])
def test_other_float_dtypes_interpolate_like_eager(dtype, tol):
    model = Interpolate(mode="bicubic", scale_factor=2, align_corners=False)
    opt = anyshape.optimize(model, (torch.randn(2, 3, 5, 4, dtype=dtype),))
    assert not opt.report.fallbacks, opt.report.fallbacks
    x = torch.randn(1, 2, 7, 3, dtype=dtype)
    got = opt(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, model(x), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kwargs, dtype, reason",
    [
        (dict(mode="bilinear", scale_factor=2), torch.uint8, "fixed point"),
        (
            dict(mode="bilinear", size=(3, 2), antialias=True),
            torch.float32,
            "_upsample_bilinear2d_aa",
        ),
        (dict(mode="nearest", scale_factor=0.7), torch.float32, "round across an integer"),
    ],
)
def test_what_is_not_compiled_runs_in_pytorch_with_its_reason(kwargs, dtype, reason):
    model = Interpolate(**kwargs)

    def sample(shape):
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, dtype=dtype)
        return torch.randn(shape)

    opt = anyshape.optimize(model, (sample((1, 3, 8, 5)),))
    assert any(reason in f.reason for f in opt.report.fallbacks), opt.report.fallbacks
    for shape in [(1, 3, 8, 5), (2, 1, 10, 7)]:
        x = sample(shape)
        assert torch.equal(opt(x), model(x))


def test_an_empty_spatial_dim_gets_eagers_error():
    model = Interpolate(mode="bilinear", scale_factor=2)
    opt = anyshape.optimize(model, (torch.randn(2, 3, 4, 5),))
    with pytest.raises(Exception, match="sizes should be greater than 0"):
        opt(torch.randn(1, 3, 0, 5))
    torch.testing.assert_close(opt(torch.randn(1, 3, 1, 1)).shape, torch.Size([1, 3, 2, 2]))


class InterpolatedPositions(torch.nn.Module):
    """ViT's position embeddings at any image size: a 4x4 grid resized bicubically to
    the image's patch grid and added to the patch embeddings."""

    def __init__(self, dim=8, patch=4):
        super().__init__()
        self.patch = patch
        self.embed = torch.nn.Conv2d(3, dim, patch, stride=patch)
        self.grid = torch.nn.Parameter(torch.randn(1, dim, 4, 4))

    def forward(self, pixels):
        h, w = pixels.shape[-2] // self.patch, pixels.shape[-1] // self.patch
        pos = F.interpolate(self.grid, size=(h, w), mode="bicubic", align_corners=False)
        return (self.embed(pixels) + pos).flatten(2).transpose(1, 2)


def test_interpolated_position_embeddings_compile_into_one_cluster():
    model = InterpolatedPositions().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 24, 20),))
    assert not opt.report.fallbacks and len(opt.report.clusters) == 1, opt.report
    before = anyshape.stats()["compilations"]
    for shape in [(1, 3, 16, 16), (3, 3, 36, 28), (1, 3, 4, 60), (2, 3, 17, 23)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)
    assert anyshape.stats()["compilations"] == before
