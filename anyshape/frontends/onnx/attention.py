"""ONNX attention and normalizations: Attention, RotaryEmbedding, RMS/Group/Instance norm, LRN.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). Every
rule builds IR from primitives, computing f16/bf16 in f32 (``acc_dtype``) and
rounding back where ONNX's reference rounds; dims may be symbolic throughout.

- ``Attention`` (opsets 23-25): 3-D inputs split into heads (``reshape`` and
  ``transpose``), past key/value concatenated on the sequence axis, ``Q @ K^T``
  and ``P @ V`` as batched ``dot``s. Grouped-query heads never repeat K/V: the
  query heads that share a KV head fold into the rows of one ``dot``. The
  additive bias (boolean or float ``attn_mask``, padded with ``-inf`` to the
  total length; the offset-aware causal mask; opset 25's sliding window;
  opset 24's ``nonpad_kv_seqlen`` padding) is built from ``iota`` compares; a
  query row whose bias is all ``-inf`` gets zero probabilities, as the spec says.
- ``RotaryEmbedding``: the cos/sin caches (gathered by ``position_ids`` when
  given) broadcast over the heads; halves or interleaved pairs are ``slice``\\ s,
  put back with ``concatenate``.
- ``RMSNormalization``, ``GroupNormalization`` (opset 18: scale and bias per
  group; 21: per channel), ``InstanceNormalization`` reduce with ``mean``;
  ``LRN`` sums the ``size`` shifted slices of the zero-padded squares.
"""

from __future__ import annotations

import math

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, floordiv
from .context import LowerCtx, Value, norm_axis, rule_registry
from .nn_ops import acc_dtype, softmax
from .reader import ir_dtype

RULES, rule = rule_registry()
_NEG_INF = -math.inf


# --- shared helpers -----------------------------------------------------------------------------


def _opt(ins, i: int) -> Value | None:
    return ins[i] if i < len(ins) else None


def _scalar_op(ctx: LowerCtx, name: str, x: Node, value: float) -> Node:
    """``x <name> value`` with the scalar broadcast over ``x``."""
    return ctx.op(name, x, ctx.full(value, x.shape, x.dtype))


def _round_to(ctx: LowerCtx, x: Node, dtype: DType) -> Node:
    """``x`` rounded to ``dtype`` and back (where ONNX's reference computes in ``dtype``)."""
    return ctx.cast(ctx.cast(x, dtype), x.dtype)


def _split_heads(ctx: LowerCtx, x: Node, heads: int, what: str) -> Node:
    """``[B, S, heads * D] -> [B, heads, S, D]``."""
    hidden = as_dim(x.shape[2])
    if isinstance(hidden, int) and hidden % heads:
        raise UnsupportedError(f"{what}: hidden size {hidden} is not divisible by {heads} heads")
    head = as_dim(floordiv(as_expr(hidden), heads))
    return ctx.transpose(ctx.reshape(x, (x.shape[0], x.shape[1], heads, head)), (0, 2, 1, 3))


def _normalized(ctx: LowerCtx, x: Node, axes, eps: float) -> Node:
    """``(x - mean) / sqrt(var + eps)`` over ``axes``."""
    m = ctx.mean(x, axes)
    d = ctx.op("sub", x, ctx.expand_back(m, x.shape, axes))
    var = ctx.mean(ctx.op("mul", d, d), axes)
    rstd = ctx.op("rsqrt", _scalar_op(ctx, "add", var, eps))
    return ctx.op("mul", d, ctx.expand_back(rstd, x.shape, axes))


def _stash_dtype(node, x: Node) -> DType:
    return acc_dtype(x.dtype) if int(node.attr("stash_type", 1)) == 1 else x.dtype


def _scale_shift(ctx: LowerCtx, y: Node, scale: Value, bias: Value, dims) -> Node:
    """``y * scale + bias`` with both vectors laid along ``dims`` of ``y``."""
    for v, op in ((scale, "mul"), (bias, "add")):
        p = ctx.cast(ctx.node(v), y.dtype)
        y = ctx.op(op, y, ctx.op("broadcast_in_dim", p, shape=tuple(y.shape), dims=tuple(dims)))
    return y


# --- normalizations ----------------------------------------------------------------------------


