"""The check of a model the model cache restored, on a smaller example first.

Sits in plugin mode's warm start (``api.optimize``, after ``model_cache.restore``).
A restored model skipped capture, so its entry is checked against eager on the
user's example before it is returned: that is what catches an entry its key could
not tell from the model (code edited outside the files the key digests). The check
asks whether the entry holds the model's program, not whether it is fast at the
example's sizes; on the example as given it costs a full call of each (BERT-base
at 2 x 16 tokens: 0.1-0.15 s, a third of a warm start).

So the check runs first on the example cut down: each dim an input shows as one
symbol of its own (a batch, a sequence, an image side) cut to ``CHECK_SIZE`` where
the example's is larger and the compiled model's range and guards for it allow
that size (checked by its own prologue's binder). Symbols in any other dim (``s0 +
1``, a product) keep the example's size, so no relation between inputs is broken.
Agreement there accepts the entry; anything else (no dim to cut, a model that
refuses the smaller inputs, a disagreement) leaves the decision to the example as
given, so an entry is only ever dropped on the evidence a cold compile's check
would use.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ..errors import InputError
from ..frontends.torch.examples import agrees_with_eager, flatten_like

CHECK_SIZE = 2  # (2, not 1: a size of 1 broadcasts, and could hide a wrong layout)


def restored_agrees_with_eager(model, module, direct, in_spec, args, kwargs) -> bool:
    """Whether the restored ``module`` computes what ``model`` does: on
    ``smaller_example`` where one exists and both run it alike, else on the example."""
    smaller = smaller_example(direct.prologue.binder, in_spec, args, kwargs)
    if smaller is not None:
        try:
            if agrees_with_eager(model, module, *smaller):
                return True
        except Exception:  # the model refuses the smaller inputs: the example decides
            pass
    return agrees_with_eager(model, module, args, kwargs)


def smaller_example(binder, in_spec, args, kwargs) -> tuple[tuple, dict] | None:
    """The example with each dim of a symbol that no other kind of dim uses narrowed
    to ``CHECK_SIZE``; None where nothing is cut or ``binder`` (the compiled model's
    prologue) refuses the result."""
    flat = flatten_like(args, kwargs, in_spec)
    if flat is None or not all(isinstance(t, torch.Tensor) for t in flat):
        return None
    try:
        env = binder.bind([tuple(t.shape) for t in flat])
    except InputError:
        return None
    plain, other = set(), set()
    for spec in binder.specs:
        for dim in spec.shape:
            if isinstance(dim, int):
                continue
            (plain if dim.is_symbol else other).update(dim.free_symbols)
    cut = {}
    for sym in plain - other:
        lo, _ = binder.store.ranges.get(sym, (0, None))
        size = max(lo, CHECK_SIZE)
        if env[sym] > size:
            cut[sym] = size
    if not cut:
        return None
    smaller = []
    for spec, t in zip(binder.specs, flat):
        for d, dim in enumerate(spec.shape):
            if not isinstance(dim, int) and dim.is_symbol and dim.symbol_name in cut:
                t = t.narrow(d, 0, cut[dim.symbol_name])
        smaller.append(t.contiguous())
    try:
        binder.bind([tuple(t.shape) for t in smaller])
    except InputError:  # a guard or range of the compiled model refuses the sizes
        return None
    args_, kwargs_ = pytree.tree_unflatten(smaller, in_spec)
    return tuple(args_), dict(kwargs_)
