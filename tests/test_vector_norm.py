"""``torch.linalg.vector_norm`` (``F.normalize``, weight norm) lowered whole
(``frontends/torch/aten/reduce.py``): every order against eager over a stream of shapes
with one compilation, and eager's refusal of an empty dim where the norm has no value."""

from __future__ import annotations

import pytest
import torch

import anyshape


class Norm(torch.nn.Module):
    def __init__(self, ord, dim, keepdim):
        super().__init__()
        self.args = ord, dim, keepdim

    def forward(self, x):
        return torch.linalg.vector_norm(x, *self.args)


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, -1, -2.5, float("inf"), float("-inf")])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_every_order_matches_eager(ord, dim, keepdim):
    torch.manual_seed(0)
    model = Norm(ord, dim, keepdim)
    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, (torch.randn(3, 4, 5),))
    for shape in [(3, 4, 5), (1, 1, 1), (2, 9, 3)]:
        x = torch.randn(*shape)
        x[0, 0, 0] = 0  # (|0| ** negative order is inf)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-6)
    assert anyshape.stats()["compilations"] - before == 1
    assert anyshape.stats()["fallback_ops"] == 0 or "fallbacks: none" in str(opt.explain())


@pytest.mark.parametrize("ord", [-1, float("inf"), float("-inf")])
def test_an_empty_dim_is_refused_where_eager_refuses(ord):
    model = Norm(ord, -1, False)
    opt = anyshape.optimize(model, (torch.randn(3, 2, 4),))
    x = torch.randn(3, 2, 0)
    with pytest.raises(RuntimeError):
        model(x)
    with pytest.raises(anyshape.InputError, match="non-empty"):
        opt(x)


@pytest.mark.parametrize("ord", [2, 1, 0.5])
def test_an_empty_dim_is_zero_where_eager_says_so(ord):
    model = Norm(ord, -1, False)
    opt = anyshape.optimize(model, (torch.randn(3, 2, 4),))
    x = torch.randn(3, 2, 0)
    torch.testing.assert_close(opt(x), model(x))
