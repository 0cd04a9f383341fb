"""C++ expressions for fused values: what a node's element at a given index is.

Sits under ``kernels``. A ``KernelScope`` collects one kernel's parameters (the
buffers it reads or writes as ``P[k]``, bound to restrict-qualified ``pk``, the run-time integers it needs as
``D[k]``) and its statements; ``value(node, idx)`` returns a C++ expression for
``node`` at index vector ``idx`` (C++ expressions over loop variables), walking
through fused producers and loading from materialized ones. Because kernels
see only ``P``/``D``, identical loop nests (repeated layers) print identically
and are emitted once. A scope that ``generalizes`` writes each static size of
``FAMILY_MIN`` or more as a run-time integer too, so loop nests that differ only
in such sizes (ResNet's blocks at 64 to 2048 channels) print identically as well
(``families`` then writes back the sizes every call shares).

Reads stay in bounds even under selects that discard them: pad, concatenate and
gather clamp the index they read with, and every buffer has at least one
element of backing storage.
"""

from __future__ import annotations

import math

from ...errors import UnsupportedError
from ...ir.graph import Node
from ...ir.symbolic import SymExpr, as_dim, as_expr, format_dim, shape_numel
from ...schedule.op_classes import INDEX_OPS, NOT_RECOMPUTED
from ...schedule.plan import Schedule
from ...schedule.variants import ONE, SAME, broadcast_dim
from .ctypes_map import c_type, compute_type, literal, rounded
from .loop_ir import const

# Static sizes from this one up are run-time integers in a generalizing scope; smaller
# ones (kernel windows, strides, short rows) stay literals the compiler unrolls on.
FAMILY_MIN = 16

UNARY = {
    "neg": "(-{0})",
    "abs": "as_abs({0})",
    "exp": "as_exp({0})",
    "log": "as_log({0})",
    "log1p": "as_log1p({0})",
    "expm1": "as_expm1({0})",
    "sqrt": "as_sqrt({0})",
    "rsqrt": "(({t})1 / as_sqrt({0}))",
    "sin": "as_sin({0})",
    "cos": "as_cos({0})",
    "tan": "as_tan({0})",
    "asin": "as_asin({0})",
    "acos": "as_acos({0})",
    "atan": "as_atan({0})",
    "sinh": "as_sinh({0})",
    "cosh": "as_cosh({0})",
    "tanh": "as_tanh({0})",
    "asinh": "as_asinh({0})",
    "acosh": "as_acosh({0})",
    "atanh": "as_atanh({0})",
    "erf": "as_erf({0})",
    "sigmoid": "as_sigmoid({0})",
    "floor": "as_floor({0})",
    "ceil": "as_ceil({0})",
    "round": "as_nearbyint({0})",
    "trunc": "as_trunc({0})",
    "sign": "as_sign({0})",
    "bitwise_not": "(~{0})",
    "isnan": "as_isnan({0})",
    "isinf": "as_isinf({0})",
}
BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "max": "as_max({0}, {1})",
    "min": "as_min({0}, {1})",
    "pow": "as_pow({0}, {1})",
    "atan2": "as_atan2({0}, {1})",
    "and": "({0} & {1})",
    "or": "({0} | {1})",
    "xor": "({0} ^ {1})",
    "shl": "({0} << {1})",
    "shr": "({0} >> {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
}
BOOL_LOGIC = {"and": "({0} && {1})", "or": "({0} || {1})", "xor": "({0} != {1})"}
# Ops that compute a new value (not an index op passing one through): f16 results round.
ROUNDING_OPS = {*UNARY, *BINARY, "div", "rem", "convert"}