@rule("RMSNormalization", first=23)
def _rms_norm(ctx, node, ins):
    x, scale = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, what)
    axes = tuple(range(axis, x.rank))
    xs = ctx.cast(x, _stash_dtype(node, x))
    ms = ctx.mean(ctx.op("mul", xs, xs), axes)
    inv = ctx.op("rsqrt", _scalar_op(ctx, "add", ms, float(node.attr("epsilon", 1e-5))))
    y = _round_to(ctx, ctx.op("mul", xs, ctx.expand_back(inv, xs.shape, axes)), x.dtype)
    acc = acc_dtype(scale.dtype)
    y = ctx.cast(y, acc)
    s = ctx.cast(scale, acc)
    s = ctx.broadcast_to(s, ctx.broadcast_shape([x.shape[axis:], s.shape], what))
    y = ctx.op("mul", y, ctx.broadcast_to(s, y.shape))
    return [Value.of_node(ctx.cast(y, scale.dtype))]


@rule("InstanceNormalization", first=1)
def _instance_norm(ctx, node, ins):
    x = ctx.node(ins[0])
    if x.rank < 3:
        raise UnsupportedError(f"{node.describe()}: input of rank {x.rank} (needs N, C, spatial)")
    acc = acc_dtype(x.dtype)
    eps = float(node.attr("epsilon", 1e-5))
    y = _normalized(ctx, ctx.cast(x, acc), tuple(range(2, x.rank)), eps)
    y = _scale_shift(ctx, y, ins[1], ins[2], (1,))
    return [Value.of_node(ctx.cast(y, x.dtype))]


