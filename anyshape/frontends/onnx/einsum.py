"""ONNX ``Einsum``: an equation lowered to transposes, reductions and one batched ``dot``.

One family of the ONNX frontend's rule table (``rules.py`` gathers it). The
equation (``"bij,bjk->bik"``, ``"...ii->...i"``, implicit outputs) is parsed
into one letter per axis, ``...`` expanded to fresh letters by each operand's
rank. Each operand first takes its diagonals (a letter repeated in it: a gather
of ``i * (n + 1)`` over the two axes flattened) and sums the letters no other
operand and not the output has. Operands then combine left to right, two at a
time: letters both have and a later use needs are batch dims, letters both
have and nothing later needs are contracted, the rest are kept on their side;
the pair becomes ``[batch, left, k] x [batch, k, right]``, one ``dot`` (computed
in float32 for 16-bit floats, as MatMul). The result is transposed to the
output's order. Sizes may be symbolic; two operands' sizes of one letter are
guarded equal, and a letter of size 1 on one side broadcasts only when static.
"""

from __future__ import annotations

import string

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_expr, shape_numel
from .context import LowerCtx, Value, rule_registry
from .nn_ops import acc_dtype

RULES, rule = rule_registry()


def parse_equation(equation: str, ranks: list[int], what: str) -> tuple[list[str], str]:
    """Each operand's letters (one per axis) and the output's, with ``...`` expanded."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise UnsupportedError(f"{what}: {len(terms)} terms for {len(ranks)} inputs")
    used = set(text) - set(".,->")
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in used]
    n_ellipsis = max(
        (r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0
    )
    ell = "".join(spare[:n_ellipsis])
    letters = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ellipsis - k :] if k else "")
        if len(t) != r or (t and not t.isalpha()):
            raise UnsupportedError(f"{what}: term {t!r} does not match rank {r}")
        letters.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit: the ellipsis, then the letters used once, in alphabetical order
        counts = {c: "".join(letters).count(c) for c in set("".join(letters))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if not out.isalpha() and out:
        raise UnsupportedError(f"{what}: output term {out!r}")
    if set(out) - set("".join(letters)) or len(set(out)) != len(out):
        raise UnsupportedError(f"{what}: output {out!r} repeats a letter or has one no input has")
    return letters, out


@rule("Einsum", first=12)
def _einsum(ctx, node, ins):
    what = node.describe()
    xs = [ctx.node(v) for v in ins]
    letters, out = parse_equation(node.attr("equation"), [x.rank for x in xs], what)
    if len({x.dtype for x in xs}) != 1:
        raise UnsupportedError(f"{what}: operand dtypes differ")
    dtype = xs[0].dtype
    work = acc_dtype(dtype) if dtype.is_float else dtype
    ops = [_diagonals(ctx, ctx.cast(x, work), t) for x, t in zip(xs, letters)]
    for k, (x, t) in enumerate(ops):
        later = set(out) | {c for _, u in ops[:k] + ops[k + 1 :] for c in u}
        ops[k] = _sum_out(ctx, x, t, later)
    y, t = ops[0]
    for k in range(1, len(ops)):
        later = set(out) | {c for _, u in ops[k + 1 :] for c in u}
        y, t = _pair(ctx, (y, t), ops[k], later, what)
    y, t = _sum_out(ctx, y, t, set(out))
    y = ctx.transpose(y, [t.index(c) for c in out]) if t != out else y
    return [Value.of_node(ctx.cast(y, dtype))]


def _diagonals(ctx: LowerCtx, x: Node, t: str) -> tuple[Node, str]:
    """``x`` with each repeated letter's axes reduced to their diagonal."""
    while len(set(t)) != len(t):
        c = next(c for c in t if t.count(c) > 1)
        i, j = t.index(c), t.index(c, t.index(c) + 1)
        perm = [a for a in range(len(t)) if a not in (i, j)] + [i, j]
        x = ctx.transpose(x, perm)
        n = x.shape[-1]
        ctx.b.constraints.guard_eq(x.shape[-2], n, f"Einsum diagonal of {c!r}")
        flat = ctx.reshape(x, tuple(x.shape[:-2]) + (shape_numel((n, n)),))
        idx = ctx.op("iota", shape=(n,), dim=0, dtype=DType.i64)
        idx = ctx.op("mul", idx, ctx.broadcast_to(ctx.scalar(as_expr(n) + 1, DType.i64), (n,)))
        x = ctx.op("gather", flat, idx, axis=len(flat.shape) - 1)
        t = "".join(t[a] for a in perm[:-2]) + c
    return x, t


def _sum_out(ctx: LowerCtx, x: Node, t: str, keep: set[str]) -> tuple[Node, str]:
    axes = [a for a, c in enumerate(t) if c not in keep]
    if not axes:
        return x, t
    return ctx.reduce(x, "sum", axes), "".join(c for c in t if c in keep)


def _pair(ctx: LowerCtx, a, b, later: set[str], what: str) -> tuple[Node, str]:
    """Two operands contracted over the letters both have and nothing later needs."""
    (x, s), (y, t) = a, b
    batch = [c for c in s if c in t and c in later]
    contract = [c for c in s if c in t and c not in later]
    left = [c for c in s if c not in t]
    right = [c for c in t if c not in s]
    size = {}
    for c, d in list(zip(s, x.shape)) + list(zip(t, y.shape)):
        if c in size and as_expr(size[c]) != as_expr(d):
            if isinstance(size[c], int) and isinstance(d, int):
                raise UnsupportedError(f"{what}: letter {c!r} has sizes {size[c]} and {d}")
            ctx.b.constraints.guard_eq(size[c], d, f"{what}: size of {c!r}")
        size.setdefault(c, d)
    dims = lambda cs: tuple(size[c] for c in cs)  # noqa: E731
    xt = ctx.transpose(x, [s.index(c) for c in batch + left + contract])
    yt = ctx.transpose(y, [t.index(c) for c in batch + contract + right])
    nb, nl, nk, nr = (shape_numel(dims(cs)) for cs in (batch, left, contract, right))
    x3 = ctx.reshape(xt, (nb, nl, nk))
    y3 = ctx.reshape(yt, (nb, nk, nr))
    z = ctx.op("dot", x3, y3)
    letters = "".join(batch + left + right)
    return ctx.reshape(z, dims(letters)), letters