class KernelScope:
    """Parameters and statements of one kernel being emitted."""

    def __init__(self, sched: Schedule, buffer_of: dict[int, int]):
        self.sched = sched
        self.buffer_of = buffer_of  # node id -> buffer id
        self.ptrs: list[int] = []  # buffer ids, P[k]
        self.ints: list[SymExpr] = []  # run-time integers, D[k]
        self.lines: list = []  # loop-nest statements (loop_ir) of the block being emitted
        self.memo: dict[tuple, str] = {}
        self.counter = 0
        self.element_cost = 1  # relative work per element (kernels.element_cost)
        self.needs_error_flag = False
        self.generalize = False  # static sizes >= FAMILY_MIN as run-time integers too
        # Speculation: a dim that may broadcast at run time (size 1) costs a select per
        # index; the no-broadcast variant assumes the plan's sizes are not 1.
        self.speculate = False
        self.assumed: tuple = ()  # the plan's BroadcastVariant.assumed
        # Speculation on extents: the variant for fewer rows (outputs) than threads splits
        # each row (reduction) over the threads instead of handing whole rows to them.
        self.split = False

    def begin_variant(self, speculate: bool, split: bool) -> None:
        """Start emitting another variant of the same kernel (same P and D)."""
        self.lines, self.memo, self.counter = [], {}, 0
        self.speculate, self.split = speculate, split

    # --- parameters ------------------------------------------------------
    def ptr(self, node: Node) -> str:
        b = self.buffer_of[id(node)]
        if b not in self.ptrs:
            self.ptrs.append(b)
        return f"p{self.ptrs.index(b)}"

    def integer(self, source) -> str:
        if source not in self.ints:
            self.ints.append(source)
        return f"D_{self.ints.index(source)}"  # a local copy of D[k] (see emit_kernel)

    def dim(self, d) -> str:
        d = as_dim(d)
        if isinstance(d, int) and not (self.generalize and d >= FAMILY_MIN):
            return str(d)
        return self.integer(d)

    def stride(self, node: Node, i: int) -> str:
        """Element stride of dim ``i``: every buffer is contiguous (the runtime ensures it)."""
        return self.dim(shape_numel(node.shape[i + 1 :]))

    def tmp(self, ctype: str, expr: str) -> str:
        name = f"t{self.counter}"
        self.counter += 1
        self.lines.append(const(ctype, name, expr))
        return name

    # --- values ------------------------------------------------------------
    def load(self, node: Node, idx) -> str:
        buf = self.ptr(node)
        terms = [
            i if self.stride(node, k) == "1" else f"({i}) * {self.stride(node, k)}"
            for k, i in enumerate(idx)
        ]
        off = " + ".join(terms) if terms else "0"
        return _typed_load(node, buf, off)

    def _flat_value(self, x: Node, flat: str) -> str | None:
        """``x`` at row-major offset ``flat``, if it is elementwise over same-shaped buffers."""
        if self.sched.is_materialized(x):
            return self.load_flat(x, flat)
        shape = tuple(x.shape)
        if not x.inputs or any(tuple(i.shape) != shape for i in x.inputs):
            return None
        args = []
        for i in x.inputs:
            v = self._flat_value(i, flat)
            if v is None:
                return None
            args.append(v)
        t = compute_type(x.dtype)
        if x.op == "convert":
            if x.dtype.is_bool:
                return f"({args[0]} != 0)"
            return rounded(x.dtype, f"(({t})({args[0]}))")
        if x.op in UNARY:
            return rounded(x.dtype, UNARY[x.op].format(args[0], t=t))
        if x.op in BINARY:
            logic = x.inputs[0].dtype.is_bool and x.op in BOOL_LOGIC
            return rounded(x.dtype, (BOOL_LOGIC if logic else BINARY)[x.op].format(*args))
        if x.op == "select":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        return None

    def load_flat(self, node: Node, offset: str) -> str:
        expr = _typed_load(node, self.ptr(node), offset)
        ct = compute_type(node.dtype)
        return expr if _is_simple(expr) else self.tmp(ct, expr)

    def value(self, node: Node, idx: tuple[str, ...]) -> str:
        key = (id(node), tuple(idx))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if self.sched.is_materialized(node):
            expr = self.load(node, idx)
        else:
            expr = self.fused_expression(node, tuple(idx))
            if node.op in ROUNDING_OPS:
                expr = rounded(node.dtype, expr)
        if not _is_simple(expr):
            expr = self.tmp(compute_type(node.dtype), expr)
        self.memo[key] = expr
        return expr

    def fused_expression(self, n: Node, idx: tuple[str, ...]) -> str:
        """``n`` at ``idx`` computed from its operands' values (never a load of ``n``),
        by the op's entry in ``FUSED``."""
        render = FUSED.get(n.op)
        if render is None:
            raise UnsupportedError(f"the CPU backend cannot fuse {n.op}")
        return getattr(self, render)(n, idx)

    # --- generated and elementwise values ------------------------------------
    def _constant(self, n: Node, idx):
        return literal(n.attr("value"), n.dtype)

    def _shape_scalar(self, n: Node, idx):
        return f"(({compute_type(n.dtype)}){self.dim(n.attr('expr'))})"

    def _iota(self, n: Node, idx):
        return f"(({compute_type(n.dtype)})({idx[n.attr('dim')]}))"

    def _convert(self, n: Node, idx):
        x = self.value(n.inputs[0], idx)
        return f"({x} != 0)" if n.dtype.is_bool else f"(({compute_type(n.dtype)})({x}))"

    def _unary(self, n: Node, idx):
        return UNARY[n.op].format(self.value(n.inputs[0], idx), t=compute_type(n.dtype))

    def _binary(self, n: Node, idx):
        op, t = n.op, compute_type(n.dtype)
        if op == "pow" and n.dtype.is_float:
            k = _constant_of(n.inputs[1])
            if k is not None and float(k) in _POW_BY_PRODUCT:
                return _POW_BY_PRODUCT[float(k)](self.value(n.inputs[0], idx), t)
        if op == "mul" and t == "float" and (x := _gelu_erf_input(n)) is not None:
            return f"as_gelu_erff({self.value(x, idx)})"
        a, b = (self.value(i, idx) for i in n.inputs)
        table = BOOL_LOGIC if n.inputs[0].dtype.is_bool and op in BOOL_LOGIC else BINARY
        return table[op].format(a, b)

    def _quotient(self, n: Node, idx):
        a, b = (self.value(i, idx) for i in n.inputs)
        return self._divide(n, a, b)

    def _select(self, n: Node, idx):
        c, a, b = (self.value(i, idx) for i in n.inputs)
        return f"({c} ? {a} : {b})"

    def _op_reduce(self, n: Node, idx) -> str:
        raise UnsupportedError("a reduction is fused only into a stitch group's rows")

    def _divide(self, n: Node, a: str, b: str) -> str:
        if n.dtype.is_float:
            return f"({a} / {b})" if n.op == "div" else f"as_fmod({a}, {b})"
        self.needs_error_flag = True
        fn = "as_idiv" if n.op == "div" else "as_irem"
        return f"{fn}({a}, {b}, err)"

    # --- index ops ---------------------------------------------------------
    def _op_broadcast_in_dim(self, n: Node, idx):
        x = n.inputs[0]
        src = []
        for i, d in enumerate(n.attr("dims")):
            size = x.shape[i]
            how = broadcast_dim(self.sched.graph.constraints, size, n.shape[d])
            if how == ONE:
                src.append("0")
            elif how == SAME:
                src.append(idx[d])
            elif self.speculate:  # the no-broadcast variant (planned: variants.py)
                if size not in self.assumed:
                    raise UnsupportedError(
                        f"internal: the kernel plan did not assume {format_dim(size)} != 1"
                    )
                src.append(idx[d])
            else:
                src.append(f"({self.dim(size)} == 1 ? 0 : {idx[d]})")
        return self.value(x, tuple(src))

    def _op_transpose(self, n: Node, idx):
        perm = n.attr("perm")
        src = [""] * len(perm)
        for j, p in enumerate(perm):
            src[p] = idx[j]
        return self.value(n.inputs[0], tuple(src))

    def _op_slice(self, n: Node, idx):
        src = []
        for i, (s, k) in enumerate(zip(n.attr("start"), n.attr("stride"))):
            base = idx[i] if k == 1 else f"({idx[i]}) * {k}"
            src.append(base if s == 0 else f"{self.dim(s)} + {base}")
        return self.value(n.inputs[0], tuple(src))

    def _op_reshape(self, n: Node, idx):
        x = n.inputs[0]
        if tuple(x.shape) == tuple(n.shape):
            return self.value(x, idx)
        groups = _reshape_groups(tuple(n.shape), tuple(x.shape))
        if any(len(o) > 1 or len(i) > 1 for o, i in groups):
            # Buffers are row-major either way: when x is elementwise over buffers of its
            # own shape, read them at the flat index instead of splitting it into x's
            # dims (a divide and a modulo per element, which also block vectorizing).
            flat = self._flat_value(x, self._linear(tuple(n.shape), idx))
            if flat is not None:
                return flat
        src: list[str] = []
        for out_dims, in_dims in groups:
            if len(out_dims) == 1 and len(in_dims) == 1:
                src.append(idx[out_dims[0]])
                continue
            sub = [n.shape[d] for d in out_dims]
            lin = self._linear(sub, [idx[d] for d in out_dims])
            if len(in_dims) > 1 and not _is_simple(lin):
                lin = self.tmp("int64_t", lin)
            for k, d in enumerate(in_dims):
                if x.shape[d] == 1:  # (its index is 0: as text, ``i0 % 1`` misses the memo)
                    src.append("0")
                    continue
                inner = shape_numel([x.shape[j] for j in in_dims[k + 1 :]])
                q = lin if inner == 1 else f"({lin} / {self.dim(inner)})"
                src.append(q if k == 0 else f"({q} % {self.dim(x.shape[d])})")
        return self.value(x, tuple(src))

    def _linear(self, shape, idx) -> str:
        terms = []
        for i, ix in enumerate(idx):
            if shape[i] == 1:  # (a dim of one: its index is 0)
                continue
            inner = shape_numel(shape[i + 1 :])
            terms.append(ix if inner == 1 else f"({ix}) * {self.dim(inner)}")
        return " + ".join(terms) if terms else "0"

    def _clamped(self, i: str, size) -> str:
        return f"as_clamp({i}, {self.dim(size)})"

    def _op_pad(self, n: Node, idx):
        x, v = n.inputs
        conds, src = [], []
        for i, (lo, d) in enumerate(zip(n.attr("low"), x.shape)):
            lo = as_dim(lo)  # (a symbolic amount: a slice scatter's start)
            j = self.tmp("int64_t", f"{idx[i]} - ({self.dim(lo)})" if lo != 0 else idx[i])
            conds.append(f"{j} >= 0 && {j} < {self.dim(d)}")
            src.append(self._clamped(j, d))
        inside = " && ".join(conds) or "true"
        return f"(({inside}) ? {self.value(x, tuple(src))} : {self.value(v, ())})"

    def _op_concatenate(self, n: Node, idx):
        axis = n.attr("axis")
        offset: SymExpr | int = 0
        pieces = []
        for x in n.inputs:
            size = x.shape[axis]
            j = self.tmp("int64_t", f"{idx[axis]} - {self.dim(offset)}")
            src = list(idx)
            src[axis] = self._clamped(j, size)
            pieces.append((f"{j} < {self.dim(size)}", self.value(x, tuple(src))))
            offset = as_dim(as_expr(offset) + as_expr(size))
        expr = pieces[-1][1]
        for cond, val in reversed(pieces[:-1]):
            expr = f"({cond} ? {val} : {expr})"
        return expr

    def _index_value(self, idx_node: Node, idx, size) -> str:
        self.needs_error_flag = True
        raw = self.value(idx_node, idx)
        return self.tmp("int64_t", f"as_index((int64_t)({raw}), {self.dim(size)}, err)")

    def _op_gather(self, n: Node, idx):
        x, ind = n.inputs
        a, r = n.attr("axis"), ind.rank
        j = self._index_value(ind, idx[a : a + r], x.shape[a])
        return self.value(x, tuple(idx[:a]) + (j,) + tuple(idx[a + r :]))

    def _op_take_along_axis(self, n: Node, idx):
        x, ind = n.inputs
        a = n.attr("axis")
        j = self._index_value(ind, idx, x.shape[a])
        src = list(idx)
        src[a] = j
        return self.value(x, tuple(src))


