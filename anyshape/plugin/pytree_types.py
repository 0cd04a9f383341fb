"""Container types models return that torch's pytree does not know: registered before capture.

Sits in front of capture in plugin mode (``api._compile``). torch.export and
TorchDynamo flatten a model's inputs and outputs with ``torch.utils._pytree``;
an unregistered type holding tensors (a transformers ``DynamicCache``, which
GPT-2 returns by default with ``use_cache=True``) makes capture fail. The
transformers cache classes are registered with transformers' own helpers, and
only when transformers is already imported (a model of it is being compiled).

During capture, a cache layer's first update makes its empty key/value tensors
with ``torch.tensor([])``: torch.export lifts each as a constant of the layer's
module, and ``run_decompositions`` (torch 2.13) then loses those constants
("Constant tensor lifted_tensor_0 is not in the constants dictionary").
``exportable_caches()`` makes them ``key_states.new_empty(0)`` instead (the
same empty tensor, an op of the graph rather than a constant).
"""

from __future__ import annotations

import contextlib
import sys

import torch


def register_model_types(model) -> None:
    """Register the pytree types ``model``'s inputs and outputs may hold (idempotent)."""
    if not _transformers_in_use():
        return
    _register_transformers_caches(model)


def _transformers_in_use() -> bool:
    """Whether transformers' models or caches are loaded: a model of it, or a cache a
    model may take or return. ``import transformers`` alone loads neither, and importing
    them costs about 0.9 s (a torchvision model compiled beside an idle transformers
    import must not pay that)."""
    return any(
        m in sys.modules for m in ("transformers.cache_utils", "transformers.modeling_utils")
    )


def _register_transformers_caches(model) -> None:
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:  # an older or newer transformers: nothing to register with
        return
    # DynamicCache first, by its dedicated helper (a flat key/value layout that also
    # flattens by spec); then every other Cache class by the generic one.
    register_dynamic_cache_export_support()
    try:
        from transformers import PreTrainedModel
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:
        return
    # Per transformers model (a wrapper's too): the helper also registers the classes
    # named *Cache in the model's own module, which in a user's module may be anything.
    one_per_class: dict[type, PreTrainedModel] = {}
    for m in model.modules() if isinstance(model, torch.nn.Module) else ():
        if isinstance(m, PreTrainedModel):
            one_per_class.setdefault(type(m), m)
    for m in one_per_class.values():
        register_cache_pytrees_for_model(m)


@contextlib.contextmanager
def exportable_caches():
    """Within: transformers' dynamic cache layers start from an empty tensor made by an
    op, not a constant (see the module docstring)."""
    layer = _dynamic_layer_class()
    if layer is None or "lazy_initialization" not in vars(layer):
        yield
        return
    original = vars(layer)["lazy_initialization"]

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self.keys = key_states.new_empty(0)
        self.values = value_states.new_empty(0)
        self.is_initialized = True

    layer.lazy_initialization = lazy_initialization
    try:
        yield
    finally:
        layer.lazy_initialization = original


def _dynamic_layer_class():
    if not _transformers_in_use():
        return None
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    return DynamicLayer
