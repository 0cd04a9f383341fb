"""Example inputs as users pass them, and the check of a compiled graph against eager.

Part of the torch frontend, shared by plugin mode (``api.optimize``) and
standalone export: ``split_inputs`` reads ``example_inputs`` (a tuple, a dict,
one tensor, or ``(args, kwargs)``); ``agrees_with_eager`` runs a compiled graph
and the model on the user's own example, to decide whether a capture traced
from widened examples (dims of 0/1 grown to 2) holds for it, or with
``with_random_floats`` whether one with copied repeated blocks does.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if (
        isinstance(example_inputs, tuple)
        and len(example_inputs) == 2
        and isinstance(example_inputs[1], dict)
        and isinstance(example_inputs[0], tuple)
    ):
        return example_inputs[0], example_inputs[1]
    return tuple(example_inputs), {}


def agrees_with_eager(model, gm, args, kwargs, tolerance: float = 1e-3) -> bool:
    """Whether the compiled graph reproduces eager on the user's own example (floating
    outputs within ``tolerance``, relative and absolute)."""
    with torch.no_grad():
        try:
            got = pytree.tree_leaves(gm(*args, **kwargs))
        except Exception:  # any failure on the user's own example means: recapture from it
            return False
        want = pytree.tree_leaves(model(*args, **kwargs))
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
                return False
            if w.is_floating_point() and not torch.allclose(
                g, w, rtol=tolerance, atol=tolerance, equal_nan=True
            ):
                return False
            if not w.is_floating_point() and not torch.equal(g, w):
                return False
    return True


def with_random_floats(args: tuple, kwargs: dict, seed: int = 0) -> tuple[tuple, dict]:
    """The example with each floating tensor replaced by seeded normal values of its shape
    and dtype (other leaves as they are): a comparison of two computations that an
    example of zeros or ones could not tell apart (a scale on a zero input) tells
    them apart here."""
    g = torch.Generator().manual_seed(seed)

    def fresh(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype)
        return v

    return pytree.tree_map(fresh, (tuple(args), dict(kwargs)))


def agrees_on_random_floats(model, gm, args, kwargs, tolerance: float = 1e-3) -> bool:
    """``agrees_with_eager`` on ``with_random_floats`` of the example; on the example as
    given where the model itself refuses those values (a float input used as an index)."""
    try:
        return agrees_with_eager(model, gm, *with_random_floats(args, kwargs), tolerance)
    except Exception:  # raised by the model, not the compiled graph (that one is caught)
        return agrees_with_eager(model, gm, args, kwargs, tolerance)


def flatten_like(args, kwargs, spec) -> list | None:
    """A call's inputs flattened by the example's pytree ``spec`` (``(args, kwargs)``);
    None when they are structured otherwise."""
    import torch.fx._pytree as fx_pytree

    args_spec, kwargs_spec = spec.children()
    if len(args) != args_spec.num_children or set(kwargs) != set(kwargs_spec.context):
        return None
    try:
        return fx_pytree.tree_flatten_spec((tuple(args), kwargs), spec)
    except Exception:  # any structural mismatch; the caller reports it
        return None


def structure_error(what: str, names: list[str], args, kwargs):
    """The ``InputError`` for a call whose inputs are not structured like the example's."""
    from ...errors import InputError

    return InputError(
        f"compiled {what} expects {len(names)} inputs ({', '.join(names)}) structured like "
        f"the example; got positional {[type(a).__name__ for a in args]} and keywords "
        f"{sorted(kwargs)}"
    )
