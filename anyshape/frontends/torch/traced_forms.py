"""Ops traced in another form while a model is captured, and put back after.

Part of capture (``capture.py``), around ``torch.export``:

- ``max_pool1d_as_2d``: ``F.max_pool1d`` traced as a 2-D pool, whose shape function
  keeps the length symbolic (the 1-D one reads it as a number).
- ``opaque_batch_norm``: eval-mode ``F.batch_norm`` traced as one opaque op whose
  output is shaped like its input. torch traces ``aten.batch_norm`` by running its
  composite implementation on fake tensors, and on a ResNet's symbolic image sizes
  (conv and pool arithmetic) that costs about 20 ms a call: half of ResNet-50's
  capture. After the export ``restore_traced_forms`` makes each such node the
  ``aten.batch_norm`` torch would have recorded, with the same arguments.
- ``opaque_relu``: ``F.relu`` (not in place) traced as one opaque op shaped like its
  input. torch traces ``aten.relu`` through its Python reference (``where(x <= 0, 0,
  x)``: broadcasting and stride checks in sympy), about 9 ms a call on ResNet-50's
  image sizes against under 1 ms; restored to ``aten.relu`` the same way.
- ``opaque_linear``: ``F.linear`` traced as one opaque op shaped ``[..., out]``.
  torch traces ``aten.linear`` through its composite (a transpose and a ``matmul``
  whose Python decomposition folds and unfolds the batch dims in sympy). Restored to
  ``aten.linear``.
- ``opaque_dropout``: eval-mode ``F.dropout`` (which returns its input) traced as one
  opaque op shaped like its input, where torch's trace clones it through the Python
  reference; restored to ``aten.dropout(x, p, False)``. With the linear form: T5-small's
  capture (32 linear layers and 18 dropouts traced) 1.12 -> 1.04 s, BERT-base's
  0.56 -> 0.53 s (AVX-512 Zen 5).

- ``opaque_upsample``: ``F.interpolate`` of a 4-D input to a given size, nearest,
  bilinear or bicubic, as one opaque op shaped ``[N, C, *size]``. torch traces the
  bicubic (and bilinear) kernels through their Python decompositions at the autograd
  key, 16 gathers and 34 clamps under symbolic sizes, though the graph keeps the op
  whole: ViT's position-embedding interpolation was about 0.4 s of its 0.9 s capture.
  The fake keeps torch's checks (sizes over 0: the same guards). Restored to the
  ``.vec`` op torch records.
- ``opaque_ops.py``: layer norm, GELU and pixel (un)shuffle, the same way.

``F.linear`` is C++, so the swapped function follows the protocol of torch's Python
functions (``handle_torch_function`` while export's function modes are on): the modes
call it again with themselves off, and it records the opaque op then.

The opaque ops' outputs are dense row-major tensors of the input's shape: anyshape
lowers values, not strides, and a view torch traces on such an output is one eager
allows on the contiguous tensors a model passes.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .opaque_ops import OPAQUE_FORMS, OPAQUE_RESTORE
from .swaps import PLAIN_TENSORS as _PLAIN_TENSORS
from .swaps import on_capturing_thread, swapped, traced_here

__all__ = [
    "max_pool1d_as_2d",
    "opaque_batch_norm",
    "opaque_dropout",
    "opaque_linear",
    "opaque_relu",
    "opaque_upsample",
    "restore_traced_forms",
    "traced_forms",
]


@torch.library.custom_op("anyshape::batch_norm_eval", mutates_args=())
def batch_norm_eval(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    momentum: float,
    eps: float,
    cudnn: bool,
) -> torch.Tensor:
    return torch.batch_norm(x, weight, bias, mean, var, False, momentum, eps, cudnn)


@batch_norm_eval.register_fake
def _(x, weight, bias, mean, var, momentum, eps, cudnn):
    # (what torch's own checks say of a wrong channel count, without its composite)
    torch._check(x.dim() >= 2, lambda: f"batch_norm: input of rank {x.dim()}")
    for t in (weight, bias, mean, var):
        if t is not None:
            torch._check(
                t.dim() == 1 and t.shape[0] == x.shape[1],
                lambda t=t: f"batch_norm: {tuple(t.shape)} for {x.shape[1]} channels",
            )
    return x.new_empty(x.shape)  # (empty_like works out strides in sympy: 3 ms a call)


_BATCH_NORM_EVAL = torch.ops.anyshape.batch_norm_eval.default


@torch.library.custom_op("anyshape::relu_opaque", mutates_args=())
def relu_opaque(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


@relu_opaque.register_fake
def _(x):
    return x.new_empty(x.shape)


_RELU_OPAQUE = torch.ops.anyshape.relu_opaque.default


@torch.library.custom_op("anyshape::linear_opaque", mutates_args=())
def linear_opaque(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch._C._nn.linear(x, weight, bias)  # (not ``F.linear``: swapped while capturing)


@linear_opaque.register_fake
def _(x, weight, bias):
    # (torch's own check, as the composite's matmul makes it: the same guard on the sizes)
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: f"linear: input {tuple(x.shape)} against weight {tuple(weight.shape)}",
    )
    if bias is not None:
        torch._check(
            bias.shape[0] == weight.shape[0],
            lambda: f"linear: bias {tuple(bias.shape)} for {weight.shape[0]} outputs",
        )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_LINEAR_OPAQUE = torch.ops.anyshape.linear_opaque.default


@torch.library.custom_op("anyshape::dropout_eval", mutates_args=())
def dropout_eval(x: torch.Tensor, p: float) -> torch.Tensor:
    return x.clone()  # (eager returns ``x`` itself; an op's output may not alias its input)


@dropout_eval.register_fake
def _(x, p):
    return x.new_empty(x.shape)


_DROPOUT_EVAL = torch.ops.anyshape.dropout_eval.default


@torch.library.custom_op("anyshape::upsample_opaque", mutates_args=())
def upsample_opaque(
    x: torch.Tensor, size: list[int], mode: str, align_corners: bool
) -> torch.Tensor:
    if mode == "nearest":
        return _UPSAMPLE_VEC[mode](x, size, None)
    return _UPSAMPLE_VEC[mode](x, size, align_corners, None)


@upsample_opaque.register_fake
def _(x, size, mode, align_corners):
    # (torch's own checks, as its meta function makes them: the same guards on the sizes)
    torch._check(
        all(d > 0 for d in x.shape[2:]) and all(d > 0 for d in size),
        lambda: (
            "Input and output sizes should be greater than 0, but got input size "
            f"{list(x.shape)} and output size {list(size)}"
        ),
    )
    return x.new_empty((x.shape[0], x.shape[1], *size))


_UPSAMPLE_OPAQUE = torch.ops.anyshape.upsample_opaque.default


_UPSAMPLE_VEC = {
    "nearest": torch.ops.aten.upsample_nearest2d.vec,
    "bilinear": torch.ops.aten.upsample_bilinear2d.vec,
    "bicubic": torch.ops.aten.upsample_bicubic2d.vec,
}


def _traced_here(name: str) -> bool:
    """Whether a call of ``F.<name>`` on this thread takes its traced form (``traced_here``)."""
    return traced_here(F, name)


def _swapped(name: str, make):
    """``F.<name>`` replaced by ``make(torch's function)`` while any capture runs (``swaps``)."""
    return swapped(F, name, make)


@contextlib.contextmanager
def traced_forms(opaque: bool = True):
    """Every substitution while the body captures; ``opaque=False`` (a capture autograd
    will differentiate) leaves the opaque ops out: batch norm, ReLU, linear and dropout
    as torch traces them."""
    forms = [max_pool1d_as_2d]
    if opaque:
        forms += [opaque_batch_norm, opaque_relu, opaque_linear, opaque_dropout, opaque_upsample,
                  *OPAQUE_FORMS]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for form in forms:
            stack.enter_context(form())
        yield


def opaque_relu():
    """``F.relu`` out of place as ``anyshape::relu_opaque`` while the body runs, on
    capturing threads, without autograd (in place, or anything else, as torch traces it)."""

    def make(original):
        def relu(input, inplace=False):
            if (
                inplace
                or not _traced_here("relu")
                or not isinstance(input, torch.Tensor)
                or torch.overrides.has_torch_function_unary(input)
            ):
                return original(input, inplace)
            return relu_opaque(input)

        return relu

    return _swapped("relu", make)


def opaque_linear():
    """``F.linear`` as ``anyshape::linear_opaque`` while the body runs, on capturing
    threads, without autograd, for a 2-D weight, a 1-D bias or none, one dtype and no
    tensor subclass (anything else as torch traces it)."""

    def make(original):
        def linear(input, weight, bias=None):
            if not _traced_here("linear"):  # (another thread meanwhile: torch's own)
                return original(input, weight, bias)
            # (torch's Python functions' protocol: export's function modes call this again
            # with them off; ``F.linear`` itself is C++ and would hand them torch's op)
            if torch.overrides.has_torch_function_variadic(input, weight, bias):
                return torch.overrides.handle_torch_function(
                    linear, (input, weight, bias), input, weight, bias=bias
                )
            plain = (
                isinstance(input, torch.Tensor)
                and isinstance(weight, torch.Tensor)
                and input.dim() >= 1
                and weight.dim() == 2
                and input.dtype == weight.dtype
                and (
                    bias is None
                    or isinstance(bias, torch.Tensor)
                    and bias.dim() == 1
                    and bias.dtype == weight.dtype
                    # (a bias of one element broadcasts: as torch traces it)
                    and statically_known_true(bias.shape[0] == weight.shape[0])
                )
                and all(type(t) in _PLAIN_TENSORS for t in (input, weight, bias) if t is not None)
            )
            if not plain:
                return original(input, weight, bias)
            return linear_opaque(input, weight, bias)

        return linear

    return _swapped("linear", make)


def opaque_dropout():
    """``F.dropout`` in eval mode, out of place, as ``anyshape::dropout_eval`` while the
    body runs, on capturing threads, without autograd (anything else as torch traces it)."""

    def make(original):
        def dropout(input, p=0.5, training=True, inplace=False):
            plain = (
                not training
                and not inplace
                and _traced_here("dropout")
                and isinstance(input, torch.Tensor)
                and isinstance(p, (int, float))
                and 0.0 <= p <= 1.0  # (torch's own error otherwise)
                and not torch.overrides.has_torch_function_unary(input)
            )
            if not plain:
                return original(input, p, training, inplace)
            return dropout_eval(input, float(p))

        return dropout

    return _swapped("dropout", make)


def opaque_upsample():
    """``F.interpolate`` of a 4-D input to a given ``size`` (nearest, bilinear or bicubic,
    no antialias, no scale factor) as ``anyshape::upsample_opaque`` while the body runs,
    on capturing threads, without autograd (anything else as torch traces it)."""

    def make(original):
        def interpolate(input, size=None, scale_factor=None, mode="nearest",
                        align_corners=None, recompute_scale_factor=None, antialias=False):  # fmt: skip
            args = (input, size, scale_factor, mode, align_corners, recompute_scale_factor,
                    antialias)  # fmt: skip
            if not _traced_here("interpolate"):
                return original(*args)
            if torch.overrides.has_torch_function_unary(input):  # (as opaque_linear)
                return torch.overrides.handle_torch_function(
                    interpolate, (input,), input, size, scale_factor, mode, align_corners,
                    recompute_scale_factor, antialias,
                )  # fmt: skip
            sizes = list(size) if isinstance(size, (list, tuple)) else [size, size]
            plain = (
                type(input) in _PLAIN_TENSORS
                and input.dim() == 4
                and input.dtype.is_floating_point
                and mode in _UPSAMPLE_VEC
                and scale_factor is None
                and not recompute_scale_factor
                and not antialias
                and len(sizes) == 2
                and all(isinstance(d, (int, torch.SymInt)) for d in sizes)
                and (align_corners is None or mode != "nearest")
            )
            if not plain:
                return original(*args)
            return upsample_opaque(input, sizes, mode, bool(align_corners))

        return interpolate

    return _swapped("interpolate", make)


def opaque_batch_norm():
    """``F.batch_norm`` in eval mode with running statistics as ``anyshape::batch_norm_eval``
    while the body runs, on capturing threads, without autograd (anything else as torch
    traces it)."""

    def make(original):
        def batch_norm(input, running_mean, running_var, weight=None, bias=None,
                       training=False, momentum=0.1, eps=1e-5):  # fmt: skip
            plain = (
                not training
                and _traced_here("batch_norm")  # (the op has no derivative)
                and momentum is not None
                and isinstance(input, torch.Tensor)
                and isinstance(running_mean, torch.Tensor)
                and isinstance(running_var, torch.Tensor)
                and not torch.overrides.has_torch_function_variadic(
                    input, running_mean, running_var, weight, bias
                )
            )
            if not plain:
                return original(input, running_mean, running_var, weight, bias, training,
                                momentum, eps)  # fmt: skip
            cudnn = torch.backends.cudnn.enabled
            return batch_norm_eval(
                input, weight, bias, running_mean, running_var, float(momentum), float(eps),
                cudnn,
            )  # fmt: skip

        return batch_norm

    return _swapped("batch_norm", make)


def restore_traced_forms(ep) -> None:
    """Each opaque op of ``ep``'s graphs (its subgraphs too: a higher-order op's body) as
    the node torch records for the call: ``aten.batch_norm``, ``aten.relu``,
    ``aten.linear``, ``aten.dropout``, an upsampling's ``.vec``, ``opaque_ops``' ops
    (its metadata kept, less the argument values recorded in the opaque op's layout; the
    graph's Python is generated where it runs, ``capture_program``)."""
    for module in ep.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for n in module.graph.nodes:
                if n.op == "call_function" and n.target in _RESTORE:
                    n.target, n.args, *kwargs = _RESTORE[n.target](*n.args)
                    n.kwargs = kwargs[0] if kwargs else {}
                    n.meta.pop("eager_input_vals", None)


def _linear_node(x, weight, bias):
    return torch.ops.aten.linear.default, (x, weight) if bias is None else (x, weight, bias)


def _batch_norm_node(x, weight, bias, mean, var, momentum, eps, cudnn):
    return torch.ops.aten.batch_norm.default, (x, weight, bias, mean, var, False, momentum,
                                                eps, cudnn)  # fmt: skip


# Opaque op -> (torch's op, its arguments[, keyword arguments]) from the opaque op's
# arguments.
_RESTORE = {
    **OPAQUE_RESTORE,
    _LINEAR_OPAQUE: _linear_node,
    _DROPOUT_EVAL: lambda x, p: (torch.ops.aten.dropout.default, (x, p, False)),
    _RELU_OPAQUE: lambda x: (torch.ops.aten.relu.default, (x,)),
    _BATCH_NORM_EVAL: _batch_norm_node,
    _UPSAMPLE_OPAQUE: lambda x, size, mode, align_corners: (
        _UPSAMPLE_VEC[mode],
        (x, size, None) if mode == "nearest" else (x, size, align_corners, None),
    ),
}


def max_pool1d_as_2d():
    """``F.max_pool1d`` traced as a 2-D pool over ``[N, C, 1, L]`` while capturing.

    torch's C++ ``max_pool1d`` reads its input length as a number, so tracing fixes
    it (``Eq(L, 9)``: every other length a new graph); the 2-D pool's shape function
    keeps it symbolic, with the same values. The returned-indices form is left to
    torch (``max_pool1d_with_indices`` is symbolic already), and so is a call on a
    thread not capturing.
    """
    return _swapped("max_pool1d", lambda original: functools.partial(_max_pool1d, original))


def _max_pool1d(original, input, kernel_size, stride=None, padding=0, dilation=1,
                ceil_mode=False, return_indices=False):  # fmt: skip
    x = input
    if (
        return_indices
        or not on_capturing_thread(F, "max_pool1d")
        or not isinstance(x, torch.Tensor)
        or x.dim() not in (2, 3)
    ):
        return original(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def one(v, default):
        if isinstance(v, (list, tuple)):
            return v[0] if len(v) else default
        return default if v is None else v

    k = one(kernel_size, None)
    y = F.max_pool2d(
        x.unsqueeze(-2), (1, k), (1, one(stride, k)), (0, one(padding, 0)),
        (1, one(dilation, 1)), ceil_mode,
    )  # fmt: skip
    return y.squeeze(-2)
