"""torch functions replaced while anyshape captures, for the capturing thread only.

Part of capture (``capture.py``): ``traced_forms`` (ops traced in another form)
and ``lean_metadata`` (no memory-format checks per traced node) replace a torch
module attribute for as long as any capture runs. The replacement is installed
by the first capture to start and removed by the last to end, whichever thread
that is; it does something else than torch's function only on a thread inside a
capture that asked for it (``on_capturing_thread``), so another thread's
``torch.compile`` or ``torch.export`` meanwhile sees torch's behaviour. (One
trace of the swap shows there: torch's Python functions, ``F.relu`` say, hand
``__torch_function__`` the module's current ``F.relu``, the replacement, which
calls torch's own.)
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch._subclasses.fake_tensor import FakeTensor

_capturing = threading.local()  # .depth: {(id(owner), name): captures on this thread swapping it}
_swap_lock = threading.Lock()
_installed: dict[tuple[int, str], tuple[object, int]] = {}  # -> (torch's object, swaps)


def on_capturing_thread(owner, name: str) -> bool:
    """Whether this thread is inside a capture that swapped ``owner.<name>``."""
    return _depths().get((id(owner), name), 0) > 0


def traced_here(owner, name: str) -> bool:
    """Whether a call of ``owner.<name>`` on this thread takes a traced form: inside a
    capture that swapped it, without autograd, and without autocast (whose casts an
    opaque op would not make)."""
    return (
        on_capturing_thread(owner, name)
        and not torch.is_grad_enabled()
        and not torch._C._is_any_autocast_enabled()
    )


# Tensors a capture traces (the fake tensors of inputs and parameters); a subclass of the
# user's keeps torch's function.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter, FakeTensor)


def _depths() -> dict[tuple[int, str], int]:
    if not hasattr(_capturing, "depth"):
        _capturing.depth = {}
    return _capturing.depth


@contextlib.contextmanager
def swapped(owner, name: str, make):
    """``owner.<name>`` replaced by ``make(torch's object)`` while any capture runs (the
    first capture installs it, the last one to end puts torch's object back); the body's
    thread counts as capturing ``owner.<name>``."""
    key = (id(owner), name)
    with _swap_lock:
        original, count = _installed.get(key, (None, 0))
        if count == 0:
            original = getattr(owner, name)
            setattr(owner, name, make(original))
        _installed[key] = (original, count + 1)
    depths = _depths()
    depths[key] = depths.get(key, 0) + 1
    try:
        yield
    finally:
        depths[key] -= 1
        with _swap_lock:
            original, count = _installed[key]
            if count == 1:
                setattr(owner, name, original)
                del _installed[key]
            else:
                _installed[key] = (original, count - 1)
