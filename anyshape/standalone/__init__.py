"""Standalone mode: export a model to one artifact file; load and run it without PyTorch.

``format`` (the file) -> ``export`` (PyTorch model to artifact; needs torch)
-> ``loader`` (artifact to a callable over NumPy arrays; needs only NumPy).
The C API for the same files is ``runtime/anyshape.h``.
"""
