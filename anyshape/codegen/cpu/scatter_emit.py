"""Scatter kernels of the CPU backend: a copy of the base, then the updates written in.

Sits beside ``kernels``, which runs ``emit_scatter`` for ``scatter`` roots: a
scatter is a kernel of its own (``schedule/op_classes.py``: no element of its
result is known before every update is in, so it is never fused into a
consumer), whose operands are read as the planner left them, computed in its
loops (a zero base, a scaled gradient) or loaded from memory. Three steps:

1. every index is checked first, in one serial pass (code 1, "an index is out
   of range", before anything is written; never a wrap, never a write outside
   the result);
2. the base is copied into the result (a flat parallel copy when it is in
   memory, a parallel loop nest computing it otherwise);
3. the updates are written in. The result is ``[lead, n, trail]`` and the
   updates ``[lead, k, trail]`` (``k``: the index dims); two updates land on
   one element only when they share their lead and trail positions, so the
   threads take disjoint (lead position, block of the first trail dim) units
   and each walks every index position in row-major order: race-free, and
   "add" accumulates (in the result's own type, f16 through float as the
   interpreter's ``np.add.at``), "set" keeps the last update, both in the
   interpreter's order. The embedding gradient ([V, H] base, [N] indices,
   [N, H] updates) runs the N rows in order on each thread's share of H, the
   inner loop contiguous and vectorized.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .ctypes_map import c_type, compute_type
from .expr import KernelScope
from .loop_ir import For, loop, stmt
from .loop_nest import PARALLEL_WORK, loop_vars, nest_open, out_offset, statements, store


def emit_scatter(scope: KernelScope, root: Node) -> list:
    base, ind, upd = root.inputs
    return [
        *_check_indices(scope, ind, scope.dim(base.shape[root.attr("axis")])),
        *_copy_base(scope, root, base),
        *_write_updates(scope, root, ind, upd),
    ]


def _index(scope: KernelScope, ind: Node, names) -> str:
    v = scope.value(ind, tuple(names))
    return v if ind.dtype is DType.i64 else scope.tmp("int64_t", f"(int64_t)({v})")


def _check_indices(scope: KernelScope, ind: Node, n: str) -> list:
    """A serial pass over the indices: the kernel returns 1 at the first one outside
    ``[0, n)``, before it writes anything."""
    names = loop_vars(ind.rank, "k")
    close = nest_open(scope, ind.shape, names, "0", "serial")

    def check():
        j = _index(scope, ind, names)
        return stmt(f"if ({j} < 0 || {j} >= {n}) return 1;")

    return close(statements(scope, check))


def _copy_base(scope: KernelScope, root: Node, base: Node) -> list:
    work = scope.dim(root.type.numel)
    if scope.sched.is_materialized(base):  # one flat copy, whatever the rank
        close = nest_open(scope, (root.type.numel,), ("c0",), work)
        t = c_type(root.dtype)
        out = scope.ptr(root)

        def copy():
            return stmt(f"(({t}*){out})[c0] = ({t})({scope.load_flat(base, 'c0')});", out)

        return close(statements(scope, copy))
    names = tuple(loop_vars(root.rank))
    close = nest_open(scope, root.shape, names, work)
    return close(statements(scope, lambda: store(scope, root, names, scope.value(base, names))))


def _write_updates(scope: KernelScope, root: Node, ind: Node, upd: Node) -> list:
    a, mode = root.attr("axis"), root.attr("mode")
    lead_names = loop_vars(a, "i")
    k_names = loop_vars(ind.rank, "k")
    trail_names = loop_vars(root.rank - a - 1, "q")  # (t0, t1...: the temporaries)
    lead = [For(v, "0", scope.dim(d)) for v, d in zip(lead_names, root.shape[:a])]
    k_loops = [For(v, "0", scope.dim(d)) for v, d in zip(k_names, ind.shape)]
    trail = [For(v, "0", scope.dim(d)) for v, d in zip(trail_names, root.shape[a + 1 :])]
    before: list = []
    units = lead
    if trail:  # the first trail dim in blocks: enough units for the threads
        n_lead = scope.dim(shape_numel(root.shape[:a]))
        n0 = trail[0].stop
        parts = f"(omp_get_max_threads() + as_max64({n_lead}, 1) - 1) / as_max64({n_lead}, 1)"
        before = [  # blocks of 16 elements: a thread rarely writes into its neighbour's line
            stmt(f"const int64_t sb = as_split_block({n0}, {parts});", "sb"),
            stmt(f"const int64_t nb = ({n0} + sb - 1) / sb;", "nb"),
        ]
        units = [*lead, For("qb", "0", "nb")]
        trail[0] = For("q0", "qb * sb", test=f"q0 < as_min64({n0}, (qb + 1) * sb)")
    t, ct = c_type(root.dtype), compute_type(root.dtype)
    out = scope.ptr(root)

    def element(j: str):
        names = (*lead_names, j, *trail_names)
        u = scope.value(upd, (*lead_names, *k_names, *trail_names))
        if mode == "set":
            return store(scope, root, names, u)
        at = f"(({t}*){out})[{out_offset(scope, root, names)}]"
        return stmt(f"{at} = ({t})(({ct}){at} + {u});", out)

    def row():
        j = _index(scope, ind, k_names)
        inner = statements(scope, lambda: element(j))
        for head in reversed(trail):
            inner = (loop(head, inner),)
        return list(inner)

    body = statements(scope, row)
    for head in reversed(k_loops):  # every index position, in row-major order
        body = (loop(head, body),)
    if not units:
        return [*before, *body]
    work = scope.dim(upd.type.numel)
    pragma = (
        f"#pragma omp parallel for collapse({len(units)}) schedule(static) "
        f"if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
    )
    return [*before, loop(units, body, [pragma])]
