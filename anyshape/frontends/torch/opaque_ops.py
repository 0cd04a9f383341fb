"""More ops traced as one opaque op each while a model is captured, and put back after.

Part of capture, with ``traced_forms.py`` (which installs these forms with its own and
restores every opaque node to the op torch records). torch traces each of these ops
by running its Python reference or meta function on fake tensors, whose symbolic size
arithmetic costs more than the rest of the trace where sizes come out of convolutions
and views (SegFormer-B0's image sizes: each layer norm 28 ms, each GELU of wav2vec
2.0's frames 36 ms, against under 1 ms for an opaque op). Each fake checks only what
eager checks, so the capture records the same guards. Their outputs are contiguous, as
eager's are for the inputs that take these forms (any input for layer norm, a contiguous
one for GELU and pixel shuffle: a strided or channels-last input keeps torch's own trace,
whose output strides a later view may depend on), or laid out as eager's (convolutions):

- ``opaque_layer_norm``: ``F.layer_norm`` with weight and bias of the input's dtype or
  none, shaped like its input; restored to ``aten.layer_norm``.
- ``opaque_gelu``: ``F.gelu``, shaped like its input; restored to ``aten.gelu``.
- ``opaque_pixel_shuffle``: ``F.pixel_shuffle`` and ``F.pixel_unshuffle`` (the same
  functions as ``torch.pixel_shuffle`` and ``torch.pixel_unshuffle``). torch's meta
  functions also bound the sizes by the example's (``h >= 4`` for a factor of 2) and
  write the factor as ``h // (h // 2)``: each small or empty image size a call later
  sent was a guard variant. Restored to ``aten.pixel_shuffle``/``pixel_unshuffle``,
  which ``aten/shape.py`` lowers whole.
- ``opaque_conv``: ``F.conv1d``, ``F.conv2d`` and ``F.conv3d`` with numeric arguments;
  restored to the ``aten.conv<n>d`` torch records. Its fake is torch's fake convolution
  less one step: torch makes a contiguous output and converts it to the layout eager
  would give, where this one returns the contiguous output as it is (SegFormer-B0's 20
  convolutions: 0.86 -> 0.29 s of fake dispatch); a channels-last one it converts as
  torch does. It asks torch's questions in torch's order (the backend's per-dim kernel
  checks, the memory format, the shape function's checks), so the guards the compiled
  graph keeps are torch's (``export_guards`` drops the layout questions).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch._meta_registrations import calc_conv_nd_return_shape
from torch._prims_common import is_contiguous_or_false
from torch.fx.experimental.symbolic_shapes import has_guarding_hint

from .swaps import PLAIN_TENSORS, swapped, traced_here

__all__ = ["OPAQUE_FORMS", "OPAQUE_RESTORE"]


@torch.library.custom_op("anyshape::layer_norm_opaque", mutates_args=())
def layer_norm_opaque(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    cudnn: bool,
) -> torch.Tensor:
    return torch.layer_norm(x, normalized_shape, weight, bias, eps, cudnn)


@layer_norm_opaque.register_fake
def _(x, normalized_shape, weight, bias, eps, cudnn):
    k = len(normalized_shape)
    # (eager's check, as its meta function makes it: the same guards on the sizes)
    torch._check(
        x.dim() >= k and all(a == b for a, b in zip(x.shape[x.dim() - k :], normalized_shape)),
        lambda: (
            f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size{list(x.shape)}"
        ),
    )
    for t in (weight, bias):
        if t is not None:
            torch._check(
                list(t.shape) == list(normalized_shape),
                lambda t=t: f"layer_norm: {list(t.shape)} for {list(normalized_shape)}",
            )
    return x.new_empty(x.shape)


_LAYER_NORM_OPAQUE = torch.ops.anyshape.layer_norm_opaque.default


@torch.library.custom_op("anyshape::gelu_opaque", mutates_args=())
def gelu_opaque(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch._C._nn.gelu(x, approximate=approximate)  # (not ``F.gelu``: swapped)


@gelu_opaque.register_fake
def _(x, approximate):
    return x.new_empty(x.shape)


_GELU_OPAQUE = torch.ops.anyshape.gelu_opaque.default


def opaque_layer_norm():
    """``F.layer_norm`` as ``anyshape::layer_norm_opaque`` while the body runs, on
    capturing threads, without autograd, for a floating input and a weight and bias of
    its dtype or none (anything else as torch traces it)."""

    def make(original):
        def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
            args = (input, normalized_shape, weight, bias, eps)
            if not traced_here(F, "layer_norm"):
                return original(*args)
            if torch.overrides.has_torch_function_variadic(input, weight, bias):
                return torch.overrides.handle_torch_function(
                    layer_norm, (input, weight, bias), *args
                )  # (as opaque_linear in traced_forms.py)
            plain = (
                isinstance(normalized_shape, (list, tuple))  # (an int: torch's TypeError)
                and len(normalized_shape) > 0  # (torch's error)
                and type(input) in PLAIN_TENSORS
                and input.dtype.is_floating_point
                and all(isinstance(d, (int, torch.SymInt)) for d in normalized_shape)
                and isinstance(eps, (int, float))
                and all(
                    type(t) in PLAIN_TENSORS and t.dtype == input.dtype
                    for t in (weight, bias)
                    if t is not None
                )
            )
            if not plain:
                return original(*args)
            cudnn = torch.backends.cudnn.enabled  # (what torch records: off while exporting)
            shape = list(normalized_shape)
            return layer_norm_opaque(input, shape, weight, bias, float(eps), cudnn)

        return layer_norm

    return swapped(F, "layer_norm", make)


def opaque_gelu():
    """``F.gelu`` of a floating tensor as ``anyshape::gelu_opaque`` while the body runs, on
    capturing threads, without autograd (anything else as torch traces it)."""

    def make(original):
        def gelu(input, *, approximate="none"):
            if not traced_here(F, "gelu"):
                return original(input, approximate=approximate)
            if torch.overrides.has_torch_function_unary(input):  # (as opaque_linear)
                return torch.overrides.handle_torch_function(
                    gelu, (input,), input, approximate=approximate
                )
            plain = (
                type(input) in PLAIN_TENSORS
                and input.dtype.is_floating_point
                and approximate in ("none", "tanh")
                and is_contiguous_or_false(input)  # (else eager's output keeps its strides)
            )
            if not plain:
                return original(input, approximate=approximate)
            return gelu_opaque(input, approximate)

        return gelu

    return swapped(F, "gelu", make)


@torch.library.custom_op("anyshape::pixel_shuffle_opaque", mutates_args=())
def pixel_shuffle_opaque(x: torch.Tensor, factor: int, inverse: bool) -> torch.Tensor:
    return (torch.pixel_unshuffle if inverse else torch.pixel_shuffle)(x, factor)


@pixel_shuffle_opaque.register_fake
def _(x, factor, inverse):
    *batch, c, h, w = x.shape
    # (eager's checks, with its messages: a guard on the sizes, nothing more)
    if inverse:
        torch._check(
            h % factor == 0 and w % factor == 0,
            lambda: (
                f"pixel_unshuffle expects height {h} and width {w} to be divisible "
                f"by downscale_factor {factor}"
            ),
        )
        return x.new_empty((*batch, c * factor * factor, h // factor, w // factor))
    torch._check(
        c % (factor * factor) == 0,
        lambda: (
            f"pixel_shuffle expects its input's 'channel' dimension {c} to be divisible "
            f"by the square of upscale_factor {factor}"
        ),
    )
    return x.new_empty((*batch, c // (factor * factor), h * factor, w * factor))


_PIXEL_SHUFFLE_OPAQUE = torch.ops.anyshape.pixel_shuffle_opaque.default


@contextlib.contextmanager
def opaque_pixel_shuffle():
    """``F.pixel_shuffle`` and ``F.pixel_unshuffle`` (and ``torch.``'s, the same
    functions) of a contiguous tensor of rank 3 or more by a positive factor as
    ``anyshape::pixel_shuffle_opaque`` while the body runs, on capturing threads, without
    autograd (anything else as torch traces it)."""

    def make(owner, name: str, inverse: bool):
        def form(original):
            def traced(input, factor):
                if torch.overrides.has_torch_function_unary(input):  # (as opaque_linear)
                    return torch.overrides.handle_torch_function(
                        shuffle if inverse else upscale, (input,), input, factor
                    )
                plain = (
                    type(input) in PLAIN_TENSORS
                    and input.dim() >= 3
                    and type(factor) is int
                    and factor > 0
                    and is_contiguous_or_false(input)  # (channels-last: eager's output too)
                )
                if not plain:
                    return original(input, factor)
                return pixel_shuffle_opaque(input, factor, inverse)

            # (torch's parameter names, which a caller may pass by keyword)
            def upscale(input, upscale_factor):
                if not traced_here(owner, name):
                    return original(input, upscale_factor)
                return traced(input, upscale_factor)

            def shuffle(input, downscale_factor):
                if not traced_here(owner, name):
                    return original(input, downscale_factor)
                return traced(input, downscale_factor)

            return shuffle if inverse else upscale

        return form

    with contextlib.ExitStack() as stack:
        for owner in (F, torch):
            for name, inverse in (("pixel_shuffle", False), ("pixel_unshuffle", True)):
                stack.enter_context(swapped(owner, name, make(owner, name, inverse)))
        yield


@torch.library.custom_op("anyshape::conv_opaque", mutates_args=())
def conv_opaque(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    conv = (torch.conv1d, torch.conv2d, torch.conv3d)[weight.dim() - 3]  # (F's are swapped)
    return conv(x, weight, bias, stride, padding, dilation, groups)


@conv_opaque.register_fake
def _(x, weight, bias, stride, padding, dilation, groups):
    # What torch's fake convolution does, in its order (eager's checks of each size first,
    # while picking the backend, then the memory format): the same guards on the sizes.
    layout = _conv_memory_format(x, weight, bias, stride, padding, dilation, groups)
    shape = calc_conv_nd_return_shape(x, weight, stride, padding, dilation, False, groups)
    out = x.new_empty(shape)
    if layout in (None, torch.contiguous_format):
        return out  # (where torch converts a contiguous output to contiguous)
    # (as torch's: the conversion's guards are layout decisions, which capture drops)
    if x.dim() == 3:
        return out.unsqueeze(2).to(memory_format=layout).squeeze(2)
    return out.to(memory_format=layout)


def _conv_memory_format(x, weight, bias, stride, padding, dilation, groups):
    """The memory format of eager's output, as torch's fake convolution decides it: from the
    backend eager would pick at the example's sizes (None where a size has no example)."""
    if not all(has_guarding_hint(d) for d in (*x.shape, *weight.shape)):
        return None
    rank = weight.dim() - 2
    backend = torch._C._select_conv_backend(
        x, weight, bias=bias, stride=stride, padding=padding, dilation=dilation,
        transposed=False, output_padding=[0] * rank, groups=groups,
    )  # fmt: skip
    if rank == 1:
        x, weight = x.contiguous().unsqueeze(2), weight.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(x, weight, backend)


