"""Options with help text, read from keyword arguments or ``ANYSHAPE_*`` environment variables.

One registry for every knob; ``Options`` is passed explicitly down the
pipeline (no hidden globals). Keyword arguments to ``optimize`` win over the
environment, which wins over the defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Options:
    debug: int = field(
        default=0,
        metadata={"help": "0 quiet; 1 print a summary per compiled graph; 2 also print the IR"},
    )
    dump_dir: str = field(
        default="",
        metadata={"help": "write the IR after every pass (and generated sources) into this folder"},
    )
    verify: bool = field(
        default=False,
        metadata={"help": "run the IR verifier after every pass (the test suite turns it on)"},
    )
    backend: str = field(
        default="cpu",
        metadata={"help": "cpu: generated C++ kernels (default); interpreter: the NumPy reference"},
    )
    profile: bool = field(
        default=False,
        metadata={"help": "time every generated kernel call; read with OptimizedModule.profile()"},
    )
    model_cache: bool = field(
        default=True,
        metadata={
            "help": "reuse a compile of the same model from any earlier process (skips capture)"
        },
    )
    min_cluster_ops: int = field(
        default=1, metadata={"help": "clusters with fewer compiled ops run in PyTorch instead"}
    )

    @staticmethod
    def from_env(**overrides) -> Options:
        values = {}
        for f in fields(Options):
            env = os.environ.get(f"ANYSHAPE_{f.name.upper()}")
            if env is not None:
                values[f.name] = _parse(f.type, env)
        unknown = set(overrides) - {f.name for f in fields(Options)}
        if unknown:
            known = ", ".join(f.name for f in fields(Options))
            raise TypeError(f"unknown anyshape option(s) {sorted(unknown)}; known: {known}")
        values.update(overrides)
        return Options(**values)


def _parse(ty, text: str):
    if ty in (bool, "bool"):
        return text.lower() not in ("", "0", "false", "no", "off")
    if ty in (int, "int"):
        return int(text)
    return text


def describe_options() -> str:
    """Every option with its environment variable and help text."""
    lines = []
    for f in fields(Options):
        lines.append(
            f"{f.name} / ANYSHAPE_{f.name.upper()} (default {f.default!r}): {f.metadata['help']}"
        )
    return "\n".join(lines)
