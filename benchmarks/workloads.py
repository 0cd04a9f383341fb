"""Benchmark workloads: models and memory-bound micrographs, each with a seeded stream of shapes.

Sits at the bottom of ``benchmarks``: the runner asks ``build(name, quick,
seed)`` for a model (transformers configs with random weights, no download,
eval mode, float32) and ``stream(...)`` for the request shapes. A shape is
``(batch, seq)`` for text, ``(batch, pixels)`` for square images, ``(batch,
samples)`` for audio (16 kHz waveforms) and ``(rows,)`` for 2-D micrographs; ``inputs(shape)`` makes the keyword inputs of
one request, seeded by the shape so every backend sees the same tensors.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import transformers

HIDDEN = 768

# Inclusive ranges of each dim of a request shape, per kind: (batch, seq), (batch, pixels),
# (batch, samples), (rows,).
FULL_RANGES = {
    "text": [(1, 8), (8, 512)],
    "image": [(1, 4), (160, 320)],
    "audio": [(1, 4), (16_000, 80_000)],  # 1-5 s at 16 kHz
    "rows": [(1, 4096)],
}
QUICK_RANGES = {
    "text": [(1, 4), (8, 64)],
    "image": [(1, 2), (32, 64)],
    "audio": [(1, 2), (1_600, 4_000)],
    "rows": [(1, 256)],
}
TEXT_EXAMPLE = (2, 16)  # the shape anyshape and the ONNX exporter compile from
ROWS_EXAMPLE = (16,)
QUICK = {  # one layer, 64 wide: the --quick configs
    "bert": dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=128),
    "gpt2": dict(n_layer=1, n_embd=64, n_head=4, bos_token_id=0, eos_token_id=0),
    "t5": dict(num_layers=1, num_decoder_layers=1, d_model=64, d_kv=16, num_heads=4, d_ff=128),
    "vit": dict(
        num_hidden_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=64,  # not the example's size: ViT skips interpolation at its config size
        patch_size=8,
    ),
    "resnet": dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]),
    "segformer": dict(depths=[1, 1, 1, 1], decoder_hidden_size=64),
    "wav2vec2": dict(
        num_hidden_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    ),
}
QUICK_VOCAB = 1000


@dataclass
class Built:
    """One workload ready to run: the model, its input maker and the compile example's shape."""

    model: torch.nn.Module
    inputs: Callable[[tuple[int, ...]], dict[str, torch.Tensor]]
    example: tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "text" | "image" | "rows": which shape stream and plot axis
    bound: str  # "compute" (read against peak GEMM) | "memory" (against copy bandwidth)
    description: str
    factory: Callable[[bool], Built]


def _generator(shape: tuple[int, ...]) -> torch.Generator:
    seed = 0
    for d in shape:
        seed = seed * 100_003 + d
    return torch.Generator().manual_seed(seed)