_CONV_OPAQUE = torch.ops.anyshape.conv_opaque.default


@contextlib.contextmanager
def opaque_conv():
    """``F.conv1d``, ``F.conv2d`` and ``F.conv3d`` of a batched floating input by a weight
    of its dtype and static shape, with numeric arguments, as ``anyshape::conv_opaque``
    while the body runs, on capturing threads, without autograd (anything else as torch
    traces it: an unbatched input, ``padding="same"``, a tensor subclass)."""

    def make(name: str, rank: int):
        def form(original):
            def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
                args = (input, weight, bias, stride, padding, dilation, groups)
                if not traced_here(F, name):
                    return original(*args)
                if torch.overrides.has_torch_function_variadic(input, weight, bias):
                    return torch.overrides.handle_torch_function(
                        conv, (input, weight, bias), *args
                    )  # (as opaque_linear in traced_forms.py)
                lists = [_conv_list(v, rank) for v in (stride, padding, dilation)]
                if not _plain_conv(input, weight, bias, groups, rank, lists):
                    return original(*args)
                return conv_opaque(input, weight, bias, *lists, groups)

            return conv

        return form

    with contextlib.ExitStack() as stack:
        for rank in (1, 2, 3):
            name = f"conv{rank}d"
            stack.enter_context(swapped(F, name, make(name, rank)))
        yield


