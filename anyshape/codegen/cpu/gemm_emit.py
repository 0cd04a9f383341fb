"""Dot kernels: oneDNN's matmul against a packed model weight, or BLAS GEMM.

Sits beside ``kernels`` (whose ``dot`` emitter is ``emit_dot``). A float32
GEMM whose right operand is a 2-D model weight (a linear layer: ``x @ W.T`` or
``x @ W``) first tries oneDNN's matmul with the weight packed once
(``dnnl_matmul.h``, only compiled when the build links oneDNN; at row counts
where the BLAS path is faster on the ISA oneDNN runs it declines); every float dot
has the BLAS path (``as_gemm_batch`` in ``gemm.h``: OpenBLAS, batched,
transposes folded into the call; ``as_gemm_views`` where an operand is a permuted
buffer read in place, attention's heads: ``operand_layout``); integer dots are a plain
loop nest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from ...schedule.plan import Schedule
from .ctypes_map import c_type
from .expr import KernelScope
from .loop_ir import Guarded, text


def dnnl_site(kind: str, geometry: list[str], name: str = "dnnl_site") -> str:
    """The declaration of ``name``, the oneDNN call site of a kernel (an ``AsMatmulSite``,
    ``AsConvSite``, ``AsTapsSite`` or ``AsWinogradSite``: primitives and packed weights) for ``geometry``: a
    static of the kernel when every value is a literal, else its family's site for this
    call's values (``as_site_for`` in dnnl.h; the table ``<name>s``). A kernel with two
    sites names the second."""
    if all(g.isdigit() for g in geometry):
        return f"static {kind} {name} = {{{', '.join(geometry)}, {{PTHREAD_MUTEX_INITIALIZER}}}};"
    make = {
        "AsMatmulSite": "as_matmul_site",
        "AsConvSite": "as_conv_site",
        "AsTapsSite": "as_taps_site",
        "AsWinogradSite": "as_winograd_site",
    }[kind]
    return (
        f"static AsSiteTable {name}s = {{PTHREAD_MUTEX_INITIALIZER, nullptr, 0}};\n"
        f"{kind}& {name} = *{make}(&{name}s, {', '.join(geometry)});"
    )


def _dnnl_matmul(scope: KernelScope, root: Node, w: Node, transposed: bool) -> Guarded:
    k, n = (w.shape[1], w.shape[0]) if transposed else (w.shape[0], w.shape[1])
    pa, pw, pc = scope.ptr(root.inputs[0]), scope.ptr(w), scope.ptr(root)  # (a is packed)
    mode = scope.sched.routes[id(root)].site_mode
    geometry = [scope.dim(k), scope.dim(n), str(int(transposed)), str(mode)]
    call = [
        *dnnl_site("AsMatmulSite", geometry).split("\n"),
        f"if (as_dnnl_matmul(&dnnl_site, (const float*){pa}, (const float*){pw}, (float*){pc}, "
        f"{scope.dim(root.shape[0])})) return 0;",
    ]
    return Guarded("ANYSHAPE_DNNL", (text(*call),))


@dataclass(frozen=True)
class OperandLayout:
    """How a dot reads one operand ``[..., rows, cols]``: its buffer, whether each matrix
    is stored transposed, the leading dimension, and the stride of each batch dim."""

    buffer: Node
    transposed: bool
    ld: object  # a dim expression
    batch_strides: list  # dim expressions, one per batch dim
    packed: bool  # matrices one after another (what ``as_gemm_batch`` reads)


def operand_layout(sched: Schedule, x: Node) -> OperandLayout:
    """``x``'s layout: packed row-major, or a transpose of a buffer read in place
    (``plan.reads_in_place``), whose strides follow from the permutation."""
    r = x.rank
    inner = sched.transposed_operands.get(id(x))
    if inner is None:
        strides = [shape_numel(x.shape[i + 1 :]) for i in range(r)]
        return OperandLayout(x, False, x.shape[-1], strides[:-2], True)
    perm = tuple(x.attr("perm"))
    source = [shape_numel(inner.shape[j + 1 :]) for j in range(r)]
    strides = [source[p] for p in perm]
    transposed = perm[-2] == r - 1  # (else perm[-1] is: rows stride, columns are contiguous)
    ld = strides[-1] if transposed else strides[-2]
    return OperandLayout(inner, transposed, ld, strides[:-2], perm[:-2] == tuple(range(r - 2)))


def outer_inner(values: list, pad=0) -> list:
    """A batch of at most two dims as gemm.h's ``as_view`` takes it, (outer, inner): its
    sizes (``pad`` 1) or an operand's strides along them (``pad`` 0, a dim it lacks)."""
    return [pad, pad, *values][-2:]


