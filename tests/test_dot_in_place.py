"""Batched dots read permuted operands in place (``plan.reads_in_place``, ``as_gemm_views``).

Attention splits its projections into heads (``[b, s, h, d] -> [b, h, s, d]``, keys
``-> [b, h, d, s]``); a GEMM reads such a view with a leading dimension and per-head
strides instead of a copy kernel. Checked against eager at sizes 0 and 1 in every dim,
for float32 and float64, one and two batch dims; permutations a GEMM cannot read (the
contiguous dim among the batch dims, three batch dims, integer dots) still copy, and
give the same results.
"""

from __future__ import annotations

import pytest
import torch

import anyshape


class PermutedDot(torch.nn.Module):
    def __init__(self, pa, pb):
        super().__init__()
        self.pa, self.pb = pa, pb

    def forward(self, a, b):
        return a.permute(*self.pa) @ b.permute(*self.pb)


class Attention(torch.nn.Module):
    """Heads split off projections (a bias added first, as a linear layer does)."""

    def __init__(self, heads: int, width: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=-1)
        h, d = self.heads, w // self.heads
        q = q.reshape(b, s, h, d).transpose(1, 2)
        k = k.reshape(b, s, h, d).permute(0, 2, 3, 1)
        v = v.reshape(b, s, h, d).transpose(1, 2)
        p = torch.softmax(q @ k / d**0.5, dim=-1)
        return (p @ v).transpose(1, 2).reshape(b, s, w)


def _kernels(opt) -> list[str]:
    return opt.report.clusters[0].compiled.native.kernel_labels


def _kernel_source(opt) -> str:
    source = opt.report.clusters[0].compiled.native.source
    return source.split("// anyshape: host")[0].split("// anyshape: kernel", 1)[-1]


def _views_called(opt) -> bool:
    return "as_gemm_views<" in _kernel_source(opt)


def _inputs(shape, pa, pb, dtype):
    """Two buffers whose permutes multiply: ``a.permute(pa)`` is [..., m, k],
    ``b.permute(pb)`` is [..., k, n], batch dims shared."""
    *batch, m, k, n = shape
    want_a, want_b = (*batch, m, k), (*batch, k, n)
    a = torch.randn(*[want_a[pa.index(i)] for i in range(len(pa))], dtype=dtype)
    b = torch.randn(*[want_b[pb.index(i)] for i in range(len(pb))], dtype=dtype)
    return a, b


def _check(pa, pb, dtype, shapes, in_place: bool):
    model = PermutedDot(pa, pb)
    opt = anyshape.optimize(model, _inputs(shapes[0], pa, pb, dtype), model_cache=False)
    assert ("transpose" not in " ".join(_kernels(opt))) == in_place, _kernels(opt)
    for shape in shapes:
        a, b = _inputs(shape, pa, pb, dtype)
        got, want = opt(a, b), model(a, b)
        assert got.shape == want.shape, (shape, got.shape, want.shape)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return opt


# (batch..., m, k, n): sizes with 0 and 1 in every dim, and uneven ones
SHAPES_2 = [(3, 5, 7, 9, 6), (2, 4, 33, 64, 17), (1, 1, 1, 1, 1), (0, 3, 4, 5, 6), (2, 0, 4, 5, 6)]
SHAPES_2 += [(2, 3, 0, 5, 6), (2, 3, 4, 0, 6), (2, 3, 4, 5, 0), (2, 3, 1, 5, 1)]
SHAPES_1 = [(4, 9, 7, 5), (3, 1, 8, 1), (0, 2, 3, 4), (2, 0, 3, 4), (2, 3, 0, 4), (2, 3, 4, 0)]


