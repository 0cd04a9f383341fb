"""Lowering rules for ATen's upsampling: nearest, nearest-exact, linear (1-3 D) and bicubic.

Part of the torch frontend's lowering table. ``F.interpolate`` exports as one
``upsample_*`` op (``.vec``: an output size or scale factors), lowered whole here,
so capture does not decompose it under symbolic sizes (``decomposition_table`` in
``capture.py``): torch's bicubic decomposition is 16 gathers and 34 clamps, and
tracing it was most of ViT-base/16's 5 s capture.

Each resized dim is a 1-D pass, last dim first, which adds the products in the
order eager's CPU kernels do (``formulas.py`` writes them as arithmetic): source
positions as a vector, with eager's formulas and dtypes (ATen's ``UpSample.h``,
``UpSampleKernel.cpp``: float32 for float32 and 16-bit data, float64 for
float64), neighbour indices clamped into the input and read with ``gather``,
the neighbours weighted and added. Eager picks nearest pixels two ways: 2-D
outputs of ``h + w <= 128`` take its fast path (float32 indices whatever the
data; a copy at the same size, a halving at twice it), everything else its
general one; the lowering selects between both per call, so nearest matches
eager exactly. (Eager also takes the fast path for channels-last inputs of more
than 3 channels, which give other pixels than the same values laid out
contiguously at odd scales; the lowering sees values, not layouts, and follows
the contiguous case.) Output sizes are torch's own (the node's metadata).
Eager refuses empty spatial dims, so each is guarded non-empty (a call that
fails it is captured again, and eager's error reaches the user). Integer data
interpolates only in the nearest modes (eager's uint8 bilinear kernel rounds
in fixed point); the antialiased ops have no rule and run in PyTorch with that
reason.
"""

from __future__ import annotations

import torch

from ....errors import UnsupportedError
from ....ir.dtypes import DType
from ...formulas import T, dim_value, iota, weighted_taps
from ..lowering import lowering

aten = torch.ops.aten
F32, F64, I64 = DType.f32, DType.f64, DType.i64
_CUBIC_A = -0.75  # eager's bicubic coefficient (``get_cubic_upsample_coefficients``)

# (op packet, interpolation, spatial dims): its ``.default`` and ``.vec`` are lowered here.
UPSAMPLE_OPS = (
    (aten.upsample_nearest1d, "nearest", 1),
    (aten.upsample_nearest2d, "nearest", 2),
    (aten.upsample_nearest3d, "nearest", 3),
    (aten._upsample_nearest_exact1d, "nearest_exact", 1),
    (aten._upsample_nearest_exact2d, "nearest_exact", 2),
    (aten._upsample_nearest_exact3d, "nearest_exact", 3),
    (aten.upsample_linear1d, "linear", 1),
    (aten.upsample_bilinear2d, "linear", 2),
    (aten.upsample_trilinear3d, "linear", 3),
    (aten.upsample_bicubic2d, "cubic", 2),
)


