"""Kernel families and small models for shape tests: one compile, any sizes, eager's answer.

Shared by ``tests/test_size_zero.py`` (size 0 and 1 in every dim position),
``tests/test_shape_fuzz.py`` (hypothesis-drawn shapes) and ``scripts/fuzz_shapes.py``
(long runs, one child process per family). A family is a module, the number of free
sizes it takes, and a function turning those sizes into inputs; ``check`` runs one draw
against PyTorch eager: eager's result, or, where eager raises, an exception (never a crash).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

import anyshape

EXAMPLE_SIZES = (2, 3, 5, 4)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    make_model: Callable[[], torch.nn.Module]
    n_sizes: int
    make_inputs: Callable[[Sequence[int]], tuple]
    dtype: torch.dtype = torch.float32
    rtol: float = 1e-4
    atol: float = 1e-4
    example: tuple[int, ...] = ()

    def example_sizes(self) -> tuple[int, ...]:
        return self.example or EXAMPLE_SIZES[: self.n_sizes]


class Refused(AssertionError):
    """anyshape refused a shape eager accepts (a guard or constraint, not a kernel)."""


class Mismatch(AssertionError):
    """anyshape returned an answer that is not eager's."""


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=_g(seed)).to(dtype)


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _fn(f):
    return lambda: _Lambda(f)


def _pointwise(x):
    return torch.sin(x) * 2 + torch.relu(x - 0.5)


def _broadcast(x, row, col):
    return x * row + col


def _views(x):
    a, b, c = x.shape
    y = torch.sin(x).transpose(1, 2).reshape(a, c * b)
    return y * 2, (x.reshape(a * b, c).t() + 1).reshape(c, a, b).sum(1)


def _reductions(x):
    return x.sum(-1), x.mean(0), x.prod(1), x.var(-1), x.sum((0, 2)), x.amax(0)


def _argmax(x):
    return x.argmax(-1), x.amin(-1)


def _stitch(x):
    return torch.softmax(x, -1), F.layer_norm(x, x.shape[-1:]), F.log_softmax(x, -1)


class _LayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x)


def _pools(x):
    return F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.max_pool2d(x, 3, 2, 1, ceil_mode=True)


def _pool1d_indices(x):
    return F.max_pool1d(x, 3, ceil_mode=True, return_indices=True)


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.strided = torch.nn.Conv2d(3, 2, 2, stride=2)

    def forward(self, x):
        return self.conv(x), self.strided(x)


def _gemm(a, b, c):
    return a @ b, torch.bmm(c, c.transpose(1, 2))


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(x)


class _Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, ids, x, idx):
        return self.emb(ids), torch.gather(x, 1, idx)


class BertBlock(torch.nn.Module):
    """LayerNorm, masked multi-head attention and a GELU MLP, with residuals."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
        att = torch.softmax(scores, -1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ConvBlock(torch.nn.Module):
    """Convolution, batch norm, ReLU and a residual add, then a max pool."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.bn(self.conv(x))) + x, 2)


def _mask(b, s):
    m = (torch.rand(b, s, generator=_g(1)) > 0.3).float()
    if s:
        m[:, 0] = 1.0
    return m


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("pointwise", _fn(_pointwise), 3, lambda d: (_randn(*d),)),
        Family(
            "broadcast",
            _fn(_broadcast),
            3,
            lambda d: (_randn(*d), _randn(d[2], seed=1), _randn(d[0], 1, 1, seed=2)),
        ),
        Family("views", _fn(_views), 3, lambda d: (_randn(*d),)),
        Family("reduction", _fn(_reductions), 3, lambda d: (_randn(*d),), rtol=1e-3),
        Family("argmax", _fn(_argmax), 2, lambda d: (_randn(*d),)),
        Family("stitch", _fn(_stitch), 3, lambda d: (_randn(*d),)),
        Family("layernorm", _LayerNorm, 2, lambda d: (_randn(d[0], d[1], 8),)),
        Family("pool", _fn(_pools), 3, lambda d: (_randn(d[0], 3, d[1], d[2]),), example=(2, 6, 7)),
        Family(
            "pool1d_indices",
            _fn(_pool1d_indices),
            2,
            lambda d: (_randn(d[0], 3, d[1]),),
            # An example length equal to the window (3) is captured as length <= 3 and a
            # longer input compiles a second graph (a capture specialization, open).
            example=(2, 7),
        ),
        Family("conv", _Conv, 3, lambda d: (_randn(d[0], 3, d[1], d[2]),), example=(2, 6, 7)),
        Family(
            "gemm",
            _fn(_gemm),
            4,
            lambda d: (
                _randn(d[0], d[1]),
                _randn(d[1], d[2], seed=1),
                _randn(d[3], d[0], d[1], seed=2),
            ),
        ),
        Family("linear", _Linear, 2, lambda d: (_randn(d[0], d[1], 8),)),
        Family(
            "gather",
            _Embedding,
            3,
            lambda d: (
                torch.randint(0, 50, (d[0], d[1]), generator=_g(3)),
                _randn(d[0], d[1]),
                torch.randint(0, max(d[1], 1), (d[0], d[2] if d[1] else 0), generator=_g(4)),
            ),
        ),
        Family(
            "bert_block",
            BertBlock,
            2,
            lambda d: (_randn(d[0], d[1], 16), _mask(d[0], d[1])),
            rtol=1e-3,
            atol=1e-3,
        ),
        Family(
            "conv_block",
            ConvBlock,
            3,
            lambda d: (_randn(d[0], 4, d[1], d[2]),),
            example=(2, 6, 7),
            rtol=1e-3,
            atol=1e-3,
        ),
    ]
}


def compile_family(family: Family):
    model = family.make_model().eval()
    opt = anyshape.optimize(model, family.make_inputs(family.example_sizes()))
    return model, opt


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(family: Family, model, opt, sizes: Sequence[int]) -> None:
    """Run one draw; raise Mismatch/Refused when anyshape does not do what eager does."""
    inputs = family.make_inputs(sizes)
    try:
        with torch.no_grad():
            want = _flat(model(*inputs))
    except Exception as eager_error:  # eager refuses: anyshape must raise too (not crash)
        try:
            got = opt(*inputs)
        except Exception:
            return
        raise Mismatch(
            f"{family.name} {list(sizes)}: eager raised {eager_error!r}, anyshape {got}"
        ) from None
    try:
        got = _flat(opt(*inputs))
    except anyshape.InputError as e:
        raise Refused(f"{family.name} {list(sizes)}: {e}") from e
    except Exception as e:
        raise Mismatch(f"{family.name} {list(sizes)}: anyshape raised {e!r}") from e
    if len(got) != len(want):
        raise Mismatch(f"{family.name} {list(sizes)}: {len(got)} outputs, eager {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(
                g, w, rtol=family.rtol, atol=family.atol, equal_nan=True, check_device=False
            )
        except AssertionError as e:
            raise Mismatch(f"{family.name} {list(sizes)} output {i}: {e}") from None
