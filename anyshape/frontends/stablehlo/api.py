"""The public face of the StableHLO frontend, exposed as ``anyshape.stablehlo``.

``anyshape/__init__.py`` binds this module as the attribute ``stablehlo``.
Importing it imports nothing heavy: jaxlib's MLIR bindings load on the first
``compile``.

    import anyshape
    module = anyshape.stablehlo.compile(exported.mlir_module())   # or a .mlir path
    outputs = module(x)                                            # a list
"""

from __future__ import annotations


def compile(text_or_path, **options):
    """Compile StableHLO/MHLO text (string, bytes or path) once for every input shape.

    Returns a ``StableHLOModule``: call it with the entry function's arguments
    (NumPy arrays, torch tensors or CPU DLPack tensors), positionally or by name;
    it returns the results as a list. ``entry=`` picks the function (default
    ``main``); other keyword options are ``anyshape.config.Options`` fields.
    """
    from .compile import compile as _compile

    return _compile(text_or_path, **options)


def export(text_or_path, *, target: str = "portable", entry: str = "main", **options):
    """Compile StableHLO text into a standalone artifact (``.save(path)``; C API, loader)."""
    from ...config import Options
    from ...standalone.export import artifact_of_graph
    from .compile import lower_text

    lowered = lower_text(text_or_path, entry)
    return artifact_of_graph(
        lowered.graph,
        Options.from_env(**options),
        target,
        "the StableHLO program",
        lowered.output_names,
        lowered.input_names,
    )


def supported_ops() -> list[str]:
    """The op names (``stablehlo.*``, ``chlo.*``, ``shape.*``...) the frontend lowers."""
    from . import lower  # noqa: F401  (fills the table)
    from .context import RULES

    return sorted([*RULES, "func.call", "func.return", "stablehlo.composite"])


__all__ = ["compile", "export", "supported_ops"]
