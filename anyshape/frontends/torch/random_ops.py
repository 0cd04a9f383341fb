"""Training-mode dropout as compiled code: a counter-based hash of a per-call seed.

Sits in the torch frontend before clustering (``plugin/compile.py`` calls
``seed_dropout`` on every graph it compiles). Eager dropout draws its mask from
torch's generator one element at a time, which compiled code cannot share. So
``dropout``/``native_dropout`` in training mode become ``anyshape::dropout(x, p,
seed, stream)``: ``seed`` is one ``randint`` from torch's default generator per
call of the graph (``torch.manual_seed`` makes a run repeatable), ``stream``
tells the graph's dropouts apart, and every element's keep decision is a hash
of (seed, stream, element index) — computed in the generated loop with the rest
of the fused kernel. The mask has eager's distribution (each element kept with
probability 1 - p, independently), not eager's exact stream.

The hash is the same in the IR lowering (``aten/random.py``) and in the op's
PyTorch kernel here (used where the op runs in PyTorch), so both give the same
mask bit for bit.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

_M32 = 0xFFFFFFFF
# A 32-bit integer finalizer (xor-shift-multiply rounds), good enough to make
# consecutive counters look independent.
HASH_ROUNDS = ((16, 0x7FEB352D), (15, 0x846CA68B))
HASH_LAST_SHIFT = 16
GOLDEN = 0x9E3779B9


def _hash32_torch(x: torch.Tensor) -> torch.Tensor:
    """The finalizer on int64 tensors holding 32-bit values (products wrap; low bits kept)."""
    for shift, mult in HASH_ROUNDS:
        x = ((x ^ (x >> shift)) * mult) & _M32
    return x ^ (x >> HASH_LAST_SHIFT)


def keep_mask_torch(shape, p: float, seed: torch.Tensor, stream: int) -> torch.Tensor:
    """The keep mask ``anyshape::dropout`` computes, in PyTorch ops."""
    index = torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)
    key = _hash32_torch((seed.to(torch.int64) + stream * GOLDEN) & _M32)
    h = _hash32_torch(((index >> 32) ^ key) & _M32)
    h = _hash32_torch((index & _M32) ^ h)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24)) >= p


def _define_op() -> None:
    lib = torch.library.Library("anyshape", "FRAGMENT")  # noqa: TOR901 (kept alive below)
    lib.define("dropout(Tensor x, float p, Tensor seed, int stream) -> (Tensor, Tensor)")

    def cpu(x, p, seed, stream):
        keep = keep_mask_torch(x.shape, p, seed, stream)
        return x * keep * (1.0 / (1.0 - p)), keep

    def meta(x, p, seed, stream):
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)

    lib.impl("dropout", cpu, "CPU")
    lib.impl("dropout", meta, "Meta")
    torch.library.register_fake("anyshape::dropout", meta, lib=lib)
    _LIBRARIES.append(lib)


_LIBRARIES: list = []
if not hasattr(torch.ops.anyshape, "dropout"):
    _define_op()


def _is_train_dropout(n: fx.Node) -> bool:
    aten = torch.ops.aten
    if n.op != "call_function" or n.target not in (
        aten.native_dropout.default,
        aten.dropout.default,
    ):
        return False
    p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p")
    train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train")
    x = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
    return (
        bool(train)
        and isinstance(p, float)
        and 0 < p < 1
        and isinstance(x, torch.Tensor)
        and x.dtype.is_floating_point
    )


def seed_dropout(gm: fx.GraphModule) -> int:
    """Rewrite ``gm``'s training-mode dropouts to ``anyshape::dropout``; how many there were."""
    drops = [n for n in gm.graph.nodes if _is_train_dropout(n)]
    if not drops:
        return 0
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        seed = gm.graph.call_function(
            torch.ops.aten.randint.low,
            (0, 1 << 31, []),
            {"dtype": torch.int64, "device": torch.device("cpu")},
        )
    seed.meta["val"] = torch.empty((), dtype=torch.int64)
    for stream, n in enumerate(drops):
        x, p = n.args[0], float(n.args[1] if len(n.args) > 1 else n.kwargs["p"])
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(torch.ops.anyshape.dropout.default, (x, p, seed, stream))
        xv = x.meta["val"]
        new.meta = dict(n.meta)
        new.meta["val"] = (xv, xv.new_empty(xv.shape, dtype=torch.bool))
        if n.target is torch.ops.aten.native_dropout.default:
            n.replace_all_uses_with(new)
        else:
            with gm.graph.inserting_after(new):
                out = gm.graph.call_function(operator.getitem, (new, 0))
            out.meta = dict(n.meta)
            n.replace_all_uses_with(out)
        gm.graph.erase_node(n)
    return len(drops)  # (the graph only: ``assemble`` regenerates the module's Python once)
