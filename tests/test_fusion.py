"""Fusion on the CPU backend: how many kernels standard blocks compile to, and that they match eager.

Stitch fusion folds row reductions into the kernel that consumes them:
softmax, log-softmax, layer norm (with its residual add), RMS norm and the
attention mask + scale + softmax each become one kernel. The counts are the
contract (a fusion regression fails here); every case also runs shapes that
stress the row loop (one row, rows of length 1, no rows, batch 1, NaN) against
eager.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

import anyshape

TOL = dict(rtol=1e-5, atol=1e-5)


def _kernels(opt) -> list[str]:
    (cluster,) = opt.report.clusters
    return cluster.compiled.native.kernel_labels


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class LogSoftmax(torch.nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, -1)


class AddLayerNorm(torch.nn.Module):
    def __init__(self, n=24):
        super().__init__()
        self.norm = torch.nn.LayerNorm(n)

    def forward(self, x, residual):
        return self.norm(x + residual)


class RmsNorm(torch.nn.Module):
    def __init__(self, n=24):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(n) + 0.5)

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + 1e-6) * self.weight


class AttentionSoftmax(torch.nn.Module):
    def forward(self, scores, mask):
        return torch.softmax(scores / math.sqrt(64) + mask, dim=-1)


CASES = {
    "softmax": (Softmax(), lambda *s: (torch.randn(*s, 24),)),
    "log_softmax": (LogSoftmax(), lambda *s: (torch.randn(*s, 24),)),
    "add_layernorm": (AddLayerNorm(), lambda *s: (torch.randn(*s, 24), torch.randn(*s, 24))),
    "rms_norm": (RmsNorm(), lambda *s: (torch.randn(*s, 24),)),
}
SHAPES = [(3, 5), (1, 1), (1, 7), (0, 4), (4, 33)]


@pytest.mark.parametrize("name", list(CASES))
def test_row_reductions_stitch_into_one_kernel(name):
    model, make = CASES[name]
    opt = anyshape.optimize(model.eval(), make(2, 3))
    assert len(_kernels(opt)) == 1, _kernels(opt)
    for shape in SHAPES:
        inputs = make(*shape)
        torch.testing.assert_close(opt(*inputs), model(*inputs), **TOL)


def test_attention_mask_scale_softmax_is_one_kernel():
    model = AttentionSoftmax()
    opt = anyshape.optimize(model, (torch.randn(2, 4, 6, 6), torch.randn(2, 1, 1, 6)))
    assert len(_kernels(opt)) == 1, _kernels(opt)
    for b, h, s in [(1, 4, 1), (3, 4, 17), (2, 4, 5)]:
        scores, mask = torch.randn(b, h, s, s), torch.zeros(b, 1, 1, s)
        mask[..., s // 2 :] = -1e9  # a padded tail, as BERT's extended mask
        torch.testing.assert_close(opt(scores, mask), model(scores, mask), **TOL)


class Standardize(torch.nn.Module):
    """LayerNorm without weights, written out: the variance reads the mean's row."""

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5)


def test_a_reduction_read_through_a_kept_dim_is_computed_once_per_row():
    """The mean reaches the variance through ``reshape`` to [rows, 1]: its index there
    was written ``i0 + (i0 % 1)``, which missed the memo of the row's mean, so the
    variance loop computed the mean again per element, and the split variant's copy
    (a parallel loop inside a simd loop) failed to build: the cluster ran in PyTorch."""
    model = Standardize()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 24),))
    assert not opt.report.fallbacks, opt.report.fallbacks
    (stitch,) = [k for k in opt.report.clusters[0].compiled.native.kernel_descriptions
                 if k.startswith("stitch:")]  # fmt: skip
    assert "reduce x2" in stitch, stitch
    assert "% 1)" not in opt.report.clusters[0].compiled.native.source
    for shape in [(1, 1, 600), (2, 5, 24), (1, 1, 1), (0, 3, 8), (3, 2, 1000)]:
        x = torch.randn(shape)
        torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)


def test_stitched_max_propagates_nan():
    opt = anyshape.optimize(Softmax(), (torch.randn(2, 8),))
    x = torch.randn(3, 8)
    x[1, 3] = float("nan")
    got = opt(x)
    assert torch.isnan(got[1]).all() and not torch.isnan(got[[0, 2]]).any()


def test_reduction_read_elsewhere_is_not_stitched():
    """A row sum that is also an output stays in memory: the consumer reads it from there."""

    class SumAndNormalize(torch.nn.Module):
        def forward(self, x):
            total = x.sum(-1, keepdim=True)
            return x / total, total

    model = SumAndNormalize()
    opt = anyshape.optimize(model, (torch.rand(3, 8) + 1,))
    assert len(_kernels(opt)) == 2
    x = torch.rand(5, 9) + 1
    torch.testing.assert_close(opt(x), model(x), **TOL)


