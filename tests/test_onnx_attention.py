"""The ONNX frontend's attention family (``frontends/onnx/attention.py``).

Attention (4-D and 3-D heads, grouped-query, masks, past/present, causal,
softcap, the 4th output, nonpad_kv_seqlen), RotaryEmbedding, RMSNormalization,
GroupNormalization, InstanceNormalization and LRN, each in a small model with
symbolic dims: compiled once, run at several shapes (a size-1 dim included) and
compared with onnxruntime, asserting exactly one compilation.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_helpers
import pytest
from onnx import TensorProto, helper
from onnx_helpers import init, run_against_ort, vinfo

import anyshape
from anyshape.errors import InputError, UnsupportedError
from anyshape.frontends.onnx import api as onnx_api

F32, F16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL


make_model = functools.partial(onnx_helpers.make_model, opset=23)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --- Attention ---------------------------------------------------------------------------------


def test_attention_4d_causal_symbolic_lengths():
    rng = np.random.default_rng(0)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1)
    model = make_model(
        [node],
        [vinfo("Q", ["b", 2, "s", 8]), vinfo("K", ["b", 2, "s", 8]), vinfo("V", ["b", 2, "s", 8])],
        [vinfo("Y", ["b", 2, "s", 8])],
    )
    cases = [{n: rand(rng, b, 2, s, 8) for n in "QKV"} for b, s in ((2, 5), (1, 1), (3, 7))]
    run_against_ort(model, cases)


def test_attention_3d_gqa_past_present_and_bool_mask():
    """3-D inputs, 4 query heads over 2 KV heads, a cache, a boolean mask over the total."""
    rng = np.random.default_rng(1)
    node = helper.make_node(
        "Attention",
        ["Q", "K", "V", "M", "PK", "PV"],
        ["Y", "K2", "V2"],
        q_num_heads=4,
        kv_num_heads=2,
    )
    model = make_model(
        [node],
        [
            vinfo("Q", ["b", "s", 16]),
            vinfo("K", ["b", "s", 8]),
            vinfo("V", ["b", "s", 12]),
            vinfo("M", ["s", "t"], BOOL),
            vinfo("PK", ["b", 2, "p", 4]),
            vinfo("PV", ["b", 2, "p", 6]),
        ],
        [vinfo("Y", None), vinfo("K2", None), vinfo("V2", None)],
    )
    cases = []
    for b, s, p in ((2, 3, 4), (1, 1, 1), (1, 4, 2)):
        mask = rng.random((s, s + p)) > 0.3
        mask[:, 0] = True  # every query attends something (onnxruntime gives NaN otherwise)
        feeds = {"Q": rand(rng, b, s, 16), "K": rand(rng, b, s, 8), "V": rand(rng, b, s, 12)}
        feeds.update(M=mask, PK=rand(rng, b, 2, p, 4), PV=rand(rng, b, 2, p, 6))
        cases.append(feeds)
    run_against_ort(model, cases)


def test_attention_causal_with_past_is_offset():
    """With a cache, query i attends keys up to past + i (a bottom-right causal mask)."""
    rng = np.random.default_rng(2)
    node = helper.make_node(
        "Attention", ["Q", "K", "V", "", "PK", "PV"], ["Y", "K2", "V2"], is_causal=1
    )
    dims = {"Q": ["b", 2, "s", 4], "K": ["b", 2, "s", 4], "V": ["b", 2, "s", 4]}
    dims.update(PK=["b", 2, "p", 4], PV=["b", 2, "p", 4])
    model = make_model(
        [node],
        [vinfo(n, d) for n, d in dims.items()],
        [vinfo("Y", None), vinfo("K2", None), vinfo("V2", None)],
    )
    cases = []
    for b, s, p in ((1, 3, 5), (2, 1, 6), (1, 4, 1)):
        feeds = {n: rand(rng, b, 2, s, 4) for n in "QKV"}
        feeds.update(PK=rand(rng, b, 2, p, 4), PV=rand(rng, b, 2, p, 4))
        cases.append(feeds)
    run_against_ort(model, cases)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_float_mask_softcap_and_qk_output(mode):
    rng = np.random.default_rng(3 + mode)
    node = helper.make_node(
        "Attention",
        ["Q", "K", "V", "M"],
        ["Y", "", "", "QK"],
        softcap=2.0,
        scale=0.3,
        qk_matmul_output_mode=mode,
    )
    model = make_model(
        [node],
        [
            vinfo("Q", ["b", 3, "s", 4]),
            vinfo("K", ["b", 3, "t", 4]),
            vinfo("V", ["b", 3, "t", 5]),
            vinfo("M", ["b", 1, "s", "t"]),
        ],
        [vinfo("Y", None), vinfo("QK", None)],
    )
    cases = []
    for b, s, t in ((2, 3, 5), (1, 1, 1), (1, 2, 6)):
        feeds = {"Q": rand(rng, b, 3, s, 4), "K": rand(rng, b, 3, t, 4)}
        feeds.update(V=rand(rng, b, 3, t, 5), M=rand(rng, b, 1, s, t))
        cases.append(feeds)
    run_against_ort(model, cases)


def test_attention_fp16_gqa_causal():
    rng = np.random.default_rng(7)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1)
    model = make_model(
        [node],
        [vinfo("Q", ["b", 4, "s", 8], F16), vinfo("K", ["b", 1, "s", 8], F16)]
        + [vinfo("V", ["b", 1, "s", 8], F16)],
        [vinfo("Y", None, F16)],
    )
    cases = []
    for b, s in ((2, 4), (1, 1)):
        feeds = {"Q": rand(rng, b, 4, s, 8, dtype=np.float16)}
        feeds.update(K=rand(rng, b, 1, s, 8, dtype=np.float16))
        feeds["V"] = rand(rng, b, 1, s, 8, dtype=np.float16)
        cases.append(feeds)
    run_against_ort(model, cases, rtol=5e-3, atol=5e-3)


def _reference_nonpad(q, k, v, lens):
    """Causal attention over a static cache: query i of batch b attends j <= lens[b] - S + i
    and j < lens[b]; a row with no key is zero."""
    b, h, s, d = q.shape
    t = k.shape[2]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    allowed = (j <= i + (lens[:, None, None] - s)) & (j < lens[:, None, None])
    scores = np.where(allowed[:, None], scores, -np.inf)
    m = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isinf(m), 0, m))
    p = e / np.maximum(e.sum(-1, keepdims=True), 1e-30)
    return p @ v


def test_attention_nonpad_kv_seqlen_opset24():
    """Per-batch valid lengths of an external cache (checked against NumPy: onnxruntime's
    CPU kernel for this input is not complete)."""
    rng = np.random.default_rng(8)
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "L"], ["Y"], is_causal=1)
    model = make_model(
        [node],
        [vinfo("Q", ["b", 2, "s", 4]), vinfo("K", ["b", 2, "t", 4]), vinfo("V", ["b", 2, "t", 4])]
        + [vinfo("L", ["b"], I64)],
        [vinfo("Y", None)],
        opset=24,
    )
    before = anyshape.stats()["compilations"]
    module = onnx_api.compile(model)
    for b, s, t, lens in ((2, 1, 6, [3, 6]), (1, 3, 5, [4]), (3, 2, 4, [1, 2, 4])):
        q, k, v = rand(rng, b, 2, s, 4), rand(rng, b, 2, t, 4), rand(rng, b, 2, t, 4)
        lens = np.array(lens, dtype=np.int64)
        (y,) = module(Q=q, K=k, V=v, L=lens)
        np.testing.assert_allclose(y, _reference_nonpad(q, k, v, lens), rtol=1e-4, atol=1e-5)
    assert anyshape.stats()["compilations"] - before == 1
    assert np.all(y[0, :, 0] == 0)  # lens 1 - S 2: the first query sees no key


def test_attention_short_mask_is_padded_long_mask_refused():
    """A mask shorter than the keys masks the rest (ONNX's reference; onnxruntime refuses
    it); a longer one breaks a guard, named at call time."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(9)
    node = helper.make_node("Attention", ["Q", "K", "V", "M"], ["Y"])
    model = make_model(
        [node],
        [vinfo("Q", [1, 2, "s", 4]), vinfo("K", [1, 2, "t", 4]), vinfo("V", [1, 2, "t", 4])]
        + [vinfo("M", ["s", "m"], BOOL)],
        [vinfo("Y", None)],
    )
    module = onnx_api.compile(model)
    reference = ReferenceEvaluator(model)
    for s, t, m in ((3, 5, 2), (1, 4, 4), (2, 3, 1)):
        feeds = {"Q": rand(rng, 1, 2, s, 4), "K": rand(rng, 1, 2, t, 4)}
        feeds.update(V=rand(rng, 1, 2, t, 4), M=rng.random((s, m)) > 0.5)
        (want,) = reference.run(None, feeds)
        np.testing.assert_allclose(module(**feeds)[0], want, rtol=1e-5, atol=1e-6)
    feeds["M"] = np.ones((2, 4), dtype=bool)
    with pytest.raises(InputError, match="attn_mask"):
        module(**feeds)