def _arguments(ctx, args: tuple, kwargs: dict) -> tuple:
    """The node's input, align_corners and one scale (or None) per spatial dim, read by
    name from the overload's schema (``.vec`` takes ``scale_factors``, the others one
    ``scales_*`` argument per dim)."""
    names = [a.name for a in ctx.node.target._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    x = bound.get("input", bound.get("self"))
    if "scale_factors" in names:
        scales = bound.get("scale_factors")
    else:
        scales = [bound.get(n) for n in names if n.startswith("scales")]
    return x, bool(bound.get("align_corners", False)), scales


def _register(packet, kind: str, spatial: int) -> None:
    def rule(ctx, *args, **kwargs):
        x, align, scales = _arguments(ctx, args, kwargs)
        return resample(ctx, x, kind, spatial, align, scales or [None] * spatial)

    lowering(packet.default, packet.vec)(rule)


for _packet, _kind, _spatial in UPSAMPLE_OPS:
    _register(_packet, _kind, _spatial)


def resample(ctx, x, kind: str, spatial: int, align: bool, scales) -> object:
    """``x`` resampled over its last ``spatial`` dims to the node's output sizes."""
    what = str(ctx.node.target)
    nearest = kind.startswith("nearest")
    if not nearest and not x.dtype.is_float:
        raise UnsupportedError(
            f"{what}: {x.dtype.name} data (eager's integer kernel rounds in fixed point)"
        )
    if len(scales) != spatial or x.rank != spatial + 2:
        raise UnsupportedError(f"{what}: input {x.type} with scales {scales}")
    out = ctx.out_type()
    acc = F64 if x.dtype == F64 else F32  # eager's opmath type
    fast = None  # eager's fast nearest path: 2-D outputs of h + w <= 128
    if nearest and spatial == 2:
        area = dim_value(ctx, out.shape[-2], I64) + dim_value(ctx, out.shape[-1], I64)
        fast = area <= 128
    y = x if nearest else ctx.cast(x, acc)
    for axis in reversed(range(2, x.rank)):  # (last first: eager's order of the sums)
        n_in, n_out = x.shape[axis], out.shape[axis]
        for d, which in ((n_in, "input"), (n_out, "output")):
            ctx.b.constraints.guard_le(1, d, f"{what}: {which} dim {axis} non-empty")
        scale = scales[axis - 2]
        if nearest:
            index = _nearest_index(ctx, n_in, n_out, scale, kind == "nearest_exact", acc, fast)
            y = weighted_taps(ctx, y, axis, [(index, None)])
        else:
            y = _weighted_axis(ctx, y, axis, n_in, n_out, scale, align, kind, acc)
    return y if nearest else ctx.cast(y, x.dtype)


def _scales_value(ctx, n_in, n_out, scale, dtype: DType) -> T:
    """Input positions per output position: ``1 / scale`` when the call gave one, else
    ``in / out`` (``compute_scales_value``)."""
    if scale is not None and scale > 0:
        return T(ctx, ctx.const(1.0 / scale, dtype))
    return dim_value(ctx, n_in, dtype) / dim_value(ctx, n_out, dtype)


def _nearest_index(ctx, n_in, n_out, scale, exact: bool, acc: DType, fast) -> T:
    """The input position each output position copies, as eager's kernel picks it: its
    general path (``HelperInterpNearest``, ``HelperInterpNearestExact``: positions in the
    data's opmath type, rounded to float32 and floored), or where ``fast`` holds its fast
    path (``nearest_idx``, ``nearest_neighbor_exact_compute_source_index``)."""
    dst = iota(ctx, (n_out,), 0, I64)
    last = dim_value(ctx, n_in, I64) - 1
    d = dst.to(acc)
    s = _scales_value(ctx, n_in, n_out, scale, acc)
    if exact:  # floor(real + 0.5), the half added in double
        real = s * (d + 0.5) - 0.5
        index = (real.to(F64) + 0.5).to(F32).un("floor").to(I64).min(last)
    else:
        index = (s * d).to(F32).un("floor").to(I64).min(last)
    if fast is None:
        return index
    s = _scales_value(ctx, n_in, n_out, scale, F32)  # (float32 whatever the data)
    if exact:  # (dst + 0.5) in double, times the float scale, rounded to float, floored
        quick = ((dst.to(F64) + 0.5) * s.to(F64)).to(F32).un("floor").to(I64).min(last)
    else:  # a copy at the same size, a shift at twice it
        quick = (dst.to(F32) * s).un("floor").to(I64).min(last)
        size_in, size_out = dim_value(ctx, n_in, I64), dim_value(ctx, n_out, I64)
        half = (dst.to(F64) * 0.5).un("floor").to(I64)
        quick = size_out.eq(size_in).where(dst, size_out.eq(size_in * 2).where(half, quick))
    return fast.where(quick, index)


def _weighted_axis(ctx, y, axis, n_in, n_out, scale, align: bool, kind: str, acc: DType):
    """A linear or bicubic pass: eager's source index, its floor clamped to the input
    and the fraction clamped to [0, 1] (``guard_index_and_lambda``), the weights."""
    dst = iota(ctx, (n_out,), 0, I64)
    last = dim_value(ctx, n_in, I64) - 1
    d = dst.to(acc)
    if align:  # ``area_pixel_compute_scale``: (in - 1) / (out - 1), 0 for one output
        size_out = dim_value(ctx, n_out, acc)
        s = (size_out > 1.0).where((dim_value(ctx, n_in, acc) - 1.0) / (size_out - 1.0), 0.0)
        real = s * d
    else:
        real = _scales_value(ctx, n_in, n_out, scale, acc) * (d + 0.5) - 0.5
        if kind == "linear":
            real = real.max(0.0)
    base = real.un("floor").to(I64).min(last)
    frac = (real - base.to(acc)).clamp(0.0, 1.0)
    if kind == "linear":
        # (``compute_source_index_and_lambda``: a copy at the same size)
        same = dim_value(ctx, n_out, I64).eq(dim_value(ctx, n_in, I64))
        base = same.where(dst, base)
        frac = same.where(0.0, frac)
        step = (base < last).where(1, 0, dtype=I64)
        taps = [(base, 1.0 - frac), (base + step, frac)]
    else:
        far = 1.0 - frac
        weights = [_cubic_far(frac + 1.0), _cubic_near(frac), _cubic_near(far),
                   _cubic_far(far + 1.0)]  # fmt: skip
        taps = [((base + (j - 1)).clamp(0, last), w) for j, w in enumerate(weights)]
    return weighted_taps(ctx, y, axis, taps)


# (``formulas.cubic_kernel`` is the same kernel; these keep eager's order of operations,
# so the weights round as eager's do)
def _cubic_near(x: T) -> T:
    """``cubic_convolution1``: the kernel at distance ``x`` in [0, 1], as eager writes it."""
    a = _CUBIC_A
    return ((x * (a + 2) - (a + 3)) * x) * x + 1.0


def _cubic_far(x: T) -> T:
    """``cubic_convolution2``: the kernel at distance ``x`` in [1, 2], as eager writes it."""
    a = _CUBIC_A
    return ((x * a - 5 * a) * x + 8 * a) * x - 4 * a