def test_bert_layer_kernel_count():
    """One BERT encoder layer: 6 GEMMs, one attention kernel and 7 fused kernels (17
    before stitch fusion).

    The attention kernel: the scores GEMM, the softmax and the context GEMM, per block of
    rows. The 7: the q, k and v bias adds (the attention GEMMs read their heads from those
    in place), the context's heads merged back (one transpose), the two residual + layer
    norms, GELU.
    """
    cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128)
    layer = transformers.models.bert.modeling_bert.BertLayer(cfg).eval()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, h):
            out = self.layer(h)
            return out[0] if isinstance(out, tuple) else out

    model = Layer().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 7, 64),))
    labels = _kernels(opt)
    gemms = [k for k in labels if k.startswith("dot ")]
    fused = [k for k in labels if not k.startswith(("dot ", "attention "))]
    assert len(gemms) == 6, labels  # q, k, v, attention out, up, down
    assert sum(k.startswith("attention ") for k in labels) == 1, labels
    assert len(fused) == 7, labels
    assert sum(k.startswith("transpose ") for k in fused) == 1, labels
    # q, k and v bias adds, and the two layer norms (whose last op adds beta)
    assert sum(k.startswith("add ") for k in fused) == 5, labels
    for b, s in [(1, 1), (3, 9), (2, 16)]:
        h = torch.randn(b, s, 64)
        torch.testing.assert_close(opt(h), model(h), rtol=1e-4, atol=1e-4)


def test_explain_lists_kernels_with_kind_and_fused_ops():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

        def forward(self, x):
            return torch.softmax(self.norm(torch.nn.functional.gelu(self.lin(x)) + x), -1)

    text = str(anyshape.explain(Block().eval(), (torch.randn(2, 3, 16),)))
    assert (
        "kernels: 2 calls (1 library GEMM/convolution, 1 generated loop nests, "
        "2 compiled functions)" in text
    )
    (stitch,) = [ln for ln in text.splitlines() if ln.strip().startswith("stitch:")]
    assert "erf x1" in stitch and "exp x1" in stitch and "reduce x4" in stitch


def test_a_broadcast_used_by_every_layer_is_stored_at_its_source_size():
    """BERT's attention mask, [1, 1, s, 1] broadcast to [b, heads, s, s] for every layer:
    stored once at its own size, never as the broadcast (a byte read per score)."""
    cfg = transformers.BertConfig(
        hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2
    )
    model = transformers.BertModel(cfg).eval()
    opt = anyshape.optimize(model, (torch.randint(0, 100, (2, 7)),))
    labels = _kernels(opt)
    assert not any(k.startswith("broadcast_in_dim") for k in labels), labels
    (cluster,) = opt.report.clusters
    assert "(const bool*)" not in cluster.compiled.native.source  # bytes vectorize, bool not
    for b, s in [(1, 1), (3, 9)]:
        ids = torch.randint(0, 100, (b, s))
        torch.testing.assert_close(
            opt(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-4, atol=1e-4
        )


class LayerNormGelu(torch.nn.Module):
    def __init__(self, n=24):
        super().__init__()
        self.norm = torch.nn.LayerNorm(n)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(x))


def test_row_buffer_only_for_values_a_later_loop_reads():
    """LayerNorm's output feeds GELU twice but only in the loop that computes it: no row
    buffer. Softmax's exp is read again by the normalizing loop: buffered."""
    model = LayerNormGelu().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 3, 24),))
    assert len(_kernels(opt)) == 1, _kernels(opt)
    (cluster,) = opt.report.clusters
    kernels_and_host = cluster.compiled.native.source.split("// anyshape: kernel", 1)[1]
    assert "as_scratch" not in kernels_and_host  # (after the runtime headers)
    for shape in SHAPES:
        x = torch.randn(*shape, 24)
        torch.testing.assert_close(opt(x), model(x), **TOL)
    (cluster,) = anyshape.optimize(Softmax(), (torch.randn(3, 24),)).report.clusters
    assert "rb[0 * " in cluster.compiled.native.source


def test_kernels_with_float_sums_reassociate_and_stay_close_to_eager():
    """A kernel with a float sum reduction is compiled with associative math, so the
    lanes of each row's sum fold as a tree (GCC folds an ``omp simd`` sum's 16 lanes one
    by one otherwise); elementwise kernels keep strict IEEE order."""

    class SoftmaxAndExp(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1), torch.exp(x)

    model = SoftmaxAndExp().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 16),))
    (cluster,) = opt.report.clusters
    source = cluster.compiled.native.source
    kernels = [
        k for k in source.split("\nAS_KERNEL int ")[1:] if k.lstrip().startswith(("k_", "__"))
    ]
    with_sums = [k for k in kernels if "reduction(+:" in k]
    assert with_sums and all(k.startswith("__attribute__((optimize(") for k in with_sums)
    assert any(not k.startswith("__attribute__") for k in kernels)
    x = torch.randn(37, 129) * 4
    for got, want in zip(opt(x), model(x)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_parallel_threshold_weighs_transcendentals():
    """A kernel goes parallel on elements x cost (kernels.element_cost): softmax's exp
    counts 8, so [8, 768] (6144 elements) uses both cores while an add of that size stays
    on one; both stay correct either side of the threshold."""

    class SoftmaxAndAdd(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1), x + 1

    model = SoftmaxAndAdd().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 16),))
    (cluster,) = opt.report.clusters
    source = cluster.compiled.native.source
    assert ") * 9 > 32768)" in source and ") * 1 > 32768)" in source
    for rows in (1, 8, 3000):
        x = torch.randn(rows, 768)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, **TOL)


