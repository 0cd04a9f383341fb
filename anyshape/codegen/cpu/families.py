"""Kernel families: kernels that differ only in their static sizes, compiled once.

Sits between kernel emission (``kernels.emit_kernel``, whose scope writes each
static size of ``expr.FAMILY_MIN`` or more as a run-time integer ``D_k``) and the
host program. Kernels whose text is then equal are one family: one C++ function
serves every member, each call site passing its own sizes. A size that every call
of the family passes alike is written back into the function as a constant
(``const int64_t D_3 = INT64_C(768);``) and no longer passed, so the compiler still
sees it (vectorized loops without a tail, constant strides); only the sizes that
differ are read at run time.

ResNet-50's 56 kernels are 19 families (convolutions and their epilogues at 64 to
2048 channels): a third of the C++ to compile. Transformers, whose repeated layers
already print identically, keep one kernel per family.
"""

from __future__ import annotations

from dataclasses import replace

from ...ir.symbolic import as_dim
from .kernels import Kernel


def bind_family_constants(kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` (one per call site) with each family's shared sizes written into its
    function; the sizes that differ within a family stay run-time integers."""
    families: dict[str, list[int]] = {}
    for site, k in enumerate(kernels):
        families.setdefault(k.body, []).append(site)
    out = list(kernels)
    for body, sites in families.items():
        first = kernels[sites[0]]
        fixed: dict[int, int] = {}
        for slot, value in enumerate(first.ints):
            value = as_dim(value)
            if isinstance(value, int) and all(
                as_dim(kernels[s].ints[slot]) == value for s in sites
            ):
                fixed[slot] = value
        if not fixed:
            continue
        kept = [slot for slot in range(len(first.ints)) if slot not in fixed]
        lines = {
            _read(slot, slot): f"const int64_t D_{slot} = INT64_C({fixed[slot]});" for slot in fixed
        }
        lines.update({_read(slot, slot): _read(slot, j) for j, slot in enumerate(kept)})
        bound = "\n".join(lines.get(ln, ln) for ln in body.split("\n"))
        for s in sites:
            out[s] = replace(kernels[s], body=bound, ints=[kernels[s].ints[k] for k in kept])
    return out


def _read(slot: int, index: int) -> str:
    """The line of a kernel's head that reads size ``D_slot`` from ``D[index]``."""
    return f"const int64_t D_{slot} = D[{index}];"