# How each op the kernels compute in their loops is rendered as a C++ expression: the
# name of its ``KernelScope`` method (a subclass, ``StitchScope``, overrides some). Ops
# that are roots of their own kernel are ``kernels.EMITTERS``; graph inputs and weights
# are loads. ``tests/test_op_tables.py`` checks that every op of the op table is one
# of these or listed as unsupported with its reason.
FUSED = {
    "constant": "_constant",
    "shape_scalar": "_shape_scalar",
    "iota": "_iota",
    "convert": "_convert",
    **{op: "_unary" for op in UNARY},
    **{op: "_binary" for op in BINARY},
    "div": "_quotient",
    "rem": "_quotient",
    "select": "_select",
    # index ops and those computed once when shared: one method each; reductions only
    # inside a stitch group's rows
    **{op: f"_op_{op}" for op in sorted(INDEX_OPS | NOT_RECOMPUTED | {"reduce"})},
}
# Ops of the op table the CPU backend does not render, with the reason (none today).
UNSUPPORTED: dict[str, str] = {}


# x ** k for constant k as products (vectorizes; libm pow does not).
_POW_BY_PRODUCT = {
    1.0: lambda x, t: f"({x})",
    2.0: lambda x, t: f"({x} * {x})",
    3.0: lambda x, t: f"({x} * {x} * {x})",
    4.0: lambda x, t: f"(({x} * {x}) * ({x} * {x}))",
    -1.0: lambda x, t: f"(({t})1 / {x})",
}