def test_attention_symbolic_heads_cannot_group():
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"])
    model = make_model(
        [node],
        [vinfo("Q", [1, "h", 3, 4]), vinfo("K", [1, "g", 3, 4]), vinfo("V", [1, "g", 3, 4])],
        [vinfo("Y", None)],
    )
    with pytest.raises(UnsupportedError, match="heads"):
        onnx_api.compile(model)


# --- RotaryEmbedding -------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_4d_position_ids(interleaved, rotary_dim):
    rng = np.random.default_rng(10)
    node = helper.make_node(
        "RotaryEmbedding",
        ["X", "C", "S", "P"],
        ["Y"],
        interleaved=interleaved,
        rotary_embedding_dim=rotary_dim,
    )
    half = (rotary_dim or 8) // 2
    model = make_model(
        [node],
        [vinfo("X", ["b", 2, "s", 8]), vinfo("P", ["b", "s"], I64)],
        [vinfo("Y", None)],
        [init("C", rand(rng, 16, half)), init("S", rand(rng, 16, half))],
    )
    cases = [
        {"X": rand(rng, b, 2, s, 8), "P": rng.integers(0, 16, (b, s)).astype(np.int64)}
        for b, s in ((2, 3), (1, 1), (1, 5))
    ]
    run_against_ort(model, cases)


