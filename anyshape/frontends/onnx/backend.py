"""anyshape as an ``onnx.backend.base.Backend``: the interface ONNX's own test suite drives.

Sits beside ``api.py`` as a second public face of the ONNX frontend: tools
written against ONNX's backend API (``onnx.backend.test.BackendTest``,
``backend.prepare(model).run(inputs)``) get anyshape through it. ``prepare``
compiles once (``compile.compile``); the returned ``AnyshapeRep`` runs any
shape and returns the outputs as a namedtuple in graph-output order, as ONNX's
backends do.

    from anyshape.frontends.onnx.backend import AnyshapeBackend
    rep = AnyshapeBackend.prepare(model_proto)
    outputs = rep.run([x])
"""

from __future__ import annotations

from collections import namedtuple

import onnx.backend.base as onnx_backend

from .compile import compile as compile_onnx


class AnyshapeRep(onnx_backend.BackendRep):
    """A prepared (compiled) model; ``run`` takes inputs in graph-input order or by name."""

    def __init__(self, module):
        self.module = module
        fields = [_field(n, i) for i, n in enumerate(module.output_names)]
        self._tuple = namedtuple("Outputs", fields, rename=True)

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            outs = self.module(**inputs)
        elif isinstance(inputs, (list, tuple)):
            outs = self.module(*inputs)
        else:
            outs = self.module(inputs)
        return self._tuple(*outs)


class AnyshapeBackend(onnx_backend.Backend):
    """ONNX backend API over anyshape's CPU compiler."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> AnyshapeRep:
        if not cls.supports_device(device):
            raise ValueError(f"anyshape's ONNX backend runs on CPU, not {device!r}")
        super().prepare(model, device, **kwargs)  # checks the model's ir_version/opset
        return AnyshapeRep(compile_onnx(model, **kwargs))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


def _field(name: str, index: int) -> str:
    return name if name.isidentifier() and not name.startswith("_") else f"output_{index}"


prepare = AnyshapeBackend.prepare
run_model = AnyshapeBackend.run_model
supports_device = AnyshapeBackend.supports_device
