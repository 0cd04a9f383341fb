"""Loop nests for each kernel kind of the CPU backend.

Sits between the schedule and the host program. ``emit_kernel`` turns one
materialized root node into a ``Kernel``: a C++ function
``AS_KERNEL int k(void* const* P, const int64_t* D)`` over its own parameters
(buffers ``P``, run-time integers ``D``) returning 0 or an error code. Kinds:

- pointwise: the fused expression of the root at every output index (a
  concatenation: one nest per piece, into its slice); the outer
  dims are flattened into one OpenMP-parallel loop (parallel only above a work
  threshold), the innermost dim is a plain loop the compiler vectorizes;
- reduce / argreduce / cumulative: the fused input expression read inside the
  reduction loops (input fusion); sums of f32 accumulate in double (``reduce_emit``);
- stitch groups: per row, the reductions into locals, then the row (``stitch_emit``);
- attention chains: the scores GEMM, the stitch group's rows and the values GEMM per
  block of query rows, the blocks in buffers of each thread's (``attention_emit``);
- dot: oneDNN's matmul against a packed model weight, or OpenBLAS sgemm/dgemm
  (batched, transposes folded into the call) (``gemm_emit``);
- convolution: float ones through oneDNN or im2col + GEMM (``conv_emit``),
  depthwise ones as direct loops (``depthwise_emit``), with their epilogue;
  others, and pool: direct window loops over a materialized input (float max
  pooling row by row, vectorized: ``pool_emit``);
- scatter: the indices checked, the base copied, then the updates written in,
  the threads on disjoint rows or columns of the result (``scatter_emit``);
- transpose: a copy that moves the last dim goes through 8x8 register tiles
  (``transpose_emit``); any other is a pointwise loop nest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import SymExpr, as_dim, as_expr, format_dim, shape_numel
from ...schedule.plan import Schedule, fused_into, stitch_root
from ...schedule.reads import members
from . import conv_emit, gemm_emit, pool_emit, scatter_emit, transpose_emit
from .attention_emit import AttentionScope, emit_attention
from .ctypes_map import c_type, compute_type
from .expr import KernelScope
from .hoist import hoist_invariants
from .loop_ir import For, block, const, if_, loop, stmt, text, write
from .loop_nest import ROW_SPLIT_WORK, loop_vars, nest_open, statements, store
from .reduce_emit import emit_argreduce, emit_cumulative, emit_reduce
from .stitch_emit import StitchScope, emit_stitch, row_tail


@dataclass
class Kernel:
    body: str  # the function body, parameter-relative (dedupe key)
    ptrs: list[int]  # buffer ids for P[k]
    ints: list[SymExpr]  # run-time integers for D[k]
    root: Node
    variants: list[str] = field(default_factory=list)  # speculation: predicate of each variant
    row_tail: str = ""  # when a stitch kernel's row loops end in a masked tail block


def _emit_pointwise(scope: KernelScope, root: Node) -> list:
    if root.op == "transpose" and transpose_emit.covers(scope, root):
        return transpose_emit.emit_transpose(scope, root)  # a copy moving the last dim
    names = tuple(loop_vars(root.rank))
    mode = "inner" if scope.split else "outer"
    group = members(scope.sched, root)  # a horizontal group stores each member
    if root.op == "concatenate" and group == [root]:
        return _emit_concatenate(scope, root, names, mode)
    close = nest_open(scope, root.shape, names, scope.dim(root.type.numel), mode)

    def stores():
        return [store(scope, m, names, scope.fused_expression(m, names)) for m in group]

    return close(statements(scope, stores))


def _emit_concatenate(scope: KernelScope, root: Node, names, mode: str) -> list:
    """One loop nest per piece, over the piece's shape, storing into its slice of the
    output: each element computes only its own piece (a nest over the whole output
    computed every piece's fused value and selected one: SegFormer-B0's decode head
    computed four bilinear upsamplings per element)."""
    axis, offset, nests = root.attr("axis"), 0, []
    for x in root.inputs:
        close = nest_open(scope, x.shape, names, scope.dim(x.type.numel), mode)
        at = list(names)
        if offset != 0:
            at[axis] = f"({names[axis]} + {scope.dim(offset)})"

        def piece(x=x, at=at):
            return store(scope, root, at, scope.value(x, names))

        nests.append(block(close(statements(scope, piece))))  # (each its own scope)
        offset = as_dim(as_expr(offset) + as_expr(x.shape[axis]))
    return nests


def _emit_window(scope: KernelScope, root: Node) -> list:
    """convolution and pool: direct loops over each output element's window."""
    if root.attr("channels_last", False):
        if root.op != "pool" or root.dtype not in (DType.f32, DType.f64) or root.rank != 4:
            raise NotImplementedError(f"channels-last {root.op} {root.type}: float 2-D pools only")
        return pool_emit.emit_pool_channels_last(scope, root)
    if pool_emit.covers(root):
        return pool_emit.emit_max_pool_rows(scope, root)
    conv = root.op == "convolution"
    x = root.inputs[0]
    nsp = len(root.attr("padding"))
    kernel = root.inputs[1].shape[2:] if conv else root.attr("kernel")
    stride, pad, dil = root.attr("stride"), root.attr("padding"), root.attr("dilation")
    out_names = tuple(loop_vars(root.rank))
    lead = root.rank - nsp
    work = f"{scope.dim(root.type.numel)} * {int(shape_numel(kernel))}"
    close = nest_open(scope, root.shape, out_names, work)
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
        value = f"acc / {float(shape_numel(kernel))}"
    else:
        value = "(cnt ? acc / cnt : 0.0)"
    inner.append(store(scope, root, out_names, f"({t})({value})").text)
    return close([text(*inner)])  # a window walk: hand-written, opaque to the passes


