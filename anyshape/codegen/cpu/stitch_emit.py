"""The loop nest of a stitch group: per row, the reductions into locals, then the row.

Sits beside ``kernels`` (which dispatches here for roots the kernel plan made
as stitch groups, see ``anyshape/schedule/stitch.py``), over the loop and reduction pieces of
``loop_nest`` and ``reduce_emit``. The row dims form one parallel loop
nest; inside it, every row broadcast the root reads is evaluated first, which
emits each reduction as a vectorized loop over the row into a scalar; then the
root's row is written by the ordinary fused expression, where those
broadcasts are now locals. Values the reductions and the row both read (the
exp of softmax) are recomputed rather than stored: the row is in cache.
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ir.symbolic import format_dim
from .ctypes_map import c_type, compute_type, rounded
from .expr import KernelScope
from .hoist import hoist_invariants, split_invariants
from .loop_ir import For, Stmt, block, const, if_, loop, prune, stmt
from .loop_nest import PARALLEL_WORK, ROW_SPLIT_WORK, loop_vars, statements, store
from .reduce_emit import (
    SIMD_REDUCTION,
    acc_type,
    accumulate,
    reduce_init,
    split_block,
    split_combine,
    split_range,
)

# Elements of a row's masked tail: one AVX-512 vector of float32, two of AVX2.
TAIL_LANES = 16
# Partial sums of a row's sum (``StitchScope.partial_sums``), in bytes of accumulators:
# eight AVX2 vectors or four AVX-512 ones, each its own chain of adds.
PARTIAL_BYTES = 256
PARTIAL_MIN = 2  # blocks a static row needs to take partial sums
PARTIAL_MIN_DYNAMIC = 8  # ... and a row of run-time length, checked per row


def row_tail(n) -> str:
    """What ``explain()`` says of the masked tail of rows of ``n`` (a stitch kernel's row
    loops, see ``StitchScope.row_loop``); empty when every row is whole vectors."""
    if isinstance(n, int):
        if n % TAIL_LANES == 0:
            return ""
        return f"rows of {n}: the last {n % TAIL_LANES} elements as one masked block"
    n = format_dim(n)
    return f"{n} % {TAIL_LANES} != 0: the last {n} % {TAIL_LANES} as one masked block"


class StitchScope(KernelScope):
    """A kernel scope where an unstored reduction is computed in place, over its row.

    Values the plan stores per row (``row_buffered``: softmax's exp) are written
    to the thread's row buffer by the first loop that computes them and read
    back by the later loops; ``rows`` are the row index names of the kernel.
    """

    def __init__(self, sched, buffer_of, root: Node):
        super().__init__(sched, buffer_of)
        self.row_names: tuple[str, ...] = ()
        self.row_slots: dict[int, int] = {}  # node id -> slot in the row buffer
        for n in sched.row_buffered.get(id(root), []):
            self.row_slots[id(n)] = len(self.row_slots)
        self.planned_slots = self.row_slots
        self.row_len = root.shape[-1]
        self.stored: dict[int, Stmt] = {}  # slot -> the statement storing it (first loop)
        self.slots_read: set[int] = set()  # slots a later loop reads back
        self.row_loops: set[str] = set()  # index names of loops over a whole row
        self.row_values: set[str] = set()  # C names of per-row values (reductions, ...)

    def begin_variant(self, speculate: bool, split: bool) -> None:
        super().begin_variant(speculate, split)
        self.stored, self.slots_read = {}, set()
        self.row_loops, self.row_values = set(), set()
        # Split over threads, a row has no one thread's buffer: its values are recomputed.
        self.row_slots = {} if split else self.planned_slots

    def value(self, node: Node, idx) -> str:
        slot = self.row_slots.get(id(node))
        if slot is None or tuple(idx[:-1]) != self.row_names or idx[-1] not in self.row_loops:
            return super().value(node, idx)  # (read at another index: computed in place)
        key = (id(node), tuple(idx))
        if key in self.memo:
            return self.memo[key]
        where = f"rb[{slot} * {self.dim(self.row_len)} + {idx[-1]}]"
        if slot in self.stored:
            expr = where
            self.slots_read.add(slot)
        else:  # the first loop over the row computes it (every loop covers the whole row)
            expr = self.tmp(compute_type(node.dtype), self.fused_expression(node, tuple(idx)))
            self.stored[slot] = stmt(f"{where} = {expr};", "rb", tag=("row store", slot))
            self.lines.append(self.stored[slot])
        self.memo[key] = expr
        return expr

    def _cheap(self, x: Node) -> bool:
        """Whether ``x``, computed in place over the row, fuses no transcendental op: a
        sum of exps (softmax) waits on the exps, not on its adds, and split into partial
        sums it ran 2-30 % slower (``partial_sums``)."""
        stack, seen = [x], set()
        while stack:
            n = stack.pop()
            if id(n) in seen or self.sched.is_materialized(n) or n.op == "reduce":
                continue
            seen.add(id(n))
            if self.sched.costs.expensive_ops.get(n.op, 0):
                return False
            stack.extend(n.inputs)
        return True

    def partial_sums(self, var: str, n: str, acc: str, acc_t: str, body) -> list:
        """A row's sum into ``acc`` through independent partial sums. One accumulator
        (``omp simd reduction``) makes every vector add wait for the one before: a
        LayerNorm row of 768 floats ran 192 ns on one AVX2 core, 109 with AVX-512.
        Here the row runs in blocks of ``PARTIAL_BYTES`` of accumulators, lane ``j`` of
        every block adding into its own partial sum (``body``'s ``acc`` is a reference
        to it), so the adds of a block are independent: 111 and 86 ns. The partial sums
        are added into ``acc``, then the rest of the row (under one block) by
        ``row_loop``. (Sums only: a max over the row already ran at the speed of its
        loads.) Setting up and folding the partial sums costs about a block's adds, so
        a row takes them from ``PARTIAL_MIN`` blocks: a static row of 80-112 floats ran
        13-17 % slower with them. A row of run-time length decides per row, from
        ``PARTIAL_MIN_DYNAMIC`` blocks: its partial sums live in memory, which GCC
        zeroes with `rep stos`, so they paid only from rows of 512 floats or so (AVX2:
        256 level, 128 1.8x slower; 768 1.4x faster)."""
        width = PARTIAL_BYTES // (8 if acc_t == "double" else 4)
        reduction = f"reduction(+:{acc})"
        whole = isinstance(self.row_len, int)
        if whole and self.row_len < PARTIAL_MIN * width:
            return self.row_loop(var, n, reduction, body)
        parts, lane, block_, blocks = f"{acc}v", f"{var}j", f"{var}b", f"{var}n"
        # Invariants move out first, so the loops below declare none of them.
        moved, body = split_invariants(frozenset({var}), hoist_invariants(body))
        lane_body = [
            const("int64_t", var, f"{block_} * {width} + {lane}"),
            stmt(f"{acc_t}& {acc} = {parts}[{lane}];", acc),
            *body,
        ]
        simd = ["#pragma omp simd"]
        fold = stmt(f"{acc} += {parts}[{lane}];", acc)
        partial = [
            stmt(f"{acc_t} {parts}[{width}];", parts),
            loop(For(lane, "0", str(width)), [stmt(f"{parts}[{lane}] = 0;", parts)], simd),
            loop(For(block_, "0", blocks), [loop(For(lane, "0", str(width)), lane_body, simd)]),
            loop(For(lane, "0", str(width)), [fold], [f"#pragma omp simd {reduction}"]),
        ]
        if whole:
            count = const("int64_t", blocks, str(self.row_len // width))
            out = [*moved, count, block(partial)]
            if self.row_len % width:
                out += self.row_loop(var, n, reduction, body, start=f"{blocks} * {width}")
            return out
        # A shorter row runs the plain loops, from 0: a rest loop starting at a run-time
        # index made rows of 16-128 floats 10-30 % slower.
        count = const("int64_t", blocks, f"({n}) / {width}")
        rest = self.row_loop(var, n, reduction, body, start=f"{blocks} * {width}")
        long_row = f"{blocks} >= {PARTIAL_MIN_DYNAMIC}"
        plain = self.row_loop(var, n, reduction, body)
        return [*moved, count, if_(long_row, [*partial, *rest], plain)]

    def row_loop(self, var: str, n: str, pragma: str, body, start: str = "0") -> list:
        """A loop over one whole row on one thread: vectors up to the last multiple of
        ``TAIL_LANES``, then the rest as one block of ``TAIL_LANES`` whose lanes past the
        row are masked off. GCC leaves an ``omp simd`` loop's remainder to scalar code,
        where exp costs 10x a vector lane: a softmax over rows of 24 ran 1.6 ns per
        element, 6x one over rows of 128. ``body`` appears in both loops: values it
        stores to the row buffer are computed, not read back, in both copies. The row's
        store pass (``pragma`` empty) keeps GCC's own tail, guarded scalar stores: marked
        ``omp simd``, its masked vector stores made rows of 24 take 1.9x as long."""
        head = [f"#pragma omp simd {pragma}".rstrip()] if pragma else []
        if not row_tail(self.row_len):
            return [loop(For(var, start, n), body, head)]
        nv = f"({n} & ~(int64_t){TAIL_LANES - 1})"
        # Invariants move out of the vector loop here, so the tail reads them too.
        *moved, vector = hoist_invariants([loop(For(var, start, nv), body, head)])
        tail = For(var, nv, test=f"{var} < {nv} + {TAIL_LANES}")
        masked = loop(tail, [if_(f"{var} < {n}", vector.body)], head)
        return [*moved, vector, if_(f"{nv} < {n}", [masked])]

    def row_parallel(self, n: str) -> str:
        """OpenMP clauses of a loop over one whole row split over the threads: each loop
        of the row is its own parallel region, so the bar is higher (softmax over one
        row of 20000 ran 11 -> 17 us split at the kernels' usual bar)."""
        return f"schedule(static) if(({n}) * {self.element_cost} > {ROW_SPLIT_WORK})"

    def _divide(self, n: Node, a: str, b: str) -> str:
        # Dividing a row by a per-row value (softmax's sum): multiply by its reciprocal,
        # which the compiler hoists out of the row loop (a divide per element is 10x a multiply).
        if n.op == "div" and n.dtype.is_float and b in self.row_values:
            return f"({a} * (({compute_type(n.dtype)})1 / {b}))"
        return super()._divide(n, a, b)

    def _op_reduce(self, n: Node, idx) -> str:
        x = n.inputs[0]
        kind, axis = n.attr("kind"), x.rank - 1
        acc, r = f"acc{self.counter}", f"r{self.counter}"
        self.counter += 1
        self.row_loops.add(r)
        # Lane-wise float partial sums (omp simd) over one row are as accurate as
        # eager's vectorized sums and twice as wide as double accumulators.
        acc_t = compute_type(x.dtype) if kind == "sum" else acc_type(kind, x.dtype)
        init = reduce_init(kind, x.dtype)
        lines = [stmt(f"{acc_t} {acc} = {init};", acc)]
        simd = SIMD_REDUCTION.get(kind, "").replace("acc", acc)
        float_minmax = kind in ("max", "min") and x.dtype.is_float
        if float_minmax:
            lines.append(stmt(f"int {acc}_nan = 0;", f"{acc}_nan"))
            simd = f"reduction({kind}:{acc}) reduction(|:{acc}_nan)"
        n_red = self.dim(x.shape[axis])
        loop_acc = acc
        if simd and self.split:
            loop_acc = f"{acc}p"
            clauses = f"{simd} {self.row_parallel(n_red)}"

        def step():
            v = self.value(x, tuple(idx) + (r,))
            return stmt(
                accumulate(kind, loop_acc, v, x.dtype, float_minmax), loop_acc, f"{loop_acc}_nan"
            )

        body = statements(self, step)
        if loop_acc != acc:
            part = [stmt(f"{acc_t} {loop_acc} = {init};", loop_acc)]
            if float_minmax:
                part.append(stmt(f"int {loop_acc}_nan = 0;", f"{loop_acc}_nan"))
            pragma = f"#pragma omp simd {simd.replace(acc, loop_acc)}"
            part.append(loop(split_range(r, n_red), body, [pragma]))
            part.append(stmt(split_combine(kind, acc, loop_acc, float_minmax), acc, f"{acc}_nan"))
            lines.append(split_block(n_red, clauses, part))
        elif kind == "sum" and acc_t in ("float", "double") and self._cheap(x):
            lines += self.partial_sums(r, n_red, acc, acc_t, body)
        else:
            lines += self.row_loop(r, n_red, simd, body)
        if float_minmax:
            lines.append(stmt(f'if ({acc}_nan) {acc} = ({acc_t})__builtin_nan("");', acc))
        self.lines += lines
        ct = compute_type(n.dtype)
        return acc if acc_t == ct else rounded(n.dtype, f"(({ct}){acc})")


def emit_stitch(scope: StitchScope, root: Node, broadcasts: list[Node]) -> list:
    """Rows split into one contiguous range per thread; indices stepped, row buffer taken once.

    Short rows (attention's 128) made per-row costs visible: a collapsed OpenMP nest
    recovers its indices with divisions, and the scratch lookup is a TLS call. In the
    split variant (``scope.split``: fewer rows than threads) the rows run one after
    another and each reduction and the row pass are split over the threads instead.
    """
    names = tuple(loop_vars(root.rank))
    rows, last = names[:-1], names[-1]
    extents = [scope.dim(d) for d in root.shape[:-1]]
    scope.row_names = rows
    scope.row_loops.add(last)
    region: list = []  # the rows' parallel region, before the row loop
    pragmas: list[str] = []
    if rows and scope.split:
        total = " * ".join(f"({e})" for e in extents)
        region.append(stmt(f"const int64_t lo = 0, hi = {total};", "lo", "hi"))
    elif rows:
        work = scope.dim(root.type.numel)
        total = " * ".join(f"({e})" for e in extents)
        pragmas.append(
            f"#pragma omp parallel if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
        )
        region += [
            stmt(f"const int64_t rows = {total};", "rows"),
            stmt(
                "const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();", "nt", "th"
            ),
            stmt("const int64_t lo = rows * th / nt, hi = rows * (th + 1) / nt;", "lo", "hi"),
        ]
    if rows:
        # The first row's indices, then each row steps them like an odometer. An extent
        # may be 0 (no rows, so lo == hi and no row runs): it must not divide.
        rest = "lo"
        for k in range(len(rows) - 1, -1, -1):
            e = extents[k]
            first = f"({e}) ? {rest} % ({e}) : 0" if k else rest
            region.append(stmt(f"int64_t {rows[k]} = {first};", rows[k]))
            rest = f"(({e}) ? {rest} / ({e}) : 0)" if k else rest

    body, buffered = row_body(
        scope, root, broadcasts, names, lambda v: store(scope, root, names, v)
    )
    if buffered:
        region += row_buffer(scope, root, buffered, flag=bool(rows))
    if not rows:
        return [*region, *body]
    step = ""
    for k in range(len(rows) - 1, 0, -1):
        step += f"if (++{rows[k]} == {extents[k]}) {{ {rows[k]} = 0; "
    step += f"++{rows[0]};" + " }" * (len(rows) - 1)
    guard = "rb && " if buffered else ""
    each_row = For("row", "lo", test=f"{guard}row < hi")
    region.append(loop(each_row, [*body, stmt(step, *rows)]))
    return [block(region, pragmas)]


def row_body(scope: StitchScope, root: Node, broadcasts: list[Node], names, write) -> tuple:
    """One row of a stitch group at index ``names`` (its row indices already set): every
    reduction into a local, then the row, ``write(value)`` the statement storing each
    element. Returns the row's statements and how many values it keeps in the row buffer
    (0: it takes none; ``row_buffer`` declares it)."""
    rows, last = names[:-1], names[-1]
    n = scope.dim(root.shape[-1])

    def row():
        for b in broadcasts:  # the reductions, once per row (memoized for the loop below)
            scope.value(b, rows + ("0",))
        scope.row_values = set(scope.memo.values())
        inner = statements(scope, lambda: write(scope.fused_expression(root, names)))
        if scope.split:
            share = loop(split_range(last, n), inner)
            scope.lines.append(split_block(n, scope.row_parallel(n), [share]))
        else:
            scope.lines += scope.row_loop(last, n, "", inner)
        return []

    body = statements(scope, row)
    # A value only the loop computing it reads (LayerNorm's output feeding GELU twice) is
    # not stored, and a kernel that reads no value back takes no row buffer.
    unread = {("row store", slot) for slot in scope.stored if slot not in scope.slots_read}
    body = prune(body, lambda node: isinstance(node, Stmt) and node.tag in unread)
    return body, len(scope.row_slots) if scope.slots_read else 0


def row_buffer(scope: StitchScope, root: Node, buffered: int, flag: bool = True) -> list:
    """The thread's row buffer ``rb`` for ``buffered`` values per element of a row; if it
    cannot be had, the error flag is set (the row loop then stops) or, ``flag`` off, the
    kernel returns the error."""
    t = c_type(root.dtype)
    # At least one element: an empty row asks for 0 bytes, which the arena refuses.
    size = f"(int64_t)sizeof({t}) * {buffered} * as_max64({scope.dim(root.shape[-1])}, 1)"
    fail = stmt("if (!rb) err_flag = 3;", "err_flag") if flag else stmt("if (!rb) return 3;")
    return [stmt(f"{t}* rb = ({t}*)as_scratch({size});", "rb"), fail]
