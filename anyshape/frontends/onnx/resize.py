"""ONNX resizing, padding and space rearrangement: Resize, Upsample, Pad, GridSample...

One family of the ONNX frontend's rule table (``rules.py`` gathers it): Resize
(opsets 10-19), Upsample (7, 9), Pad, CenterCropPad, DepthToSpace, SpaceToDepth,
Col2Im, AffineGrid, GridSample and LpPool. Nothing loops: source positions are
computed as tensors (``iota`` -> formulas over ``T`` from ``frontends/formulas.py``
-> ``convert``), clamped and read with ``gather``/``take_along_axis``;
interpolations weight-combine the gathered neighbours. Resize is separable (a
1-D pass per axis), coordinates in f64 as ONNX's reference, data in f32 for
16-bit floats and integers (rounded and saturated back); output dims
``floor(in * scale)`` use the scale's exact binary fraction, so they stay
symbolic, and sizes may be symbolic dims. Pad amounts are static ints:
constant mode is the IR ``pad``, edge/reflect/wrap gather indices.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import as_dim, as_expr, floordiv, shape_numel
from ..formulas import T, along, cubic_kernel, dim_value, iota, weighted_taps
from .context import Value, norm_axis, rule_registry
from .nn_ops import _ints, _padding, _pool_size, acc_dtype
from .shape_ops import slice_dim

RULES, rule = rule_registry()
F64, I64 = DType.f64, DType.i64


def _acc(dtype: DType) -> DType:
    return acc_dtype(dtype) if dtype.is_float else DType.f32


def _to_dtype(ctx, y: Node, dtype: DType) -> Node:
    """Back to the input's dtype: integers rounded and saturated, as ONNX's reference."""
    if dtype.is_float or dtype.is_bool:
        return ctx.cast(y, dtype)
    info = np.iinfo(dtype.to_numpy())
    return T(ctx, y).un("round").clamp(float(info.min), float(info.max)).to(dtype).n


# --- Resize and Upsample ------------------------------------------------------------------------


# nearest_mode -> (shift, rounding): the input position read is rounding(x + shift)
_NEAREST = {"round_prefer_floor": (-0.5, "ceil"), "round_prefer_ceil": (0.5, "floor")}


class _Interp:
    """One Resize node's interpolation settings (``legacy``: opset 10 and Upsample)."""

    def __init__(self, node, legacy: bool):
        self.mode = {"bilinear": "linear"}.get(node.attr("mode"), node.attr("mode", "nearest"))
        self.coord = node.attr("coordinate_transformation_mode", "half_pixel")
        self.nearest = node.attr("nearest_mode", "round_prefer_floor")
        if legacy:  # onnxruntime's reading: asymmetric, ceil when shrinking else floor
            self.coord, self.nearest = "asymmetric", "simple"
        self.a = float(node.attr("cubic_coeff_a", -0.75))
        self.exclude = bool(node.attr("exclude_outside", 0))
        self.extrapolation = float(node.attr("extrapolation_value", 0.0))
        self.antialias = bool(node.attr("antialias", 0)) and self.mode != "nearest"
        modes = ("nearest", "linear", "cubic")
        if self.mode not in modes or self.nearest not in (*_NEAREST, "floor", "ceil", "simple"):
            raise UnsupportedError(f"{node.describe()}: mode {self.mode} ({self.nearest})")


