"""The one table of expected failures of the OpInfo conformance suite (tests/test_opinfo.py).

Keys are ``(opinfo name, dtype name)``: the OpInfo name is ``name`` or
``name.variant`` as in PyTorch's ``op_db``, the dtype one of ``float32``,
``int64``, ``int32``, ``bool``. Both tables are checked both ways, so they
always say what is really broken:

- ``EXPECTED_FAILURES``: the whole case fails; it runs as a strict xfail, so
  once it passes the suite fails until the entry is removed.
- ``KNOWN_SAMPLE_FAILURES``: argument combinations a rule does not cover. A
  sample whose failure message contains one of the fragments is passed over
  (the case's other samples are still checked); the case fails if none of the
  samples it looks at fails with a listed fragment any more.

Ops anyshape does not claim (some ATen op of the graph has no lowering rule)
are neither: the suite checks that they run in PyTorch, reported as fallbacks with reasons.
"""

_CONV_WEIGHT = (
    "the weight is a model input, so its dims are symbolic, and the IR's convolution "
    "needs a static weight (ir/ops.py): the symbolic stage falls back to PyTorch"
)
EXPECTED_FAILURES: dict[tuple[str, str], str] = {
    ("nn.functional.conv1d", "float32"): _CONV_WEIGHT,
    ("nn.functional.conv1d", "int64"): _CONV_WEIGHT,
    ("nn.functional.conv2d", "float32"): _CONV_WEIGHT,
    ("nn.functional.conv2d", "int64"): _CONV_WEIGHT,
}

_DATA_DEPENDENT_SPLIT = (
    "tensor indices make the split points data-dependent (.item()): the slices are "
    "left to PyTorch: no model input carries the unbacked symbol the slices need"
)

_MAX_POOL_INDICES = {
    "the indices output of max pooling": "return_indices=True: nn.py computes no indices",
}

KNOWN_SAMPLE_FAILURES: dict[tuple[str, str], dict[str, str]] = {
    ("nn.functional.max_pool1d", "float32"): _MAX_POOL_INDICES,
    ("nn.functional.max_pool2d", "float32"): _MAX_POOL_INDICES,
    ("nn.functional.max_pool2d", "int64"): _MAX_POOL_INDICES,
    ("nn.functional.max_pool2d", "int32"): _MAX_POOL_INDICES,
    ("tensor_split", "float32"): {"needs data-dependent sizes": _DATA_DEPENDENT_SPLIT},
    ("tensor_split", "int64"): {"needs data-dependent sizes": _DATA_DEPENDENT_SPLIT},
    ("tensor_split", "int32"): {"needs data-dependent sizes": _DATA_DEPENDENT_SPLIT},
    ("tensor_split", "bool"): {"needs data-dependent sizes": _DATA_DEPENDENT_SPLIT},
}
