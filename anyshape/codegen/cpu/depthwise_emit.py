"""Depthwise convolutions (one input channel per group, any channel multiplier) as
direct loops.

Sits beside ``conv_emit``, whose ``emit_conv`` calls here for every float
depthwise convolution. im2col + GEMM ran one GEMM per channel, 1 output row by
kernel-size deep: at SegFormer-B0's 1024-channel 3x3 layers that was 1.3 ms a call
for 0.3 M multiply-adds.

- Channels last (``emit_depthwise_channels_last``, float32 2-D in plugin mode, where
  the layout pass converts them): each output pixel sums its taps over blocks of
  channels held in registers, every tap's input and weight read as contiguous
  vectors.
- Channels first (``emit_depthwise``: float64, artifacts, 1-D and 3-D): each output
  row accumulates one kernel tap at a time over the columns that tap keeps in range
  (one interval, ``pool_emit.in_range_columns``), a branch-free vector loop over a
  row that stays in L1.

Images run one after another, each image's work split over the threads, and each
image's epilogue runs right after it, its output still in cache.
"""

from __future__ import annotations

from math import prod

from . import pool_emit
from .conv_geometry import ConvGeometry
from .loop_ir import For, loop, text

# Below this many multiply-adds per image, one thread runs the image.
PARALLEL_WORK = 32768

# Output channels a channels-last pixel accumulates at once: four 64-byte vectors.
BLOCK_BYTES = 256


def is_depthwise(c: ConvGeometry) -> bool:
    """One input channel per group: every output channel reads one input plane."""
    return c.groups > 1 and c.cg == 1


def _rows(c: ConvGeometry) -> list[str]:
    """C accumulating output channel ``oc``'s plane ``yc`` from input plane ``xc``."""
    nsp, t = len(c.kernel), c.t
    last = nsp - 1
    lines, depth = [], "  "
    for s in range(last):  # outer output coordinates
        lines.append(f"{depth}for (int64_t o{s} = 0; o{s} < {c.outs[s]}; ++o{s}) {{")
        depth += "  "
    base_out = pool_emit.row_major("o", c.outs, last)
    lines += [
        f"{depth}{t}* d = yc + ({base_out});",
        f"{depth}for (int64_t o = 0; o < {c.outs[last]}; ++o) d[o] = ({t})0;",
    ]
    for s in range(last):  # outer taps, their input row tested once
        lines += [
            f"{depth}for (int64_t k{s} = 0; k{s} < {c.kernel[s]}; ++k{s}) {{",
            f"{depth}  const int64_t y{s} = o{s} * {c.stride[s]} - {c.pad[s]} + k{s} * {c.dil[s]};",
            f"{depth}  if (y{s} < 0 || y{s} >= {c.ins[s]}) continue;",
        ]
        depth += "  "
    tap = " + ".join([f"k{s} * {prod(c.kernel[s + 1 :])}" for s in range(last)] + [f"k{last}"])
    lines += [
        f"{depth}const {t}* s = xc + ({pool_emit.row_major('y', c.ins, last)});",
        f"{depth}for (int64_t k{last} = 0; k{last} < {c.kernel[last]}; ++k{last}) {{",
        f"{depth}  const {t} wv = wc[{tap}];",
        f"{depth}  const int64_t off = k{last} * {c.dil[last]} - {c.pad[last]};",
        *(
            f"{depth}  {ln}"
            for ln in pool_emit.in_range_columns("off", c.ins[last], c.outs[last], c.stride[last])
        ),
        f"{depth}  #pragma omp simd",
        f"{depth}  for (int64_t o = lo; o < hi; ++o) d[o] += wv * s[o * {c.stride[last]} + off];",
        f"{depth}}}",
    ]
    for _ in range(2 * last):
        depth = depth[:-2]
        lines.append(f"{depth}}}")
    return lines


def emit_depthwise(c: ConvGeometry, epilogue: list | None) -> list:
    """Image ``n``'s output channels split over the threads, then its epilogue."""
    t = c.t
    work = f"{c.OC} * {c.P} * {c.ksize}"
    image = [
        text(
            f"#pragma omp parallel for schedule(static) if({work} > {PARALLEL_WORK})",
            f"for (int64_t oc = 0; oc < {c.OC}; ++oc) {{",
            f"  const {t}* xc = (const {t}*){c.px} + (n * {c.C} + oc / {c.OG}) * {c.Q};",
            f"  {t}* yc = ({t}*){c.po} + (n * {c.OC} + oc) * {c.P};",
            f"  const {t}* wc = (const {t}*){c.pw} + oc * {c.ksize};",
            *_rows(c),
            "}",
        )
    ]
    if epilogue is not None:
        image += epilogue
    return [loop(For("n", "0", c.N), image), text("return 0;")]