def _emit_conv(scope: KernelScope, root: Node) -> list:
    """Float convolutions: ``conv_emit`` (oneDNN, or im2col + GEMM), each image's epilogue
    right after it; other dtypes: the direct window loop."""
    if root.dtype not in (DType.f32, DType.f64):
        return _emit_window(scope, root)
    epilogue = scope.sched.epilogues.get(id(root))
    if epilogue is None:
        return conv_emit.emit_conv(scope, root, None)
    return conv_emit.emit_conv(
        scope,
        root,
        _epilogue(scope, epilogue),
        _fusion(scope, root, epilogue),
        lambda: _epilogue_rows(scope, epilogue),
    )


def _fusion(scope: KernelScope, root: Node, epilogue: Node) -> conv_emit.Fusion | None:
    """The epilogue of a channels-last convolution oneDNN runs as post-ops (``routes.py``
    decided), its operands' buffers."""
    route = scope.sched.routes.get(id(root))
    ops = route.post_ops if route is not None else None
    if ops is None:
        return None
    operands = [(scope.ptr(v), whole) for v, whole in zip(ops.operands, ops.tensors)]
    return conv_emit.Fusion(ops.code, operands, scope.ptr(epilogue))


def _epilogue(scope: KernelScope, epilogue: Node) -> list:
    """The epilogue loop nest over one image ``n`` of the convolution's output."""
    names = ("n", *loop_vars(epilogue.rank)[1:])
    work = scope.dim(shape_numel(epilogue.shape[1:]))
    close = nest_open(scope, epilogue.shape[1:], names[1:], work)
    return close(
        statements(
            scope, lambda: store(scope, epilogue, names, scope.fused_expression(epilogue, names))
        )
    )


def _epilogue_rows(scope: KernelScope, epilogue: Node) -> list:
    """The epilogue over pixels ``r0`` to ``r1`` of a channels-last [N, H, W, C] output
    seen as [N * H * W, C] rows: what a row block of a 1x1 convolution's GEMM runs right
    after it, while the block is in cache (``conv_emit``)."""
    names = ("n", *loop_vars(epilogue.rank)[1:])
    h, w, c = (scope.dim(d) for d in epilogue.shape[1:])
    pixel = (
        const("int64_t", "n", f"p / ({h} * {w})"),
        const("int64_t", names[1], f"p / {w} % {h}"),
        const("int64_t", names[2], f"p % {w}"),
    )
    body = statements(
        scope, lambda: store(scope, epilogue, names, scope.fused_expression(epilogue, names))
    )
    return [loop(For("p", "r0", "r1"), [*pixel, loop(For(names[3], "0", c), body)])]


def _flat_load(scope: KernelScope, node: Node, ptr: str, idx) -> str:
    terms = []
    for k, i in enumerate(idx):
        st = scope.dim(shape_numel(node.shape[k + 1 :]))
        terms.append(f"({i})" if st == "1" else f"({i}) * {st}")
    return f"((const {c_type(node.dtype)}*){ptr})[{' + '.join(terms)}]"


EMITTERS = {
    "reduce": emit_reduce,
    "argreduce": emit_argreduce,
    "cumulative": emit_cumulative,
    "dot": gemm_emit.emit_dot,
    "convolution": _emit_conv,
    "pool": _emit_window,
    "scatter": scatter_emit.emit_scatter,
}


