"""Examples grown where torch.export fixed a size derived from them to 1.

Part of capture, used by ``optimize`` (``api.py``). ``widen_example`` grows example
dims of 0 or 1, but a size computed from the example can be 1 too: wav2vec 2.0's
feature encoder turns 401 samples into 1 frame. torch.export then specializes the
graph on that size (a guard ``floordiv(s + 240, 320) - 1 == 1``) and every longer
input compiles again. ``grown_example`` reads those guards and doubles the input dims
their symbols name (by repetition: token ids and masks stay valid); the caller
captures again and checks the result against eager on the user's own example, and
keeps the first capture where the grown example cannot be captured (two inputs tied
by an offset) or the grown capture does not serve the user's example. (SegFormer at
32 px is such a case: its grown capture guards that the last stage has 2 or more
pixels, which the 32 px example does not meet.) ``serves`` sees most such cases from
the capture's ranges and guards alone, before anything is compiled.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ...ir.constraints import Guard

# Captures grown at most this many times (each doubles the dims the guards name).
MAX_GROWTH = 3


def pinned_symbols(guards: list[Guard]) -> set[str]:
    """The input symbols of guards that fix a derived size to 1 (not a remainder: ``mod(n,
    4) == 0`` says a reshape divides evenly, which growing would not change)."""
    out: set[str] = set()
    for g in guards:
        if g.op != "eq":
            continue
        for side, other in ((g.lhs, g.rhs), (g.rhs, g.lhs)):
            if other.is_constant and other.constant_value == 1 and side.free_symbols:
                if "mod(" not in str(side):
                    out |= set(side.free_symbols)
    return out


def serves(captured, args: tuple, kwargs: dict) -> bool:
    """Whether ``captured``'s symbol ranges and guards admit the example ``(args,
    kwargs)``: its input symbols bound to the example's sizes, every range and every
    guard they decide holds. True where the inputs do not line up (the check against
    eager after compiling decides then)."""
    env = _input_sizes(captured.exported, args, kwargs)
    if env is None:
        return True
    for name, (lo, hi) in captured.symbol_ranges.items():
        if name in env and (env[name] < lo or (hi is not None and env[name] > hi)):
            return False
    return all(g.holds(env) for g in captured.guards if g.free_symbols_bound(env))


def _input_sizes(exported, args: tuple, kwargs: dict) -> dict[str, int] | None:
    """Each input symbol of ``exported`` bound to the example's size for it; None where
    the inputs do not line up or one symbol names two sizes."""
    paired = _paired_inputs(exported, args, kwargs)
    if paired is None:
        return None
    env: dict[str, int] = {}
    for leaf, val in paired[0]:
        if val is None:
            continue
        if leaf.dim() != val.dim():
            return None
        for size, got in zip(val.shape, leaf.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                if env.setdefault(str(size), got) != got:
                    return None
    return env


def grown_example(exported, args: tuple, kwargs: dict, symbols: set[str]):
    """``(args, kwargs)`` with every tensor dim whose size is one of ``symbols`` doubled,
    or None where none is (or the program's inputs do not line up with the example)."""
    paired = _paired_inputs(exported, args, kwargs)
    if paired is None:
        return None
    grown, changed = [], False
    for leaf, val in paired[0]:
        for d, size in enumerate(val.shape if val is not None else ()):
            if isinstance(size, torch.SymInt) and str(size) in symbols:
                leaf = torch.cat([leaf, leaf], dim=d)
                changed = True
        grown.append(leaf)
    return pytree.tree_unflatten(grown, paired[1]) if changed else None


def _paired_inputs(exported, args: tuple, kwargs: dict):
    """The example's leaves, each with the fake tensor ``exported`` traced for it (None
    where either is not a tensor), and the example's tree spec; None where the program's
    inputs do not line up with the example."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    names = exported.graph_signature.user_inputs
    if len(names) != len(leaves):
        return None
    pairs = []
    for name, leaf in zip(names, leaves):
        val = placeholders[name].meta.get("val") if name in placeholders else None
        tensors = isinstance(leaf, torch.Tensor) and isinstance(val, torch.Tensor)
        pairs.append((leaf, val if tensors else None))
    return pairs, spec
