"""anyshape: a dynamic-shape compiler for deep learning. Compile once, run any shape.

Public API (plugin mode)::

    opt = anyshape.optimize(model, example_inputs)   # an nn.Module
    torch.compile(model, backend="anyshape")         # TorchDynamo backend
    print(anyshape.explain(model, example_inputs))   # clusters, fallbacks, reasons
    anyshape.stats()["compilations"]                 # graphs compiled in this process

The core (``ir``, ``passes``, ``runtime``) needs only NumPy; torch is imported
lazily by the functions that need it.
"""

from .errors import AnyshapeError, CaptureError, InputError, UnsupportedError
from .stats import reset_stats, stats

__version__ = "0.1.0"

__all__ = [
    "AnyshapeError",
    "CaptureError",
    "InputError",
    "UnsupportedError",
    "explain",
    "optimize",
    "reset_stats",
    "stats",
]


def optimize(model, example_inputs, **kwargs):
    """Compile ``model`` once for any input shape; see ``anyshape.api.optimize``."""
    from .api import optimize as _optimize

    return _optimize(model, example_inputs, **kwargs)


def explain(model, example_inputs, **kwargs):
    """Report clusters and fallbacks; see ``anyshape.api.explain``."""
    from .api import explain as _explain

    return _explain(model, example_inputs, **kwargs)
