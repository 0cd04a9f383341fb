"""Dot kernels: oneDNN's matmul against a packed model weight, or BLAS GEMM.

Sits beside ``kernels`` (whose ``dot`` emitter is ``emit_dot``). A float32
GEMM whose right operand is a 2-D model weight (a linear layer: ``x @ W.T`` or
``x @ W``) first tries oneDNN's matmul with the weight packed once
(``dnnl_matmul.h``, only compiled when the build links oneDNN; at row counts
where the BLAS path is faster on the ISA oneDNN runs it declines); every float dot
has the BLAS path (``as_gemm_batch`` in ``prelude.h``: OpenBLAS, batched,
transposes folded into the call); integer dots are a plain loop nest.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from ...schedule.plan import Schedule
from .ctypes_map import c_type
from .expr import KernelScope
from .loop_ir import Guarded, text


def _operand(sched: Schedule, x: Node) -> tuple[Node, bool]:
    """The buffer a dot reads for operand ``x`` and whether it reads it transposed."""
    inner = sched.transposed_operands.get(id(x))
    return (inner, True) if inner is not None else (x, False)


def dnnl_site(kind: str, geometry: list[str]) -> str:
    """The declaration of ``dnnl_site``, the oneDNN call site of a kernel (an ``AsMatmulSite``
    or ``AsConvSite``: primitives and packed weights) for ``geometry``: a static of the
    kernel when every value is a literal, else its family's site for this call's values
    (``as_site_for`` in dnnl.h)."""
    if all(g.isdigit() for g in geometry):
        return (
            f"static {kind} dnnl_site = {{{', '.join(geometry)}, {{PTHREAD_MUTEX_INITIALIZER}}}};"
        )
    make = {"AsMatmulSite": "as_matmul_site", "AsConvSite": "as_conv_site"}[kind]
    return (
        "static AsSiteTable dnnl_sites = {PTHREAD_MUTEX_INITIALIZER, nullptr, 0};\n"
        f"{kind}& dnnl_site = *{make}(&dnnl_sites, {', '.join(geometry)});"
    )


def _dnnl_matmul(scope: KernelScope, root: Node, w: Node, transposed: bool) -> Guarded:
    k, n = (w.shape[1], w.shape[0]) if transposed else (w.shape[0], w.shape[1])
    pa, pw, pc = scope.ptr(_operand(scope.sched, root.inputs[0])[0]), scope.ptr(w), scope.ptr(root)
    always = int(scope.sched.routes[id(root)].always)
    geometry = [scope.dim(k), scope.dim(n), str(int(transposed)), str(always)]
    call = [
        *dnnl_site("AsMatmulSite", geometry).split("\n"),
        f"if (as_dnnl_matmul(&dnnl_site, (const float*){pa}, (const float*){pw}, (float*){pc}, "
        f"{scope.dim(root.shape[0])})) return 0;",
    ]
    return Guarded("ANYSHAPE_DNNL", (text(*call),))


def emit_dot(scope: KernelScope, root: Node) -> list:
    """The GEMM call (hand-written glue, opaque to the passes)."""
    a, b = root.inputs
    m, n = root.shape[-2], root.shape[-1]
    k = a.shape[-1]
    batch = shape_numel(root.shape[:-2])
    (abuf, ta), (bbuf, tb) = _operand(scope.sched, a), _operand(scope.sched, b)
    pa, pb, pc = scope.ptr(abuf), scope.ptr(bbuf), scope.ptr(root)
    M, N, K, B = (scope.dim(v) for v in (m, n, k, batch))
    if root.dtype in (DType.f32, DType.f64):
        t = c_type(root.dtype)
        lda = M if ta else K
        ldb = K if tb else N
        lines = [
            text(
                f"if ({M} == 0 || {N} == 0) return 0;",
                f"if ({K} == 0) {{ for (int64_t q = 0; q < {B} * {M} * {N}; ++q) (({t}*){pc})[q] = 0; "
                "return 0; }",
            )
        ]
        if id(root) in scope.sched.routes:  # oneDNN matmul (routes.py), when linked
            lines.append(_dnnl_matmul(scope, root, bbuf, tb))
        return lines + [
            text(
                f"as_gemm_batch<{t}>({'CblasTrans' if ta else 'CblasNoTrans'}, "
                f"{'CblasTrans' if tb else 'CblasNoTrans'}, {M}, {N}, {K}, "
                f"(const {t}*){pa}, {lda}, (const {t}*){pb}, {ldb}, ({t}*){pc}, {B});",
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