@pytest.mark.parametrize(
    "pa, pb",
    [
        ((0, 2, 1, 3), (0, 2, 3, 1)),  # q [b, s, h, d] and keys [b, s, h, d] -> [b, h, d, s]
        ((0, 2, 1, 3), (0, 2, 1, 3)),  # scores @ values (both read in rows)
        ((2, 0, 1, 3), (1, 2, 3, 0)),  # batch dims swapped, and a transposed right operand
        ((0, 2, 3, 1), (0, 1, 3, 2)),  # a transposed left operand beside a packed ^T
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_two_batch_dims_read_in_place(pa, pb, dtype):
    opt = _check(pa, pb, dtype, SHAPES_2, in_place=True)
    assert _views_called(opt)


@pytest.mark.parametrize("pa, pb", [((1, 0, 2), (1, 2, 0)), ((1, 0, 2), (0, 2, 1))])
def test_one_batch_dim_read_in_place(pa, pb):
    opt = _check(pa, pb, torch.float32, SHAPES_1, in_place=True)
    assert _views_called(opt)


def test_swapped_last_two_dims_stay_a_packed_batch():
    opt = _check((0, 1, 3, 2), (0, 1, 3, 2), torch.float32, SHAPES_2, in_place=True)
    assert not _views_called(opt)  # (the batch of packed matrices: as_gemm_batch)


@pytest.mark.parametrize(
    "pa, pb, dtype, shapes",
    [
        # the contiguous dim is a batch dim of the left operand: no leading dimension
        ((0, 3, 1, 2), (0, 1, 2, 3), torch.float32, SHAPES_2),
        # three batch dims
        ((0, 1, 3, 2, 4), (0, 1, 2, 3, 4), torch.float32, [(2, 3, 4, 5, 6, 7), (1, 0, 2, 3, 4, 5)]),
        # an integer dot is a loop nest over packed operands
        ((0, 2, 1, 3), (0, 2, 3, 1), torch.int64, SHAPES_2[:3]),
    ],
)
def test_what_a_gemm_cannot_read_is_copied(pa, pb, dtype, shapes):
    if dtype.is_floating_point:
        _check(pa, pb, dtype, shapes, in_place=False)
        return
    model = PermutedDot(pa, pb)
    make = lambda s: tuple(t.mul(3).round().to(dtype) for t in _inputs(s, pa, pb, torch.float32))  # noqa: E731
    opt = anyshape.optimize(model, make(shapes[0]), model_cache=False)
    assert any("transpose" in k for k in _kernels(opt))
    for shape in shapes:
        a, b = make(shape)
        assert torch.equal(opt(a, b), model(a, b)), shape


def test_attention_heads_need_no_copy_kernels():
    """Q, K and V are read from the projection's output in place: the only copy left is
    the heads merged back (``[b, h, s, d] -> [b, s, h, d]``), a tiled one. Fused into one
    attention kernel, its GEMMs read each head through ``as_view``; unfused, the batched
    GEMMs read them through ``as_gemm_views``."""
    torch.manual_seed(0)
    model = Attention(heads=4, width=32).eval()
    opt = anyshape.optimize(model, (torch.randn(2, 7, 32),), model_cache=False)
    transposes = [k for k in _kernels(opt) if k.startswith("transpose")]
    assert len(transposes) <= 1, _kernels(opt)
    assert "as_block_sgemm(" in _kernel_source(opt) and "as_view(" in _kernel_source(opt)
    unfused = anyshape.optimize(
        model, (torch.randn(2, 7, 32),), model_cache=False, attention_fusion=False
    )
    assert len([k for k in _kernels(unfused) if k.startswith("transpose")]) <= 1
    assert _views_called(unfused)
    with torch.no_grad():
        for b, s in [(1, 1), (3, 19), (0, 5), (2, 0), (4, 64)]:
            x = torch.randn(b, s, 32)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(unfused(x), model(x), rtol=1e-5, atol=1e-5)


# (b, 8 heads, m, k, n): rows of 8 x 64 floats either side of 128 reads
SCORES = [(2, 8, 130, 64, 140), (1, 8, 127, 64, 128), (2, 8, 128, 64, 5), (1, 8, 3, 64, 200)]
VALUES = [(2, 8, 130, 140, 64), (1, 8, 127, 128, 64), (2, 8, 128, 5, 64), (1, 8, 0, 9, 64)]


@pytest.mark.parametrize(
    "pa, pb, shapes",
    [
        ((0, 2, 1, 3), (0, 2, 3, 1), SCORES),  # queries and keys both copied
        ((0, 1, 2, 3), (0, 2, 1, 3), VALUES),  # probabilities x values: the values copied
    ],
)
def test_heads_whose_rows_are_2kb_apart_are_copied_dense_first(pa, pb, shapes):
    """Heads read in place from a [b, s, 8, 64] projection have rows 512 floats apart;
    a GEMM that reads each of those rows 128 times or more reads a dense copy instead
    (``as_far_rows``): right on both sides of that bound."""
    opt = _check(pa, pb, torch.float32, shapes, in_place=True)
    assert _views_called(opt)
