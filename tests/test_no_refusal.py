"""Compile once, run any shape: no shape that eager PyTorch runs is refused.

Each model is compiled from one example and called at new shapes (sizes 0 and 1 in
each dim included) against eager. Where the graph does not depend on a guard torch
recorded from the example (a reshape's or slice's view path, a pool's last-window
decision, a bound the user gave torch.export), it compiles once. Where it really
does (a slice is 4 long only on inputs of 4 or more), the failing call is compiled
again for its case, counted in ``stats()`` and named in ``explain()``. Bad input
is still an ``InputError``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_models import Fn
from torch.export import Dim

import anyshape
from anyshape.standalone.commands import compile_cmd


def _counts():
    s = anyshape.stats()
    return s["compilations"], s["guard_recompilations"]


def run_shapes(fn, example: tuple, shapes: list[tuple]) -> tuple[anyshape.OptimizedModule, int]:
    """Compile ``fn`` at ``example``; check every shape (each one eager runs) against
    eager; return the module and its compilations."""
    model = Fn(fn).eval()
    before, _ = _counts()
    opt = anyshape.optimize(model, (torch.randn(example),))
    for shape in shapes:
        x = torch.randn(shape)
        want = model(x)
        got = opt(x)
        for g, w in zip(
            torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
        ):
            assert g.shape == w.shape, (shape, g.shape, w.shape)
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"shape {shape}")
    return opt, _counts()[0] - before


def test_reshape_view_path_guards_do_not_refuse():
    # torch.export recorded Ne(floordiv(s0*s1*s2, 4), s0) choosing reshape's view path
    shapes = [(1, 1, 4), (1, 2, 2), (0, 4, 8), (5, 1, 4), (2, 0, 4), (1, 1, 0), (3, 4, 8)]
    _, compiled = run_shapes(lambda x: x.reshape(-1, 4) + 1, (3, 4, 8), shapes)
    assert compiled == 1


def test_slice_view_path_guards_do_not_refuse():
    # Ne(s1*s2, 4*s2) chose whether the slice is contiguous: [2, 4, 4] was refused
    shapes = [(2, 4, 4), (1, 5, 9), (0, 6, 6), (2, 4, 7), (3, 9, 4)]
    _, compiled = run_shapes(lambda y: y[..., :4, :4] * 2, (2, 6, 6), shapes)
    assert compiled == 1


def test_a_real_condition_compiles_the_other_case():
    """A slice is 4 long only on inputs of 4 or more: shorter calls get a graph of
    their own, compiled from the call, counted and named in explain()."""
    _, recompiled_before = _counts()
    opt, compiled = run_shapes(
        lambda y: y[..., :4, :4] * 2,
        (2, 6, 6),
        [(2, 3, 3), (2, 1, 1), (2, 0, 0), (1, 2, 7), (2, 6, 6), (2, 3, 3)],
    )
    recompiled = _counts()[1] - recompiled_before
    assert 1 <= recompiled <= 4 and compiled == 1 + recompiled
    assert "guard variant 1: compiled again for inputs [[2, 3, 3]]" in str(opt.explain())


@pytest.mark.parametrize(
    "fn, width",
    [
        (lambda x: x[:, :2] * 2, 6),  # 2 wide only from 2 on: a wrong shape at 1 before
        (lambda x: x[:, 1:] * 2, 6),  # s - 1 wide: negative at 0
        (lambda x: x[:, -2:] * 2, 6),
    ],
)
def test_slices_torch_sized_by_assuming_two_or_more(fn, width):
    _, compiled = run_shapes(fn, (2, width), [(2, 1), (2, 0), (1, 2), (3, 5), (2, 1)])
    assert compiled >= 1


# name -> (pool, the shortest length eager pools); each drops ceil_mode's last window
# at some lengths and not at others, the example's among the first
POOLS = {
    "avg_k3_s3_p1": (lambda x: F.avg_pool2d(x, 3, 3, padding=1, ceil_mode=True), 1),
    "avg_k2_s2_p1_exclude_pad": (
        lambda x: F.avg_pool2d(x, 2, 2, padding=1, ceil_mode=True, count_include_pad=False),
        1,
    ),
    "max_k2_s2_p1": (lambda x: F.max_pool2d(x, 2, 2, padding=1, ceil_mode=True), 1),
    "max1d_k2_s2_p1": (
        lambda x: F.max_pool1d(x, 2, 2, padding=1, ceil_mode=True, return_indices=True)[0],
        2,
    ),
    # torch's C++ max_pool1d (no indices) reads the length as a number: Eq(s, 9)
    "max1d_k3_s2_p1_values": (lambda x: F.max_pool1d(x, 3, 2, padding=1, ceil_mode=True), 1),
    "max1d_module_k2": (torch.nn.MaxPool1d(2, ceil_mode=True), 1),
    "max1d_keywords": (  # by keyword, sizes as NumPy integers, as models write them
        lambda x: F.max_pool1d(
            input=x, kernel_size=np.int64(3), stride=[np.int64(2)], padding=(1,), ceil_mode=True
        ),
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_ceil_mode_pools_size_every_input(name):
    """ceil_mode's last window must start inside the input: an exact min/floordiv size,
    not a guard torch recorded at the example (3*floordiv(s + 1, 3) + 1 <= s + 1)."""
    fn, shortest = POOLS[name]
    lengths = [(8, 8), (11, 5), (shortest, shortest), (shortest + 1, 3), (9, 9), (5, 6)]
    if "1d" in name:
        example, shapes = (1, 2, 9), [(2, 1, h) for h, _ in lengths] + [(0, 2, 5)]
    else:
        example, shapes = (1, 2, 9, 9), [(2, 1, h, w) for h, w in lengths] + [(0, 2, 5, 5)]
    opt, compiled = run_shapes(fn, example, shapes)
    assert compiled == 1, str(opt.explain())


def test_a_negative_slice_start_clamped_at_the_example_is_not_refused():
    """``x[-10:2]`` traced at 3 starts at 0 (3 - 10 clamps): its guard is that the
    input is at least 2 long, not 10; longer inputs are another case of the graph."""
    _, recompiled_before = _counts()
    shapes = [(3, 2), (2, 2), (9, 1), (1, 2), (0, 2), (10, 2), (12, 3), (13, 2), (5, 2)]
    opt, compiled = run_shapes(lambda x: x[-10:2] + 1, (3, 2), shapes)
    assert compiled == 1 + _counts()[1] - recompiled_before
    assert "10 <= " not in str(opt.explain())


def test_max_pool3d_with_indices_takes_new_spatial_sizes():
    shapes = [(1, 2, 8, 6, 4), (2, 1, 2, 2, 2), (0, 2, 4, 4, 4), (1, 1, 3, 5, 7)]
    _, compiled = run_shapes(
        lambda x: F.max_pool3d(x, 2, return_indices=True)[0], (1, 2, 6, 6, 6), shapes
    )
    assert compiled == 1
    _, compiled = run_shapes(
        lambda x: (lambda y, i: y + i.float())(*F.max_pool3d(x, 2, return_indices=True)),
        (1, 2, 6, 6, 6),
        shapes,
    )
    assert compiled == 1


def test_max_pool1d_indices_cross_the_pytorch_boundary():
    """The indices run in PyTorch and enter a compiled cluster sized floordiv(s, 2):
    a size no input dim binds, once mistaken for a linear one (a division by zero)."""

    def fn(x):
        y, i = F.max_pool1d(x, 3, 2, ceil_mode=True, return_indices=True)
        return y * 2 + i.float()

    shapes = [(2, 3, 54), (2, 3, 20), (1, 1, 3), (0, 3, 9), (2, 3, 55), (1, 2, 4)]
    _, compiled = run_shapes(fn, (2, 3, 54), shapes)
    assert compiled == 1


def test_stft_takes_new_lengths():
    window = torch.hann_window(64)

    def fn(x):
        spec = torch.stft(x, 64, hop_length=16, center=True, window=window, return_complex=True)
        return torch.view_as_real(spec)

    shapes = [(2, 1000), (1, 500), (3, 64), (1, 33), (2, 95), (1, 1001)]
    _, compiled = run_shapes(fn, (2, 1000), shapes)
    assert compiled == 1


class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        return h.reshape(x.shape[0], -1) + 1


def test_pt2_compile_drops_the_users_export_bounds(tmp_path):
    """``anyshape compile model.pt2`` of a program exported with ``Dim("seq", min=2)``:
    torch's decomposition guards 8*s1 < 8*s1*s0 (true from 2 on) once refused batch 1."""
    model = Heads().eval()
    seq = Dim("seq", min=2)
    program = torch.export.export(
        model, (torch.randn(2, 5, 8),), dynamic_shapes=({0: Dim("batch"), 1: seq},)
    )
    pt2, out = tmp_path / "heads.pt2", tmp_path / "heads.anyshape"
    torch.export.save(program, pt2)
    compile_cmd(argparse.Namespace(model=str(pt2), output=str(out), target="portable"))
    compiled = anyshape.load(str(out))
    for shape in [(2, 5, 8), (1, 1, 8), (1, 7, 8), (3, 1, 8), (2, 0, 8)]:
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        (got,) = compiled(x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class Masked(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask


def test_bad_input_is_still_an_input_error():
    model = Masked()
    opt = anyshape.optimize(model, (torch.randn(3, 8), torch.ones(3, 8)))
    _, recompiled = _counts()
    x, mask = torch.randn(5, 4), torch.ones(5, 4)
    torch.testing.assert_close(opt(x, mask), model(x, mask))
    with pytest.raises(anyshape.InputError, match=r"input 'mask' dim 1: expected 4 .* got 7"):
        opt(torch.randn(5, 4), torch.ones(5, 7))
    with pytest.raises(anyshape.InputError, match=r"rank 3"):
        opt(torch.randn(2, 2, 4), torch.ones(2, 4))
    with pytest.raises(anyshape.InputError, match=r"dtype"):
        opt(torch.randn(2, 4, dtype=torch.float64), torch.ones(2, 4))
    assert _counts()[1] == recompiled
