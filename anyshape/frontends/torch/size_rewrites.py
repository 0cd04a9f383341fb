"""Sizes torch derived under a guard, rewritten to expressions that hold for every size.

Part of the torch frontend, between capture (``capture.py``) and the size conversions
(``symbols.py``). torch's shape functions pick a formula by asking about the example's
sizes, and the exported graph carries the formula that held for it:

- ``max/avg_pool(ceil_mode=True)`` drops the last window when it would start past the
  input (``pooling_output_shape_pad_lr``); the graph holds one of the two sizes. The
  rewrite is the exact size for every input length,
  ``min(ceildiv(L + 2p - d(k-1) - 1, s) + 1, floordiv(L + p - 1, s) + 1)``, so the
  guard that chose between them is no longer a condition of the graph.
- ``reshape(-1, k)`` writes the ``k`` it infers as ``floordiv(n, floordiv(n, k))``,
  which is ``k`` for every ``n`` divisible by ``k`` (what reshape checks) except 0,
  where it divides by zero; the rewrite is ``k``.

The rewrites are registered per graph (its ShapeEnv) with ``symbols.register_size_rewrites``
and applied wherever a size crosses into the IR.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .symbols import register_size_rewrites as _register

aten = torch.ops.aten

# pooling op -> spatial dims
_POOLS = {
    aten.max_pool1d.default: 1,
    aten.max_pool2d.default: 2,
    aten.max_pool3d.default: 3,
    aten.max_pool1d_with_indices.default: 1,
    aten.max_pool2d_with_indices.default: 2,
    aten.max_pool3d_with_indices.default: 3,
    aten.avg_pool1d.default: 1,
    aten.avg_pool2d.default: 2,
    aten.avg_pool3d.default: 3,
}


def register_size_rewrites(shape_env, graph: fx.Graph) -> bool:
    """Register the rewrites of ``graph``'s sizes; whether every ceil_mode pool got one
    (then the guards torch's pool shape function recorded are not conditions)."""
    rewrites = _reshape_rewrites(shape_env)
    exact = True
    for node in graph.nodes:
        if node.op != "call_function" or not _arg(node, "ceil_mode", False):
            continue
        if node.target not in _POOLS:
            exact = False  # a pool this module does not know: torch's guard stays
            continue
        rewrites.update(_pool_rewrites(node))
    _register(shape_env, rewrites)
    return exact


def _arg(node: fx.Node, name: str, default):
    """An argument of an ATen call by its schema name (``default`` when absent)."""
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if name not in names:
        return default
    i = names.index(name)
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _expand(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _expr(size):
    """A size (int or SymInt) as a sympy expression."""
    import sympy

    if isinstance(size, torch.SymInt):
        return size.node.expr
    return sympy.Integer(int(size))


def _pool_rewrites(node: fx.Node) -> dict:
    """torch's recorded output size of each spatial dim -> the exact one, where they differ."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    n = _POOLS[node.target]
    k = _expand(_arg(node, "kernel_size", ()), n)
    s = _expand(_arg(node, "stride", ()) or k, n)
    p = _expand(_arg(node, "padding", 0), n)
    d = _expand(_arg(node, "dilation", 1), n)
    x = node.args[0].meta.get("val")
    out = node.meta.get("val")
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return {}
    rewrites = {}
    for i in range(n):
        recorded = out.shape[out.dim() - n + i]
        if not isinstance(recorded, torch.SymInt):
            continue  # a static input length: torch's answer is exact
        length = _expr(x.shape[x.dim() - n + i])
        windows = FloorDiv(length + 2 * p[i] - d[i] * (k[i] - 1) - 1 + s[i] - 1, s[i]) + 1
        starts_inside = FloorDiv(length + p[i] - 1, s[i]) + 1
        exact = sympy.Min(windows, starts_inside)
        torch_size = recorded.node.expr
        if _differ(torch_size, exact):
            rewrites[torch_size] = exact
    return rewrites


def _differ(a, b, sizes=range(1, 48)) -> bool:
    """Whether two size expressions over the same symbols differ for some size >= 1
    (every symbol set to one value at a time: pool lengths are single dims)."""
    free = sorted(a.free_symbols | b.free_symbols, key=str)
    for v in sizes:
        env = {sym: v for sym in free}
        want = b.xreplace(env)
        if int(want) >= 1 and int(a.xreplace(env)) != int(want):
            return True
    return False


def _reshape_rewrites(shape_env) -> dict:
    """``floordiv(n, floordiv(n, k)) -> k`` for each ``n`` torch checked divisible by ``k``."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod

    rewrites = {}
    for g in getattr(shape_env, "guards", ()):
        expr = g.expr.xreplace(shape_env.replacements)
        if not isinstance(expr, sympy.Eq) or expr.rhs != 0 or not isinstance(expr.lhs, Mod):
            continue
        n, k = expr.lhs.args
        if isinstance(k, sympy.Integer) and int(k) > 0:
            rewrites[FloorDiv(n, FloorDiv(n, k))] = k
    return rewrites
