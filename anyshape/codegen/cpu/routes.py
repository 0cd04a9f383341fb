"""Library routes: which kernels oneDNN runs, decided once per graph from the settings.

Sits in the CPU backend between planning (``anyshape/schedule``) and emission:
``plan_kernels`` runs the planner with the CPU's costs and adds the routes. The
backend's settings (``CpuSettings``, made from ``Options``) are read here and
nowhere else; the decision for each kernel root is stored in the plan
(``Schedule.routes``) and read by the emitters (``gemm_emit``, ``conv_emit``),
the host program (which oneDNN header to paste, which weights to pack) and
``explain()``. A route holds when the build links oneDNN: the emitted call sits
under ``#ifdef ANYSHAPE_DNNL``, next to the BLAS path an unlinked build runs, so
a translation unit the model cache kept builds either way (the cache key does
not see whether the oneDNN package is installed).

- oneDNN matmul: a float32 2-D dot whose right operand is a static 2-D model
  weight read untransposed on the left (a linear layer), the weight packed once.
  With ``dnnl_matmul="auto"`` each call checks whether the matmul beats the BLAS
  path at its row count on the ISA oneDNN runs (``as_matmul_pays`` in
  ``dnnl_matmul.h``, measured per ISA) and otherwise runs BLAS; ``"always"``
  runs every row count there, ``"off"`` keeps BLAS (a channels-last 1x1
  convolution's GEMM too).
- oneDNN convolution: a float32 2-D convolution without groups on a model
  weight (``passes.channels_last.onednn_convolution``), channels last, or
  channels first with a kernel over 1x1 (a 1x1 kernel channels first stays a
  GEMM on the activations in place: oneDNN's reorders cost more than it saves);
  ``dnnl_conv="all"`` sends those too, ``"off"`` keeps im2col + GEMM. A channels-
  last 1x1 convolution with unit stride and no padding runs as oneDNN's matmul
  over the batch's pixels (one GEMM per call), whose one primitive serves every
  batch and image size, where it beats the BLAS path at that row count (the linear layers' rule: with AVX2,
  ResNet-50's wide 1x1 layers at 144 pixels ran at 143-160 GFLOP/s through the
  matmul against 230-240 through OpenBLAS). With ``conv_post_ops``, a
  convolution whose epilogue oneDNN can run as post-ops (``post_ops.py``: batch
  norm, ReLU, a skip add) runs them there, and a 1x1 one runs on oneDNN's
  convolution one image at a time instead of the matmul: ResNet-50 restricted to
  AVX2 2x192 55.0 -> 54.1 ms, 4x160 82.4 -> 76.3, 4x224 152.9 -> 146.9 (AVX-512
  level to 1 % faster).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...config import Options
from ...ir.dtypes import DType
from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from ...passes.channels_last import onednn_convolution
from ...schedule.hooks import after_planning
from ...schedule.plan import Schedule, plan_schedule
from .costs import CPU_COSTS
from .post_ops import PostOps, post_ops


@dataclass(frozen=True)
class CpuSettings:
    """What ``Options`` says to the CPU backend's planning and emission."""

    dnnl_matmul: str = "auto"  # one of the option's choices (config.py)
    few_rows_gemm: bool = True  # up to 32 rows on the runtime's own GEMM (dnnl_matmul.h)
    dnnl_conv: str = "channels_last"  # one of the option's choices (config.py)
    conv_post_ops: bool = False  # convolution epilogues as oneDNN post-ops (post_ops.py)
    winograd: bool = True  # 3x3 convolutions by Winograd's F(4x4 or 2x2, 3x3) (winograd.h)

    @property
    def matmul_site_mode(self) -> int:
        """A matmul site's ``mode`` (dnnl_matmul.h): 1 every row count on oneDNN's matmul
        (``dnnl_matmul="always"``), 0 few rows on the runtime's own GEMM and more where the
        matmul wins, 2 the matmul where it wins (``few_rows_gemm=False``)."""
        return 1 if self.dnnl_matmul == "always" else 0 if self.few_rows_gemm else 2

    @staticmethod
    def from_options(options: Options) -> CpuSettings:
        return CpuSettings(
            dnnl_matmul=options.dnnl_matmul,
            few_rows_gemm=options.few_rows_gemm,
            dnnl_conv=options.dnnl_conv,
            conv_post_ops=options.conv_post_ops,
            winograd=options.winograd,
        )