def _source_coords(ctx, n_in, n_out, scale, roi, coord: str):
    """Each output position's coordinate in the input (f64), and where it is outside."""
    y = iota(ctx, (n_out,), 0, F64)
    fin, fout = dim_value(ctx, n_in, F64), dim_value(ctx, n_out, F64)
    s = T(ctx, ctx.const(scale, F64)) if scale is not None else fout / fin
    width = s * fin  # the output length before flooring
    half = (y + 0.5) / s - 0.5
    single = fout <= 1.0
    if coord == "half_pixel":
        return half, None
    if coord == "asymmetric":
        return y / s, None
    if coord == "tf_half_pixel_for_nn":
        return (y + 0.5) / s, None
    if coord == "pytorch_half_pixel":
        return single.where(0.0, half), None
    if coord == "half_pixel_symmetric":
        return half + fin / 2.0 * (1.0 - fout / width), None
    span = fin - 1.0
    step = span / (width - 1.0)
    if coord == "align_corners":
        return single.where(0.0, y * step), None
    if coord != "tf_crop_and_resize":
        raise UnsupportedError(f"coordinate_transformation_mode {coord!r}")
    r0, r1 = roi
    x = single.where(span * (0.5 * (r0 + r1)), y * (step * (r1 - r0)) + span * r0)
    return x, (x < 0.0) | (x > span)


def _resize_axis(ctx, x: Node, axis: int, n_out, scale, roi, cfg: _Interp, what: str) -> Node:
    """One separable 1-D resize pass of ``x`` along ``axis``."""
    x_ori, outside = _source_coords(ctx, x.shape[axis], n_out, scale, roi, cfg.coord)
    last = dim_value(ctx, x.shape[axis], I64) - 1
    if cfg.mode == "nearest":
        how = cfg.nearest
        if how == "simple":  # ceil when shrinking, else floor
            how = "ceil" if scale is not None and scale < 1 else "floor"
        shift, rounding = _NEAREST.get(how, (0.0, how))
        taps, weights = [(x_ori + shift).un(rounding).to(I64).clamp(0, last)], [None]
    else:
        taps, weights = _weights(x_ori, scale, last, cfg, what)
    y = weighted_taps(ctx, x, axis, zip(taps, weights))
    if outside is not None:
        fill = ctx.full(cfg.extrapolation, y.shape, y.dtype)
        y = ctx.op("select", along(ctx, outside.n, y.shape, axis), fill, y)
    return y


def _weights(x_ori: T, scale, last: T, cfg, what) -> tuple[list[T], list[T]]:
    """Linear or cubic (optionally antialiased) neighbours of ``x_ori`` and their weights."""
    stretch = 1.0
    if cfg.antialias:
        if scale is None:
            raise UnsupportedError(f"{what}: antialias with a symbolic scale (its window width)")
        stretch = min(scale, 1.0)
    radius = 1 if cfg.mode == "linear" else 2
    start = math.floor(-radius / stretch) + 1
    base = x_ori.un("floor")
    ratio = x_ori - base
    base = base.to(I64)
    taps, weights = [], []
    for off in range(start, 2 - start):
        t = (ratio - float(off)).un("abs") * stretch
        w = (1.0 - t).max(0.0) if radius == 1 else cubic_kernel(t, cfg.a)
        i = base + off
        if cfg.exclude:
            w = ((i >= 0) & (i <= last)).where(w, 0.0)
        taps.append(i.clamp(0, last))
        weights.append(w)
    if cfg.antialias or cfg.exclude:
        total = sum(weights[1:], weights[0])
        total = total.eq(0.0).where(1.0, total)
        weights = [w / total for w in weights]
    return taps, weights


def _scaled(d, scale: float):
    """``floor(d * scale)`` exactly (the scale's binary fraction), symbolic-safe."""
    f = Fraction(scale)
    return as_dim(floordiv(as_expr(d) * f.numerator, f.denominator))


def _floats(ctx, v: Value | None, what: str) -> list[float] | None:
    arr = None if v is None else ctx.const_of(v, what).reshape(-1)
    return [float(s) for s in arr] if arr is not None and arr.size else None