def _conv_list(v, rank: int) -> list[int] | None:
    """A stride, padding or dilation as torch records it (an int repeated per spatial dim,
    a sequence as given), or None when it is not plain ints (a string padding, say)."""
    if type(v) is int:
        return [v] * rank
    if isinstance(v, (list, tuple)) and len(v) in (1, rank) and all(type(d) is int for d in v):
        return list(v)
    return None


def _plain_conv(x, weight, bias, groups, rank: int, lists) -> bool:
    """Whether the opaque form takes this convolution: numeric arguments eager accepts,
    plain tensors of one floating dtype, a weight of static shape with input channels
    (torch's fake gives a convolution of none an output of no channels, whatever the
    weight says) and a bias to match."""
    if any(v is None for v in lists):
        return False
    stride, padding, dilation = lists
    if not (
        all(type(t) in PLAIN_TENSORS for t in (x, weight, bias) if t is not None)
        and x.dim() == weight.dim() == rank + 2
        and weight.dtype.is_floating_point
        and x.dtype == weight.dtype
        and all(type(d) is int for d in weight.shape)
        and weight.shape[1] > 0  # (no input channels: eager's output has none either)
        and type(groups) is int
        and groups > 0
        and weight.shape[0] % groups == 0
        and min(stride) > 0
        and min(dilation) > 0
        and min(padding) >= 0
    ):
        return False
    return bias is None or bias.dtype == weight.dtype and list(bias.shape) == [weight.shape[0]]