def _text_inputs(vocab: int, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    b, s = shape
    ids = torch.randint(0, vocab, (b, s), generator=_generator(shape))
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1:
        mask[-1, s - s // 4 :] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask}


def _image_inputs(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    b, px = shape
    return {"pixel_values": torch.randn(b, 3, px, px, generator=_generator(shape))}


def _config(cls, name: str, quick: bool, **fixed):
    """``cls()`` defaults (the full-size model), or the small ``--quick`` config."""
    small = QUICK[name] if quick else {}
    vocab = {"vocab_size": QUICK_VOCAB} if quick and name in ("bert", "gpt2", "t5") else {}
    return cls(**small, **vocab, **fixed)


def _bert(quick: bool) -> Built:
    cfg = _config(transformers.BertConfig, "bert", quick)
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    return Built(model, lambda shape: _text_inputs(cfg.vocab_size, shape), TEXT_EXAMPLE)


def _gpt2(quick: bool) -> Built:
    cfg = _config(transformers.GPT2Config, "gpt2", quick, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg)
    return Built(model, lambda shape: _text_inputs(cfg.vocab_size, shape), TEXT_EXAMPLE)


def _t5(quick: bool) -> Built:
    cfg = _config(transformers.T5Config, "t5", quick, use_cache=False)
    model = transformers.T5Model(cfg)

    def inputs(shape):
        b, s = shape
        out = _text_inputs(cfg.vocab_size, shape)
        dec = _text_inputs(cfg.vocab_size, (b, max(1, s // 4)))["input_ids"]
        return out | {"decoder_input_ids": dec}

    return Built(model, inputs, TEXT_EXAMPLE)


class _ViTAnySize(torch.nn.Module):
    """ViT that interpolates its position embeddings, so any image size is valid."""

    def __init__(self, cfg: transformers.ViTConfig):
        super().__init__()
        self.vit = transformers.ViTModel(cfg, add_pooling_layer=False)

    def forward(self, pixel_values):
        return self.vit(pixel_values, interpolate_pos_encoding=True).last_hidden_state


def _image_example(quick: bool) -> tuple[int, int]:
    """Batch 2 at the smallest image size of the stream."""
    return (2, (QUICK_RANGES if quick else FULL_RANGES)["image"][1][0])


def _vit(quick: bool) -> Built:
    cfg = _config(transformers.ViTConfig, "vit", quick)
    return Built(_ViTAnySize(cfg), _image_inputs, _image_example(quick))


def _resnet(quick: bool) -> Built:
    cfg = _config(transformers.ResNetConfig, "resnet", quick)
    return Built(transformers.ResNetModel(cfg), _image_inputs, _image_example(quick))


class _SegmentationLogits(torch.nn.Module):
    """SegFormer's per-pixel class scores (its decode head upsamples every stage bilinearly)."""

    def __init__(self, cfg: transformers.SegformerConfig):
        super().__init__()
        self.segformer = transformers.SegformerForSemanticSegmentation(cfg)

    def forward(self, pixel_values):
        return self.segformer(pixel_values=pixel_values).logits


def _segformer(quick: bool) -> Built:
    cfg = _config(transformers.SegformerConfig, "segformer", quick)
    return Built(_SegmentationLogits(cfg), _image_inputs, _image_example(quick))


def _audio_inputs(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    b, samples = shape
    return {"input_values": torch.randn(b, samples, generator=_generator(shape))}


class _SpeechFeatures(torch.nn.Module):
    """wav2vec 2.0's contextual features of a raw waveform (a convolutional feature
    encoder, a grouped positional convolution under weight norm, a transformer)."""

    def __init__(self, cfg: transformers.Wav2Vec2Config):
        super().__init__()
        self.wav2vec2 = transformers.Wav2Vec2Model(cfg)

    def forward(self, input_values):
        return self.wav2vec2(input_values=input_values).last_hidden_state


def _wav2vec2(quick: bool) -> Built:
    cfg = _config(transformers.Wav2Vec2Config, "wav2vec2", quick)
    example = (2, (QUICK_RANGES if quick else FULL_RANGES)["audio"][1][0])
    return Built(_SpeechFeatures(cfg), _audio_inputs, example)


class _FirstOutput(torch.nn.Module):
    """A BertLayer returning its hidden states as one tensor."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        out = self.layer(hidden_states)
        return out[0] if isinstance(out, tuple) else out


def _bert_layer(quick: bool) -> Built:
    cfg = transformers.BertConfig()  # one full-size layer even in quick mode: it is the unit
    layer = _FirstOutput(transformers.models.bert.modeling_bert.BertLayer(cfg))

    def inputs(shape):
        return {"hidden_states": torch.randn(*shape, cfg.hidden_size, generator=_generator(shape))}

    return Built(layer, inputs, TEXT_EXAMPLE)


class LayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)

    def forward(self, x):
        return self.norm(x)


class Softmax(torch.nn.Module):
    def forward(self, x):
        return x.softmax(dim=-1)


class BiasGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(4 * HIDDEN))

    def forward(self, x):
        return F.gelu(x + self.bias)


class AddLayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)

    def forward(self, x, residual):
        return self.norm(x + residual)


class MaskScaleSoftmax(torch.nn.Module):
    """Attention probabilities: scores * 1/sqrt(d) + additive mask, softmax over keys."""

    def forward(self, scores, mask):
        return (scores * 0.125 + mask).softmax(dim=-1)


def _rows(module: torch.nn.Module, names: tuple[str, ...], width: int) -> Built:
    def inputs(shape):
        g = _generator(shape)
        return {n: torch.randn(shape[0], width, generator=g) for n in names}

    return Built(module, inputs, ROWS_EXAMPLE)


def _attention_softmax(quick: bool) -> Built:
    heads = 12

    def inputs(shape):
        b, s = shape
        g = _generator(shape)
        mask = torch.zeros(b, 1, 1, s)
        if b > 1:
            mask[-1, ..., s - s // 4 :] = -1e4
        return {"scores": torch.randn(b, heads, s, s, generator=g), "mask": mask}

    return Built(MaskScaleSoftmax(), inputs, TEXT_EXAMPLE)


WORKLOADS = {
    w.name: w
    for w in [
        Workload("bert", "text", "compute", "BERT-base (BertModel, BertConfig() defaults)", _bert),
        Workload(
            "gpt2", "text", "compute", "GPT-2 small (GPT2LMHeadModel, use_cache=False)", _gpt2
        ),
        Workload(
            "t5", "text", "compute", "T5-small encoder-decoder forward (use_cache=False)", _t5
        ),
        Workload("vit", "image", "compute", "ViT-base/16 (interpolated position embeddings)", _vit),
        Workload("resnet", "image", "compute", "ResNet-50 (ResNetConfig() defaults)", _resnet),
        Workload("segformer", "image", "compute", "SegFormer-B0 semantic segmentation", _segformer),
        Workload("wav2vec2", "audio", "compute", "wav2vec 2.0 base (Wav2Vec2Model)", _wav2vec2),
        Workload("bert_layer", "text", "compute", "one BertLayer (hidden 768)", _bert_layer),
        Workload(
            "layernorm",
            "rows",
            "memory",
            "LayerNorm over 768",
            lambda q: _rows(LayerNorm(), ("x",), HIDDEN),
        ),
        Workload(
            "softmax",
            "rows",
            "memory",
            "softmax over the last dim (768)",
            lambda q: _rows(Softmax(), ("x",), HIDDEN),
        ),
        Workload(
            "bias_gelu",
            "rows",
            "memory",
            "GELU(x + bias), width 3072",
            lambda q: _rows(BiasGelu(), ("x",), 4 * HIDDEN),
        ),
        Workload(
            "add_layernorm",
            "rows",
            "memory",
            "LayerNorm(x + residual), width 768",
            lambda q: _rows(AddLayerNorm(), ("x", "residual"), HIDDEN),
        ),
        Workload(
            "attn_softmax",
            "text",
            "memory",
            "softmax(scores/8 + mask), 12 heads",
            _attention_softmax,
        ),
    ]
}


# --quick's default selection: the full list takes over 10 minutes on a loaded 2-core machine,
# most of it Inductor compiling; add the rest with --workloads all.
QUICK_WORKLOADS = [
    "bert",
    "bert_layer",
    "layernorm",
    "softmax",
    "bias_gelu",
    "add_layernorm",
    "attn_softmax",
]


def build(name: str, quick: bool, seed: int) -> Built:
    """The workload ``name`` with weights drawn from ``seed``, in eval mode."""
    torch.manual_seed(seed)
    built = WORKLOADS[name].factory(quick)
    built.model.eval()
    return built


def stream(kind: str, n: int, seed: int, quick: bool, ranges=None) -> list[tuple[int, ...]]:
    """``n`` seeded request shapes of ``kind`` (within ``ranges`` when given)."""
    default = (QUICK_RANGES if quick else FULL_RANGES)[kind]
    if ranges is not None and len(ranges) != len(default):
        raise ValueError(f"{kind} shapes have {len(default)} dims, got ranges {ranges}")
    ranges = ranges or default
    rng = random.Random(seed)
    return [tuple(rng.randint(lo, hi) for lo, hi in ranges) for _ in range(n)]


def size(kind: str, shape: tuple[int, ...]) -> int:
    """Tokens (batch x seq), pixels (batch x height x width), samples (batch x length) or
    rows of one request."""
    if kind == "image":
        return shape[0] * shape[1] * shape[1]
    return shape[0] * shape[1] if kind in ("text", "audio") else shape[0]


SIZE_LABEL = {
    "text": "tokens (batch × sequence)",
    "image": "pixels (batch × height × width)",
    "audio": "samples (batch × length)",
    "rows": "rows",
}