def element_cost(sched: Schedule, root: Node) -> int:
    """Relative work per output element: 1, plus 8 per transcendental the kernel fuses.

    A kernel goes parallel when elements x this cost passes PARALLEL_WORK, so an
    exp-heavy softmax over [8, 768] (2.3 us of exp alone) uses both cores while a
    copy of the same size stays on one.
    """
    group = members(sched, root)
    nodes = [*group, *fused_into(sched, root)]
    return min(len(group) + sum(sched.costs.expensive_ops.get(n.op, 0) for n in nodes), 32)


def _split_variant(sched, scope, root, emit, lines, texts: list[str], speculate: bool):
    """``lines`` behind a run-time choice of the split variant when fewer rows (outputs)
    than threads would leave threads idle; with the variants' descriptions."""
    variant = sched.split.get(id(root))  # planned (anyshape/schedule/variants.py)
    if variant is None:
        return lines, [" and ".join(texts) or "general"]
    extent, noun, what = variant.extent, variant.noun, variant.what
    scope.begin_variant(speculate, True)
    split = emit()
    scope.split = False
    if list(split) == list(lines):  # the emitter splits no rows (a tiled transpose)
        return lines, [" and ".join(texts) or "general"]
    few = f"{scope.dim(extent)} < omp_get_max_threads()"
    cond = f"{format_dim(extent)} {noun} < threads"
    if id(root) in sched.stitches:  # short rows keep the row buffer and one thread
        row = scope.dim(root.shape[-1])
        few += f" && {row} * {scope.element_cost} > {ROW_SPLIT_WORK}"
        cond += f" and rows longer than {ROW_SPLIT_WORK // scope.element_cost}"
    out = [if_(few, split, lines)]
    many = ", ".join([" and ".join(texts)] * bool(texts) + [f"else whole {noun} per thread"])
    return out, [" and ".join(texts + [f"{cond}: {what}"]), many]


def _window_refusal(scope: KernelScope, root: Node) -> list:
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
    return [stmt(f"if ({' || '.join(conds)}) return 6;")] if conds else []


def emit_kernel(
    sched: Schedule, root: Node, buffer_of: dict[int, int], generalize: bool = False
) -> Kernel:
    """The kernel of ``root``; ``generalize``: its static sizes of ``FAMILY_MIN`` or more
    as run-time integers too (a kernel family's text, see ``families.py``)."""
    tail = ""
    if id(root) in sched.attention:
        scope = AttentionScope(sched, buffer_of, root)
        tail = row_tail(stitch_root(sched, root).shape[-1])

        def emit():
            return emit_attention(scope, root)
    elif id(root) in sched.stitches:
        scope = StitchScope(sched, buffer_of, root)
        tail = row_tail(root.shape[-1])

        def emit():
            return emit_stitch(scope, root, sched.stitches[id(root)])
    else:
        scope = KernelScope(sched, buffer_of)

        def emit():
            return EMITTERS.get(root.op, _emit_pointwise)(scope, root)

    scope.generalize = generalize
    scope.ptr(root)  # the output is P[0]
    scope.element_cost = element_cost(sched, root)
    refuse = _window_refusal(scope, root)
    lines = emit()
    assumed = sched.no_broadcast.get(id(root))  # planned (anyshape/schedule/variants.py)
    if assumed is not None:
        # A dim that may be 1 at run time selects its index per element, which blocks
        # vectorization: a second variant assumes no such dim is 1, chosen per call.
        general = lines
        scope.assumed = assumed.assumed
        scope.begin_variant(True, False)
        fast = emit()
        if list(fast) == list(general):  # the plan's broadcasts were matched away (pow's
            assumed = None  # constant exponent): no select to speculate on
    if assumed is not None:
        cond = " && ".join(f"{scope.dim(d)} != 1" for d in assumed.assumed)
        described = assumed.describe() + " (no run-time broadcast)"
        fast, fast_variants = _split_variant(sched, scope, root, emit, fast, [described], True)
        lines = [if_(cond, fast, general)]
        variants = fast_variants + ["general"]
    else:
        lines, variants = _split_variant(sched, scope, root, emit, lines, [], False)
        if len(variants) == 1:
            variants = []
    lines = write(hoist_invariants([*refuse, *lines]))
    # Buffers never overlap within a kernel: restrict lets loops vectorize without checks.
    head = [f"void* __restrict__ p{k} = P[{k}];" for k in range(len(scope.ptrs))]
    # Sizes as locals: read through D inside a `#pragma omp simd` loop, an index such
    # as i0 * D[5] + r0 is not seen as contiguous and becomes a gather (3.4x slower
    # attention softmax).
    head += [f"const int64_t D_{k} = D[{k}];" for k in range(len(scope.ints))]
    head.append("int err_flag = 0; int* err = &err_flag; (void)err;")
    body = "\n".join(head + lines + ["return err_flag;"])
    return Kernel(body, scope.ptrs, scope.ints, root, variants, tail)
