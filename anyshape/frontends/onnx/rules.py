"""The ONNX frontend's rule table: (op type, opset range) -> lowering function.

Sits between the driver (``lower.py``), which asks for the rule of each node,
and the rule families, which register their rules in their own ``RULES`` lists
(``elementwise.py``: arithmetic, math, activations, Where, Cast;
``shape_ops.py``: Shape, Reshape, Gather, Concat, Slice, Expand, Constant...;
``nn_ops.py``: MatMul, Gemm, Softmax, normalizations, reductions, Conv, pools).
A rule is ``fn(ctx, node, inputs) -> list[Value | None]`` (``None``: an output
the rule does not compute; the driver refuses it only if something reads it).

A node whose op type has no rule, or none for the model's opset, is an
``UnsupportedError`` naming the node, its op type and the opset.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import UnsupportedError
from . import (
    activations,
    attention,
    conv_transpose,
    einsum,
    elementwise,
    index_ops,
    losses,
    nn_ops,
    resize,
    shape_ops,
)
from .context import RuleEntry

RULE_TABLE: dict[str, list[RuleEntry]] = {}
for _family in (
    elementwise,
    activations,
    shape_ops,
    index_ops,
    resize,
    nn_ops,
    conv_transpose,
    einsum,
    attention,
    losses,
):
    for _entry in _family.RULES:
        RULE_TABLE.setdefault(_entry.op_type, []).append(_entry)


def rule_for(op_type: str, opset: int, node_name: str, domain: str = "") -> Callable:
    """The lowering function for ``op_type`` at ``opset``, or an error naming the node."""
    where = f"node {node_name!r}: op {op_type}"
    if domain not in ("", "ai.onnx"):
        raise UnsupportedError(f"{where} of domain {domain!r} is not supported (opset {opset})")
    entries = RULE_TABLE.get(op_type)
    if not entries:
        raise UnsupportedError(
            f"{where} (opset {opset}) is not supported by anyshape's ONNX frontend"
        )
    for e in entries:
        if e.first <= opset <= e.last:
            return e.fn
    ranges = ", ".join(f"{e.first}-{e.last}" for e in entries)
    raise UnsupportedError(f"{where} is supported for opsets {ranges}, not opset {opset}")


def supported_ops() -> dict[str, list[tuple[int, int]]]:
    """Each supported op type with the opset ranges its rules cover (for docs and tests)."""
    return {k: [(e.first, e.last) for e in v] for k, v in sorted(RULE_TABLE.items())}
