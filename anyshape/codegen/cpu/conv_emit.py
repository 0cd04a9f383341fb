"""Float convolutions: oneDNN's direct convolution, or im2col + GEMM.

Sits beside ``kernels`` (whose ``convolution`` emitter calls ``emit_conv`` for
float32/float64 and passes the loop nest of the convolution's epilogue, see
``anyshape/schedule/epilogue.py``). A 2-D float32 convolution without groups, with a kernel over
1x1 and a model weight as weights, first tries oneDNN one image at a time
(``dnnl_conv.h``, only compiled when the build links oneDNN); every float
convolution has the im2col + GEMM path: per (image, group), or with the columns
of all images side by side when each image has few output positions, except a
depthwise one (one input channel per group), which is a direct loop
(``depthwise_emit``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import UnsupportedError
from ...ir.graph import Node
from . import depthwise_emit, pool_emit
from .conv_geometry import ConvGeometry, conv_geometry
from .expr import KernelScope
from .gemm_emit import dnnl_site
from .loop_ir import For, Guarded, if_, loop, text

if TYPE_CHECKING:
    from .routes import Route

# Below this many output positions per image, a batch's columns share one GEMM.
BATCHED_CONV_POSITIONS = 256


def _im2col_tap(c: ConvGeometry) -> list[str]:
    """Column-matrix row ``r`` (a channel and tap) of image ``xg`` written to ``dst``."""
    lines = [
        f"    int64_t rem = r % {c.ksize};",
        f"    const {c.t}* xc = xg + (r / {c.ksize}) * {c.Q};",
    ]
    for sdim in range(len(c.kernel) - 1, -1, -1):
        k = c.kernel[sdim]
        lines.append(f"    const int64_t k{sdim} = rem % {k}; rem /= {k};")
    return lines + _im2col_row(c.t, len(c.kernel), c.stride, c.pad, c.dil, c.ins, c.outs)


@dataclass(frozen=True)
class Fusion:
    """The epilogue as oneDNN post-ops (``post_ops.py``): their code, their operands'
    buffers (each a per-channel vector, or a tensor of the output's shape: ``True``) and
    the epilogue's output, which a fused call writes."""

    code: int
    operands: list[tuple[str, bool]]
    out: str


def _operands(c: ConvGeometry, fusion: Fusion) -> str:
    """The declaration of ``post_operands``, the post-ops' operands at image ``n``."""
    image = f" + n * {c.P} * {c.OC}"
    ptrs = [f"(const float*){p}" + (image if whole else "") for p, whole in fusion.operands]
    return f"const float* const post_operands[] = {{{', '.join(ptrs or ['nullptr'])}}};"


def _dnnl_site(
    c: ConvGeometry,
    route: Route,
    x: str,
    y: str,
    rows: str | None = None,
    fusion: Fusion | None = None,
    z: str = "nullptr",
) -> tuple[str, str]:
    """The kernel's oneDNN call site (a static holding its primitives and packed weights)
    and the call that runs image ``x`` into ``y`` there (or ``rows`` pixels of a 1x1
    kernel): ``dnnl_conv.h``, or ``dnnl_matmul.h`` for a channels-last 1x1 kernel, where it
    pays at that row count (``as_matmul_pays``) or always. The call is 0 where oneDNN does
    not run it, 1 where it ran, 2 where it also ran ``fusion``'s post-ops into ``z``."""
    w = f"(const float*){c.pw}"
    post = str(fusion.code) if fusion else "0"
    operands = "post_operands" if fusion else "nullptr"  # (``_operands``, before the call)
    if route.as_matmul:  # (no post-ops: oneDNN's matmul with them left brgemm for gemm:jit)
        site = dnnl_site("AsMatmulSite", [c.CG, c.OC, "1", str(route.site_mode)])
        call = f"as_dnnl_matmul(&dnnl_site, {x}, {w}, {y}, {rows or c.P})"
    else:
        static = [*c.kernel, *c.stride, *c.pad, *c.dil, int(c.channels_last)]
        site = dnnl_site("AsConvSite", [c.CG, c.OC, *map(str, static), post])
        call = f"as_dnnl_conv2d(&dnnl_site, {x}, {w}, {y}, {c.ins[0]}, {c.ins[1]}, {operands}, {z})"
    return site, call


def _conv_dnnl(c: ConvGeometry, epilogue: list | None, route: Route) -> list:
    """A channels-first convolution one image at a time through oneDNN, each image's
    epilogue right after it. If the first image cannot run there, im2col + GEMM below
    runs instead."""
    x = f"(const float*){c.px} + n * {c.C} * {c.Q}"
    site, call = _dnnl_site(c, route, x, f"(float*){c.po} + n * {c.OC} * {c.P}")
    each_image = [text("const int64_t n = done;", f"if (!{call}) break;"), *(epilogue or ())]
    body = (
        text(*site.split("\n"), "int64_t done = 0;"),
        loop(For("done", None, c.N), each_image),
        text(f"if (done == {c.N}) return 0;", "if (done > 0) return 4;"),
    )
    return [Guarded("ANYSHAPE_DNNL", body)]


def _conv_batched(c: ConvGeometry) -> list[str]:
    """im2col + GEMM with every image's columns side by side: one GEMM of N x P columns
    per group into a scratch, then each image's rows copied to the output."""
    t, P = c.t, c.P
    lines = [
        f"const int64_t NP = {c.N} * {P};",
        f"{t}* col = ({t}*)as_scratch((int64_t)sizeof({t}) * ({c.ROWS} + {c.OG}) * NP);",
        "if (!col) return 3;",
        f"{t}* acc = col + (int64_t){c.ROWS} * NP;",
        f"for (int64_t g = 0; g < {c.groups}; ++g) {{",
        f"  #pragma omp parallel for collapse(2) schedule(static) if({c.ROWS} * NP > 32768)",
        f"  for (int64_t r = 0; r < {c.ROWS}; ++r) for (int64_t n = 0; n < {c.N}; ++n) {{",
        f"    const {t}* xg = (const {t}*){c.px} + (n * {c.C} + g * {c.CG}) * {c.Q};",
        f"    {t}* dst = col + r * NP + n * {P};",
    ]
    if c.direct:
        lines += [
            f"    const {t}* xc = xg + r * {c.Q};",
            "    #pragma omp simd",
            f"    for (int64_t q = 0; q < {P}; ++q) dst[q] = xc[q];",
        ]
    else:
        lines += _im2col_tap(c)
    lines += [
        "  }",
        f"  as_conv_gemm<{t}>({c.OG}, NP, {c.ROWS}, "
        f"(const {t}*){c.pw} + g * {c.OG} * {c.ROWS}, {c.ROWS}, col, NP, acc);",
        f"  #pragma omp parallel for collapse(2) schedule(static) if({c.OG} * NP > 32768)",
        f"  for (int64_t n = 0; n < {c.N}; ++n) for (int64_t o = 0; o < {c.OG}; ++o) {{",
        f"    {t}* out = ({t}*){c.po} + (n * {c.OC} + g * {c.OG} + o) * {P};",
        f"    const {t}* src = acc + o * NP + n * {P};",
        "    #pragma omp simd",
        f"    for (int64_t q = 0; q < {P}; ++q) out[q] = src[q];",
        "  }",
        "}",
    ]
    return lines


def _conv_channels_last(
    c: ConvGeometry,
    epilogue: list | None,
    route: Route | None,
    fusion: Fusion | None = None,
    epilogue_rows: Callable[[], list] | None = None,
) -> list:
    """A convolution on [N, H, W, C] activations, one image at a time, each image's
    epilogue right after it (its output still in cache), or inside oneDNN's convolution
    as post-ops (``fusion``) where oneDNN takes them. The image runs on oneDNN
    (``route``, when linked) unless oneDNN cannot run the call's first image, or the
    matmul does not pay at its pixel count (the same for every image of a call); then
    every image of the call runs ``as_conv2d_nhwc`` (gemm.h: im2col + one GEMM, one
    function shared by every such kernel), so the epilogue is written once."""
    if c.groups != 1 or len(c.kernel) != 2:
        raise UnsupportedError(
            f"a channels-last convolution with {c.groups} groups over {len(c.kernel)} spatial "
            "dims: the CPU backend's channels-last kernel is 2-D without groups"
        )
    if c.direct and (route is None or route.as_matmul):
        return _conv_channels_last_direct(c, epilogue, route, epilogue_rows)
    taps = []  # (the runtime's own kernels, before oneDNN's, once the weight is packed)
    if route is not None and c.t == "float" and fusion is None:
        if c.cg <= TAPS_CHANNELS:
            taps = _conv_taps(c, epilogue_rows() if epilogue is not None else [])
        elif route.winograd:
            taps = _conv_winograd(c, epilogue_rows() if epilogue is not None else [])
    t, (kh, kw), (sh, sw), (ph, pw), (dh, dw) = c.t, c.kernel, c.stride, c.pad, c.dil
    (h, w), (oh, ow) = c.ins, c.outs
    x, y = (
        f"xn = (const {t}*){c.px} + n * {c.Q} * {c.C}",
        f"yn = ({t}*){c.po} + n * {c.P} * {c.OC}",
    )
    flags = "bool ran = false, fused = false;" if fusion else "bool ran = false;"
    image = [text(f"const {t}* {x};", f"{t}* {y};", flags)]
    before = []
    if route is not None:
        z = f"(float*){fusion.out} + n * {c.P} * {c.OC}" if fusion else "nullptr"
        site, call = _dnnl_site(c, route, "xn", "yn", fusion=fusion, z=z)
        before.append(
            Guarded("ANYSHAPE_DNNL", (text(*site.split("\n"), "bool dnnl_runs = true;"),))
        )
        runs = (
            "if (dnnl_runs) {",
            *(["  " + _operands(c, fusion)] if fusion else []),
            f"  const int r = {call};",
            "  ran = r > 0;",
            *(["  fused = r == 2;"] if fusion else []),
            "  if (!ran && n > 0) return 4;  // (oneDNN ran this call's earlier images)",
            "  dnnl_runs = ran;",
            "}",
        )
        image.append(Guarded("ANYSHAPE_DNNL", (text(*runs),)))
    fallback = (
        f"if (!ran && !{_nhwc_fallback(t)}(xn, (const {t}*){c.pw}, yn, {c.C}, {c.OC}, "
        f"{h}, {w}, {oh}, {ow}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw})) return 3;"
    )
    image.append(text(fallback))
    if epilogue is not None:
        image += [if_("!fused", epilogue)] if fusion else epilogue
    return [*taps, *before, loop(For("n", "0", c.N), image), text("return 0;")]


def _nhwc_fallback(t: str) -> str:
    """The function a kernel calls when oneDNN does not run its convolution: gemm.h's
    ``as_conv2d_nhwc``, for float without template arguments, so that with oneDNN linked
    the overload compiled once in its glue object (``dnnl_conv.h``) is called and no unit
    of the library compiles the template (ResNet-50's two units: 0.09 s less)."""
    return "as_conv2d_nhwc" if t == "float" else f"as_conv2d_nhwc<{t}>"


# Up to this many input channels a channels-last convolution runs as ``_conv_taps``.
TAPS_CHANNELS = 4


def _conv_taps(c: ConvGeometry, epilogue_rows: list) -> list:
    """A convolution with few input channels (an image network's stem) as GEMMs over its
    windows, one row of output pixels at a time over the threads: each pixel's window
    copied into a per-thread buffer, a run of ``kw x C`` floats per kernel row, then
    ``as_rows_gemm`` (dnnl_matmul.h) by the weight in its panels, then the epilogue over
    that row's pixels while they are in cache. oneDNN ran ResNet-50's 3-channel 7x7 stem
    through a blocked kernel with reorders in and out, at half ONNX Runtime's speed
    (docs/performance.md, "2026-12-07, eighth"). Runs once the weight's panels are packed
    (its second call); the oneDNN path after it runs otherwise."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = c.kernel, c.stride, c.pad, c.dil
    (h, w), (oh, ow) = c.ins, c.outs
    k = c.cg * kh * kw
    site = dnnl_site("AsTapsSite", [str(k), c.OC, str(c.cg)], name="taps_site")
    run = kw * c.cg  # floats in a kernel row's window (the channels are static: groups 1)
    window = [
        f"const float* xn = (const float*){c.px} + n * {h} * {w} * {c.cg};",
        f"for (int64_t ox = 0; ox < {ow}; ++ox) {{",
        f"  float* d = col + ox * {k};",
        f"  const int64_t x0 = ox * {sw} - {pw};",
        f"  for (int64_t i = 0; i < {kh}; ++i, d += {run}) {{",
        f"    const int64_t y = oy * {sh} - {ph} + i * {dh};",
        f"    const bool inside = y >= 0 && y < {h};",
        f"    const float* row = xn + (inside ? y : 0) * {w} * {c.cg};  // (read only inside)",
    ]
    if dw == 1:  # the taps inside the image are one run
        window += [
            f"    if (inside && x0 >= 0 && x0 + {kw} <= {w}) {{",
            f"      memcpy(d, row + x0 * {c.cg}, sizeof(float) * {run});",
            "      continue;",
            "    }",
        ]
    window += [
        f"    for (int64_t j = 0; j < {kw}; ++j) {{",
        f"      const int64_t x = x0 + j * {dw};",
        f"      const bool in = inside && x >= 0 && x < {w};",
        f"      for (int64_t q = 0; q < {c.cg}; ++q) d[j * {c.cg} + q] = in ? row[x * {c.cg} + q] : 0.0f;",
        "    }",
    ]
    window += ["  }", "}"]
    block = [
        text(
            f"const int64_t n = b / {oh}, oy = b % {oh};",
            f"float* col = (float*)as_scratch((int64_t)sizeof(float) * {ow} * {k});",
            "if (!col) { failed = 1; continue; }",
            *window,
            f"const int64_t r0 = b * {ow}, r1 = r0 + {ow};",
            f"as_rows_gemm({ow}, {c.OC}, {k}, col, panels, (float*){c.po} + r0 * {c.OC});",
        ),
        *epilogue_rows,
    ]
    parallel = (
        "#pragma omp parallel for schedule(static) reduction(|:failed) "
        f"if({c.N} * {oh} * {ow} * {c.OC} >= 32768)"
    )
    body = (
        text(
            *site.split("\n"),
            f"const float* taps_panels = as_taps_panels(&taps_site, (const float*){c.pw});",
        ),
        if_(
            "taps_panels",
            [
                text("const float* panels = taps_panels;", "int failed = 0;"),
                loop(For("b", "0", f"{c.N} * {oh}"), block, [parallel]),
                text("return failed ? 3 : 0;"),
            ],
        ),
    )
    return [Guarded("ANYSHAPE_DNNL", body)]


# Up to this many input x output channels a 3x3 convolution runs Winograd's minimal
# filtering (winograd.h picks F(4x4, 3x3) up to 128 x 128, F(2x2, 3x3) above).
# ResNet-50's 512-channel layers ran level with oneDNN or slower (docs/performance.md,
# "2026-12-08").
WINOGRAD_CHANNEL_PAIRS = 256 * 256


def _conv_winograd(c: ConvGeometry, epilogue_rows: list) -> list:
    """A 3x3 convolution by Winograd's minimal filtering F(4x4, 3x3) or F(2x2, 3x3)
    through ``as_winograd_conv`` (winograd.h): 36 multiplications for each 4 x 4 block of
    output and channel pair, or 16 for each 2 x 2 block, where the direct convolution takes
    144 or 36, as 36 or 16 GEMMs by the weight transformed once, then the epilogue over
    blocks of pixels across the threads. Capped to AVX2, oneDNN 3.2 ran ResNet-50's 3x3
    layers at 165-195 GFLOP/s, ONNX Runtime's direct kernel at 210 (docs/performance.md,
    "2026-12-08"). Runs once the transformed
    weight is packed (its second call); where an output is not finite (Winograd's
    transforms turn an infinity into NaN across a tile), the oneDNN path after it computes
    the call again, as it does otherwise."""
    (h, w), (oh, ow), (ph, pw) = c.ins, c.outs, c.pad
    site = dnnl_site("AsWinogradSite", [str(c.cg), c.OC], name="winograd_site")
    geometry = [c.N, h, w, c.cg, c.OC, ph, pw, oh, ow]
    rows = f"{c.N} * {oh} * {ow}"
    run = [
        text(
            f"const int64_t winograd_geometry[9] = {{{', '.join(map(str, geometry))}}};",
            "const int winograd = as_winograd_conv(winograd_geometry, "
            f"(const float*){c.px}, winograd_panels, (float*){c.po});",
        )
    ]
    done = []
    if epilogue_rows:
        done += [
            text(
                f"const int64_t bs = as_conv_row_block({rows}, {c.OC});",
                f"const int64_t nb = ({rows} + bs - 1) / bs;",
            ),
            loop(
                For("b", "0", "nb"),
                [
                    text(f"const int64_t r0 = b * bs, r1 = as_min64({rows}, r0 + bs);"),
                    *epilogue_rows,
                ],
                [f"#pragma omp parallel for schedule(static) if({rows} * {c.OC} >= 32768)"],
            ),
        ]
    body = (
        text(
            *site.split("\n"),
            f"const float* winograd_panels = {c.OC} * {c.cg} > {WINOGRAD_CHANNEL_PAIRS} ? nullptr"
            f" : as_winograd_panels(&winograd_site, (const float*){c.pw});",
        ),
        if_("winograd_panels", [*run, if_("winograd == 0", [*done, text("return 0;")])]),
    )
    return [Guarded("ANYSHAPE_DNNL", body)]


def _conv_channels_last_direct(
    c: ConvGeometry,
    epilogue: list | None,
    route: Route | None,
    epilogue_rows: Callable[[], list] | None = None,
) -> list:
    """A channels-last 1x1 convolution with unit stride and no padding: the batch's
    pixels are the rows of one GEMM by the weight (oneDNN's matmul where it pays at N x P
    rows, else ``as_conv2d_nhwc``'s BLAS GEMM), then its epilogue; a float epilogue runs
    over blocks of rows (``_row_blocks``), which for a large output also run their own
    GEMMs. One GEMM reads the weight once per call where one per image read it N times:
    with AVX2, ResNet-50's 2048-wide layers at 6x6 pixels ran at 135 GFLOP/s one image at a
    time, 172 as one GEMM for two images. (A strided 1x1 convolution stays on oneDNN's
    convolution: its pixels gathered into one GEMM ran level with AVX2 and 10-15 % slower
    with AVX-512.)"""
    t = c.t
    rows = f"{c.N} * {c.P}"
    body = [text(f"const {t}* xn = (const {t}*){c.px};", f"{t}* yn = ({t}*){c.po};")]
    body.append(text("bool ran = false;"))
    whole = []  # the GEMM over every pixel
    block_call = None
    if route is not None:
        site, call = _dnnl_site(c, route, "xn", "yn", rows)
        _, block_call = _dnnl_site(c, route, f"xn + r0 * {c.C}", f"yn + r0 * {c.OC}", "r1 - r0")
        body.append(Guarded("ANYSHAPE_DNNL", (text(*site.split("\n")),)))
        whole.append(Guarded("ANYSHAPE_DNNL", (text(f"ran = {call};"),)))
    whole.append(
        text(
            f"if (!ran && !{_nhwc_fallback(t)}(xn, (const {t}*){c.pw}, yn, {c.C}, {c.OC}, "
            f"{rows}, 1, {rows}, 1, 1, 1, 1, 1, 0, 0, 1, 1)) return 3;"
        )
    )
    if epilogue_rows is not None and t == "float":
        return body + _row_blocks(c, rows, whole, block_call, epilogue_rows())
    body += whole
    if epilogue is not None:
        body.append(loop(For("n", "0", c.N), epilogue))
    return [*body, text("return 0;")]


def _row_blocks(
    c: ConvGeometry, rows: str, whole: list, block_call: str | None, epilogue_rows: list
) -> list:
    """The epilogue over each thread's blocks of pixels (``as_conv_row_block``, about 512
    KB of output each). A large output (``as_conv_rows_fused``) runs each block's GEMM
    right before its epilogue, while the block is in cache: oneDNN's matmul where it pays
    at the block's rows (``block_call``), else its sgemm, both single-threaded inside the
    parallel loop. Otherwise the GEMM over every pixel (``whole``) runs first. Measured
    (docs/performance.md, "1x1 convolutions in row blocks"): ResNet-50's first expansion
    64 -> 256 at 4x56x56 pixels, restricted to AVX2, 112 -> 143 GFLOP/s, with AVX-512
    139 -> 149-153."""
    gemm = (
        f"dnnl_sgemm('N', 'T', r1 - r0, {c.OC}, {c.C}, 1.0f, xn + r0 * {c.C}, {c.C}, "
        f"(const float*){c.pw}, {c.C}, 0.0f, yn + r0 * {c.OC}, {c.OC}) == 0"
    )
    run = f"({block_call} || {gemm})" if block_call else f"({gemm})"
    if block_call:  # (the site's own kernel on its panels, once they are packed)
        own = f"as_rows_gemm(r1 - r0, {c.OC}, {c.C}, xn + r0 * {c.C}, panels, yn + r0 * {c.OC})"
        run_block = f"if (fused) {{ if (panels) {own}; else failed |= !{run}; }}"
        panels = f"if (fused) panels = as_rows_panels(&dnnl_site, (const float*){c.pw});"
    else:
        run_block, panels = f"if (fused) failed |= !{run};", ""
    block = [
        text(f"const int64_t r0 = b * bs, r1 = as_min64({rows}, r0 + bs);"),
        Guarded("ANYSHAPE_DNNL", (text(run_block),)),
        *epilogue_rows,
    ]
    parallel = (
        "#pragma omp parallel for schedule(static) reduction(|:failed) "
        f"if({rows} * {c.OC} >= 32768)"
    )
    return [
        text("bool fused = false;"),
        text("const float* panels = nullptr; (void)panels;"),
        Guarded(
            "ANYSHAPE_DNNL",
            (text(f"fused = as_conv_rows_fused({rows}, {c.OC});", *([panels] if panels else [])),),
        ),
        if_("!fused", whole),
        text(
            f"const int64_t bs = as_conv_row_block({rows}, {c.OC});",
            f"const int64_t nb = ({rows} + bs - 1) / bs;",
            "int failed = 0;",
        ),
        loop(For("b", "0", "nb"), block, [parallel]),
        text("return failed ? 3 : 0;  // (oneDNN's sgemm fails only out of memory)"),
    ]


def _im2col_row(t, nsp, stride, pad, dil, ins, outs) -> list[str]:
    """One column-matrix row (a channel and kernel tap) over every output position.

    The outer spatial dims test their input row once; along the last dim the
    in-range output columns form one interval, computed per tap, so the copy is a
    branch-free (vectorizable) loop between two zero fills.
    """
    lines, depth = [], "    "
    for sdim in range(nsp - 1):
        lines.append(
            f"{depth}for (int64_t o{sdim} = 0; o{sdim} < {outs[sdim]}; ++o{sdim}) {{"
            f" const int64_t y{sdim} = o{sdim} * {stride[sdim]} - {pad[sdim]} + "
            f"k{sdim} * {dil[sdim]}; const bool in{sdim} = y{sdim} >= 0 && "
            f"y{sdim} < {ins[sdim]};"
        )
        depth += "  "
    last = nsp - 1
    n_out, n_in, st = outs[last], ins[last], stride[last]
    base_out = pool_emit.row_major("o", outs, last)
    base_in = pool_emit.row_major("y", ins, last)
    inside = " && ".join(f"in{sdim}" for sdim in range(last)) or "true"
    lines += [
        f"{depth}{t}* d = dst + ({base_out});",
        f"{depth}const int64_t off = k{last} * {dil[last]} - {pad[last]};",
        *(depth + ln for ln in pool_emit.in_range_columns("off", n_in, n_out, st, inside)),
        f"{depth}const {t}* s = xc + ({base_in}) + off;",
        f"{depth}for (int64_t o = 0; o < lo; ++o) d[o] = ({t})0;",
        f"{depth}#pragma omp simd",
        f"{depth}for (int64_t o = lo; o < hi; ++o) d[o] = s[o * {st}];",
        f"{depth}for (int64_t o = hi; o < {n_out}; ++o) d[o] = ({t})0;",
    ]
    for _ in range(nsp - 1):
        depth = depth[:-2]
        lines.append(f"{depth}}}")
    return lines


def emit_conv(
    scope: KernelScope,
    root: Node,
    epilogue: list | None,
    fusion: Fusion | None = None,
    epilogue_rows: Callable[[], list] | None = None,
) -> list:
    """Float convolution as im2col + one BLAS GEMM per (batch entry, group).

    A 1x1 convolution with unit stride and no padding reads its input as the GEMM
    operand directly; otherwise the columns go to a per-thread scratch buffer.
    ``epilogue`` is the loop nest of the elementwise consumer over one image ``n``.
    The hand-written parts are ``Text`` (opaque to the passes); the epilogue stays
    a loop nest the passes see.
    """
    c = conv_geometry(scope, root)
    t, g = c.t, c.groups
    out: list = [text(f"if ({c.N} == 0 || {c.P} == 0) return 0;")]
    route = scope.sched.routes.get(id(root))  # oneDNN (routes.py), when linked
    if depthwise_emit.is_depthwise(c):
        if c.channels_last:
            return out + depthwise_emit.emit_depthwise_channels_last(c, epilogue)
        return out + depthwise_emit.emit_depthwise(c, epilogue)
    if c.channels_last:
        return out + _conv_channels_last(c, epilogue, route, fusion, epilogue_rows)
    if route is not None:
        out += _conv_dnnl(c, epilogue, route)
    batched = [text(*_conv_batched(c))]
    if epilogue is not None:
        batched.append(loop(For("n", "0", c.N), epilogue))
    batched.append(text("return 0;"))
    out.append(if_(f"{c.N} > 1 && {c.P} < {BATCHED_CONV_POSITIONS}", batched))
    if not c.direct:
        out.append(
            text(
                f"{t}* col = ({t}*)as_scratch((int64_t)sizeof({t}) * {c.ROWS} * {c.P});",
                "if (!col) return 3;",
            )
        )
    image = [f"const {t}* xg = (const {t}*){c.px} + (n * {c.C} + g * {c.CG}) * {c.Q};"]
    if c.direct:
        image.append(f"const {t}* B = xg;")
    else:
        image.append(f"#pragma omp parallel for schedule(static) if({c.ROWS} * {c.P} > 32768)")
        image.append(f"for (int64_t r = 0; r < {c.ROWS}; ++r) {{")
        image.append(f"  {t}* dst = col + r * {c.P};")
        image += [ln[2:] for ln in _im2col_tap(c)]
        image.append("}")
        image.append(f"const {t}* B = col;")
    image.append(
        f"as_conv_gemm<{t}>({c.OG}, {c.P}, {c.ROWS}, "
        f"(const {t}*){c.pw} + g * {c.OG} * {c.ROWS}, {c.ROWS}, B, {c.P}, "
        f"({t}*){c.po} + (n * {c.OC} + g * {c.OG}) * {c.P});"
    )
    per_group = [text(*image)]
    if epilogue is not None:  # this image's output, still in cache
        per_group.append(if_(f"g == {g} - 1", epilogue))
    out.append(loop([For("n", "0", c.N), For("g", "0", str(g))], per_group))
    return out
