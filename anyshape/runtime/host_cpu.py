"""The CPU this process runs on: its architecture and feature flags.

Sits in the runtime, below every backend: the CPU backend picks the ISA level
to build for from it (``codegen/cpu/target.py``), and the artifact loaders
(``standalone/loader.py``; ``anyshape_file.h`` in C) refuse a library built
for flags this CPU lacks. NumPy-free and torch-free.
"""

from __future__ import annotations

import functools
import platform


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``flags`` on x86, ``Features`` on Arm)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa_machine(isa: str) -> str:
    """The architecture an ISA name runs on (``x86-64-v3`` -> ``x86_64``)."""
    name = isa.removeprefix("native-")
    if name.startswith("x86-64"):
        return "x86_64"
    if name.startswith(("aarch64", "armv8")):
        return "aarch64"
    return name


def missing_cpu_flags(cpu_flags) -> list[str]:
    """The flags an artifact needs that this CPU does not have."""
    have = host_cpu_flags()
    return [f for f in cpu_flags if f not in have]
