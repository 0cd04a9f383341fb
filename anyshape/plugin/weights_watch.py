"""Packed weights kept in step with the model's own: in-place changes are noticed.

Sits in ``OptimizedModule.forward``, before the compiled clusters run. A native
library with oneDNN convolutions may keep each weight reordered into the
convolution's layout (packing once instead of on every call). Compiled models
read weights live, so a weight changed in place (``load_state_dict``, an
optimizer step, ``weight.mul_(2)``) must reach those packed copies. torch bumps
a tensor's version counter on every in-place change; ``WeightsWatch`` compares
the versions of the packed weights on each call (a few microseconds for
ResNet-50's 17) and tells the libraries when one moved. A weight nobody watches
(one the model does not name, a ``torch.compile`` graph with gradients on) is
packed on every call instead. A weight that is not contiguous (a transposed view
held as a parameter) is a contiguous copy in the library: it is watched too, and
copied again when it changes.
"""

from __future__ import annotations

import weakref

import torch


class WeightsWatch:
    def __init__(self, tensors: list[torch.Tensor], libraries: list, unresolved: int = 0):
        self.tensors = tensors
        self.libraries = libraries
        self.unresolved = unresolved  # packed weights neither model nor graph names
        self.versions = self._versions()
        for lib in libraries:
            lib.watch_weights()
        # When the compiled model goes, so do its registrations: freed weights' addresses
        # may be reused by weights nobody watches.
        weakref.finalize(self, _unwatch, libraries)

    def _versions(self) -> tuple[int, ...]:
        return tuple(t._version for t in self.tensors)

    def __call__(self) -> None:
        now = self._versions()
        if now != self.versions:
            self.versions = now
            for lib in self.libraries:
                lib.weights_changed()

    @classmethod
    def attach(cls, model: torch.nn.Module, clusters, graph=None) -> WeightsWatch | None:
        """A watch over every packed weight of ``clusters``' libraries that ``model`` names,
        or ``None`` when no library packs weights. A packed weight the model does not name
        is a constant the compiled ``graph`` holds (a lifted tensor: one the model's code
        captured), the captured tensor itself, so it is watched there."""
        tensors: dict[int, torch.Tensor] = {}
        libraries = []
        unresolved = 0
        for cluster in clusters:
            native = getattr(cluster.compiled, "native", None)
            names = [
                *(getattr(native, "packed_params", None) or ()),
                *(getattr(native, "copied_params", None) or ()),
            ]
            if not names:
                continue
            for name in names:
                t = resolve_tensor(model, name)
                if t is None and graph is not None:
                    t = resolve_tensor(graph, name)
                if t is not None:
                    tensors[id(t)] = t
                else:
                    unresolved += 1
            libraries.append(native)
        return cls(list(tensors.values()), libraries, unresolved) if libraries else None


def packs_repacked(clusters) -> None:
    """Every packed copy the libraries of ``clusters`` hold is made again at its next
    use: a library another module loaded may hold copies of these very weights (the
    same model optimized twice), packed before an in-place change that module has not
    called since to notice. Asked before a restored model is checked against eager."""
    for cluster in clusters:
        native = getattr(cluster.compiled, "native", None)
        if getattr(native, "packed_params", None) or getattr(native, "copied_params", None):
            native.weights_changed()


def resolve_tensor(model, name: str) -> torch.Tensor | None:
    """The tensor ``model`` holds at the dotted path ``name``, or ``None``."""
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


def _unwatch(libraries) -> None:
    for lib in libraries:
        lib.unwatch_weights()