def _typed_load(node: Node, buf: str, offset: str) -> str:
    """An element of ``buf`` in the compute type. Booleans are read as bytes: a ``bool``
    load in a loop kept GCC from vectorizing a masked select (3x slower attention mask)."""
    if node.dtype.is_bool:
        return f"(((const uint8_t*){buf})[{offset}] != 0)"
    raw = f"((const {c_type(node.dtype)}*){buf})[{offset}]"
    ct = compute_type(node.dtype)
    return raw if ct == c_type(node.dtype) else f"(({ct}){raw})"


def _constant_of(node: Node):
    """The value of a scalar constant, seen through broadcasts and converts; else None."""
    while node.op in ("broadcast_in_dim", "convert", "reshape"):
        node = node.inputs[0]
    if node.op == "constant" and node.rank == 0:
        return node.attr("value")
    return None


def _times(node: Node, value: float):
    """``x`` when ``node`` is ``x * value`` (either order, same dtype), else None."""
    if node.op != "mul":
        return None
    for x, k in (node.inputs, node.inputs[::-1]):
        c = _constant_of(k)
        if c is not None and abs(float(c) - value) <= 1e-7 * value and x.dtype == node.dtype:
            return x
    return None


def _gelu_erf_input(n: Node):
    """``x`` when ``n`` is ``(x * 0.5) * (1 + erf(x * (1/sqrt 2)))``, exact GELU as the
    torch lowering builds it (operands in either order), else None: vmath's
    ``as_gelu_erff`` computes it in 3 fewer ops per element."""
    for half, rest in (n.inputs, n.inputs[::-1]):
        x = _times(half, 0.5)
        if x is None or rest.op != "add" or rest.dtype != n.dtype:
            continue
        for one, e in (rest.inputs, rest.inputs[::-1]):
            c = _constant_of(one)
            if c is not None and float(c) == 1.0 and e.op == "erf" and e.dtype == n.dtype:
                if _times(e.inputs[0], 1.0 / math.sqrt(2.0)) is x:
                    return x
    return None


