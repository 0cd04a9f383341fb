"""Guard variants: the compiled model for a case its first graph's guards exclude.

Sits behind ``OptimizedModule`` (``api.py``). torch.export builds a graph for the
example's case of every size decision it takes; anyshape drops the decisions that
only pick a layout (``frontends/torch/capture.py``) and the prologue checks the rest.
A call that fails one of those checks is not refused: the model is captured again
with that call's inputs as the example, compiled, and kept beside the first graph.
Every later call goes to the first graph whose guards hold. Each variant counts in
``anyshape.stats()`` (``compilations`` and ``guard_recompilations``) and is named in
``explain()``. Bad input (a wrong rank or dtype, dims that contradict each other)
fails no guard: it stays an ``InputError``, and so does a call no capture accepts
(then eager PyTorch refuses it too). Dims that contradict a relation torch derived
for sizes of at least 1, where a size of 0 takes part, count as a failed guard: a
slice ``x[..., :-1]`` of a width-0 ``x`` is empty in eager, where the graph says
``s - 1`` long, and eager broadcasts a size 1 against a 0 where the graph made the
two one symbol.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import AnyshapeError, CaptureError, InputError, first_line
from ..stats import bump

# What the prologue says when a call fails a condition of the graph rather than of the
# model's signature: a guard the capture recorded, a bound torch derived from one (a
# symbol's range), or a size it specialized.
_GUARD_FAILURES = (
    "shape constraint ",
    "the model was compiled for",
    "(a static dim of the compiled model)",
)


def failed_guard(error: InputError) -> bool:
    """Whether ``error`` says a call left the case the graph was compiled for: a guard,
    or a relation between dims torch derived for sizes of at least 1 that a size of 0
    breaks (``InputError.at_size_edge``; eager refuses the call if it is bad input, and
    so does the capture of a variant)."""
    if error.at_size_edge:
        return True
    text = str(error)
    return text.startswith(_GUARD_FAILURES[0]) or any(f in text for f in _GUARD_FAILURES[1:])


class GuardVariants:
    """The graphs compiled for calls that failed the first graph's guards, in order."""

    def __init__(self, compile_variant: Callable, facts: list[str]):
        self._compile_variant = compile_variant  # (args, kwargs) -> a compiled module
        self._facts = facts  # the first graph's report facts, which explain() prints
        self._lock = threading.Lock()
        self.variants: list = []
        # Calls whose capture failed (bad input, which eager refuses too), by signature
        # (_signature): the same call again is refused at once, not captured again.
        self._refused: dict[tuple, str] = {}

    def __call__(self, failure: InputError, args: tuple, kwargs: dict):
        """Run the first variant whose guards hold, compiling one if none does."""
        for variant in list(self.variants):
            try:
                return variant(*args, **kwargs)
            except InputError:
                # (the first graph accepted this call's ranks, dtypes and dims: a variant
                # refusing it is specialized elsewhere, e.g. a square image's two dims
                # made one, so the call goes on to the next variant or a new one)
                continue
        key = _signature(args, kwargs)
        refused = self._refused.get(key)
        if refused is not None:
            raise InputError(refused)
        with self._lock:
            variant = self._compile(failure, args, kwargs, key)
        return variant(*args, **kwargs)

    def _compile(self, failure: InputError, args: tuple, kwargs: dict, key: tuple):
        try:
            variant = self._compile_variant(args, kwargs)
        except AnyshapeError as e:
            # (a capture's first line: the model captured once, so its hints on control
            # flow and dynamic_shapes do not apply; what failed is eager's own check)
            why = first_line(e) if isinstance(e, CaptureError) else e
            message = f"{failure}; capturing the model again for these inputs failed too: {why}"
            if len(self._refused) >= _REFUSALS_KEPT:
                self._refused.pop(next(iter(self._refused)))
            self._refused[key] = message
            raise InputError(message) from e
        self.variants.append(variant)
        bump("guard_recompilations")
        condition = str(failure).split(" does not hold")[0].split(": expected")[0]
        shapes = [list(a.shape) for a in _tensors(args, kwargs)]
        self._facts.append(
            f"guard variant {len(self.variants)}: compiled again for inputs {shapes}, "
            f"which fail {condition}"
        )
        return variant


_REFUSALS_KEPT = 64  # calls remembered as refused (the oldest forgotten first)


def _signature(args, kwargs) -> tuple:
    """What a capture of this call depends on: the structure of the inputs (keyword names
    included), each tensor's shape and dtype, each other value's repr."""
    import torch
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (str(spec),) + tuple(
        (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v) for v in leaves
    )


def _tensors(args, kwargs) -> list:
    import torch
    import torch.utils._pytree as pytree

    return [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
