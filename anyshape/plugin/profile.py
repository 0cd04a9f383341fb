"""Where a compiled model's time goes: per-kernel timings of the CPU backend.

Sits beside ``explain``. With the ``profile`` option (``ANYSHAPE_PROFILE=1``)
every generated host program times each of its kernel call sites (one branch
per call when off). ``OptimizedModule.profile()`` reads and resets the
counters of every cluster and returns a ``ProfileReport``: per call site the
op and type it computes, its calls and seconds, and totals per op.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class SiteTiming:
    cluster: str
    site: int
    label: str  # "op type" of the kernel's root
    calls: int
    seconds: float

    @property
    def op(self) -> str:
        return self.label.split(" ", 1)[0]


class ProfileReport:
    def __init__(self, sites: list[SiteTiming]):
        self.sites = sites

    @property
    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.sites)

    def by_op(self) -> dict[str, float]:
        """Seconds per kernel root op, largest first."""
        acc: dict[str, float] = defaultdict(float)
        for s in self.sites:
            acc[s.op] += s.seconds
        return dict(sorted(acc.items(), key=lambda kv: -kv[1]))

    def table(self, top: int = 15) -> str:
        total = self.total_seconds or 1e-30
        lines = ["anyshape profile", "================"]
        if not any(s.calls for s in self.sites):
            lines.append("no timed calls (compile with profile=True or ANYSHAPE_PROFILE=1)")
            return "\n".join(lines)
        lines.append(f"kernel time: {self.total_seconds * 1e3:.2f} ms")
        lines.append("by op:")
        for op, sec in self.by_op().items():
            lines.append(f"  {op:<20} {sec * 1e3:10.2f} ms  {100 * sec / total:5.1f}%")
        lines.append("top call sites:")
        for s in sorted(self.sites, key=lambda s: -s.seconds)[:top]:
            lines.append(
                f"  {s.cluster}#{s.site:<4} {s.seconds * 1e3:9.2f} ms {100 * s.seconds / total:5.1f}%"
                f"  x{s.calls}  {s.label}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__
