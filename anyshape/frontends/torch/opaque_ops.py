"""More ops traced as one opaque op each while a model is captured, and put back after.

Part of capture, with ``traced_forms.py`` (which installs these forms with its own and
restores every opaque node to the op torch records). torch traces each of these ops
by running its Python reference or meta function on fake tensors, whose symbolic size
arithmetic costs more than the rest of the trace where sizes come out of convolutions
and views (SegFormer-B0's image sizes: each layer norm 28 ms, each GELU of wav2vec
2.0's frames 36 ms, against under 1 ms for an opaque op). Each fake checks only what
eager checks, so the capture records the same guards. Their outputs are contiguous, as
eager's are for the inputs that take these forms (any input for layer norm, a contiguous
one for the others: a strided or channels-last input keeps torch's own trace, whose
output strides a later view may depend on):

- ``opaque_layer_norm``: ``F.layer_norm`` with weight and bias of the input's dtype or
  none, shaped like its input; restored to ``aten.layer_norm``.
- ``opaque_gelu``: ``F.gelu``, shaped like its input; restored to ``aten.gelu``.
- ``opaque_pixel_shuffle``: ``F.pixel_shuffle`` and ``F.pixel_unshuffle`` (the same
  functions as ``torch.pixel_shuffle`` and ``torch.pixel_unshuffle``). torch's meta
  functions also bound the sizes by the example's (``h >= 4`` for a factor of 2) and
  write the factor as ``h // (h // 2)``: each small or empty image size a call later
  sent was a guard variant. Restored to ``aten.pixel_shuffle``/``pixel_unshuffle``,
  which ``aten/shape.py`` lowers whole.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch._prims_common import is_contiguous_or_false

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


OPAQUE_FORMS = (opaque_layer_norm, opaque_gelu, opaque_pixel_shuffle)

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
    _PIXEL_SHUFFLE_OPAQUE: lambda x, factor, inverse: (
        torch.ops.aten.pixel_unshuffle.default if inverse else torch.ops.aten.pixel_shuffle.default,
        (x, factor),
        {},
    ),
}