HORIZONTAL_IR = """graph @h(%x: f32[s0, s1], %y: f32[s0, s1]) {
  %0 = exp(%x) : f32[s0, s1]
  %1 = reduce(%0) {axes=[0], kind="sum"} : f32[s1]
  %2 = broadcast_in_dim(%1) {dims=[1], shape=[s0, s1]} : f32[s0, s1]
  %3 = mul(%y, %2) : f32[s0, s1]
  %4 = sin(%y) : f32[s0, s1]
  return %0, %3, %4
}
"""


def test_independent_loop_nests_over_one_shape_fuse_horizontally():
    """exp(x) and sin(y) share one loop nest; mul(y, colsum(exp(x))) cannot join them
    (it reads a kernel that runs after the group)."""
    from anyshape.codegen.cpu.executable import CpuExecutable
    from anyshape.ir.parser import parse_graph

    exe = CpuExecutable(parse_graph(HORIZONTAL_IR), [])
    assert exe.kernel_labels[0] == "exp f32[s0, s1] + 1 more", exe.kernel_labels
    assert exe.kernel_descriptions[0].startswith("horizontal loop x2: exp f32[s0, s1] <- sin x1")
    assert len(exe.kernel_labels) == 3 and exe.kernel_labels[2].startswith("mul ")
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 5), (2, 3000)]:
        x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        e, m, s = exe([x, y], [])
        np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
        np.testing.assert_allclose(m, y * np.exp(x).sum(0), rtol=1e-5)
        np.testing.assert_allclose(s, np.sin(y), rtol=1e-5, atol=1e-6)


def test_gpt2_attention_reads_its_heads_without_transposing_them():
    """GPT-2 splits q, k and v off one projection; the attention GEMMs read each head in
    place (``plan.reads_in_place``): the one transpose left merges the heads back."""
    cfg = transformers.GPT2Config(
        n_embd=64, n_head=4, n_layer=1, vocab_size=100, n_positions=64, use_cache=False
    )
    model = transformers.GPT2Model(cfg).eval()
    opt = anyshape.optimize(model, (torch.randint(0, 100, (2, 7)),))
    (cluster,) = opt.report.clusters
    described = cluster.compiled.native.kernel_descriptions
    transposes = [d for d in described if "transpose" in d.split("<-")[0]]
    assert len(transposes) == 1, described
    for b, s in [(1, 1), (3, 9), (2, 30)]:
        ids = torch.randint(0, 100, (b, s))
        torch.testing.assert_close(
            opt(ids).last_hidden_state, model(ids).last_hidden_state, rtol=1e-4, atol=1e-4
        )


class ResidualBlock(torch.nn.Module):
    """conv-BN-ReLU, a grouped conv-BN, and a projection shortcut closing the block."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)
        self.b2 = torch.nn.BatchNorm2d(8)
        self.short = torch.nn.Conv2d(4, 8, 1, stride=1, bias=False)
        self.bs = torch.nn.BatchNorm2d(8)
        for bn in (self.b1, self.b2, self.bs):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.bs(self.short(x)))


def test_convolution_runs_its_batch_norm_and_relu_as_an_epilogue(monkeypatch):
    """Each image's conv output gets BN + ReLU while in cache; the closing add reads two
    convolutions, and only the later one hosts it. Shapes cover the per-image GEMMs,
    the batched GEMM of small images (under 256 positions, batch > 1) and batch 1.
    Channels first throughout (the channels-last layout pass: ``test_channels_last``)."""
    monkeypatch.setenv("ANYSHAPE_DNNL_CONV", "spatial")
    model = ResidualBlock().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 4, 9, 9),))
    (cluster,) = opt.report.clusters
    described = cluster.compiled.native.kernel_descriptions
    convs = [d for d in described if d.startswith("im2col + GEMM")]
    assert len(convs) == 3, described
    assert sum("+ epilogue" in d for d in convs) == 2, described
    assert not any(d.startswith("loop: max") for d in described), described
    with torch.no_grad():
        for shape in [(1, 4, 5, 5), (3, 4, 7, 9), (2, 4, 20, 17), (1, 4, 31, 30), (4, 4, 1, 1)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