@rule("GroupNormalization", first=18)
def _group_norm(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    groups = int(node.attr("num_groups", 0))
    if x.rank < 2 or groups < 1:
        raise UnsupportedError(f"{what}: input {x.type} with num_groups {groups}")
    c = as_dim(x.shape[1])
    if isinstance(c, int) and c % groups:
        raise UnsupportedError(f"{what}: {c} channels are not divisible by {groups} groups")
    per_group = as_dim(floordiv(as_expr(c), groups))
    grouped = (x.shape[0], groups, per_group, *x.shape[2:])
    stash = _stash_dtype(node, x) if node.opset >= 21 else acc_dtype(x.dtype)
    xg = ctx.reshape(ctx.cast(x, stash), grouped)
    y = _normalized(ctx, xg, tuple(range(2, len(grouped))), float(node.attr("epsilon", 1e-5)))
    y = ctx.cast(_round_to(ctx, y, x.dtype), acc_dtype(x.dtype))
    if node.opset >= 21:
        y = _scale_shift(ctx, ctx.reshape(y, x.shape), ins[1], ins[2], (1,))
    else:
        if ins[1].rank != 1 or not ctx.b.constraints.prove_eq(ins[1].shape[0], groups):
            raise UnsupportedError(f"{what}: opset 18 takes scale and bias of shape ({groups},)")
        y = ctx.reshape(_scale_shift(ctx, y, ins[1], ins[2], (1,)), x.shape)
    return [Value.of_node(ctx.cast(y, x.dtype))]


@rule("LRN", first=1)
def _lrn(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    size = int(node.attr("size", 0))
    if x.rank < 3 or size < 1:
        raise UnsupportedError(f"{what}: input {x.type} with size {size}")
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    xs = ctx.cast(x, acc_dtype(x.dtype))
    sq = ctx.op("mul", xs, xs)
    low, high = (size - 1) // 2, size // 2  # floor((size-1)/2), ceil((size-1)/2)
    rest = (0,) * (x.rank - 2)
    zero = ctx.const(0.0, sq.dtype)
    padded = ctx.op("pad", sq, zero, low=(0, low, *rest), high=(0, high, *rest))
    total = None
    for k in range(size):  # the window's k-th channel, for every channel at once
        limit = (sq.shape[0], as_dim(as_expr(sq.shape[1]) + k), *sq.shape[2:])
        part = ctx.op("slice", padded, start=(0, k, *rest), limit=limit, stride=(1,) * x.rank)
        total = part if total is None else ctx.op("add", total, part)
    base = _scalar_op(ctx, "add", _scalar_op(ctx, "mul", total, alpha / size), bias)
    y = ctx.op("div", xs, _scalar_op(ctx, "pow", base, beta))
    return [Value.of_node(ctx.cast(y, x.dtype))]


# --- rotary embedding ---------------------------------------------------------------------------


def _last_slice(ctx: LowerCtx, x: Node, start, limit) -> Node:
    """``x[..., start:limit]``."""
    lead = x.rank - 1
    return ctx.op(
        "slice",
        x,
        start=(0,) * lead + (as_dim(start),),
        limit=tuple(x.shape[:lead]) + (as_dim(limit),),
        stride=(1,) * x.rank,
    )


def _rotary_cache(ctx: LowerCtx, cache: Value, pos: Value | None, what: str) -> Node:
    """The cos or sin values per (batch, position): ``[B, S, R/2]``."""
    c = ctx.node(cache)
    if pos is not None:
        if c.rank != 2:
            raise UnsupportedError(f"{what}: with position_ids the caches must be 2-D")
        return ctx.op("gather", c, ctx.node(pos), axis=0)
    if c.rank != 3:
        raise UnsupportedError(f"{what}: without position_ids the caches must be 3-D")
    return c


@rule("RotaryEmbedding", first=23)
def _rotary(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    acc = acc_dtype(x.dtype)
    if x.rank == 4:  # [B, H, S, D]
        x4, cache_dims = x, (0, 2, 3)
    elif x.rank == 3:  # [B, S, H * D]
        heads = int(node.attr("num_heads", 0))
        if heads < 1:
            raise UnsupportedError(f"{what}: a 3-D input needs num_heads")
        x4 = ctx.transpose(_split_heads(ctx, x, heads, what), (0, 2, 1, 3))  # [B, S, H, D]
        cache_dims = (0, 1, 3)
    else:
        raise UnsupportedError(f"{what}: input of rank {x.rank} (needs 3 or 4)")
    x4 = ctx.cast(x4, acc)
    head = x4.shape[3]
    rdim = int(node.attr("rotary_embedding_dim", 0)) or head
    if isinstance(as_dim(rdim), int) and rdim % 2:
        raise UnsupportedError(f"{what}: an odd rotary dim {rdim}")
    try:
        ctx.b.constraints.guard_le(rdim, head, f"{what}: rotary dim <= head size")
    except ValueError as e:
        raise UnsupportedError(str(e)) from None
    half = as_dim(floordiv(as_expr(rdim), 2))
    pos = _opt(ins, 3)
    cos = _rotary_cache(ctx, ins[1], pos, what)
    sin = _rotary_cache(ctx, ins[2], pos, what)
    shape = (*x4.shape[:3], half)
    cos, sin = (
        ctx.op("broadcast_in_dim", ctx.cast(c, acc), shape=shape, dims=cache_dims)
        for c in (cos, sin)
    )
    interleaved = bool(int(node.attr("interleaved", 0)))
    if interleaved:  # pairs (x[2i], x[2i+1]) as a trailing axis of 2 (no strided slices)
        pairs = ctx.reshape(_last_slice(ctx, x4, 0, rdim), (*shape, 2))
        x1, x2 = (ctx.reshape(_last_slice(ctx, pairs, i, i + 1), shape) for i in (0, 1))
    else:
        x1, x2 = _last_slice(ctx, x4, 0, half), _last_slice(ctx, x4, half, rdim)
    real = ctx.op("sub", ctx.op("mul", cos, x1), ctx.op("mul", sin, x2))
    imag = ctx.op("add", ctx.op("mul", sin, x1), ctx.op("mul", cos, x2))
    if interleaved:
        pair = (*shape, 1)
        y = ctx.op("concatenate", ctx.reshape(real, pair), ctx.reshape(imag, pair), axis=4)
        y = ctx.reshape(y, (*shape[:3], rdim))
    else:
        y = ctx.op("concatenate", real, imag, axis=3)
    if not ctx.b.constraints.prove_eq(rdim, head):
        y = ctx.op("concatenate", y, _last_slice(ctx, x4, rdim, head), axis=3)
    return [Value.of_node(ctx.cast(ctx.reshape(y, x.shape), x.dtype))]


# --- attention: the additive bias --------------------------------------------------------------


def _add_bias(ctx: LowerCtx, a: Node | None, b: Node, what: str) -> Node:
    if a is None:
        return b
    return ctx.op("add", *ctx.broadcast_all([a, b], what))


def _allowed_to_bias(ctx: LowerCtx, allowed: Node, dtype: DType) -> Node:
    """0 where ``allowed``, ``-inf`` elsewhere."""
    zero = ctx.full(0.0, allowed.shape, dtype)
    return ctx.op("select", allowed, zero, ctx.full(_NEG_INF, allowed.shape, dtype))


def _mask_bias(ctx: LowerCtx, mask: Node, total, dtype: DType, what: str) -> Node:
    """``attn_mask`` as an additive bias, its last dim padded with ``-inf`` to ``total``."""
    if mask.rank == 0:
        raise UnsupportedError(f"{what}: a rank-0 attn_mask")
    bias = _allowed_to_bias(ctx, mask, dtype) if mask.dtype.is_bool else ctx.cast(mask, dtype)
    store = ctx.b.constraints
    last = mask.shape[-1]
    if store.prove_eq(last, total):
        return bias
    try:
        store.guard_le(last, total, f"{what}: attn_mask's last dim <= the total sequence length")
    except ValueError as e:
        raise UnsupportedError(str(e)) from None
    high = (0,) * (mask.rank - 1) + (as_dim(as_expr(total) - as_expr(last)),)
    fill = ctx.const(_NEG_INF, dtype)
    return ctx.op("pad", bias, fill, low=(0,) * mask.rank, high=high)


def _frontier(ctx: LowerCtx, sq, total, offset) -> tuple[Node, Node]:
    """``(i + offset, j)`` over ``[Sq, T]``, or ``[B, Sq, T]`` for a per-batch offset tensor."""
    i64 = DType.i64
    if isinstance(offset, Node):
        shape = (offset.shape[0], sq, total)
        i = ctx.op("iota", shape=shape, dim=1, dtype=i64)
        j = ctx.op("iota", shape=shape, dim=2, dtype=i64)
        off = ctx.op("broadcast_in_dim", offset, shape=shape, dims=(0,))
        return ctx.op("add", i, off), j
    shape = (sq, total)
    i = ctx.op("iota", shape=shape, dim=0, dtype=i64)
    j = ctx.op("iota", shape=shape, dim=1, dtype=i64)
    if not (isinstance(as_dim(offset), int) and as_dim(offset) == 0):
        i = ctx.op("add", i, ctx.broadcast_to(ctx.scalar(offset, i64), shape))
    return i, j


def _as_bias(ctx: LowerCtx, allowed: Node, dtype: DType) -> Node:
    """A frontier's allowed set as a bias; a per-batch one gets its head axis."""
    bias = _allowed_to_bias(ctx, allowed, dtype)
    if bias.rank == 3:
        bias = ctx.reshape(bias, (bias.shape[0], 1, *bias.shape[1:]))
    return bias


def _window_allowed(ctx: LowerCtx, pos: Node, j: Node, left: int, right: int) -> Node:
    """``pos - left <= j <= pos + right`` for each nonnegative bound."""
    diff = ctx.op("sub", pos, j)
    allowed = None
    for bound, d in ((left, diff), (right, ctx.op("neg", diff))):
        if bound < 0:
            continue
        ok = ctx.op("le", d, ctx.full(bound, d.shape, d.dtype))
        allowed = ok if allowed is None else ctx.op("and", allowed, ok)
    return allowed


def _attention_bias(ctx, node, ins, sq, total, past_len, dtype: DType):
    """The additive bias (rank <= 4, broadcast to ``[B, Hq, Sq, T]``) or None, and whether
    some query row may be fully masked."""
    what = node.describe()
    mask, nonpad = _opt(ins, 3), _opt(ins, 6)
    bias = None
    if mask is not None:
        bias = _mask_bias(ctx, ctx.node(mask), total, dtype, what)
    offset = past_len
    if nonpad is not None:
        lens = ctx.node(nonpad)
        if lens.rank != 1 or not lens.dtype.is_int:
            raise UnsupportedError(f"{what}: nonpad_kv_seqlen must be an integer vector")
        lens = ctx.cast(lens, DType.i64)
        offset = ctx.op("sub", lens, ctx.broadcast_to(ctx.scalar(sq, DType.i64), lens.shape))
    if int(node.attr("is_causal", 0)):
        pos, j = _frontier(ctx, sq, total, offset)
        bias = _add_bias(ctx, bias, _as_bias(ctx, ctx.op("le", j, pos), dtype), what)
    left, right = -1, -1
    if node.opset >= 25:
        left = int(node.attr("left_window_size", -1))
        right = int(node.attr("right_window_size", -1))
    if left >= 0 or right >= 0:
        pos, j = _frontier(ctx, sq, total, offset)
        window = _as_bias(ctx, _window_allowed(ctx, pos, j, left, right), dtype)
        bias = _add_bias(ctx, bias, window, what)
    if nonpad is not None:
        b = lens.shape[0]
        j = ctx.op("iota", shape=(b, total), dim=1, dtype=DType.i64)
        valid = ctx.op("lt", j, ctx.op("broadcast_in_dim", lens, shape=(b, total), dims=(0,)))
        pad_bias = ctx.reshape(_allowed_to_bias(ctx, valid, dtype), (b, 1, 1, total))
        bias = _add_bias(ctx, bias, pad_bias, what)
    may_empty_rows = mask is not None or nonpad is not None or left >= 0 or right >= 0
    return bias, may_empty_rows


def _zero_masked_rows(ctx: LowerCtx, probs: Node, bias: Node) -> Node:
    """Zero the rows of ``probs`` whose bias is all ``-inf`` (no key may be attended)."""
    row_max = ctx.reduce(bias, "max", (bias.rank - 1,))
    empty = ctx.op("eq", row_max, ctx.full(_NEG_INF, row_max.shape, row_max.dtype))
    dims = tuple(range(probs.rank - bias.rank, probs.rank - 1))
    empty = ctx.op("broadcast_in_dim", empty, shape=tuple(probs.shape), dims=dims)
    return ctx.op("select", empty, ctx.full(0.0, probs.shape, probs.dtype), probs)


# --- attention ---------------------------------------------------------------------------------


def _group_size(ctx: LowerCtx, hq, hkv, what: str):
    """How many query heads share one KV head (1 for multi-head attention)."""
    store = ctx.b.constraints
    if store.prove_eq(hq, hkv):
        return 1
    hq, hkv = as_dim(hq), as_dim(hkv)
    if isinstance(hkv, int) and hkv == 1:
        return hq
    if isinstance(hq, int) and isinstance(hkv, int):
        if hq % hkv:
            raise UnsupportedError(f"{what}: {hq} query heads are not a multiple of {hkv} KV heads")
        return hq // hkv
    raise UnsupportedError(f"{what}: query heads {hq} and KV heads {hkv} must be static to group")


def _grouped_dot(ctx: LowerCtx, a: Node, b: Node, group) -> Node:
    """``a [B, Hq, M, K] @ b [B, Hkv, K, N]``, query head h reading KV head ``h // group``."""
    if isinstance(group, int) and group == 1:
        return ctx.op("dot", a, b)
    bsz, hq, m, _ = a.shape
    rows = as_dim(as_expr(group) * as_expr(m))
    folded = ctx.reshape(a, (bsz, b.shape[1], rows, a.shape[3]))
    return ctx.reshape(ctx.op("dot", folded, b), (bsz, hq, m, b.shape[3]))


def _heads(ctx: LowerCtx, node, q: Node, k: Node, v: Node) -> tuple[Node, Node, Node]:
    """Q, K, V as ``[B, H, S, D]``."""
    what = node.describe()
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise UnsupportedError(f"{what}: Q, K, V of ranks {q.rank}, {k.rank}, {v.rank}")
    if q.rank == 4:
        return q, k, v
    hq, hkv = int(node.attr("q_num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if hq < 1 or hkv < 1:
        raise UnsupportedError(f"{what}: 3-D inputs need q_num_heads and kv_num_heads")
    return (
        _split_heads(ctx, q, hq, what),
        _split_heads(ctx, k, hkv, what),
        _split_heads(ctx, v, hkv, what),
    )


def _with_past(ctx: LowerCtx, past: Value | None, x: Node, what: str) -> Node:
    if past is None:
        return x
    p = ctx.node(past)
    if p.rank != 4 or p.dtype != x.dtype:
        raise UnsupportedError(f"{what}: past state {p.type} does not fit {x.type}")
    return ctx.op("concatenate", p, x, axis=2)


def _scale(ctx: LowerCtx, node, head, dtype: DType) -> Node:
    """The score scale (``1/sqrt(head_size)`` by default) as a rank-0 node."""
    scale = node.attr("scale")
    if scale is not None:
        return ctx.const(float(scale), dtype)
    head = as_dim(head)
    if isinstance(head, int):
        return ctx.const(1.0 / math.sqrt(head), dtype)
    return ctx.op("rsqrt", ctx.cast(ctx.scalar(head, DType.i64), dtype))


@rule("Attention", first=23)
def _attention(ctx, node, ins):
    what = node.describe()
    q, k, v = _heads(ctx, node, *(ctx.node(x) for x in ins[:3]))
    past_k, past_v, nonpad = _opt(ins, 4), _opt(ins, 5), _opt(ins, 6)
    if (past_k is None) != (past_v is None):
        raise UnsupportedError(f"{what}: past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise UnsupportedError(f"{what}: nonpad_kv_seqlen cannot be combined with a past cache")
    present_k = _with_past(ctx, past_k, k, what)
    present_v = _with_past(ctx, past_v, v, what)
    past_len = 0 if past_k is None else past_k.shape[2]
    dt, acc = q.dtype, acc_dtype(q.dtype)
    sq, total = q.shape[2], present_k.shape[2]
    group = _group_size(ctx, q.shape[1], present_k.shape[1], what)

    # Scores: (Q * scale) @ K^T, rounded to Q's type as ONNX's reference does.
    scale = _scale(ctx, node, q.shape[3], acc)
    qs = _round_to(ctx, ctx.op("mul", ctx.cast(q, acc), ctx.broadcast_to(scale, q.shape)), dt)
    kt = ctx.transpose(ctx.cast(present_k, acc), (0, 1, 3, 2))
    scores = _round_to(ctx, _grouped_dot(ctx, qs, kt, group), dt)
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise UnsupportedError(f"{what}: qk_matmul_output_mode {mode}")
    qk_out = scores
    softcap = float(node.attr("softcap", 0.0))
    if softcap > 0:
        scores = _scalar_op(ctx, "div", scores, softcap)
        scores = _round_to(ctx, _scalar_op(ctx, "mul", ctx.op("tanh", scores), softcap), dt)
        qk_out = scores if mode == 1 else qk_out

    bias, may_empty_rows = _attention_bias(ctx, node, ins, sq, total, past_len, acc)
    if bias is not None:
        shape = ctx.broadcast_shape([scores.shape, bias.shape], what)
        if len(shape) != 4:
            raise UnsupportedError(f"{what}: attn_mask of shape {bias.shape} has too many dims")
        scores = ctx.op("add", ctx.broadcast_to(scores, shape), ctx.broadcast_to(bias, shape))
    if mode == 2:
        qk_out = scores

    # Softmax in softmax_precision (default: Q's type, computed as f32 for f16).
    precision = node.attr("softmax_precision")
    sdt = dt if precision is None else ir_dtype(int(precision), f"{what}: softmax_precision")
    logits = ctx.cast(ctx.cast(scores, sdt), acc_dtype(sdt))
    probs = softmax(ctx, logits, 3, log=False)
    if bias is not None and may_empty_rows:
        probs = _zero_masked_rows(ctx, probs, ctx.cast(bias, probs.dtype))
    probs = ctx.cast(ctx.cast(probs, dt), acc)
    if mode == 3:
        qk_out = probs

    y = _grouped_dot(ctx, probs, ctx.cast(present_v, acc), group)
    if ins[0].rank == 3:
        y = ctx.transpose(y, (0, 2, 1, 3))
        y = ctx.reshape(y, (y.shape[0], y.shape[1], as_dim(as_expr(y.shape[2]) * y.shape[3])))
    outs = [ctx.cast(y, dt), present_k, present_v, ctx.cast(qk_out, dt)]
    return [Value.of_node(n) for n in outs]
