"""What CPU codegen hands the build and the loader: the translation unit and its layout.

Sits between ``host`` (which emits a ``HostProgram``) and ``build``/``executable``
(which split, build and load it). Kept apart from the emitters so that a model the
model cache restores (its ``HostProgram`` saved) loads without importing them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HostProgram:
    source: str
    output_slots: list[int]  # for each graph output: slot in out[], or -1 for a source
    extra_symbols: list[str]
    param_names: list[str]  # weights in the order of prm[]
    kernel_labels: list[str]  # what each profiled call site runs, in call order
    kernel_descriptions: list[str]  # kind, root and fused ops of each call site (explain)
    packed_params: list[str]  # weights the library may keep packed copies of (oneDNN)
    dnnl_routes: list[str]  # per kernel: what oneDNN runs when linked, else "" (explain)


# Where each kernel and the host function start: the build may compile kernels as
# translation units of their own, in parallel (build.py, ``split_units``).
KERNEL_MARK = "// anyshape: kernel"
HOST_MARK = "// anyshape: host"