@dataclass(frozen=True)
class Route:
    """A kernel oneDNN runs: the runtime header it calls into and the weight it packs."""

    header: str  # dnnl_matmul.h or dnnl_conv.h
    weight: Node
    as_matmul: bool = False  # a channels-last 1x1 convolution run as oneDNN's matmul
    post_ops: PostOps | None = None  # the convolution's epilogue as oneDNN post-ops
    site_mode: int = 0  # a matmul site's mode (CpuSettings.matmul_site_mode)
    winograd: bool = False  # a 3x3 convolution may run as_winograd_conv (conv_emit)

    @property
    def description(self) -> str:
        what = "oneDNN matmul" if self.header == "dnnl_matmul.h" else "oneDNN convolution"
        if self.header == "dnnl_matmul.h" and self.site_mode != 1:
            what += " where it wins"
            if self.site_mode == 0:
                what = "own GEMM up to 32 rows, " + what
        if self.post_ops:
            what += " with its epilogue as post-ops"
        if self.winograd:
            what = "Winograd F(4x4 or 2x2, 3x3) on its transformed weight, else " + what
        return f"{what}, weight {self.weight.attr('name')}"


def plan_kernels(graph, options: Options) -> Schedule:
    """The CPU backend's kernel plan for ``graph``: the planner with the CPU's costs,
    then the library routes; verified and dumped as the options say."""
    costs = replace(CPU_COSTS, attention_fusion=options.attention_fusion)
    sched = plan_schedule(graph, costs)
    sched.routes = plan_routes(sched, CpuSettings.from_options(options))
    return after_planning(sched, options)


def plan_routes(sched, settings: CpuSettings) -> dict[int, Route]:
    """Kernel root id -> its route, for the kernels of ``sched`` a library runs."""
    routes = {}
    for root in sched.kernels:
        route = _conv_route(sched, root, settings) or _matmul_route(sched, root, settings)
        if route is not None:
            routes[id(root)] = route
    return routes


def _conv_route(sched, root: Node, settings: CpuSettings) -> Route | None:
    if root.op != "convolution" or settings.dnnl_conv == "off":
        return None
    if not onednn_convolution(root):
        return None
    channels_last = root.attr("channels_last", False)
    if not (
        channels_last or settings.dnnl_conv == "all" or shape_numel(root.inputs[1].shape[2:]) != 1
    ):
        return None
    epilogue = sched.epilogues.get(id(root))
    fused = None
    if settings.conv_post_ops and epilogue is not None:
        fused = post_ops(sched, root, epilogue)  # (None for channels first)
    as_matmul = _runs_as_matmul(root) and fused is None
    if as_matmul and settings.dnnl_matmul == "off":
        return None  # (the BLAS GEMM of its pixels, as for a linear layer)
    header = "dnnl_matmul.h" if as_matmul else "dnnl_conv.h"
    mode = settings.matmul_site_mode
    winograd = settings.winograd and fused is None and _winograd_shape(root)
    return Route(header, root.inputs[1], as_matmul, fused, mode, winograd)


def _winograd_shape(root: Node) -> bool:
    """A channels-last 3x3 convolution with unit stride and dilation (conv_emit runs it by
    Winograd's minimal filtering where its channels are few enough and the weight is
    watched)."""
    return bool(
        root.attr("channels_last", False)
        and root.dtype == DType.f32
        and root.attr("groups", 1) == 1
        and tuple(root.inputs[1].shape[2:]) == (3, 3)
        and all(v == 1 for v in root.attr("stride"))
        and all(v == 1 for v in root.attr("dilation"))
    )


def _runs_as_matmul(root: Node) -> bool:
    w = root.inputs[1]
    return bool(
        root.attr("channels_last", False)
        and tuple(w.shape[2:]) == (1, 1)
        and all(v == 1 for v in root.attr("stride"))
        and not any(root.attr("padding"))
    )


def _matmul_route(sched, root: Node, settings: CpuSettings) -> Route | None:
    if (
        settings.dnnl_matmul == "off"
        or root.op != "dot"
        or root.dtype != DType.f32
        or root.rank != 2
    ):
        return None
    a = sched.transposed_operands.get(id(root.inputs[0]))
    w = sched.transposed_operands.get(id(root.inputs[1]), root.inputs[1])
    static = all(isinstance(d, int) and d > 0 for d in w.shape)
    if a is None and w.op == "param" and w.rank == 2 and static:
        return Route("dnnl_matmul.h", w, site_mode=settings.matmul_site_mode)
    return None
