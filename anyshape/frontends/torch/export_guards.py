"""Which of torch.export's shape guards a captured graph keeps, as anyshape guards.

Part of capture (``capture.py``): ``export_guards`` reads the ShapeEnv's guards
and drops the decisions that do not shape the compiled graph (strides and
views, conditions every size of 2 or more meets, decisions an op's lowering
takes again per call); ``slice_size_guards`` adds the conditions of slice sizes
torch fixed by assuming dims of 2 or more. The prologue checks what is kept; a
call that fails a guard is compiled again for its case (``plugin/guard_variants.py``).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ...errors import UnsupportedError
from ...ir.constraints import Guard
from ...ir.symbolic import as_expr, format_dim
from .symbols import sympy_to_expr, to_dim


def slice_size_guards(gm: fx.GraphModule) -> list[Guard]:
    """The sizes torch gave slices by assuming their input dims are 2 or more.

    torch records no guard for what its ``[2, inf]`` range already implies: ``x[:, :2]``
    at an example of 6 is 2 wide, unguarded, and ``x[:, 1:]`` is ``s - 1`` wide. Each
    such size holds only while the input dim is long enough: ``2 <= s``, ``0 <= s - 1``;
    the prologue checks that, so a shorter call is compiled again for its case instead
    of computing a wrong shape.
    """
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.aten.slice.Tensor:
            continue
        x, y = n.args[0].meta.get("val"), n.meta.get("val")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or not x.dim():
            continue
        dim = (n.args[1] if len(n.args) > 1 else 0) % x.dim()
        start = n.args[2] if len(n.args) > 2 else None
        step = n.args[4] if len(n.args) > 4 else 1
        size, kept = to_dim(x.shape[dim]), to_dim(y.shape[dim])
        if isinstance(size, int):
            continue
        why = f"slice {n.name} is {format_dim(kept)} long for dim {dim} of {n.args[0].name}"
        if not isinstance(kept, int):
            if any(c < 0 for _, c in kept.terms):
                out.append(Guard("le", as_expr(0), kept, why))
        elif kept > 0 and isinstance(start, (int, type(None))) and isinstance(step, int):
            start = start or 0
            if start < 0 and _clamped_at_zero(x.shape[dim], start):
                start = 0  # (torch's own guard keeps the dim shorter than -start)
            need = -start if start < 0 else start + (kept - 1) * step + 1
            out.append(Guard("le", as_expr(need), size, why))
    return out


def _clamped_at_zero(size, start: int) -> bool:
    """Whether a negative slice start fell below 0 at the example's size (``x[-10:2]``
    traced at 3 starts at 0, not at 3 - 10): the slice then starts at 0."""
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint is not None and int(hint) + start < 0


def shape_env_of(ep):
    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    fake = next((v for v in vals if isinstance(v, torch.Tensor)), None)
    return getattr(getattr(fake, "fake_mode", None), "shape_env", None)


def export_guards(ep, exact_pools: bool = False) -> list[Guard]:
    """The ShapeEnv guards the compiled graph depends on, as anyshape guards.

    A guard is a question torch asked about the example's sizes; only some answers
    shaped the graph. Dropped, as not conditions of the compiled graph:

    - guards from torch's stride and view decisions (``_LAYOUT_DECISIONS``): either
      answer gives a graph computing the same values;
    - ceil_mode pooling's last-window decision, when ``exact_pools`` (its size is then
      an exact expression, see ``size_rewrites.py``);
    - inequalities that hold for every size of 2 or more (``s != 1``, ``s >= 2``,
      ``8*s0 < 8*s0*s1``): torch assumes a dynamic dim is never 0 or 1, anyshape
      decides broadcasting at run time, so those sizes are valid. (A remainder by a
      constant is no size: ``mod(floordiv(s, 5) - 1, 2) != 1``, a model's branch on an
      even frame count, is kept.)

    A size decision (``_SIZE_DECISIONS``: a slice clamped to its input) is never
    dropped. Every kept guard (``floordiv(s0, 8)**2 + 1 == 17`` when a model took
    a branch that holds only for the example's image size) is checked in the
    prologue; a call that fails one is compiled again for its case (``api.py``).
    """
    import sympy

    env = shape_env_of(ep)
    if env is None:
        return []
    # (run_decompositions traces again and records the same guards without their torch
    # function, so a guard restating a classified one is classified with it; a guard
    # with its own function is classified by it: ``s // 2 == 1`` asked by a contiguity
    # check and again by ``expand`` is a layout decision once and a size decision once)
    exact = {g.expr for g in env.guards if exact_pools and _pool_size(g)}
    sized = {g.expr for g in env.guards if _framework_function(g) in _SIZE_DECISIONS} - exact
    layout = {g.expr for g in env.guards if _layout_only(g)} | exact
    out: list[Guard] = []
    for g in env.guards:
        restated = _framework_function(g) is None
        if g.expr not in sized and (
            _layout_only(g) or g.expr in exact or (restated and g.expr in layout)
        ):
            continue
        expr = g.expr.xreplace(env.replacements)
        if expr in (sympy.true, sympy.false) or not isinstance(
            expr, sympy.core.relational.Relational
        ):
            continue
        if g.expr not in sized and _holds_for_sizes_over_one(expr):
            continue
        try:
            lhs, rhs = sympy_to_expr(expr.lhs), sympy_to_expr(expr.rhs)
        except UnsupportedError:
            continue
        op = type(expr).__name__
        text = f"torch.export guard {expr}"
        if op == "Equality":
            out.append(Guard("eq", lhs, rhs, text))
        elif op == "Unequality":
            # (``s != 1`` is torch's assumption about a size, not a decision: dropped, as
            # is ``mod(1, s) != 0``, the same assumption; a remainder by a constant,
            # ``mod(n, 2) != 1``, is a branch on parity: kept)
            if g.expr in sized or not (
                rhs.is_constant
                and rhs.constant_value in (0, 1)
                and not _remainder_by_a_constant(expr.lhs)
            ):
                out.append(Guard("ne", lhs, rhs, text))
        elif op in ("GreaterThan", "StrictGreaterThan", "LessThan", "StrictLessThan"):
            small, big = (rhs, lhs) if op.startswith(("Greater", "StrictGreater")) else (lhs, rhs)
            if op.startswith("Strict"):
                small = small + 1
            out.append(Guard("le", small, big, text))
    return out


def _remainder_by_a_constant(expr) -> bool:
    """Whether ``expr`` is a remainder by a constant (``Mod(n, 2)``), not a size that
    holds one (``floordiv(s + mod(s, 2), 2)``: a padded size, whose ``!= 1`` is torch's
    assumption again)."""
    return type(expr).__name__ in ("Mod", "PythonMod") and expr.args[1].is_number


# torch functions whose guards choose a size of the graph: never dropped as 0/1 facts
# (``x[:, :2]`` at an example of 6 records ``s >= 2``: its size is 2 only then).
_SIZE_DECISIONS = ("_compute_slice_index", "pooling_output_shape_pad_lr")


def _holds_for_sizes_over_one(expr) -> bool:
    """Whether an inequality or ``!=`` over sizes holds whenever every size is 2 or
    more, by torch's interval arithmetic on the factored difference (no guess: an
    unproven one is kept)."""
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    if isinstance(expr, (sympy.Gt, sympy.Ge)):
        diff, strict = expr.lhs - expr.rhs, isinstance(expr, sympy.Gt)
    elif isinstance(expr, (sympy.Lt, sympy.Le)):
        diff, strict = expr.rhs - expr.lhs, isinstance(expr, sympy.Lt)
    elif isinstance(expr, sympy.Ne):
        diff, strict = expr.lhs - expr.rhs, True
    else:
        return False
    ranges = {s: ValueRanges(2, int_oo) for s in diff.free_symbols}
    for form in (diff, sympy.factor(diff)):
        try:
            lo = bound_sympy(form, ranges).lower
        except Exception:  # torch's range analysis does not know every function
            continue
        if lo > 0 or (lo >= 0 and not strict):
            return True
        if isinstance(expr, sympy.Ne) and bound_sympy(-form, ranges).lower > 0:
            return True
    return False


# torch functions whose size decisions only pick strides or a view-versus-copy path:
# either way the decomposed graph computes the same values, which is all anyshape's
# value-semantics IR keeps, so their guards are not conditions of the compiled graph.
_LAYOUT_DECISIONS = (
    "_reshape_view_helper_core_alg",  # how reshape groups dims into a view
    "check_contiguous_sizes_strides",
    "is_contiguous",
    "is_channels_last_contiguous_2d",
    "is_channels_last_contiguous_3d",
    "is_non_overlapping_and_dense",
    "_is_non_overlapping_and_dense_or_false",  # (asked of an upsampling's output)
    "compute_elementwise_output_logical_to_physical_perm",
    "compute_elementwise_output_strides",
)


# Decisions torch takes while it works out the shape of an op capture keeps whole, and
# which that op's lowering takes again on every call: an upsampling's align_corners
# scale for an output of one (``_compute_scale``; ``aten/resample.py`` selects per call).
_DECIDED_PER_CALL = ("_compute_scale",)


def _framework_function(guard) -> str | None:
    return getattr(getattr(getattr(guard, "sloc", None), "framework_loc", None), "name", None)


def _pool_size(guard) -> bool:
    """Whether a guard is ceil_mode's "last window starts inside the input" decision."""
    return _framework_function(guard) == "pooling_output_shape_pad_lr"


