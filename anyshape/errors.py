"""The exceptions anyshape raises to its users.

Every error names what was wrong (which input, which dim, expected vs got, which
op and where in the model) so a user can act on it without a debugger.
"""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """An exception's first line of text (its type name when it has none), for reasons."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class AnyshapeError(Exception):
    """Base class of every anyshape error."""


class InputError(AnyshapeError, ValueError):
    """A compiled model was called with inputs that break its signature or constraints.

    ``at_size_edge``: a dim broke a relation torch derived between dims for sizes of at
    least 1 (a slice ``x[..., :-1]`` is ``s - 1`` long, so another input's dim is
    ``s - 1``; two dims added are one) where a size of 0 takes part. Eager may run such
    a call (the slice clamped to 0, a size 1 broadcast against a 0).
    """

    at_size_edge = False


class UnsupportedError(AnyshapeError, NotImplementedError):
    """An op (or one of its argument combinations) cannot be compiled; says why."""


class CaptureError(AnyshapeError, RuntimeError):
    """The model could not be captured into a graph; says what to try."""


class ArtifactError(AnyshapeError, ValueError):
    """An artifact file cannot be used: corrupt, truncated, or built for another target."""
