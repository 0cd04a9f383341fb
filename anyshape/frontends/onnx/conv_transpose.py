"""ONNX ``ConvTranspose`` (opsets 1, 11, 22), 1-D, 2-D and 3-D, as one IR ``convolution``.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). A
transposed convolution is the convolution, stride 1, of the input

- dilated by the stride: ``stride - 1`` zeros between neighbours, built per
  spatial axis from IR ops that hold for symbolic sizes (a new axis after it,
  concatenated with zeros, folded back by a reshape; the trailing zeros are
  cropped by the padding step below),
- padded by ``dilation * (kernel - 1) - pad`` on each side (a negative amount
  crops), plus ``output_padding`` at the end,

with the kernel flipped spatially and its in/out channel axes swapped within
each group (``[C, M / group, *k] -> [M, C / group, *k]``, done once in NumPy:
the weight must be a constant; a graph input is compiled per value by
``specialize.py``, anything computed is refused). f16/bf16 compute in f32.

Padding follows the ONNX spec: ``pads``; or ``output_shape`` (then ``pads`` is
ignored and the total padding ``stride * (in - 1) + output_padding +
dilation * (kernel - 1) + 1 - output_shape`` is split, the odd one at the end
for ``SAME_UPPER`` and at the start otherwise); or ``SAME_UPPER``/``SAME_LOWER``
(the output is ``in * stride``), ``VALID`` (no padding). Where runtimes and the
ONNX reference disagree (a negative total padding, except an output one longer
than the full result under ``NOTSET``/``VALID``; ``SAME_*`` with stride > 1 before opset
11) the node is refused rather than given one reading.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr
from .context import LowerCtx, Value, rule_registry
from .nn_ops import acc_dtype

RULES, rule = rule_registry()


def _ints(v, n: int, default: int, what: str, name: str) -> tuple[int, ...]:
    if v is None or len(v) == 0:
        return (default,) * n
    if len(v) != n:
        raise UnsupportedError(f"{what}: {name} has {len(v)} entries, expected {n}")
    return tuple(int(i) for i in v)


def _flipped_weight(w: np.ndarray, groups: int, what: str) -> np.ndarray:
    """``[C, M / g, *k]`` -> ``[M, C / g, *k]`` flipped spatially: the convolution's weight."""
    c, mg = w.shape[:2]
    if groups < 1 or c % groups:
        raise UnsupportedError(f"{what}: {c} input channels not divisible by group {groups}")
    k = w.shape[2:]
    w = w.reshape(groups, c // groups, mg, *k).swapaxes(1, 2)
    w = w.reshape(groups * mg, c // groups, *k)
    return np.ascontiguousarray(np.flip(w, axis=tuple(range(2, w.ndim))))


def _split(total: int, upper: bool) -> tuple[int, int]:
    """(begin, end) of a total padding: the odd one at the end when ``upper``."""
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def _pads(node, sizes, k, s, d, op, what: str) -> tuple[list, list]:
    """(begin, end) padding of the output per spatial dim, as the ONNX spec computes it."""
    n = len(k)
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise UnsupportedError(f"{what}: auto_pad {auto!r}")
    out_shape = node.attr("output_shape")
    if out_shape is not None and len(out_shape) > 0:
        out_shape = [int(v) for v in out_shape]
        if len(out_shape) == n + 2:  # given with batch and channels: onnxruntime reads the tail
            out_shape = out_shape[2:]
        if len(out_shape) != n:
            raise UnsupportedError(f"{what}: output_shape {out_shape} for {n} spatial dims")
        begin, end = [], []
        for i, size in enumerate(sizes):
            size = as_dim(size)
            if not isinstance(size, int):
                raise UnsupportedError(
                    f"{what}: output_shape with a symbolic input size (dim {i + 2}); "
                    "give pads instead"
                )
            total = s[i] * (size - 1) + op[i] + d[i] * (k[i] - 1) + 1 - out_shape[i]
            if total < 0 and not (total == -1 and auto in ("NOTSET", "VALID")):
                raise UnsupportedError(
                    f"{what}: output_shape {out_shape} is larger than the full result "
                    f"(total padding {total}): runtimes disagree on where the zeros go"
                )
            b, e = _split(total, auto == "SAME_UPPER")
            begin.append(b)
            end.append(e)
        return begin, end
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto == "NOTSET":
        pads = _ints(node.attr("pads"), 2 * n, 0, what, "pads")
        return list(pads[:n]), list(pads[n:])
    if node.opset < 11 and any(si != 1 for si in s):
        raise UnsupportedError(
            f"{what}: {auto} with stride > 1 before opset 11 (its output size is ambiguous)"
        )
    begin, end = [], []
    for i in range(n):  # the output is in * stride: the total padding does not depend on `in`
        total = op[i] + d[i] * (k[i] - 1) + 1 - s[i]
        if total < 0:
            raise UnsupportedError(
                f"{what}: {auto} with stride {s[i]} larger than the dilated kernel "
                f"({d[i] * (k[i] - 1) + 1}) plus output_padding: runtimes disagree"
            )
        b, e = _split(total, auto == "SAME_UPPER")
        begin.append(b)
        end.append(e)
    return begin, end


def _dilate(ctx: LowerCtx, x: Node, axis: int, stride: int) -> Node:
    """``stride - 1`` zeros after every element along ``axis`` (the last one's included)."""
    shape = tuple(x.shape)
    lead, size, tail = shape[:axis], shape[axis], shape[axis + 1 :]
    x1 = ctx.reshape(x, (*lead, size, 1, *tail))
    zeros = ctx.full(0, (*lead, size, stride - 1, *tail), x.dtype)
    cat = ctx.op("concatenate", x1, zeros, axis=axis + 1)
    return ctx.reshape(cat, (*lead, as_dim(as_expr(size) * stride), *tail))


@rule("ConvTranspose", first=1)
def _conv_transpose(ctx, node, ins):
    what = node.describe()
    if len(ins) < 2 or ins[1] is None:
        raise UnsupportedError(f"{what}: no weight")
    x = ctx.node(ins[0])
    w = np.asarray(ctx.const_of(ins[1], f"{what}: the weight"))
    n = w.ndim - 2
    if n < 1 or x.rank != w.ndim:
        raise UnsupportedError(f"{what}: input {x.type} and weight of shape {list(w.shape)}")
    k = tuple(int(i) for i in w.shape[2:])
    ks = node.attr("kernel_shape")
    if ks is not None and len(ks) > 0 and tuple(int(i) for i in ks) != k:
        raise UnsupportedError(f"{what}: kernel_shape {list(ks)} differs from the weight's {k}")
    if not x.dtype.is_float:
        raise UnsupportedError(f"{what}: input of dtype {x.dtype}")
    s = _ints(node.attr("strides"), n, 1, what, "strides")
    d = _ints(node.attr("dilations"), n, 1, what, "dilations")
    op = _ints(node.attr("output_padding"), n, 0, what, "output_padding")
    if min(s) < 1 or min(d) < 1 or any(not 0 <= o < max(si, di) for o, si, di in zip(op, s, d)):
        raise UnsupportedError(
            f"{what}: strides {s}, dilations {d}, output_padding {op} (each output_padding "
            "must be below its stride or dilation)"
        )
    groups = int(node.attr("group", 1))
    sizes = x.shape[2:]
    begin, end = _pads(node, sizes, k, s, d, op, what)

    acc = acc_dtype(x.dtype)
    wt = _flipped_weight(w.astype(acc.to_numpy()), groups, what)
    name = f"{ins[1].param_name}_flipped" if ins[1].param_name else None
    y = ctx.cast(x, acc)
    for i in range(n):
        if s[i] > 1:
            y = _dilate(ctx, y, 2 + i, s[i])
    # padding of the (dilated) input, per side; the dilation's trailing zeros cropped
    low = [d[i] * (k[i] - 1) - begin[i] for i in range(n)]
    high = [d[i] * (k[i] - 1) - end[i] + op[i] - (s[i] - 1) for i in range(n)]
    sym = [max(0, min(lo, hi)) for lo, hi in zip(low, high)]  # the convolution's own padding
    low = [lo - p for lo, p in zip(low, sym)]
    high = [hi - p for hi, p in zip(high, sym)]
    if any(low) or any(high):
        zero = ctx.const(0, acc)
        y = ctx.op("pad", y, zero, low=(0, 0, *low), high=(0, 0, *high))
    attrs = {"stride": (1,) * n, "padding": tuple(sym), "dilation": d}
    y = ctx.op("convolution", y, ctx.const_node(wt, name), groups=groups, **attrs)
    if len(ins) > 2 and ins[2] is not None:
        b = ctx.cast(ctx.node(ins[2]), acc)
        if b.rank != 1:
            raise UnsupportedError(f"{what}: bias of shape {list(b.shape)}")
        y = ctx.op("add", y, ctx.op("broadcast_in_dim", b, shape=tuple(y.shape), dims=(1,)))
    return [Value.of_node(ctx.cast(y, x.dtype))]
