"""anyshape: a dynamic-shape compiler for deep learning. Compile once, run any shape.

Public API (plugin mode)::

    opt = anyshape.optimize(model, example_inputs)   # an nn.Module
    torch.compile(model, backend="anyshape")         # TorchDynamo backend
    print(anyshape.explain(model, example_inputs))   # clusters, fallbacks, reasons
    anyshape.stats()["compilations"]                 # graphs compiled in this process

Standalone mode::

    anyshape.export(model, example_inputs).save("model.anyshape")   # needs torch
    model = anyshape.load("model.anyshape")                         # needs only NumPy
    outputs = model(*numpy_arrays)

ONNX (first slice: the ops torch's exporters write for MLPs, transformer
blocks and small CNNs; needs only the ``onnx`` package)::

    module = anyshape.onnx.compile("model.onnx")   # any shape its dims allow
    outputs = module(*numpy_arrays)                 # or by input name

StableHLO (text from ``jax.export``, torch-mlir or TensorFlow; needs ``jaxlib``)::

    module = anyshape.stablehlo.compile("model.mlir")      # or the text itself
    f = anyshape.jax.compile(jax.export.export(jax.jit(fn))(*specs))
    text = anyshape.to_stablehlo(model, example_inputs)    # a torch model, as StableHLO

The core (``ir``, ``passes``, ``runtime``) needs only NumPy; torch is imported
lazily by the functions that need it.
"""

from .errors import AnyshapeError, ArtifactError, CaptureError, InputError, UnsupportedError
from .frontends.onnx import api as onnx  # anyshape.onnx.compile(model): the ONNX frontend
from .frontends.stablehlo import api as stablehlo  # anyshape.stablehlo.compile(text)
from .frontends.stablehlo import jax_api as jax  # anyshape.jax.compile(exported)
from .stats import reset_stats, stats
from .version import __version__ as __version__

__all__ = [
    "AnyshapeError",
    "ArtifactError",
    "CaptureError",
    "InputError",
    "UnsupportedError",
    "explain",
    "export",
    "include_dir",
    "jax",
    "load",
    "onnx",
    "optimize",
    "reset_stats",
    "stablehlo",
    "stats",
    "to_stablehlo",
]


def optimize(model, example_inputs, **kwargs):
    """Compile ``model`` once for any input shape; see ``anyshape.api.optimize``."""
    from .api import optimize as _optimize

    return _optimize(model, example_inputs, **kwargs)


def explain(model, example_inputs, **kwargs):
    """Report clusters and fallbacks; see ``anyshape.api.explain``."""
    from .api import explain as _explain

    return _explain(model, example_inputs, **kwargs)


def export(model, example_inputs, **kwargs):
    """Compile ``model`` into a standalone artifact; see ``anyshape.standalone.export.export``."""
    from .standalone.export import export as _export

    return _export(model, example_inputs, **kwargs)


def load(path, **kwargs):
    """Load an artifact to run from NumPy; see ``anyshape.standalone.loader.load``."""
    from .standalone.loader import load as _load

    return _load(path, **kwargs)


def include_dir() -> str:
    """The folder holding ``anyshape.h``, the C API for artifacts."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")


def to_stablehlo(model, example_inputs, **kwargs) -> str:
    """A torch model as StableHLO text with ``?`` dims; see ``anyshape.standalone.stablehlo``."""
    from .standalone.stablehlo import to_stablehlo as _to_stablehlo

    return _to_stablehlo(model, example_inputs, **kwargs)
