"""The ATen lowering table, one module per op family; importing this package fills it."""

from . import (  # noqa: F401
    attention,
    creation,
    elementwise,
    indexing,
    linalg,
    nn,
    random,
    reduce,
    resample,
    scatter,
    shape,
)
