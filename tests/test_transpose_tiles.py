"""Transposes that move the last dim run as tiled copies (codegen/cpu/transpose_emit.py).

Every permutation is checked against eager, bit for bit, at sizes that leave partial
8x8 tiles, at 0 and 1 in every dim, and through a reshape (attention heads split off a
projection); the tiled call is asserted where the last dim moves and nowhere else.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import anyshape

TILED = "as_transpose2d<"


class Permute(torch.nn.Module):
    def __init__(self, perm):
        super().__init__()
        self.perm = perm

    def forward(self, x):
        return x.permute(*self.perm).contiguous(), x.sum()


def _tiled(opt) -> bool:
    """Whether a generated kernel (not the prelude defining it) calls the tiled copy."""
    source = opt.report.clusters[0].compiled.native.source
    kernels = source.split("// anyshape: host")[0].split("// anyshape: kernel", 1)[-1]
    return TILED in kernels


def _check(perm, dtype, shapes):
    model = Permute(perm)
    example = torch.zeros(*range(3, 3 + len(perm)), dtype=dtype)
    opt = anyshape.optimize(model, (example,), model_cache=False)
    assert _tiled(opt) == (perm[-1] != len(perm) - 1), perm
    for shape in shapes:
        x = (torch.randn(*shape) * 100).to(dtype)
        got, want = opt(x)[0], model(x)[0]
        assert got.shape == want.shape and torch.equal(got, want), (perm, shape)


def _shapes(rank: int) -> list[tuple[int, ...]]:
    return [
        tuple(9 + 7 * k for k in range(rank)),  # partial tiles both ways
        tuple([17, 33, 8, 64][:rank]),
        tuple([1] * rank),
        tuple([0] + [5] * (rank - 1)),
        tuple([5] * (rank - 1) + [0]),
    ]


@pytest.mark.parametrize(
    "perm", [*itertools.permutations(range(2)), *itertools.permutations(range(3))]
)
def test_every_permutation_of_rank_2_and_3(perm):
    _check(perm, torch.float32, _shapes(len(perm)))


@pytest.mark.parametrize(
    "perm", [(0, 2, 3, 1), (0, 1, 3, 2), (3, 2, 1, 0), (1, 3, 0, 2), (0, 2, 1, 3)]
)
def test_rank_4(perm):
    _check(perm, torch.float32, _shapes(4))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64])
def test_other_element_sizes(dtype):
    _check((0, 2, 1), dtype, _shapes(3))


def test_attention_keys_split_off_a_projection_are_tiled():
    """T5's keys: [b, s, 512] -> [b, s, 8, 64] -> [b, 8, 64, s], here returned (a GEMM
    reads them in place instead, ``test_dot_in_place.py``)."""

    class Keys(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = torch.nn.Linear(64, 64, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            return self.k(x).view(b, s, 4, 16).permute(0, 2, 3, 1).contiguous()

    torch.manual_seed(0)
    model = Keys().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 12, 64),), model_cache=False)
    assert _tiled(opt)
    with torch.no_grad():
        for shape in [(2, 12, 64), (1, 1, 64), (3, 37, 64), (0, 5, 64), (2, 0, 64)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)


class ChannelsFirstThenTokens(torch.nn.Module):
    """SegFormer's Mix-FFN: a depthwise convolution over channels-first maps, its output
    flattened to tokens (channels last) and passed through GELU."""

    def __init__(self, channels=16):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.dw(x).flatten(2).transpose(1, 2))


def test_work_fused_with_a_plane_transpose_runs_after_a_tiled_copy():
    """A transpose reading channel planes with GELU fused in read across whole planes
    per element; the plan puts its input in memory and tiles the copy
    (``plan._moves_last_dim``), and the GELU loop reads the copy in order."""
    model = ChannelsFirstThenTokens().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 16, 12, 10),), model_cache=False)
    assert _tiled(opt)
    loops = [k for k in str(opt.explain()).splitlines() if "loop:" in k and "erf" in k]
    assert loops and all("transpose" not in k for k in loops), loops
    for shape in [(1, 16, 1, 1), (3, 16, 17, 9), (1, 16, 40, 48)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)