def test_rotary_embedding_3d_without_position_ids():
    rng = np.random.default_rng(11)
    node = helper.make_node("RotaryEmbedding", ["X", "C", "S"], ["Y"], num_heads=3, interleaved=1)
    model = make_model(
        [node],
        [vinfo("X", ["b", "s", 12]), vinfo("C", ["b", "s", 2]), vinfo("S", ["b", "s", 2])],
        [vinfo("Y", None)],
    )
    cases = [
        {"X": rand(rng, b, s, 12), "C": rand(rng, b, s, 2), "S": rand(rng, b, s, 2)}
        for b, s in ((2, 4), (1, 1))
    ]
    run_against_ort(model, cases)


# --- normalizations ---------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis):
    rng = np.random.default_rng(12)
    node = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=axis, epsilon=1e-3)
    model = make_model(
        [node],
        [vinfo("X", ["b", 3, 6])],
        [vinfo("Y", None)],
        [init("W", rand(rng, 6))],
    )
    cases = [{"X": rand(rng, b, 3, 6)} for b in (4, 1)]
    run_against_ort(model, cases)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(opset):
    rng = np.random.default_rng(13)
    node = helper.make_node("GroupNormalization", ["X", "W", "B"], ["Y"], num_groups=2)
    n = 2 if opset == 18 else 6
    model = make_model(
        [node],
        [vinfo("X", ["n", 6, "h", "w"])],
        [vinfo("Y", None)],
        [init("W", rand(rng, n)), init("B", rand(rng, n))],
        opset=opset,
    )
    cases = [{"X": rand(rng, b, 6, h, w)} for b, h, w in ((2, 3, 4), (1, 1, 5))]
    run_against_ort(model, cases)


def test_instance_normalization_fp16():
    rng = np.random.default_rng(14)
    node = helper.make_node("InstanceNormalization", ["X", "W", "B"], ["Y"], epsilon=1e-4)
    w, b = rand(rng, 3, dtype=np.float16), rand(rng, 3, dtype=np.float16)
    model = make_model(
        [node],
        [vinfo("X", ["n", 3, "l"], F16)],
        [vinfo("Y", None, F16)],
        [init("W", w), init("B", b)],
    )
    cases = [{"X": rand(rng, n, 3, ln, dtype=np.float16)} for n, ln in ((2, 9), (1, 2))]
    run_against_ort(model, cases, rtol=1e-2, atol=1e-2)


def _lrn_reference(x, size, alpha, beta, bias):
    """ONNX's LRN formula: the window over channels is [c - floor((size-1)/2), c + ceil(...)]."""
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size // 2
    sq = np.stack([(x[:, max(0, i - lo) : min(c, i + hi + 1)] ** 2).sum(1) for i in range(c)], 1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    rng = np.random.default_rng(15)
    node = helper.make_node("LRN", ["X"], ["Y"], size=size, alpha=0.01, beta=0.6, bias=1.5)
    model = make_model([node], [vinfo("X", ["n", "c", "h", 3])], [vinfo("Y", None)])
    cases = [{"X": rand(rng, n, c, h, 3)} for n, c, h in ((2, 5, 2), (1, 1, 1), (1, 3, 4))]
    run_against_ort(model, cases)


def test_lrn_even_size_against_formula():
    """onnxruntime refuses an even size; the spec's window is then one longer on the right."""
    rng = np.random.default_rng(16)
    node = helper.make_node("LRN", ["X"], ["Y"], size=4, alpha=0.5, beta=0.75, bias=1.0)
    model = make_model([node], [vinfo("X", ["n", "c", 2])], [vinfo("Y", None)])
    before = anyshape.stats()["compilations"]
    module = onnx_api.compile(model)
    for n, c in ((2, 6), (1, 1), (1, 3)):
        x = rand(rng, n, c, 2)
        (y,) = module(X=x)
        np.testing.assert_allclose(y, _lrn_reference(x, 4, 0.5, 0.75, 1.0), rtol=1e-5, atol=1e-6)
    assert anyshape.stats()["compilations"] - before == 1
