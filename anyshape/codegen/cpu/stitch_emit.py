"""The loop nest of a stitch group: per row, the reductions into locals, then the row.

Sits beside ``kernels`` (which dispatches here for roots ``schedule`` planned
as stitch groups, see ``stitch_plan``). The row dims form one parallel loop
nest; inside it, every row broadcast the root reads is evaluated first, which
emits each reduction as a vectorized loop over the row into a scalar; then the
root's row is written by the ordinary fused expression, where those
broadcasts are now locals. Values the reductions and the row both read (the
exp of softmax) are recomputed rather than stored: the row is in cache.
"""

from __future__ import annotations

from ...ir.graph import Node
from .ctypes_map import compute_type
from .expr import KernelScope
from .kernels import (
    _SIMD_REDUCTION,
    PARALLEL_WORK,
    _acc_type,
    _body,
    _combine,
    _indent,
    _loop_vars,
    _reduce_init,
    _store,
)


class StitchScope(KernelScope):
    """A kernel scope where an unstored reduction is computed in place, over its row."""

    def _op_reduce(self, n: Node, idx) -> str:
        x = n.inputs[0]
        kind, axis = n.attr("kind"), x.rank - 1
        acc, r = f"acc{self.counter}", f"r{self.counter}"
        self.counter += 1
        acc_t = _acc_type(kind, x.dtype)
        lines = [f"{acc_t} {acc} = {_reduce_init(kind, x.dtype)};"]
        simd = _SIMD_REDUCTION.get(kind, "").replace("acc", acc)
        float_minmax = kind in ("max", "min") and x.dtype.is_float
        if float_minmax:
            lines.append(f"int {acc}_nan = 0;")
            simd = f"reduction({kind}:{acc}) reduction(|:{acc}_nan)"
        if simd:
            lines.append(f"#pragma omp simd {simd}")
        lines.append(f"for (int64_t {r} = 0; {r} < {self.dim(x.shape[axis])}; ++{r}) {{")

        def step():
            v = self.value(x, tuple(idx) + (r,))
            if float_minmax:
                better = ">" if kind == "max" else "<"
                return f"{acc}_nan |= ({v} != {v}); {acc} = {v} {better} {acc} ? {v} : {acc};"
            return _combine(kind, acc, v, x.dtype)

        lines += _indent(_body(self, step), 1)
        lines.append("}")
        if float_minmax:
            lines.append(f'if ({acc}_nan) {acc} = ({acc_t})__builtin_nan("");')
        self.lines += lines
        ct = compute_type(n.dtype)
        return acc if acc_t == ct else f"(({ct}){acc})"


def emit_stitch(scope: StitchScope, root: Node, broadcasts: list[Node]) -> list[str]:
    names = tuple(_loop_vars(root.rank))
    rows, last = names[:-1], names[-1]
    lines: list[str] = []
    if rows:
        work = scope.dim(root.type.numel)
        collapse = f"collapse({len(rows)}) " if len(rows) > 1 else ""
        lines.append(
            f"#pragma omp parallel for {collapse}schedule(static) if(({work}) > {PARALLEL_WORK})"
        )
        lines.append(
            " ".join(
                f"for (int64_t {v} = 0; {v} < {scope.dim(d)}; ++{v})"
                for v, d in zip(rows, root.shape[:-1])
            )
            + " {"
        )

    def row():
        for b in broadcasts:  # the reductions, once per row (memoized for the loop below)
            scope.value(b, rows + ("0",))
        n = scope.dim(root.shape[-1])
        scope.lines.append(f"for (int64_t {last} = 0; {last} < {n}; ++{last}) {{")
        inner = _body(scope, lambda: _store(scope, root, names, scope._fused(root, names)))
        scope.lines += _indent(inner, 1) + ["}"]
        return ""

    lines += _indent(_body(scope, row), 1 if rows else 0)
    if rows:
        lines.append("}")
    return lines