def _resize_plan(ctx, node, x: Node, scales, sizes, axes, roi):
    """Per resized axis: (axis, output dim, scale or None if only known at run time, roi)."""
    what, n = node.describe(), len(axes)
    roi = roi if roi and len(roi) == 2 * n else [0.0] * n + [1.0] * n
    dims = [as_dim(x.shape[a]) for a in axes]
    if scales is not None:
        outs = [_scaled(d, s) for d, s in zip(dims, scales)]
    elif sizes is not None:
        outs = [as_dim(s) for s in sizes]
        scales = [o / d if {type(o), type(d)} == {int} and d else None for d, o in zip(dims, outs)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if None in scales:
                raise UnsupportedError(f"{what}: keep_aspect_ratio_policy on symbolic sizes")
            s = (min if policy == "not_larger" else max)(scales)
            outs, scales = [int(s * d + 0.5) for d in dims], [s] * n
        eq = ctx.b.constraints.prove_eq
        scales = [1.0 if eq(d, o) else s for d, o, s in zip(dims, outs, scales)]
    if scales is None or len(scales) != n or len(outs) != n:
        raise UnsupportedError(f"{what}: scales or sizes for {n} axes expected")
    return list(zip(axes, outs, scales, roi[:n], roi[n:]))


def resize(ctx, x: Node, plan, cfg: _Interp, what: str) -> Node:
    """``x`` resized along each planned axis in turn (identity axes skipped)."""
    y = x if cfg.mode == "nearest" else ctx.cast(x, _acc(x.dtype))
    for axis, n_out, scale, r0, r1 in plan:
        trivial = cfg.coord != "tf_crop_and_resize" or (r0, r1) == (0.0, 1.0)
        if scale == 1.0 and trivial and ctx.b.constraints.prove_eq(n_out, y.shape[axis]):
            continue
        y = _resize_axis(ctx, y, axis, n_out, scale, (r0, r1), cfg, what)
    return y if cfg.mode == "nearest" else _to_dtype(ctx, y, x.dtype)


@rule("Upsample", first=7, last=9)
@rule("Resize", first=10)
def _resize(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    arg = [*ins, None, None, None][:4]
    cfg = _Interp(node, legacy=node.opset < 11)
    roi, sizes = None, None
    if node.opset < 9:  # Upsample-7: scales as an attribute
        scales = [float(s) for s in node.attr("scales")]
    elif node.opset < 11:
        scales = _floats(ctx, arg[1], f"{what}: scales")
    else:
        if cfg.coord == "tf_crop_and_resize":
            roi = _floats(ctx, arg[1], f"{what}: roi")
        scales = _floats(ctx, arg[2], f"{what}: scales")
        if scales is None and arg[3] is not None:
            sizes = ctx.known_of(arg[3], f"{what}: sizes")
    axes = node.attr("axes") if node.opset >= 18 else None
    axes = [norm_axis(a, x.rank, what) for a in axes] if axes else list(range(x.rank))
    plan = _resize_plan(ctx, node, x, scales, sizes, axes, roi)
    return [Value.of_node(resize(ctx, x, plan, cfg, what))]


# --- padding and cropping --------------------------------------------------------------------------


def _pad_index(ctx, n, low: int, out, mode: str) -> T:
    """For each position of a padded axis, the input position it copies (edge/reflect/wrap)."""
    j = iota(ctx, (out,), 0, I64) - low
    size = dim_value(ctx, n, I64)
    if mode == "edge":
        return j.clamp(0, size - 1)
    if mode == "wrap":
        return (j % size + size) % size
    if mode != "reflect":
        raise UnsupportedError(f"pad mode {mode!r}")
    period = ((size - 1) * 2).max(1)
    m = (j % period + period) % period
    return (m < size).where(m, period - m)


def pad(ctx, x: Node, low, high, mode: str, value: Node | None) -> Node:
    """``x`` padded by ``low``/``high`` (ints; negative crops) in an ONNX Pad mode."""
    if mode == "constant":
        fill = ctx.const(0, x.dtype) if value is None else ctx.reshape(ctx.cast(value, x.dtype), ())
        return ctx.op("pad", x, fill, low=tuple(low), high=tuple(high))
    for a, (lo, hi) in enumerate(zip(low, high)):
        if lo < 0 or hi < 0:
            x = slice_dim(ctx, x, a, max(-lo, 0), as_dim(as_expr(x.shape[a]) + min(hi, 0)))
        lo, hi = max(lo, 0), max(hi, 0)
        if lo or hi:
            out = as_dim(as_expr(x.shape[a]) + lo + hi)
            x = ctx.op("gather", x, _pad_index(ctx, x.shape[a], lo, out, mode).n, axis=a)
    return x


@rule("Pad", first=2)
def _pad(ctx, node, ins):
    xv = ins[0]
    what = node.describe()
    mode = node.attr("mode", "constant")
    arg = [*ins, None, None, None][:4]
    if node.opset < 11:
        pads, value_v = list(node.attr("pads")), Value.of_const(np.array(node.attr("value", 0.0)))
    else:
        pads, value_v = list(ctx.known_of(arg[1], f"{what}: pads")), arg[2]
    axes = range(xv.rank)
    if node.opset >= 18 and arg[3] is not None:
        axes = ctx.const_of(arg[3], f"{what}: axes").reshape(-1)
        axes = [norm_axis(int(a), xv.rank, what) for a in axes]
    if not all(isinstance(as_dim(p), int) for p in pads) or len(pads) != 2 * len(axes):
        raise UnsupportedError(f"{what}: pads must be {2 * len(axes)} constant ints, got {pads}")
    low, high = [0] * xv.rank, [0] * xv.rank
    for k, a in enumerate(axes):
        low[a], high[a] = int(pads[k]), int(pads[len(axes) + k])
    if mode != "constant" and any(isinstance(d, int) and d == 0 for d in xv.shape):
        raise UnsupportedError(f"{what}: {mode} padding of an empty dim")
    fill = 0 if value_v is None else value_v.const
    if xv.const is not None and min(low + high, default=0) >= 0 and fill is not None:
        kw = {"constant_values": np.reshape(fill, -1)[0]} if mode == "constant" else {}
        return [Value.of_const(np.pad(xv.const, list(zip(low, high)), mode=mode, **kw))]
    value = None if value_v is None else ctx.node(value_v)
    return [Value.of_node(pad(ctx, ctx.node(xv), low, high, mode, value))]


@rule("CenterCropPad", first=18)
def _center_crop_pad(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    shape = ctx.known_of(ins[1], f"{what}: shape")
    axes = node.attr("axes") or range(x.rank)
    for a, want in zip((norm_axis(a, x.rank, what) for a in axes), shape):
        d, want = as_dim(x.shape[a]), as_dim(want)
        if ctx.b.constraints.prove_eq(d, want):
            continue
        if isinstance(d, int) and isinstance(want, int):
            lo = (d - want) // 2 if want < d else -((want - d) // 2)
            low, high = [0] * x.rank, [0] * x.rank
            low[a], high[a] = -lo, want - d + lo
            x = ctx.op("pad", x, ctx.const(0, x.dtype), low=tuple(low), high=tuple(high))
            continue
        # Crop or pad is only known at run time: read x at j + trunc((d - want) / 2).
        size = dim_value(ctx, d, I64)
        src = iota(ctx, (want,), 0, I64) + (size - dim_value(ctx, want, I64)) / 2
        g = ctx.op("gather", x, src.clamp(0, size - 1).n, axis=a)
        inside = along(ctx, ((src >= 0) & (src < size)).n, g.shape, a)
        x = ctx.op("select", inside, g, ctx.full(0, g.shape, g.dtype))
    return [Value.of_node(x)]


# --- space rearrangement ---------------------------------------------------------------------------


@rule("DepthToSpace", "SpaceToDepth", first=1)
def _depth_space(ctx, node, ins):
    x = ctx.node(ins[0])
    if x.rank != 4:
        raise UnsupportedError(f"{node.describe()}: input of rank {x.rank} (4 expected)")
    b = int(node.attr("blocksize"))
    dcr = node.attr("mode", "DCR") == "DCR"
    n, c, h, w = (as_expr(d) for d in x.shape)
    if node.op_type == "DepthToSpace":
        cb = floordiv(c, b * b)
        tmp = (n, b, b, cb, h, w) if dcr else (n, cb, b, b, h, w)
        perm = (0, 3, 4, 1, 5, 2) if dcr else (0, 1, 4, 2, 5, 3)
        out = (n, cb, h * b, w * b)
    else:
        hb, wb = floordiv(h, b), floordiv(w, b)
        tmp = (n, c, hb, b, wb, b)
        perm = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
        out = (n, c * (b * b), hb, wb)
    y = ctx.transpose(ctx.reshape(x, [as_dim(d) for d in tmp]), perm)
    return [Value.of_node(ctx.reshape(y, [as_dim(d) for d in out]))]


@rule("Col2Im", first=18)
def _col2im(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    image = [as_dim(d) for d in ctx.known_of(ins[1], f"{what}: image_shape")]
    block = [int(k) for k in ctx.const_of(ins[2], f"{what}: block_shape").reshape(-1)]
    nd = len(image)
    stride, dil = _ints(node.attr("strides"), nd, 1), _ints(node.attr("dilations"), nd, 1)
    pads = _ints(node.attr("pads"), 2 * nd, 0)
    n, ck, length = x.shape
    c = as_dim(floordiv(as_expr(ck), math.prod(block)))
    reach = [dil[i] * (block[i] - 1) + 1 - pads[i] - pads[nd + i] for i in range(nd)]
    blocks = [as_dim(floordiv(as_expr(d) - r, st) + 1) for d, r, st in zip(image, reach, stride)]
    ctx.b.constraints.guard_eq(length, shape_numel(blocks), f"{what}: number of blocks")
    cols = ctx.reshape(ctx.cast(x, acc_dtype(x.dtype)), (n, c, math.prod(block), length))
    out_shape, ones, total = (n, c, *image), (1, 1, 1, 1), None
    for k, offs in enumerate(itertools.product(*[range(b) for b in block])):
        lin, ok = None, None  # the column each image position reads at this kernel offset
        for i in range(nd):
            t = iota(ctx, image, i, I64) + (pads[i] - offs[i] * dil[i])
            q, nb = t / stride[i], dim_value(ctx, blocks[i], I64)
            good = (t >= 0) & (q < nb)
            if stride[i] > 1:
                good = good & (t % stride[i]).eq(0)
            q = q.clamp(0, nb - 1)
            lin, ok = (q, good) if lin is None else (lin * nb + q, ok & good)
        plane = ctx.op("slice", cols, start=(0, 0, k, 0), limit=(n, c, k + 1, length), stride=ones)
        g = ctx.op("gather", ctx.reshape(plane, (n, c, length)), lin.n, axis=2)
        mask = ctx.op("broadcast_in_dim", ok.n, shape=out_shape, dims=tuple(range(2, 2 + nd)))
        g = ctx.op("select", mask, g, ctx.full(0, out_shape, g.dtype))
        total = g if total is None else ctx.op("add", total, g)
    return [Value.of_node(ctx.cast(total, x.dtype))]


# --- sampling grids ------------------------------------------------------------------------------


@rule("AffineGrid", first=20)
def _affine_grid(ctx, node, ins):
    theta = ctx.node(ins[0])
    what = node.describe()
    size = [as_dim(d) for d in ctx.known_of(ins[1], f"{what}: size")]
    spatial = tuple(size[2:])
    nd = len(spatial)
    if nd not in (2, 3) or theta.rank != 3:
        raise UnsupportedError(f"{what}: size of length {len(size)} (4 or 5 expected)")
    n, align = theta.shape[0], node.attr("align_corners", 0)
    full = (n, *spatial)
    base = []  # normalized coordinates along W, H (, D): the homogeneous grid's x, y (, z)
    for axis in reversed(range(nd)):
        j, s = iota(ctx, spatial, axis, F64), dim_value(ctx, spatial[axis], F64)
        v = j * 2.0 / (s - 1.0).max(1.0) - 1.0 if align else (j * 2.0 + 1.0) / s - 1.0
        v = (s > 1.0).where(v, 0.0)  # a lone position sits at 0, as in torch and onnxruntime
        base.append(ctx.op("broadcast_in_dim", v.n, shape=full, dims=tuple(range(1, nd + 1))))
    th = ctx.cast(theta, F64)

    def coef(i, j):
        v = ctx.op("slice", th, start=(0, i, j), limit=(n, i + 1, j + 1), stride=(1, 1, 1))
        return ctx.op("broadcast_in_dim", ctx.reshape(v, (n,)), shape=full, dims=(0,))

    outs = []
    for i in range(nd):
        acc = coef(i, nd)
        for j in range(nd):
            acc = ctx.op("add", acc, ctx.op("mul", coef(i, j), base[j]))
        outs.append(ctx.reshape(acc, (*full, 1)))
    return [Value.of_node(ctx.cast(ctx.op("concatenate", *outs, axis=nd + 1), theta.dtype))]


def _reflect(c: T, lo: T, hi: T) -> T:
    """GridSample's reflection of the coordinates outside [lo, hi] back into it."""
    span = hi - lo
    pos = span > 0.0
    safe = pos.where(span, 1.0)
    below = c < lo
    dx = below.where(lo - c, c - hi)
    k = (dx / safe).un("floor")
    r = dx - k * safe
    near, far = below.where(lo + r, hi - r), below.where(hi - r, lo + r)
    y = pos.where((k % 2.0).ne(0.0).where(far, near), lo)
    return (below | (c > hi)).where(y, c)


def _grid_taps(ctx, c: T, d, mode: str, padding: str, align: bool):
    """For one spatial dim: (index, weight or None, in-range mask or None) per neighbour."""
    size = dim_value(ctx, d, c.n.dtype)
    edge = 0.0 if align else 0.5  # the borders: [0, d - 1] or [-0.5, d - 0.5]
    c = (c + 1.0) / 2.0 * (size - 1.0) if align else ((c + 1.0) * size - 1.0) / 2.0
    lo, hi = T(ctx, ctx.const(-edge, size.n.dtype)), size - (1.0 - edge)
    if mode == "nearest":
        c = c.un("round")
    if padding == "border":
        c = ((c < lo) | (c > hi)).where(c.clamp(0.0, size - 1.0), c)
    elif padding == "reflection":
        c = _reflect(c, lo, hi)
    if mode == "nearest":
        base, taps = c.un("trunc"), [(0, None)]
    else:
        base = c.un("floor")
        f = c - base
        if mode == "linear":
            taps = [(0, 1.0 - f), (1, f)]
        else:
            taps = [(o, cubic_kernel((f - float(o)).un("abs"), -0.75)) for o in (-1, 0, 1, 2)]
    last = dim_value(ctx, d, I64) - 1
    out = []
    for off, w in taps:
        i, inside = base + float(off), None
        if padding == "zeros":
            inside = (i >= 0.0) & (i < size)
        elif padding == "reflection":
            i = _reflect(i, lo, hi).un("trunc")
        out.append((i.to(I64).clamp(0, last), w, inside))
    return out


@rule("GridSample", first=16)
def _grid_sample(ctx, node, ins):
    x, grid = ctx.node(ins[0]), ctx.node(ins[1])
    what = node.describe()
    mode = node.attr("mode", "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = node.attr("padding_mode", "zeros")
    nd = x.rank - 2
    if nd < 1 or grid.rank != x.rank or grid.shape[-1] != nd:
        raise UnsupportedError(f"{what}: input {x.type} with grid {grid.type}")
    modes, paddings = ("nearest", "linear", "cubic"), ("zeros", "border", "reflection")
    if mode not in modes or padding not in paddings:
        raise UnsupportedError(f"{what}: mode {mode!r} with padding_mode {padding!r}")
    acc, align = _acc(x.dtype), bool(node.attr("align_corners", 0))
    n, c = x.shape[:2]
    spatial, out_sp = x.shape[2:], grid.shape[1:-1]
    q = shape_numel(out_sp)
    g = ctx.reshape(ctx.cast(grid, acc), (n, q, nd))
    per_dim = []
    for i in range(nd):  # the grid lists coordinates innermost dim first (x, y, z)
        gi = ctx.op("slice", g, start=(0, 0, nd - 1 - i), limit=(n, q, nd - i), stride=(1, 1, 1))
        gi = T(ctx, ctx.reshape(gi, (n, q)))
        per_dim.append(_grid_taps(ctx, gi, spatial[i], mode, padding, align))
    data = ctx.reshape(ctx.cast(x, acc), (n, c, shape_numel(spatial)))
    spread = {"shape": (n, c, q), "dims": (0, 2)}
    total = None
    for combo in itertools.product(*per_dim):
        lin, w, ok = None, None, None
        for i, (idx, wi, inside) in enumerate(combo):
            lin = idx if lin is None else lin * dim_value(ctx, spatial[i], I64) + idx
            if wi is not None:
                w = wi if w is None else w * wi
            if inside is not None:
                ok = inside if ok is None else ok & inside
        term = ctx.op("take_along_axis", data, ctx.op("broadcast_in_dim", lin.n, **spread), axis=2)
        if w is not None:
            term = ctx.op("mul", term, ctx.op("broadcast_in_dim", w.n, **spread))
        if ok is not None:
            mask = ctx.op("broadcast_in_dim", ok.n, **spread)
            term = ctx.op("select", mask, term, ctx.full(0, term.shape, acc))
        total = term if total is None else ctx.op("add", total, term)
    return [Value.of_node(_to_dtype(ctx, ctx.reshape(total, (n, c, *out_sp)), x.dtype))]


# --- LpPool ----------------------------------------------------------------------------------------


@rule("LpPool", first=2)
def _lp_pool(ctx, node, ins):
    x = ctx.node(ins[0])
    what = node.describe()
    k = tuple(int(i) for i in node.attr("kernel_shape"))
    nsp = len(k)
    s, d = _ints(node.attr("strides"), nsp, 1), _ints(node.attr("dilations"), nsp, 1)
    p = float(node.attr("p", 2))
    sizes = x.shape[x.rank - nsp :]
    low, high = _padding(node, sizes, k, s, d, what)
    if int(node.attr("ceil_mode", 0)):
        for i, size in enumerate(sizes):
            floor_out = (as_dim(size) + low[i] + high[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1
            if _pool_size(size, k[i], s[i], d[i], low[i], high[i], True) != floor_out:
                raise UnsupportedError(f"{what}: ceil_mode with a partial window")
    xa = T(ctx, ctx.cast(x, acc_dtype(x.dtype))).un("abs")
    powed = (xa if p == 1 else xa * xa if p == 2 else xa.pow(p)).n
    lead = (0,) * (x.rank - nsp)
    if any(low) or any(high):
        zero = ctx.const(0, powed.dtype)
        powed = ctx.op("pad", powed, zero, low=lead + tuple(low), high=lead + tuple(high))
    attrs = {"kernel": k, "stride": s, "padding": (0,) * nsp, "dilation": d}
    pooled = ctx.op("pool", powed, kind="avg", count_include_pad=True, **attrs)
    total = T(ctx, pooled) * float(math.prod(k))
    y = total if p == 1 else total.un("sqrt") if p == 2 else total.pow(1.0 / p)
    return [Value.of_node(ctx.cast(y.n, x.dtype))]
