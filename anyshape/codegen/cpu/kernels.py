"""Loop nests for each kernel kind of the CPU backend.

Sits between the schedule and the host program. ``emit_kernel`` turns one
materialized root node into a ``Kernel``: a C++ function
``static int k(void* const* P, const int64_t* D)`` over its own parameters
(buffers ``P``, run-time integers ``D``) returning 0 or an error code. Kinds:

- pointwise: the fused expression of the root at every output index; the outer
  dims are flattened into one OpenMP-parallel loop (parallel only above a work
  threshold), the innermost dim is a plain loop the compiler vectorizes;
- reduce / argreduce / cumulative: the fused input expression read inside the
  reduction loops (input fusion); sums of f32 accumulate in double;
- dot: oneDNN's matmul against a packed model weight, or OpenBLAS sgemm/dgemm
  (batched, transposes folded into the call) (``gemm_emit``);
- convolution: float ones through oneDNN or im2col + GEMM (``conv_emit``), with
  their epilogue; others, and pool: direct window loops over a materialized input
  (float max pooling row by row, vectorized: ``pool_emit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import SymExpr, format_dim
from . import conv_emit, gemm_emit, pool_emit
from .ctypes_map import c_type, compute_type, literal
from .expr import KernelScope, _product
from .hoist import hoist_invariants
from .schedule import EXPENSIVE_OPS, Schedule, fused_into, members

PARALLEL_WORK = 32768  # work (elements x cost per element) below which a kernel stays serial
BLOCK = 4096  # elements per parallel block of a 1-D loop
# Work of one row below which a stitch kernel keeps it on one thread: each of the row's
# loops is its own parallel region (softmax over one row of 20000: 11 -> 17 us split).
ROW_SPLIT_WORK = 8 * PARALLEL_WORK


@dataclass
class Kernel:
    body: str  # the function body, parameter-relative (dedupe key)
    ptrs: list[int]  # buffer ids for P[k]
    ints: list[SymExpr]  # run-time integers for D[k]
    root: Node
    variants: list[str] = field(default_factory=list)  # speculation: predicate of each variant
    row_tail: str = ""  # when a stitch kernel's row loops end in a masked tail block


def _loop_vars(rank: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{k}" for k in range(rank)]


def _nest_open(
    scope: KernelScope, shape, names, work: str, lines: list[str], mode: str = "outer"
) -> None:
    """Open loops over ``shape``: the outer dims as one collapsed parallel loop nest.

    OpenMP's ``collapse`` splits the outer iterations over threads and steps the
    indices incrementally (no divide/modulo per row, which dominated short rows
    such as a CNN's [N, C, H, W] maps). A 1-D nest is split into blocks so it
    can run in parallel too. The innermost loop is left to the vectorizer.
    ``mode`` "inner" (fewer rows than threads) also splits each row into
    blocks, one share per thread; "serial" opens plain loops (the work is split
    further in).
    """
    r = len(shape)
    if r == 0:
        return
    par = f"schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
    last = names[-1]
    outer = " ".join(
        f"for (int64_t {names[k]} = 0; {names[k]} < {scope.dim(shape[k])}; ++{names[k]})"
        for k in range(r - 1)
    )
    if mode == "serial":
        lines.append(outer + " {")
        lines.append(f"  for (int64_t {last} = 0; {last} < {scope.dim(shape[-1])}; ++{last}) {{")
        return
    if mode == "inner" and r >= 2:
        n = scope.dim(shape[-1])
        lines.append(f"const int64_t bs = as_split_block({n}, omp_get_max_threads());")
        lines.append(f"const int64_t nb = ({n} + bs - 1) / bs;")
        lines.append(f"#pragma omp parallel for collapse({r}) {par}")
        lines.append(f"{outer} for (int64_t ob = 0; ob < nb; ++ob) {{")
        lines.append(
            f"  for (int64_t {last} = ob * bs; {last} < as_min64({n}, (ob + 1) * bs); ++{last}) {{"
        )
        return
    if r == 1:
        n = scope.dim(shape[0])
        lines.append(f"#pragma omp parallel for {par}")
        lines.append(f"for (int64_t ob = 0; ob < ({n} + {BLOCK - 1}) / {BLOCK}; ++ob) {{")
        lines.append(
            f"  for (int64_t {last} = ob * {BLOCK}; {last} < as_min64({n}, (ob + 1) * {BLOCK}); "
            f"++{last}) {{"
        )
        return
    collapse = f"collapse({r - 1}) " if r > 2 else ""
    lines.append(f"#pragma omp parallel for {collapse}{par}")
    lines.append(outer + " {")
    lines.append(f"  for (int64_t {last} = 0; {last} < {scope.dim(shape[-1])}; ++{last}) {{")


def _nest_close(rank: int, lines: list[str]) -> None:
    if rank:
        lines.append("  }")
        lines.append("}")


def _out_offset(scope: KernelScope, node: Node, names) -> str:
    terms = []
    for k, n in enumerate(names):
        st = scope.dim(_product(node.shape[k + 1 :]))
        terms.append(n if st == "1" else f"{n} * {st}")
    return " + ".join(terms) if terms else "0"


def _store(scope: KernelScope, node: Node, names, value: str) -> str:
    out = scope.ptr(node)
    return (
        f"(({c_type(node.dtype)}*){out})[{_out_offset(scope, node, names)}] = "
        f"({c_type(node.dtype)})({value});"
    )


def _body(scope: KernelScope, compute) -> list[str]:
    """Run ``compute`` in a fresh statement scope; returns its statements."""
    saved_lines, saved_memo = scope.lines, scope.memo
    scope.lines, scope.memo = [], dict(saved_memo)
    last = compute()
    out = scope.lines + [last]
    scope.lines, scope.memo = saved_lines, saved_memo
    return out


def _indent(lines, depth):
    return ["  " * depth + ln for ln in lines]


def _emit_pointwise(scope: KernelScope, root: Node) -> list[str]:
    names = tuple(_loop_vars(root.rank))
    lines: list[str] = []
    mode = "inner" if scope.split else "outer"
    _nest_open(scope, root.shape, names, scope.dim(root.type.numel), lines, mode)
    group = members(scope.sched, root)  # a horizontal group stores each member

    def stores():
        return " ".join(_store(scope, m, names, scope._fused(m, names)) for m in group)

    body = _body(scope, stores)
    lines += _indent(body, 2 if root.rank else 0)
    _nest_close(root.rank, lines)
    return lines


_INIT = {
    "sum": "0",
    "prod": "1",
    "any": "false",
    "all": "true",
}


def _acc_type(kind: str, dt: DType) -> str:
    if kind in ("any", "all"):
        return "bool"
    if kind in ("sum", "prod"):
        return "double" if dt.is_float else "int64_t"
    return compute_type(dt)


def _combine(kind: str, acc: str, v: str, dt: DType) -> str:
    if kind == "sum":
        return f"{acc} += {v};"
    if kind == "prod":
        return f"{acc} *= {v};"
    if kind == "any":
        return f"{acc} = {acc} || ({v} != 0);"
    if kind == "all":
        return f"{acc} = {acc} && ({v} != 0);"
    return f"{acc} = as_{kind}({acc}, {v});"


# OpenMP reductions that vectorize the innermost reduction loop (reassociating the sum).
_SIMD_REDUCTION = {"sum": "reduction(+:acc)", "prod": "reduction(*:acc)"}


def _reduce_init(kind: str, dt: DType) -> str:
    if kind in _INIT:
        return _INIT[kind]
    if dt.is_float:
        return f"(({compute_type(dt)})({'' if kind == 'min' else '-'}__builtin_inf()))"
    if dt.is_bool:
        return "true" if kind == "min" else "false"
    info = np.iinfo(dt.to_numpy())
    return literal(info.max if kind == "min" else info.min, dt)


def split_open(n: str, clauses: str) -> list[str]:
    """Open a loop over ``n`` elements split into one block per thread (``cb``), closed
    by two braces; ``split_range`` opens the block's own loop. Each block reduces into
    its own accumulator and combines once: an ``omp parallel for simd`` reduction run on
    one thread (below the work bar) came out 4x slower than a plain simd loop."""
    return [
        "{",
        f"const int64_t bs = as_split_block({n}, omp_get_max_threads()), nb = ({n} + bs - 1) / bs;",
        f"#pragma omp parallel for {clauses}",
        "for (int64_t cb = 0; cb < nb; ++cb) {",
    ]


def split_range(var: str, n: str) -> str:
    return f"for (int64_t {var} = cb * bs; {var} < as_min64({n}, (cb + 1) * bs); ++{var}) {{"


def split_combine(kind: str, acc: str, part: str, nan: bool) -> str:
    """Fold a block's partial ``part`` into ``acc`` (NaN flags folded apart)."""
    if nan:
        better = ">" if kind == "max" else "<"
        return f"{acc}_nan |= {part}_nan; {acc} = {part} {better} {acc} ? {part} : {acc};"
    return {"sum": f"{acc} += {part};", "prod": f"{acc} *= {part};"}.get(
        kind, f"{acc} = as_{kind}({acc}, {part});"
    )


def _emit_reduce(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    kind, axes = root.attr("kind"), tuple(root.attr("axes"))
    out_names = tuple(_loop_vars(root.rank))
    lines: list[str] = []
    work = scope.dim(x.type.numel)
    _nest_open(scope, root.shape, out_names, work, lines, "serial" if scope.split else "outer")
    idx, it = [], iter(out_names)
    for d in range(x.rank):
        idx.append(f"r{d}" if d in axes else next(it))
    acc_t = _acc_type(kind, x.dtype)
    inner = [f"{acc_t} acc = {_reduce_init(kind, x.dtype)};"]
    simd = _SIMD_REDUCTION.get(kind)
    float_minmax = kind in ("max", "min") and x.dtype.is_float
    if float_minmax:  # NaN propagates: tracked apart so the max/min itself vectorizes
        inner.append("int acc_nan = 0;  // an int: a bool flag blocks vectorization (13x slower)")
        simd = f"reduction({kind}:acc) reduction(|:acc_nan)"
    loop_acc = "acc"
    if scope.split:  # fewer outputs than threads: blocks of the innermost reduced dim
        n_last = scope.dim(x.shape[axes[-1]])
        clause = (simd or f"reduction({kind}:acc)") + (
            f" schedule(static) if(({work}) * {scope.element_cost} > {PARALLEL_WORK})"
        )
        inner += split_open(n_last, clause)
        inner.append(f"{acc_t} accp = {_reduce_init(kind, x.dtype)};")
        if float_minmax:
            inner.append("int accp_nan = 0;")
        loop_acc = "accp"
    for k, a in enumerate(axes):
        n_axis = scope.dim(x.shape[a])
        if simd and k == len(axes) - 1:
            inner.append(f"#pragma omp simd {simd.replace('acc', loop_acc)}")
        if scope.split and k == len(axes) - 1:
            inner.append(split_range(f"r{a}", n_axis))
        else:
            inner.append(f"for (int64_t r{a} = 0; r{a} < {n_axis}; ++r{a}) {{")

    def step():
        v = scope.value(x, tuple(idx))
        if float_minmax:
            better = ">" if kind == "max" else "<"
            return (
                f"{loop_acc}_nan |= ({v} != {v}); "
                f"{loop_acc} = {v} {better} {loop_acc} ? {v} : {loop_acc};"
            )
        return _combine(kind, loop_acc, v, x.dtype)

    inner += _indent(_body(scope, step), len(axes))
    inner += ["}"] * len(axes)
    if scope.split:
        inner += [split_combine(kind, "acc", "accp", float_minmax), "}", "}"]
    if float_minmax:
        inner.append(f'if (acc_nan) acc = ({acc_t})__builtin_nan("");')
    inner.append(_store(scope, root, out_names, "acc"))
    lines += _indent(inner, 2 if root.rank else 0)
    _nest_close(root.rank, lines)
    if any(x.shape[a] == 0 for a in axes) and kind in ("max", "min"):
        raise UnsupportedError("max/min over an empty dim")
    return lines


def _emit_argreduce(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    out_names = tuple(_loop_vars(root.rank))
    lines: list[str] = []
    _nest_open(scope, root.shape, out_names, scope.dim(x.type.numel), lines)
    idx = list(out_names[:axis]) + ["r"] + list(out_names[axis:])
    better = ">" if kind == "argmax" else "<"
    t = compute_type(x.dtype)
    # Eager refuses an empty reduced dim, even when the result is empty too.
    lines.insert(0, f"if ({scope.dim(x.shape[axis])} == 0) return 5;")
    inner = [
        f"{t} best = 0; int64_t arg = 0;",
        f"for (int64_t r = 0; r < {scope.dim(x.shape[axis])}; ++r) {{",
    ]

    def step():
        v = scope.value(x, tuple(idx))
        nan = f"as_isnan({v})"
        return (
            f"if (r == 0 || (!as_isnan(best) && ({nan} || {v} {better} best))) "
            f"{{ best = {v}; arg = r; }}"
        )

    inner += _indent(_body(scope, step), 1)
    inner.append("}")
    inner.append(_store(scope, root, out_names, "arg"))
    lines += _indent(inner, 2 if root.rank else 0)
    _nest_close(root.rank, lines)
    return lines


def _emit_cumulative(scope: KernelScope, root: Node) -> list[str]:
    x = root.inputs[0]
    axis, kind = root.attr("axis"), root.attr("kind")
    outer_shape = tuple(d for k, d in enumerate(root.shape) if k != axis)
    outer_names = tuple(f"i{k}" for k in range(root.rank) if k != axis)
    idx = tuple(f"i{k}" if k != axis else "r" for k in range(root.rank))
    lines: list[str] = []
    _nest_open(scope, outer_shape, outer_names, scope.dim(root.type.numel), lines)
    acc_t = _acc_type(kind, x.dtype)
    inner = [
        f"{acc_t} acc = {_INIT[kind]};",
        f"for (int64_t r = 0; r < {scope.dim(root.shape[axis])}; ++r) {{",
    ]
    body = _body(
        scope,
        lambda: (
            _combine(kind, "acc", scope.value(x, idx), x.dtype)
            + " "
            + _store(scope, root, idx, "acc")
        ),
    )
    inner += _indent(body, 1)
    inner.append("}")
    lines += _indent(inner, 2 if outer_shape else 0)
    _nest_close(len(outer_shape), lines)
    return lines


def _emit_window(scope: KernelScope, root: Node) -> list[str]:
    """convolution and pool: direct loops over each output element's window."""
    if root.attr("channels_last", False):
        if root.op != "pool" or root.dtype not in (DType.f32, DType.f64) or root.rank != 4:
            raise NotImplementedError(f"channels-last {root.op} {root.type}: float 2-D pools only")
        return pool_emit.emit_pool_channels_last(scope, root, _nest_open, _nest_close)
    if pool_emit.covers(root):
        return pool_emit.emit_max_pool_rows(scope, root, _nest_open, _nest_close)
    conv = root.op == "convolution"
    x = root.inputs[0]
    nsp = len(root.attr("padding"))
    kernel = root.inputs[1].shape[2:] if conv else root.attr("kernel")
    stride, pad, dil = root.attr("stride"), root.attr("padding"), root.attr("dilation")
    out_names = tuple(_loop_vars(root.rank))
    lead = root.rank - nsp
    lines: list[str] = []
    work = f"{scope.dim(root.type.numel)} * {int(_product(kernel))}"
    _nest_open(scope, root.shape, out_names, work, lines)
    t = compute_type(x.dtype)
    kind = "sum" if conv else root.attr("kind")
    px = scope.ptr(x)
    inner: list[str] = []
    if conv:
        g = root.attr("groups")
        w = root.inputs[1]
        pw = scope.ptr(w)
        cg = w.shape[1]
        og = w.shape[0] // g
        inner += [
            "double acc = 0;",
            f"const int64_t c0 = ({out_names[1]} / {og}) * {cg};",
            f"for (int64_t c = 0; c < {cg}; ++c) {{",
        ]
    else:
        inner += [
            f"double acc = {'-__builtin_inf()' if kind == 'max' else '0'}; int64_t cnt = 0;",
            "{",
        ]
    for s in range(nsp):
        inner.append(f"for (int64_t k{s} = 0; k{s} < {kernel[s]}; ++k{s}) {{")
        pos = f"{out_names[lead + s]} * {stride[s]} - {pad[s]} + k{s} * {dil[s]}"
        inner.append(f"  const int64_t y{s} = {pos};")
        inner.append(f"  if (y{s} < 0 || y{s} >= {scope.dim(x.shape[x.rank - nsp + s])}) continue;")
    if conv:
        xi = [out_names[0], "c0 + c"] + [f"y{s}" for s in range(nsp)]
        wi = [out_names[1], "c"] + [f"k{s}" for s in range(nsp)]
        xv = _flat_load(scope, x, px, xi)
        wv = _flat_load(scope, w, pw, wi)
        inner.append(f"  acc += (double){xv} * (double){wv};")
    else:
        xi = list(out_names[:lead]) + [f"y{s}" for s in range(nsp)]
        xv = _flat_load(scope, x, px, xi)
        step = f"acc = as_max(acc, (double){xv});" if kind == "max" else f"acc += {xv};"
        inner.append(f"  {step} ++cnt;")
    inner += ["}"] * nsp
    inner.append("}")
    if conv:
        value = "acc"
    elif kind == "max":
        value = "acc"
    elif root.attr("count_include_pad"):
        value = f"acc / {float(_product(kernel))}"
    else:
        value = "(cnt ? acc / cnt : 0.0)"
    inner.append(_store(scope, root, out_names, f"({t})({value})"))
    lines += _indent(inner, 2)
    _nest_close(root.rank, lines)
    return lines


def _emit_conv(scope: KernelScope, root: Node) -> list[str]:
    """Float convolutions: ``conv_emit`` (oneDNN, or im2col + GEMM), each image's epilogue
    right after it; other dtypes: the direct window loop."""
    if root.dtype not in (DType.f32, DType.f64):
        return _emit_window(scope, root)
    epilogue = scope.sched.epilogues.get(id(root))
    return conv_emit.emit_conv(
        scope, root, _epilogue(scope, epilogue) if epilogue is not None else None
    )


def _epilogue(scope: KernelScope, epilogue: Node) -> list[str]:
    """The epilogue loop nest over one image ``n`` of the convolution's output."""
    names = ("n", *_loop_vars(epilogue.rank)[1:])
    lines: list[str] = []
    work = scope.dim(_product(epilogue.shape[1:]))
    _nest_open(scope, epilogue.shape[1:], names[1:], work, lines)
    body = _body(scope, lambda: _store(scope, epilogue, names, scope._fused(epilogue, names)))
    lines += _indent(body, 2)
    _nest_close(epilogue.rank - 1, lines)
    return lines


def _flat_load(scope: KernelScope, node: Node, ptr: str, idx) -> str:
    terms = []
    for k, i in enumerate(idx):
        st = scope.dim(_product(node.shape[k + 1 :]))
        terms.append(f"({i})" if st == "1" else f"({i}) * {st}")
    return f"((const {c_type(node.dtype)}*){ptr})[{' + '.join(terms)}]"


EMITTERS = {
    "reduce": _emit_reduce,
    "argreduce": _emit_argreduce,
    "cumulative": _emit_cumulative,
    "dot": gemm_emit.emit_dot,
    "convolution": _emit_conv,
    "pool": _emit_window,
}


# Kernel kinds that get a speculative no-broadcast variant (loop nests without early returns).
SPECULATED = {"reduce"}
# Reductions whose split over threads is an OpenMP reduction clause.
SPLIT_REDUCTIONS = {"sum", "prod", "max", "min"}
# Rows (outputs) statically at least this many never take the split variant.
SPLIT_ROWS_MAX = 256
# A row statically shorter than this is never split over threads.
SPLIT_ROW_MIN = 1024


def _split_extent(sched: Schedule, root: Node):
    """The extent whose being below the thread count selects the split variant, and what
    is split; ``None`` when the kernel has no such variant (or always splits)."""
    stitched = id(root) in sched.stitches
    if root.op == "reduce" and not stitched:
        x, axes = root.inputs[0], root.attr("axes")
        short = (
            all(isinstance(x.shape[a], int) for a in axes)
            and _product([x.shape[a] for a in axes]) < SPLIT_ROW_MIN
        )
        if root.attr("kind") not in SPLIT_REDUCTIONS or short:
            return None
        extent, noun, what = _product(root.shape), "outputs", "each reduction"
    elif not (stitched or root.op not in EMITTERS) or root.rank < (1 if stitched else 2):
        return None
    elif isinstance(root.shape[-1], int) and root.shape[-1] < SPLIT_ROW_MIN:
        return None
    else:
        extent, noun = _product(root.shape[:-1]), "rows"
        what = "each row's reductions and pass" if stitched else "the last dim"
    if isinstance(extent, int) and extent >= SPLIT_ROWS_MAX:
        return None
    return extent, noun, f"{what} split over threads"


def element_cost(sched: Schedule, root: Node) -> int:
    """Relative work per output element: 1, plus 8 per transcendental the kernel fuses.

    A kernel goes parallel when elements x this cost passes PARALLEL_WORK, so an
    exp-heavy softmax over [8, 768] (2.3 us of exp alone) uses both cores while a
    copy of the same size stays on one.
    """
    group = members(sched, root)
    nodes = [*group, *fused_into(sched, root)]
    return min(len(group) + sum(EXPENSIVE_OPS.get(n.op, 0) for n in nodes), 32)


def _split_variant(sched, scope, root, emit, lines, texts: list[str], speculate: bool):
    """``lines`` behind a run-time choice of the split variant when fewer rows (outputs)
    than threads would leave threads idle; with the variants' descriptions."""
    found = _split_extent(sched, root)
    if found is None:
        return lines, [" and ".join(texts) or "general"]
    extent, noun, what = found
    scope.begin_variant(speculate, True)
    split = emit()
    scope.split = False
    few = f"{scope.dim(extent)} < omp_get_max_threads()"
    cond = f"{format_dim(extent)} {noun} < threads"
    if id(root) in sched.stitches:  # short rows keep the row buffer and one thread
        row = scope.dim(root.shape[-1])
        few += f" && {row} * {scope.element_cost} > {ROW_SPLIT_WORK}"
        cond += f" and rows longer than {ROW_SPLIT_WORK // scope.element_cost}"
    out = [f"if ({few}) {{", *_indent(split, 1), "} else {", *_indent(lines, 1), "}"]
    many = ", ".join([" and ".join(texts)] * bool(texts) + [f"else whole {noun} per thread"])
    return out, [" and ".join(texts + [f"{cond}: {what}"]), many]


def _window_refusal(scope: KernelScope, root: Node) -> list[str]:
    """Eager refuses a pool or convolution over an empty spatial dim, or whose window is
    larger than the padded input (an output size below 1): an error, as there, not an
    empty result (and never a window read outside the input)."""
    if root.op not in ("pool", "convolution"):
        return []
    x = root.inputs[0]
    nsp = len(root.attr("kernel")) if root.op == "pool" else x.rank - 2
    last = 1 if root.attr("channels_last", False) else 0
    first = x.rank - nsp - last
    sizes = [*x.shape[first : first + nsp], *root.shape[first : first + nsp]]
    conds = [f"{scope.dim(d)} <= 0" for d in sizes if not (isinstance(d, int) and d > 0)]
    return [f"if ({' || '.join(conds)}) return 6;"] if conds else []


def emit_kernel(sched: Schedule, root: Node, buffer_of: dict[int, int]) -> Kernel:
    tail = ""
    if id(root) in sched.stitches:
        from .stitch_emit import StitchScope, emit_stitch, row_tail

        scope = StitchScope(sched, buffer_of, root)
        tail = row_tail(root.shape[-1])

        def emit():
            return emit_stitch(scope, root, sched.stitches[id(root)])
    else:
        scope = KernelScope(sched, buffer_of)

        def emit():
            return EMITTERS.get(root.op, _emit_pointwise)(scope, root)

    scope.ptr(root)  # the output is P[0]
    scope.element_cost = element_cost(sched, root)
    refuse = _window_refusal(scope, root)
    lines = emit()
    speculated = id(root) in sched.stitches or root.op in SPECULATED or root.op not in EMITTERS
    if scope.may_broadcast and speculated:
        # A dim that may be 1 at run time selects its index per element, which blocks
        # vectorization: a second variant assumes no such dim is 1, chosen per call.
        general = lines
        scope.begin_variant(True, False)
        fast = emit()
        cond = " && ".join(c for c, _ in scope.assumptions)
        text = " and ".join(t for _, t in scope.assumptions) + " (no run-time broadcast)"
        fast, fast_variants = _split_variant(sched, scope, root, emit, fast, [text], True)
        lines = [f"if ({cond}) {{", *_indent(fast, 1), "} else {", *_indent(general, 1), "}"]
        variants = fast_variants + ["general"]
    else:
        lines, variants = _split_variant(sched, scope, root, emit, lines, [], False)
        if len(variants) == 1:
            variants = []
    lines = hoist_invariants(lines)
    # Buffers never overlap within a kernel: restrict lets loops vectorize without checks.
    head = [f"void* __restrict__ p{k} = P[{k}];" for k in range(len(scope.ptrs))]
    # Sizes as locals: read through D inside a `#pragma omp simd` loop, an index such
    # as i0 * D[5] + r0 is not seen as contiguous and becomes a gather (3.4x slower
    # attention softmax).
    head += [f"const int64_t D_{k} = D[{k}];" for k in range(len(scope.ints))]
    head.append("int err_flag = 0; int* err = &err_flag; (void)err;")
    body = "\n".join(head + refuse + lines + ["return err_flag;"])
    return Kernel(body, scope.ptrs, scope.ints, root, variants, tail)
