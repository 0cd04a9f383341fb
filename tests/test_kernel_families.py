"""Kernel families (codegen/cpu/families.py): kernels that differ only in static sizes
compile to one function, each call passing its sizes; sizes every call shares are
constants again. Every model check compares with eager and with the same model compiled
without families (``kernel_families=False``)."""

from __future__ import annotations

import pytest
import torch
from concurrency import mismatches_from_threads

import anyshape
from anyshape.codegen.cpu.families import bind_family_constants
from anyshape.codegen.cpu.kernels import Kernel
from anyshape.codegen.cpu.program import KERNEL_MARK
from anyshape.ir.symbolic import SymExpr


def _functions(opt) -> int:
    (cluster,) = opt.report.clusters
    return cluster.compiled.native.source.count(f"\n{KERNEL_MARK}\n")


def _kernel(body_uses: str, ints: list) -> Kernel:
    head = [f"const int64_t D_{k} = D[{k}];" for k in range(len(ints))]
    return Kernel("\n".join([*head, body_uses, "return err_flag;"]), [0], ints, root=None)


def test_shared_sizes_become_constants_and_the_rest_stay_per_call():
    s = SymExpr.symbol("s0")
    uses = "for (int64_t i = 0; i < D_0 * D_1; ++i) p0[i] = D_2;"
    a, b = _kernel(uses, [s, 64, 768]), _kernel(uses, [s, 128, 768])
    other = _kernel("p0[0] = D_0 + D_1;", [256, 512])
    bound = bind_family_constants([a, b, other])
    assert bound[0].body == bound[1].body  # one family: one function
    assert "const int64_t D_2 = INT64_C(768);" in bound[0].body  # shared by both calls
    assert "const int64_t D_0 = D[0];" in bound[0].body
    assert "const int64_t D_1 = D[1];" in bound[0].body  # 64 at one call, 128 at the other
    assert bound[0].ints == [s, 64] and bound[1].ints == [s, 128]
    # A kernel alone is a family of one: every static size is a constant, nothing passed.
    assert "const int64_t D_0 = INT64_C(256);" in bound[2].body
    assert "const int64_t D_1 = INT64_C(512);" in bound[2].body and bound[2].ints == []
    assert len({k.body for k in bound}) == 2  # two C++ functions
    # A size passed per call after a shared one is read from its new place.
    c, d = _kernel(uses, [64, s, 32]), _kernel(uses, [64, 128, 32])
    e, f = bind_family_constants([c, d])
    assert "const int64_t D_0 = INT64_C(64);" in e.body and "const int64_t D_1 = D[0];" in e.body
    assert "const int64_t D_2 = INT64_C(32);" in e.body and e.body == f.body
    assert e.ints == [s] and f.ints == [128]


class Tower(torch.nn.Module):
    """The same conv-BN-ReLU block at three widths, then pooling and a head."""

    def __init__(self, widths=(16, 32, 64)):
        super().__init__()
        layers, cin = [], 3
        for w in widths:
            layers += [torch.nn.Conv2d(cin, w, 3, padding=1, bias=False), torch.nn.BatchNorm2d(w)]
            layers += [torch.nn.ReLU()]
            cin = w
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(cin, 10)
        for m in self.body:
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


def test_a_tower_of_widths_compiles_fewer_functions_and_agrees_with_eager():
    torch.manual_seed(0)
    model = Tower().eval()
    example = (torch.randn(2, 3, 12, 12),)
    fam = anyshape.optimize(model, example, model_cache=False)
    each = anyshape.optimize(model, example, model_cache=False, kernel_families=False)
    assert _functions(fam) < _functions(each)
    assert "compiled functions" in str(fam.explain())
    with torch.no_grad():
        for shape in [(1, 3, 1, 1), (2, 3, 12, 12), (3, 3, 17, 9), (1, 3, 32, 32), (0, 3, 8, 8)]:
            x = torch.randn(shape)
            torch.testing.assert_close(fam(x), model(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(fam(x), each(x), rtol=1e-5, atol=1e-5)


class Widths(torch.nn.Module):
    """Linear layers of four shapes: GEMM kernels that differ only in the weight's sizes."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(24, 40, bias=False)
        self.b = torch.nn.Linear(40, 72, bias=False)
        self.c = torch.nn.Linear(72, 40, bias=False)
        self.d = torch.nn.Linear(40, 24, bias=False)

    def forward(self, x):
        return self.d(torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))))


@pytest.mark.parametrize("route", ["auto", "always", "off"])
def test_one_gemm_function_keeps_a_site_and_packed_weights_per_shape(route):
    """Each weight shape gets its own oneDNN site (primitive, packed weights) inside the one
    function; packed weights follow in-place changes; row counts on both sides of the
    point where oneDNN's matmul takes over (4 rows)."""
    torch.manual_seed(1)
    model = Widths().eval()
    opt = anyshape.optimize(model, (torch.randn(5, 24),), dnnl_matmul=route, model_cache=False)
    assert _functions(opt) < 7  # four GEMMs and three tanh: the GEMMs share functions
    with torch.no_grad():
        for rows in [1, 3, 4, 7, 64, 300]:
            x = torch.randn(rows, 24)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
        x = torch.randn(9, 24)
        before = opt(x).clone()
        model.b.weight.mul_(-1.5)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
        assert not torch.allclose(opt(x), before)


def test_family_sites_from_several_threads():
    """Sites are made on a family's first call for each shape, under its table's lock:
    threads calling at once all get the right site."""
    torch.manual_seed(2)
    model = Widths().eval()
    opt = anyshape.optimize(model, (torch.randn(5, 24),), dnnl_matmul="always", model_cache=False)
    xs = [torch.randn(4 + 3 * k, 24) for k in range(8)]
    with torch.no_grad():
        want = [model(x) for x in xs]
    assert mismatches_from_threads(opt, xs, want, threads=8, rounds=8) == []


class Projection(torch.nn.Module):
    """GPT-2's attention output projection: ``x @ W`` with W held as [in, out]."""

    def __init__(self, n=64):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n) / 8)
        self.b = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w)


def test_a_family_of_one_with_a_constant_site():
    """A family of one call: its site's geometry is all constants in the function (the
    case GCC 12 miscompiled when the site lookup was inlined)."""
    torch.manual_seed(3)
    model = Projection().eval()
    opt = anyshape.optimize(model, (torch.randn(14, 64),), model_cache=False)
    assert "as_matmul_site(&dnnl_sites, D_" in opt.report.clusters[0].compiled.native.source
    with torch.no_grad():
        for rows in [1, 4, 14, 33]:
            x = torch.randn(rows, 64)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