def _conv_node(x, weight, bias, stride, padding, dilation, groups):
    """The ``aten.conv<n>d`` torch records: trailing arguments equal to their defaults left
    out (a one-element list is not the default, as in torch's record)."""
    rank = len(weight.meta["val"].shape) - 2
    args = [x, weight, bias, stride, padding, dilation, groups]
    defaults = [None, [1] * rank, [0] * rank, [1] * rank, 1]
    while len(args) > 2 and args[-1] == defaults[len(args) - 3]:
        args.pop()
    op = (torch.ops.aten.conv1d, torch.ops.aten.conv2d, torch.ops.aten.conv3d)[rank - 1]
    return op.default, tuple(args), {}


OPAQUE_FORMS = (opaque_layer_norm, opaque_gelu, opaque_pixel_shuffle, opaque_conv)

# Opaque op -> (torch's op, its arguments, its keyword arguments), as traced_forms.py
# restores them.
OPAQUE_RESTORE = {
    _LAYER_NORM_OPAQUE: lambda x, shape, weight, bias, eps, cudnn: (
        torch.ops.aten.layer_norm.default,
        (x, shape, weight, bias, eps, cudnn),
        {},
    ),
    _GELU_OPAQUE: lambda x, approximate: (
        torch.ops.aten.gelu.default,
        (x,),
        {} if approximate == "none" else {"approximate": approximate},
    ),
    _CONV_OPAQUE: _conv_node,
    _PIXEL_SHUFFLE_OPAQUE: lambda x, factor, inverse: (
        torch.ops.aten.pixel_unshuffle.default if inverse else torch.ops.aten.pixel_shuffle.default,
        (x, factor),
        {},
    ),
}
