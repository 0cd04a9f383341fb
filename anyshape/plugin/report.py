"""What a plugin-mode compile hands back besides the module: the report and the input check.

Sits beside ``plugin/compile.py``, which fills them, and is kept free of capture,
lowering-rule and partitioning imports so that a model restored from the model cache
(``plugin/model_cache.py``) starts without loading them. ``CompileReport`` is what
``explain()`` prints; ``ModelPrologue`` checks a call's flat inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..errors import InputError
from ..frontends.torch.symbols import TORCH_TO_DTYPE
from ..runtime.binder import InputSpec, ShapeBinder
from .compiled_cluster import CompiledCluster

if TYPE_CHECKING:
    from .partition import Fallback


@dataclass
class ClusterInfo:
    name: str
    aten_ops: dict[str, int]
    compiled: CompiledCluster


@dataclass
class CompileReport:
    clusters: list[ClusterInfo] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    input_specs: list[InputSpec] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    capture: list[str] = field(default_factory=list)  # how the model was captured, if not whole
    # where the compile's time went, in order: stage -> seconds (explain() prints it)
    timings: dict[str, float] = field(default_factory=dict)

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds


class ModelPrologue:
    """Checks a call's flat inputs against the compiled signature before anything runs."""

    def __init__(self, names: list[str], binder: ShapeBinder):
        self.names = names
        self.binder = binder
        self.__name__ = self.__qualname__ = "anyshape_prologue"  # FX codegen names it

    def __call__(self, *inputs):
        shapes, dtypes = [], []
        for name, t in zip(self.names, inputs):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name!r} must be a tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise InputError(f"input {name!r} is on device {t.device}, expected cpu")
            if t.dtype not in TORCH_TO_DTYPE:
                raise InputError(f"input {name!r} has unsupported dtype {t.dtype}")
            shapes.append(tuple(t.shape))
            dtypes.append(TORCH_TO_DTYPE[t.dtype])
        self.binder.bind(shapes, dtypes)

    def __repr__(self) -> str:
        return "anyshape_prologue"
