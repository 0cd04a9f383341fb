"""Symbolic floats made of sizes, as operands of compiled ops.

A model that scales by a ratio of sizes (ViT's interpolated position
embeddings scale by ``8 / (h // 8)``) hands torch.export a ``SymFloat``,
``IntTrueDiv`` of two size expressions, or ``ToFloat`` of one. The lowering
computes such a ratio in float64 from the sizes, as Python does, and casts it
to the op's type, as torch casts a Python scalar: the op compiles instead of
running in PyTorch, and its results match eager at every size, once compiled.
"""

from __future__ import annotations

import pytest
import torch

import anyshape


class ScaleByPatches(torch.nn.Module):
    def forward(self, x):
        return x * (8 / (x.shape[-1] // 8)) + 1


class ScaleBySize(torch.nn.Module):
    def forward(self, x):
        return x * torch.sym_float(x.shape[0]) - x.shape[1] / 3  # (float() specializes)


class IntTimesRatio(torch.nn.Module):
    def forward(self, n):
        return n * (8 / (n.shape[-1] // 4))


@pytest.mark.parametrize(
    "model, example, shapes",
    [
        (ScaleByPatches(), torch.randn(2, 24), [(1, 8), (3, 40), (2, 100), (1, 15)]),
        (ScaleBySize(), torch.randn(3, 5), [(1, 1), (7, 3), (2, 11), (0, 4)]),
    ],
)
def test_a_ratio_of_sizes_compiles_and_matches_eager(model, example, shapes):
    opt = anyshape.optimize(model, (example,))
    assert not opt.report.fallbacks, opt.report.fallbacks
    before = anyshape.stats()["compilations"]
    for shape in shapes:
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-6, atol=1e-6)
    assert anyshape.stats()["compilations"] == before


def test_an_integer_tensor_times_a_ratio_is_float_as_in_eager():
    model = IntTimesRatio()
    opt = anyshape.optimize(model, (torch.arange(24).reshape(2, 12),))
    assert not opt.report.fallbacks, opt.report.fallbacks
    for shape in [(1, 4), (3, 20), (2, 13)]:
        n = torch.randint(-50, 50, shape)
        got, want = opt(n), model(n)
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want)
