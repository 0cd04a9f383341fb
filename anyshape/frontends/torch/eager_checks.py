"""Size checks eager's kernels make that the traced graph drops, kept as prologue guards.

Part of capture (``capture.py``), around ``torch.export``. torch assumes every dynamic
dim is 2 or more while it traces, so a condition that holds at every such size records
no guard, and anyshape serves sizes 0 and 1 too. Where eager's kernel refuses such a
size and the graph torch records would compute a result (its decomposition checks
nothing), the condition is recorded while the op traces (``eager_checks``) and becomes
a guard of the captured program (``guards``): a call that fails it is captured again
for its sizes, where the same check raises eager's error.

- ``F.pad`` in reflect mode: each padding must be less than its dim. torch traces
  ``reflection_pad*d`` as index arithmetic, which at a dim of 1 reads the one row
  for every padded one where eager refuses.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

from ...ir.constraints import Guard
from ...ir.symbolic import as_expr
from .export_guards import shape_env_of
from .swaps import on_capturing_thread, swapped
from .symbols import sympy_to_expr

_recording = threading.local()  # the checks of the capture running on this thread


@contextlib.contextmanager
def eager_checks():
    """Record eager's size checks while the body captures on this thread; yields the
    list of ``(size, least, reason)``: ``least <= size`` for a symbolic ``size``."""
    checks: list[tuple] = []
    outer = getattr(_recording, "checks", None)
    _recording.checks = checks

    def make(original):
        def pad(input, pad, mode="constant", value=None):
            if mode == "reflect" and on_capturing_thread(F, "pad"):
                _reflect_checks(input, pad, getattr(_recording, "checks", None))
            return original(input, pad, mode, value)

        return pad

    try:
        with swapped(F, "pad", make):
            yield checks
    finally:
        _recording.checks = outer


def _reflect_checks(x, pad, checks: list | None) -> None:
    """Eager's check of a reflect padding (each side less than its dim): raised at once
    for a size known here, recorded for a symbolic one."""
    if checks is None or not isinstance(x, torch.Tensor):
        return
    if not all(type(p) is int for p in pad) or len(pad) % 2 or len(pad) // 2 > x.dim():
        return  # (torch's own refusal follows)
    for k in range(len(pad) // 2):
        d = x.dim() - 1 - k
        size, most = x.shape[d], max(pad[2 * k], pad[2 * k + 1])
        if most <= 0:
            continue
        if isinstance(size, int):
            if most >= size:
                raise RuntimeError(
                    f"Padding size should be less than the corresponding input dimension, "
                    f"but got: padding ({pad[2 * k]}, {pad[2 * k + 1]}) at dimension {d} of "
                    f"input {list(x.shape)}"
                )
            continue
        checks.append((size.node.expr, most + 1, f"reflect padding of {most} in dim {d}"))


def guards(ep, checks) -> list[Guard]:
    """The recorded checks as guards of the captured program ``ep`` (its symbols)."""
    env = shape_env_of(ep)
    out = []
    for size, least, why in checks:
        if env is not None:
            size = size.xreplace(env.replacements)
        try:
            rhs = sympy_to_expr(size)
        except Exception:  # (a size the prologue cannot state: no check, as before)
            continue
        guard = Guard("le", as_expr(least), rhs, why)
        if all(str(g) != str(guard) for g in out):  # (export's modes call ``F.pad`` again)
            out.append(guard)
    return out
