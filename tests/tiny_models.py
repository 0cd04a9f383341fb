"""Small models shared by the tests: transformers models with random weights, a module around a function."""

from __future__ import annotations

import torch
import transformers


def tiny_bert(vocab_size: int = 50, **config) -> transformers.BertModel:
    """A one-layer BERT (hidden 32, 2 heads) in eval mode; ``config`` overrides fields,
    ``add_pooling_layer`` is passed to the model."""
    pooling = config.pop("add_pooling_layer", True)
    cfg = transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
        **config,
    )
    return transformers.BertModel(cfg, add_pooling_layer=pooling).eval()


class Fn(torch.nn.Module):
    """A module whose forward is the function it holds."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
