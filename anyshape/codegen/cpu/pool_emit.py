"""Float max pooling over two spatial dims, one output row at a time, vectorized.

Sits beside ``kernels`` (which calls ``emit_max_pool_rows`` for ``pool`` nodes
it covers: kind max, float, two spatial dims). The window walk of
``kernels._emit_window`` tests bounds per tap and output element, which keeps
the compiler from vectorizing it (ResNet-50's stem pool took 4.5 % of the
model). Here each output row starts at -inf in the output buffer, and for
every valid input row ``iy`` and tap ``kx`` one branch-free loop over the
output columns whose input column is in range -- a range computed once per
tap -- takes the max (NaN wins, as in torch). A channels-last pool (max or
average) walks the window per output position with one vector loop over the
channels per tap (``emit_pool_channels_last``). Everything else keeps the
general window loop.
"""

from __future__ import annotations

from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .loop_ir import text
from .loop_nest import nest_open


def covers(root: Node) -> bool:
    return (
        root.op == "pool"
        and root.attr("kind") == "max"
        and root.dtype in (DType.f32, DType.f64)
        and len(root.attr("padding")) == 2
    )


def in_range_columns(off: str, n_in, n_out, stride, valid: str = "true") -> list[str]:
    """C declaring ``lo``, ``hi``: the output columns ``o`` with ``o * stride + off`` in
    ``[0, n_in)`` (an empty range unless ``valid``). Shared with im2col's rows."""
    return [
        f"const int64_t lo = !({valid}) ? {n_out} : {off} >= 0 ? 0 : "
        f"as_min64({n_out}, (-{off} + {stride} - 1) / {stride});",
        f"const int64_t hi = !({valid}) ? {n_out} : as_max64(lo, as_min64({n_out}, "
        f"{n_in} - {off} <= 0 ? 0 : ({n_in} - {off} + {stride} - 1) / {stride}));",
    ]


def row_major(prefix: str, dims, count: int) -> str:
    """Row-major offset of ``prefix0 .. prefix{count-1}`` within ``dims`` (``0`` if none)."""
    terms = [
        f"{prefix}{s}" + "".join(f" * {dims[j]}" for j in range(s + 1, len(dims)))
        for s in range(count)
    ]
    return " + ".join(terms) or "0"


def emit_max_pool_rows(scope, root: Node) -> list:
    x = root.inputs[0]
    (kh, kw), (sh, sw) = root.attr("kernel"), root.attr("stride")
    (ph, pw), (dh, dw) = root.attr("padding"), root.attr("dilation")
    t = "float" if root.dtype == DType.f32 else "double"
    lead = root.rank - 2
    names = tuple(f"i{k}" for k in range(lead + 1))  # leading dims, then the output row
    H, W = (scope.dim(d) for d in x.shape[-2:])
    OW = scope.dim(root.shape[-1])
    plane_in = " + ".join(
        [f"{names[k]} * {scope.dim(shape_numel(x.shape[k + 1 : lead]))}" for k in range(lead)]
    )
    plane_out = " + ".join(
        [f"{names[k]} * {scope.dim(shape_numel(root.shape[k + 1 : lead]))}" for k in range(lead)]
    )
    plane_in, plane_out = plane_in or "0", plane_out or "0"
    oh = names[-1]
    work = f"{scope.dim(root.type.numel)} * {kh * kw}"
    close = nest_open(scope, root.shape[:-1], names, work)
    px, po = scope.ptr(x), scope.ptr(root)
    OH = scope.dim(root.shape[-2])
    body = [
        f"{t}* o = ({t}*){po} + (({plane_out}) * {OH} + {oh}) * {OW};",
        f"const {t}* xp = (const {t}*){px} + ({plane_in}) * {H} * {W};",
        f"for (int64_t ow = 0; ow < {OW}; ++ow) o[ow] = -__builtin_inf();",
        f"for (int64_t ky = 0; ky < {kh}; ++ky) {{",
        f"  const int64_t iy = {oh} * {sh} - {ph} + ky * {dh};",
        f"  if (iy < 0 || iy >= {H}) continue;",
        f"  const {t}* xr = xp + iy * {W};",
        f"  for (int64_t kx = 0; kx < {kw}; ++kx) {{",
        f"    const int64_t off = kx * {dw} - {pw};",
        *("    " + ln for ln in in_range_columns("off", W, OW, sw)),
        "    #pragma omp simd",
        "    for (int64_t ow = lo; ow < hi; ++ow) {",
        f"      const {t} v = xr[ow * {sw} + off];",
        "      o[ow] = (v > o[ow] || v != v) ? v : o[ow];",
        "    }",
        "  }",
        "}",
    ]
    return close([text(*body)])  # hand-written, opaque to the passes


def emit_pool_channels_last(scope, root: Node) -> list:
    """A 2-D float pool over [N, H, W, C]: per output position, every tap in range adds
    (or takes the max of) one contiguous channel vector."""
    x = root.inputs[0]
    (kh, kw), (sh, sw) = root.attr("kernel"), root.attr("stride")
    (ph, pw), (dh, dw) = root.attr("padding"), root.attr("dilation")
    t = "float" if root.dtype == DType.f32 else "double"
    kind = root.attr("kind")
    H, W, C = (scope.dim(d) for d in x.shape[1:])
    OH, OW = (scope.dim(d) for d in root.shape[1:3])
    # (image, output row, output column: the images' rows over the threads, not the images
    # alone, which left a thread idle at batch 1 and 3)
    names = ("i0", "i1", "ow")
    close = nest_open(scope, root.shape[:3], names, f"{scope.dim(root.type.numel)} * {kh * kw}")
    px, po = scope.ptr(x), scope.ptr(root)
    if kind == "max":
        init, step = "-__builtin_inf()", "o[c] = (v > o[c] || v != v) ? v : o[c];"
    else:
        init, step = "0", "o[c] += v;"
    body = [  # (the body of the loop over `ow`, one output pixel's channels)
        f"  {t}* o = ({t}*){po} + ((i0 * {OH} + i1) * {OW} + ow) * {C};",
        "  #pragma omp simd",
        f"  for (int64_t c = 0; c < {C}; ++c) o[c] = {init};",
        *(["  int64_t taps = 0;"] if kind == "avg" else []),
        f"  for (int64_t ky = 0; ky < {kh}; ++ky) {{",
        f"    const int64_t iy = i1 * {sh} - {ph} + ky * {dh};",
        f"    if (iy < 0 || iy >= {H}) continue;",
        f"    for (int64_t kx = 0; kx < {kw}; ++kx) {{",
        f"      const int64_t ix = ow * {sw} - {pw} + kx * {dw};",
        f"      if (ix < 0 || ix >= {W}) continue;",
        f"      const {t}* s = (const {t}*){px} + ((i0 * {H} + iy) * {W} + ix) * {C};",
        *(["      ++taps;"] if kind == "avg" else []),
        "      #pragma omp simd",
        f"      for (int64_t c = 0; c < {C}; ++c) {{ const {t} v = s[c]; {step} }}",
        "    }",
        "  }",
    ]
    if kind == "avg":
        count = str(kh * kw) if root.attr("count_include_pad") else "taps"
        body += [
            f"  const {t} scale = taps ? ({t})1 / ({t}){count} : ({t})0;",
            "  #pragma omp simd",
            f"  for (int64_t c = 0; c < {C}; ++c) o[c] *= scale;",
        ]
    return close([text(*(ln[2:] for ln in body))])