def _reshape_groups(out_shape, in_shape) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pair runs of output and input dims with provably equal products, left to right.

    A dim that passes through a reshape unchanged forms a group of its own, so its
    index is used as is (no divide or modulo in the loop). Size-1 dims join the
    group before them. When products cannot be matched symbolically, everything
    is one group (a flat index).
    """
    flat = [(tuple(range(len(out_shape))), tuple(range(len(in_shape))))]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(out_shape) and j < len(in_shape):
        oi, ij = [i], [j]
        po, pi = as_expr(out_shape[i]), as_expr(in_shape[j])
        i, j = i + 1, j + 1
        while po != pi:
            if _divides(po, pi) and i < len(out_shape):
                po, i = po * out_shape[i], i + 1
                oi.append(i - 1)
            elif _divides(pi, po) and j < len(in_shape):
                pi, j = pi * in_shape[j], j + 1
                ij.append(j - 1)
            elif i < len(out_shape) and j < len(in_shape):
                po, pi = po * out_shape[i], pi * in_shape[j]
                oi.append(i)
                ij.append(j)
                i, j = i + 1, j + 1
            else:
                break
        if po != pi:
            return flat
        groups.append((oi, ij))
    rest_out, rest_in = list(range(i, len(out_shape))), list(range(j, len(in_shape)))
    rest_sizes = [out_shape[d] for d in rest_out] + [in_shape[d] for d in rest_in]
    if not groups or any(size != 1 for size in rest_sizes):
        return flat
    groups[-1][0].extend(rest_out)
    groups[-1][1].extend(rest_in)
    return [(tuple(o), tuple(n)) for o, n in groups]


def _divides(a: SymExpr, b: SymExpr) -> bool:
    """``a`` divides ``b`` for every value of the symbols (a proper factor)."""
    if a == b or (a.is_constant and a.constant_value == 0):  # (a static dim of 0: no factor)
        return False
    if a.is_constant and b.is_constant:
        av, bv = a.constant_value, b.constant_value
        return av != 0 and bv % av == 0 and abs(av) < abs(bv)
    q = b // a  # (a product of atoms over a factor of it divides exactly; anything else
    return q * a == b  # keeps a floor division, which does not multiply back)


def _is_simple(expr: str) -> bool:
    return expr.isidentifier() or expr.replace(".", "").replace("-", "").isdigit()
