"""A concatenation that roots its kernel writes each piece into its slice of the output.

``kernels._emit_concatenate`` opens one loop nest per piece, over the piece's own shape,
so each output element computes only its own piece's fused value (a nest over the whole
output computed every piece and selected one). Checked against eager along every axis,
with pieces of size 0 and 1 and symbolic offsets, for float and integer dtypes, with
one compilation per model; the kernel is asserted to hold one nest per piece.
"""

from __future__ import annotations

import pytest
import torch

import anyshape


class Pieces(torch.nn.Module):
    """Three pieces, each with its own fused work, concatenated along ``dim``."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, a, b, c):
        return torch.cat([a * 3 + 1, (b - 2) * b, -c], self.dim)


def _concat_kernel(opt) -> str:
    source = opt.report.clusters[0].compiled.native.source
    (kernel,) = source.split("// anyshape: host")[0].split("// anyshape: kernel")[1:]
    return kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_each_piece_in_its_slice(dim, dtype):
    torch.manual_seed(dim)
    model = Pieces(dim)

    def inputs(sizes):
        out = []
        for size in sizes:
            shape = [4, 5, 6]
            shape[dim] = size
            out.append((torch.randn(*shape) * 10).to(dtype))
        return out

    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, inputs((3, 2, 2)), model_cache=False)
    kernel = _concat_kernel(opt)  # (a variant per split of the work, each with its nests)
    stores = kernel.count(f"(({'float' if dtype == torch.float32 else 'int64_t'}*)p0)[")
    assert stores and stores == kernel.count("#pragma omp parallel") and stores % 3 == 0
    assert " ? " not in kernel  # no piece selected per element
    for sizes in [(3, 2, 2), (7, 1, 0), (0, 1, 5), (1, 1, 1), (9, 4, 13), (0, 0, 0)]:
        args = inputs(sizes)
        got, want = opt(*args), model(*args)
        if dtype == torch.float32:  # (a multiply-add may round once, fused)
            torch.testing.assert_close(got, want)
        else:
            assert got.shape == want.shape and torch.equal(got, want), sizes
    assert anyshape.stats()["compilations"] - before == 1
