"""A float convolution's geometry as the CPU emitters read it: C expressions for its
sizes and buffers, static ints for its window.

Sits under ``conv_emit`` (im2col + GEMM, oneDNN) and ``depthwise_emit`` (direct
loops), which both take a ``ConvGeometry`` made here from the kernel's scope.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from .ctypes_map import c_type
from .expr import KernelScope


@dataclass(frozen=True)
class ConvGeometry:
    """One float convolution's geometry, as C expressions and static ints."""

    t: str  # element C type
    kernel: list[int]
    stride: tuple
    pad: tuple
    dil: tuple
    groups: int
    og: int  # output channels per group
    cg: int  # input channels per group
    out_channels: int
    ksize: int  # taps per channel
    rows: int  # column-matrix rows per group: cg x taps
    px: str
    pw: str
    po: str
    N: str
    C: str
    P: str  # output positions per image
    Q: str  # input positions per image
    CG: str  # cg, og, out_channels and rows as the kernel reads them (a family's run-time
    OG: str  # integers when its scope generalizes, see families.py)
    OC: str
    ROWS: str
    ins: list[str]
    outs: list[str]
    channels_last: bool  # x [N, *spatial, C] and y [N, *spatial, O]

    @property
    def direct(self) -> bool:
        """A 1x1 convolution with unit stride and no padding reads its input as columns."""
        return self.ksize == 1 and all(v == 1 for v in self.stride) and not any(self.pad)


def conv_geometry(scope: KernelScope, root: Node) -> ConvGeometry:
    x, w = root.inputs
    kernel = [int(k) for k in w.shape[2:]]
    g = root.attr("groups")
    ksize = int(shape_numel(kernel))
    last = root.attr("channels_last", False)
    x_spatial, y_spatial = (
        (x.shape[1:-1], root.shape[1:-1]) if last else (x.shape[2:], root.shape[2:])
    )
    return ConvGeometry(
        t=c_type(root.dtype),
        kernel=kernel,
        stride=root.attr("stride"),
        pad=root.attr("padding"),
        dil=root.attr("dilation"),
        groups=g,
        og=w.shape[0] // g,
        cg=w.shape[1],
        out_channels=w.shape[0],
        ksize=ksize,
        rows=w.shape[1] * ksize,
        px=scope.ptr(x),
        pw=scope.ptr(w),
        po=scope.ptr(root),
        N=scope.dim(x.shape[0]),
        C=scope.dim(x.shape[-1 if last else 1]),
        P=scope.dim(shape_numel(y_spatial)),
        Q=scope.dim(shape_numel(x_spatial)),
        CG=scope.dim(w.shape[1]),
        OG=scope.dim(w.shape[0] // g),
        OC=scope.dim(w.shape[0]),
        ROWS=scope.dim(w.shape[1] * ksize),
        ins=[scope.dim(d) for d in x_spatial],
        outs=[scope.dim(d) for d in y_spatial],
        channels_last=last,
    )
