"""The ATen lowering table, one module per op family; importing this package fills it."""

from . import creation, elementwise, indexing, linalg, nn, reduce, shape  # noqa: F401
