"""ONNX loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). Both
ops take scores ``x`` of shape ``[N, C]`` or ``[N, C, d1..dk]``, integer
targets ``[N, d1..dk]`` and optional class weights ``[C]``:

- the score of each element's class is picked with the IR's
  ``take_along_axis`` on the class axis (targets reshaped to
  ``[N, 1, d1..dk]``); SoftmaxCrossEntropyLoss first takes the log-softmax over
  the class axis (its optional second output);
- a target equal to ``ignore_index`` is replaced by 0 before any indexing (so
  it never reads out of range), then its loss and its weight are set to 0;
  a negative target left over is made too large for any dim, so the compiled
  code reports it as out of range instead of wrapping it;
- ``reduction``: ``none`` keeps ``[N, d1..dk]``, ``sum`` sums, ``mean``
  divides the sum by the sum of the selected weights (each 1 without class
  weights; ignored elements count 0).

f16/bf16 inputs compute in float32 (``acc_dtype``); the outputs have the
input's dtype. Every input constant folds with NumPy.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.graph import Node
from .context import LowerCtx, Value, rule_registry
from .nn_ops import acc_dtype, softmax

RULES, rule = rule_registry()

_REDUCTIONS = ("none", "sum", "mean")


# --- attributes and shapes ----------------------------------------------------------------


def _attributes(node) -> tuple[str, int | None]:
    """(reduction, ignore_index or None)."""
    reduction = node.attr("reduction", "mean") or "mean"
    if reduction not in _REDUCTIONS:
        raise UnsupportedError(
            f"{node.describe()}: reduction {reduction!r} is not one of none/sum/mean"
        )
    ignore = node.attr("ignore_index")
    return reduction, None if ignore is None else int(ignore)


def _check_operands(ctx: LowerCtx, x: Value, target: Value, weight: Value | None, what: str):
    """Ranks and dtypes as the op needs them; the target's dims guarded equal to the input's."""
    if x.rank < 2:
        raise UnsupportedError(f"{what}: input of rank {x.rank}, needs [N, C, d1..dk]")
    if not x.dtype.is_float:
        raise UnsupportedError(f"{what}: input of dtype {x.dtype}, needs a float type")
    if not target.dtype.is_int:
        raise UnsupportedError(f"{what}: target of dtype {target.dtype}, needs int32 or int64")
    if target.rank != x.rank - 1:
        raise UnsupportedError(
            f"{what}: target of rank {target.rank} for an input of rank {x.rank} (needs {x.rank - 1})"
        )
    if weight is not None and (weight.rank != 1 or weight.dtype != x.dtype):
        raise UnsupportedError(
            f"{what}: weight must be a 1-D {x.dtype} tensor, got {weight.dtype}{list(weight.shape)}"
        )
    pairs = [(x.shape[0], target.shape[0], "N of input and target")]
    pairs += [
        (a, b, f"d{i + 1} of input and target")
        for i, (a, b) in enumerate(zip(x.shape[2:], target.shape[1:]))
    ]
    if weight is not None:
        pairs.append((x.shape[1], weight.shape[0], "C of input and weight"))
    for a, b, name in pairs:
        try:
            ctx.b.constraints.guard_eq(a, b, f"{what}: dim {name}")
        except ValueError as e:
            raise UnsupportedError(str(e)) from None


# --- folding --------------------------------------------------------------------------------


def _fold(x, target, weight, reduction: str, ignore, log_softmax: bool) -> list[np.ndarray]:
    """The op on constants, with NumPy (float64, cast back to the input's dtype)."""
    xs = x.astype(np.float64)
    if log_softmax:
        z = xs - xs.max(axis=1, keepdims=True)
        xs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    t = target.astype(np.int64)
    ignored = np.zeros(t.shape, bool) if ignore is None else t == ignore
    safe = np.where(ignored, 0, t)
    if safe.size and (safe.min() < 0 or safe.max() >= x.shape[1]):
        raise UnsupportedError("a loss's target is out of range for its classes")
    picked = np.take_along_axis(xs, np.expand_dims(safe, 1), axis=1)[:, 0]
    w = np.ones(t.shape) if weight is None else weight.astype(np.float64)[safe]
    w = np.where(ignored, 0.0, w)
    loss = -picked * w
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        with np.errstate(all="ignore"):
            loss = loss.sum() / w.sum()
    outs = [np.asarray(loss).astype(x.dtype)]
    if log_softmax:
        outs.append(xs.astype(x.dtype))
    return outs


# --- IR ---------------------------------------------------------------------------------------


def _safe_targets(ctx: LowerCtx, t: Node, ignore: int | None) -> tuple[Node, Node | None]:
    """(targets fit for indexing, the mask of ignored elements or None)."""
    ignored = None
    info = np.iinfo(t.dtype.to_numpy())
    if ignore is not None and info.min <= ignore <= info.max:  # else no target equals it
        ignored = ctx.op("eq", t, ctx.full(ignore, t.shape, t.dtype))
        t = ctx.op("select", ignored, ctx.full(0, t.shape, t.dtype), t)
    too_large = int(info.max)
    negative = ctx.op("lt", t, ctx.full(0, t.shape, t.dtype))
    t = ctx.op("select", negative, ctx.full(too_large, t.shape, t.dtype), t)
    return t, ignored


def _pick_classes(ctx: LowerCtx, scores: Node, t: Node) -> Node:
    """``scores[n, t[n, d..], d..]``: shape ``[N, d1..dk]``."""
    idx = ctx.reshape(t, (t.shape[0], 1, *t.shape[1:]))
    picked = ctx.op("take_along_axis", scores, idx, axis=1)
    return ctx.reshape(picked, t.shape)


def _zero_where(ctx: LowerCtx, mask: Node | None, v: Node) -> Node:
    if mask is None:
        return v
    return ctx.op("select", mask, ctx.full(0, v.shape, v.dtype), v)


def _reduce_loss(ctx: LowerCtx, loss: Node, w: Node | None, reduction: str) -> Node:
    """The per-element loss reduced as ``reduction`` says (``w``: the selected weights)."""
    if reduction == "none":
        return loss
    axes = tuple(range(loss.rank))
    if reduction == "sum":
        return ctx.reduce(loss, "sum", axes)
    if w is None:
        return ctx.mean(loss, axes)
    return ctx.op("div", ctx.reduce(loss, "sum", axes), ctx.reduce(w, "sum", axes))


def lower_loss(ctx: LowerCtx, node, ins, log_softmax: bool) -> list[Value]:
    """[loss] (and log_prob for SoftmaxCrossEntropyLoss) of the node's inputs."""
    what = node.describe()
    x, target = ins[0], ins[1]
    weight = ins[2] if len(ins) > 2 else None
    reduction, ignore = _attributes(node)
    _check_operands(ctx, x, target, weight, what)
    if all(v is None or v.const is not None for v in (x, target, weight)):
        w_const = None if weight is None else weight.const
        outs = _fold(x.const, target.const, w_const, reduction, ignore, log_softmax)
        return [Value.of_const(o) for o in outs]
    acc = acc_dtype(x.dtype)
    scores = ctx.cast(ctx.node(x), acc)
    if log_softmax:
        scores = softmax(ctx, scores, 1, log=True)
    t, ignored = _safe_targets(ctx, ctx.node(target), ignore)
    loss = ctx.op("neg", _pick_classes(ctx, scores, t))
    w = None
    if weight is not None:
        w = ctx.op("gather", ctx.cast(ctx.node(weight), acc), t, axis=0)
        loss = ctx.op("mul", loss, w)
    if ignored is not None:
        loss = _zero_where(ctx, ignored, loss)
        w = _zero_where(ctx, ignored, ctx.full(1, t.shape, acc) if w is None else w)
    outs = [Value.of_node(ctx.cast(_reduce_loss(ctx, loss, w, reduction), x.dtype))]
    if log_softmax:
        outs.append(Value.of_node(ctx.cast(scores, x.dtype)))
    return outs


@rule("NegativeLogLikelihoodLoss", first=12)
def _nll_loss(ctx, node, ins):
    return lower_loss(ctx, node, ins, log_softmax=False)


@rule("SoftmaxCrossEntropyLoss", first=12)
def _softmax_cross_entropy(ctx, node, ins):
    return lower_loss(ctx, node, ins, log_softmax=True)