def emit_dot(scope: KernelScope, root: Node) -> list:
    """The GEMM call (hand-written glue, opaque to the passes)."""
    a, b = root.inputs
    m, n = root.shape[-2], root.shape[-1]
    k = a.shape[-1]
    batch = shape_numel(root.shape[:-2])
    la, lb = operand_layout(scope.sched, a), operand_layout(scope.sched, b)
    (abuf, ta), (bbuf, tb) = (la.buffer, la.transposed), (lb.buffer, lb.transposed)
    pa, pb, pc = scope.ptr(abuf), scope.ptr(bbuf), scope.ptr(root)
    M, N, K, B = (scope.dim(v) for v in (m, n, k, batch))
    if root.dtype in (DType.f32, DType.f64):
        t = c_type(root.dtype)
        lines = [
            text(
                f"if ({M} == 0 || {N} == 0) return 0;",
                f"if ({K} == 0) {{ for (int64_t q = 0; q < {B} * {M} * {N}; ++q) (({t}*){pc})[q] = 0; "
                "return 0; }",
            )
        ]
        if id(root) in scope.sched.routes:  # oneDNN matmul (routes.py), when linked
            lines.append(_dnnl_matmul(scope, root, bbuf, tb))
        trans = ["CblasTrans" if f else "CblasNoTrans" for f in (ta, tb)]
        lda, ldb = scope.dim(la.ld), scope.dim(lb.ld)
        if la.packed and lb.packed:
            return lines + [
                text(
                    f"as_gemm_batch<{t}>({trans[0]}, {trans[1]}, {M}, {N}, {K}, "
                    f"(const {t}*){pa}, {lda}, (const {t}*){pb}, {ldb}, ({t}*){pc}, {B});",
                )
            ]
        # A batch over one or two dims (outer, inner), each operand at its own strides.
        outer, inner = outer_inner(list(root.shape[:-2]), 1)
        c_strides = [shape_numel(root.shape[i + 1 :]) for i in range(root.rank - 2)]

        def pair(strides: list) -> str:
            return ", ".join(scope.dim(s) for s in outer_inner(strides))

        return lines + [
            text(
                f"as_gemm_views<{t}>({trans[0]}, {trans[1]}, {M}, {N}, {K}, "
                f"(const {t}*){pa}, {lda}, {pair(la.batch_strides)}, "
                f"(const {t}*){pb}, {ldb}, {pair(lb.batch_strides)}, "
                f"({t}*){pc}, {N}, {pair(c_strides)}, {scope.dim(outer)}, {scope.dim(inner)});",
            )
        ]
    ct, acc = c_type(root.dtype), "double" if root.dtype.is_float else "int64_t"
    ia = f"(p * {K} + kk) * {M} + i" if ta else f"(p * {M} + i) * {K} + kk"
    ib = f"(p * {N} + j) * {K} + kk" if tb else f"(p * {K} + kk) * {N} + j"
    return [
        text(
            "#pragma omp parallel for collapse(2)",
            f"for (int64_t p = 0; p < {B}; ++p) for (int64_t i = 0; i < {M}; ++i)",
            f"  for (int64_t j = 0; j < {N}; ++j) {{ {acc} s = 0;",
            f"    for (int64_t kk = 0; kk < {K}; ++kk) s += ({acc})(({c_type(a.dtype)}*){pa})[{ia}] * "
            f"({acc})(({c_type(b.dtype)}*){pb})[{ib}];",
            f"    (({ct}*){pc})[(p * {M} + i) * {N} + j] = ({ct})s; }}",
        )
    ]