def _layout_only(guard) -> bool:
    """Whether a ShapeEnv guard came from a torch decision about strides or views only.

    ``_prims_common``'s stride ordering (its ``__lt__``) counts too: it sorts dims to
    lay out an output, it does not change any size. So does the memory format torch's
    fake convolution picks for its output (``_conv_determine_backend_memory_format``
    asks whether a dim is 1: SegFormer's last stage at 32 px), told from the same
    function's backend choice by its source line, and the one the opaque convolution
    picks the same way.
    """
    frame = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    name = getattr(frame, "name", None)
    if name in _LAYOUT_DECISIONS:
        return True
    # (tests/test_models.py's SegFormer stream recompiles without this; the opaque
    # convolution's fake asks the same in ``opaque_ops._conv_memory_format``)
    if name in ("conv", "_conv_memory_format") and "memory_format" in (
        getattr(frame, "line", "") or ""
    ):
        return True
    if name in _DECIDED_PER_CALL:
        return True
    filename = getattr(frame, "filename", "") or ""
    return name == "__lt__" and "_prims_common" in filename


def finite_int(v) -> int | None:
    """A sympy bound as an int, None when infinite."""
    import sympy

    try:
        return int(v) if v.is_Integer or isinstance(v, (int, sympy.Integer)) else None
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