def emit_depthwise_channels_last(c: ConvGeometry, epilogue: list | None) -> list:
    """[N, H, W, C] in, [N, OH, OW, OC] out: each output pixel sums its taps over a
    block of channels at a time, the block's sums in registers and each tap's input and
    weight read as contiguous vectors (the weights first copied tap-major). Image
    ``n``'s pixels split over the threads, then its epilogue."""
    t, (sh, sw), (ph, pw), (oh, ow) = c.t, c.stride, c.pad, c.outs
    oc, taps = c.out_channels, c.ksize
    width = BLOCK_BYTES // (4 if t == "float" else 8)
    head = text(
        f"{t}* wt = ({t}*)as_scratch((int64_t)sizeof({t}) * {oc * taps});",
        "if (!wt) return 3;",
        f"for (int64_t o = 0; o < {oc}; ++o) for (int64_t k = 0; k < {taps}; ++k)",
        f"  wt[k * {oc} + o] = ((const {t}*){c.pw})[o * {taps} + k];",
    )
    blocks = []
    if oc // width:
        blocks += [f"  for (int64_t ob = 0; ob < {oc // width * width}; ob += {width}) {{"]
        blocks += _pixel_block(c, width, "ob", "    ")
        blocks += ["  }"]
    if oc % width:
        blocks += ["  {", f"    const int64_t ob = {oc // width * width};"]
        blocks += _pixel_block(c, oc % width, "ob", "    ")
        blocks += ["  }"]
    image = [
        text(
            f"#pragma omp parallel for collapse(2) schedule(static) "
            f"if({c.P} * {oc * taps} > {PARALLEL_WORK})",
            f"for (int64_t y0 = 0; y0 < {oh}; ++y0) for (int64_t y1 = 0; y1 < {ow}; ++y1) {{",
            f"  const {t}* xn = (const {t}*){c.px} + n * {c.Q} * {c.C};",
            f"  {t}* yp = ({t}*){c.po} + ((n * {oh} + y0) * {ow} + y1) * {oc};",
            f"  const int64_t h0 = y0 * {sh} - {ph}, w0 = y1 * {sw} - {pw};",
            *blocks,
            "}",
        )
    ]
    if epilogue is not None:
        image += epilogue
    return [head, loop(For("n", "0", c.N), image), text("return 0;")]


def _pixel_block(c: ConvGeometry, width: int, ob: str, pad: str) -> list[str]:
    """C summing output channels ``ob .. ob + width`` of pixel ``yp`` over its taps."""
    t, (kh, kw), (dh, dw) = c.t, c.kernel, c.dil
    (h, w) = c.ins
    x_at = "xp[j]" if c.og == 1 else f"xp[(ob + j) / {c.og}]"
    x_row = f"xn + (ih * {w} + iw) * {c.C} + {ob}" if c.og == 1 else f"xn + (ih * {w} + iw) * {c.C}"
    return [
        f"{pad}{t} acc[{width}] = {{}};",
        f"{pad}for (int64_t k0 = 0; k0 < {kh}; ++k0) {{",
        f"{pad}  const int64_t ih = h0 + k0 * {dh};",
        f"{pad}  if (ih < 0 || ih >= {h}) continue;",
        f"{pad}  for (int64_t k1 = 0; k1 < {kw}; ++k1) {{",
        f"{pad}    const int64_t iw = w0 + k1 * {dw};",
        f"{pad}    if (iw < 0 || iw >= {w}) continue;",
        f"{pad}    const {t}* xp = {x_row};",
        f"{pad}    const {t}* wp = wt + (k0 * {kw} + k1) * {c.out_channels} + {ob};",
        f"{pad}    #pragma omp simd",
        f"{pad}    for (int64_t j = 0; j < {width}; ++j) acc[j] += wp[j] * {x_at};",
        f"{pad}  }}",
        f"{pad}}}",
        f"{pad}for (int64_t j = 0; j < {width}; ++j) yp[{ob} + j] = acc[j];",
    ]
