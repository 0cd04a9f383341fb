"""``export(model)``: an ONNX model as a standalone artifact (``anyshape compile model.onnx``).

Sits at the end of the ONNX frontend, beside ``compile.py``: the same reading
and lowering, then the standalone target (``standalone.export.artifact_of_graph``)
instead of an in-process module. The artifact, its loader and its C API are the
ones PyTorch models export to; inputs keep their ONNX names and symbolic dims.
A model with an input that sets a shape (``specialize.py``) has no single
artifact: that is an error naming the input.
"""

from __future__ import annotations

from ...config import Options
from ...errors import UnsupportedError
from .context import NeedsInputValue
from .lower import lower_model
from .reader import read_model


def export(model_or_path, *, target: str = "portable", base_dir: str | None = None, **options):
    """Compile an ONNX model into a ``standalone.export.Artifact`` for ``target``.

    ``target``: ``"portable"`` (the widest ISA level this machine supports) or
    ``"native"``; ``options`` are ``anyshape.config.Options`` fields.
    """
    from ...standalone.export import artifact_of_graph

    model = read_model(model_or_path, base_dir)
    try:
        lowered = lower_model(model)
    except NeedsInputValue as e:
        raise UnsupportedError(
            f"the model cannot be exported as one artifact: {e}; its output shapes depend on "
            "that input's value (export the model with it as a constant)"
        ) from None
    return artifact_of_graph(
        lowered.graph,
        Options.from_env(**options),
        target,
        f"ONNX model {model.name!r}",
        lowered.output_names,
        lowered.input_names,
    )
