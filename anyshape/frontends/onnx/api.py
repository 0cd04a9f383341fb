"""The public face of the ONNX frontend, exposed as ``anyshape.onnx``.

``anyshape/__init__.py`` binds this module as the attribute ``onnx`` (not a
module file named ``onnx`` in the package, which some import styles would
confuse with the ``onnx`` package). Importing it imports nothing heavy: onnx
loads on the first ``compile``.

    import anyshape
    module = anyshape.onnx.compile("model.onnx", threads=4)
    outputs = module(x)                       # a list, in graph-output order
"""

from __future__ import annotations


def compile(model_or_path, **options):
    """Compile an ONNX model (``ModelProto``, path or bytes) once for every input shape.

    Returns an ``OnnxModule``: call it with the graph's inputs positionally or by
    name (NumPy arrays, or torch tensors for torch tensors back); it returns the
    outputs as a list. Keyword options are ``anyshape.config.Options`` fields,
    plus ``base_dir`` (where external weight files are, for a ``ModelProto``) and
    ``fallback="onnxruntime"`` (opt-in: nodes anyshape cannot compile run in ONNX
    Runtime between compiled parts; ``module.explain()`` lists them with reasons).
    """
    fallback = options.pop("fallback", None)
    if fallback is not None:
        if fallback != "onnxruntime":
            raise ValueError(f"fallback={fallback!r}: the one fallback is 'onnxruntime'")
        from .fallback import compile_with_fallback

        return compile_with_fallback(model_or_path, **options)
    from .compile import compile as _compile

    return _compile(model_or_path, **options)


def export(model_or_path, *, target: str = "portable", **options):
    """Compile an ONNX model into a standalone artifact (``.save(path)``; C API, loader).

    Inputs keep their ONNX names and symbolic dims; ``target`` is ``"portable"``
    or ``"native"``.
    """
    from .export import export as _export

    return _export(model_or_path, target=target, **options)


def explain(model_or_path, **options):
    """What anyshape compiles of an ONNX model: ops, unsupported op types, kernels, guards."""
    from .explain import explain as _explain

    return _explain(model_or_path, **options)


def supported_ops() -> dict[str, list[tuple[int, int]]]:
    """Op type -> the opset ranges the ONNX frontend lowers."""
    from .rules import supported_ops as _supported

    return _supported()


__all__ = ["compile", "explain", "export", "supported_ops"]
