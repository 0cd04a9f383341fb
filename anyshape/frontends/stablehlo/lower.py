"""Lowering a StableHLO program to one IR graph: the StableHLO frontend's driver.

Sits after the reader (``reader.py``: the parsed module, its functions, resource
blobs) and before the shared compile path (``pipelines.compile_graph``). The
entry function's arguments become graph inputs, each ``?`` dim a symbol; its
ops are lowered in order through the rule table (``context.RULES``, filled by
``elementwise.py``, ``shape_ops.py``, ``compute_ops.py``, ``dialect_ops.py``).

- ``func.call`` is inlined: the callee's body is lowered with the call's operand
  values, so ``jax.export``'s wrapped main and private helpers vanish. So is a
  ``stablehlo.composite`` (jax wraps ``chlo.erf`` and others in one): its
  decomposition function.
- Symbols are named before lowering (``name_symbols``): a dim ``jax.export``
  passes to its wrapped function as ``jax.global_constant = "b"`` is ``b``; dims a
  ``shape_assertion`` checks equal share one symbol, so the call prologue reports
  a wrong size as the input, the dim, the expected and the received size.
- Every other ``shape_assertion`` becomes a guard checked in the prologue, with
  the producer's message.

After each op, the lowered value is checked against the op's declared result
type (dtype, rank and static dims; a declared static size of a symbolic dim is
guarded), so a lowering bug names the op instead of returning a wrong result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UnsupportedError
from ...ir.graph import Graph, GraphBuilder
from ...ir.symbolic import SymExpr, as_dim, as_expr, floordiv, mod
from ...ir.types import TensorType
from ..building import ir_name
from ..values import Value, lowering_error
from . import compute_ops, dialect_ops, elementwise, shape_ops  # noqa: F401  (fill RULES)
from .context import RULES, LowerCtx, OpView, canonical_name
from .reader import Program, tensor_type

RETURNS = ("func.return", "stablehlo.return", "shape.assuming_yield")


@dataclass
class LoweredProgram:
    graph: Graph
    input_names: list[str]
    output_names: list[str]


def lower_program(program: Program) -> LoweredProgram:
    """The entry function as one IR graph, or an ``UnsupportedError`` naming an op."""
    builder = GraphBuilder(name=program.name[:48] or "stablehlo")
    ctx = LowerCtx(builder, program)
    ctx.env = {}  # MLIR value -> Value, across inlined calls and regions
    ctx.lower_region = lambda ops: lower_ops(ctx, ops)
    entry = program.entry
    block = entry.regions[0].blocks[0]
    names = argument_names(entry)
    symbols = name_symbols(program, names)
    args = []
    for i, (arg, name) in enumerate(zip(block.arguments, names)):
        dtype, dims = tensor_type(arg.type)
        shape = tuple(symbols[(i, d)] if n is None else n for d, n in enumerate(dims))
        v = Value.of_node(builder.input(name, TensorType(dtype, shape)))
        v.input_name = name
        args.append(v)
    outs = lower_function(ctx, entry, args)
    outputs = [ctx.node(v) for v in outs]
    return LoweredProgram(builder.build(outputs), names, result_names(entry, len(outputs)))


def argument_names(func) -> list[str]:
    """Input names: ``jax.arg_info`` / ``anyshape.name`` / ``tf._user_specified_name``,
    else ``arg0``, ``arg1``..."""
    block = func.regions[0].blocks[0]
    attrs = _arg_attrs(func, "arg_attrs", len(block.arguments))
    taken: set[str] = set()
    names = []
    for i, a in enumerate(attrs):
        text = None
        for key in ("anyshape.name", "jax.arg_info", "tf._user_specified_name"):
            if key in a:
                text = str(a[key]).strip('"')
                break
        names.append(ir_name(text.strip("_") if text else f"arg{i}", taken))
    return names


def result_names(func, count: int) -> list[str]:
    attrs = _arg_attrs(func, "res_attrs", count)
    taken: set[str] = set()
    out = []
    for i, a in enumerate(attrs):
        text = None
        for key in ("anyshape.name", "jax.result_info"):
            if key in a:
                text = str(a[key]).strip('"')
                break
        out.append(ir_name(text.strip("_") if text else f"out{i}", taken))
    return out


def _arg_attrs(func, key: str, count: int) -> list[dict]:
    if key not in func.attributes:
        return [{} for _ in range(count)]
    out = []
    for d in func.attributes[key]:
        out.append({k: d[k] for k in _dict_keys(d)})
    return out + [{} for _ in range(count - len(out))]


def _dict_keys(d) -> list[str]:
    try:
        return [na.name for na in d]
    except AttributeError:
        return list(d)


def name_symbols(program: Program, names: list[str]) -> dict[tuple[int, int], SymExpr]:
    """A symbol for every ``?`` dim of the entry's arguments (see the module docstring)."""
    entry = program.entry
    block = entry.regions[0].blocks[0]
    arg_index = {a: i for i, a in enumerate(block.arguments)}
    dim_of = {}  # get_dimension_size result -> (arg, dim)
    parent: dict[tuple[int, int], tuple[int, int]] = {}
    label: dict[tuple[int, int], str] = {}

    def find(k):
        while parent.get(k, k) != k:
            k = parent[k]
        return k

    compares = {}
    for op in block.operations:
        o = op.operation
        name = canonical_name(o.name)
        if name == "stablehlo.get_dimension_size" and o.operands[0] in arg_index:
            dim = int(str(o.attributes["dimension"]).split(":")[0])
            dim_of[o.results[0]] = (arg_index[o.operands[0]], dim)
        elif name == "stablehlo.convert" and o.operands[0] in dim_of:
            dim_of[o.results[0]] = dim_of[o.operands[0]]  # the size as another integer type
        elif name == "stablehlo.compare" and "EQ" in str(o.attributes["comparison_direction"]):
            a, b = (dim_of.get(x) for x in o.operands)
            if a is not None and b is not None:
                compares[o.results[0]] = (a, b)
        elif name == "stablehlo.custom_call" and _is_shape_assertion(o) and o.operands:
            pair = compares.get(o.operands[0])
            if pair is not None:
                ra, rb = find(pair[0]), find(pair[1])
                if ra != rb:
                    ra, rb = min(ra, rb), max(ra, rb)  # the first input's dim names the class
                    parent[rb] = ra
        elif name == "func.call":
            callee = program.functions.get(str(o.attributes["callee"]).lstrip("@"))
            if callee is None:
                continue
            for x, a in zip(o.operands, _arg_attrs(callee, "arg_attrs", len(o.operands))):
                if x in dim_of and str(a.get("jax.global_constant", '""')).strip('"'):
                    label[dim_of[x]] = str(a["jax.global_constant"]).strip('"')
    by_root: dict[tuple[int, int], str] = {}
    for key, text in label.items():
        by_root.setdefault(find(key), ir_name(text, set()).replace(".", "_"))
    out = {}
    taken = set(by_root.values())
    for i, arg in enumerate(block.arguments):
        _, dims = tensor_type(arg.type)
        for d, n in enumerate(dims):
            if n is not None:
                continue
            root = find((i, d))
            if root not in by_root:
                by_root[root] = ir_name(f"{names[root[0]]}_d{root[1]}".replace(".", "_"), taken)
            out[(i, d)] = SymExpr.symbol(by_root[root])
    return out


def _is_shape_assertion(o) -> bool:
    return str(o.attributes["call_target_name"]).strip('"') == "shape_assertion"


def lower_function(ctx: LowerCtx, func, args: list[Value]) -> list[Value]:
    """Lower a ``func.func``'s body with ``args`` for its block arguments (inlining)."""
    block = func.regions[0].blocks[0]
    if len(block.arguments) != len(args):
        raise UnsupportedError(
            f"@{str(func.attributes['sym_name']).strip(chr(34))} takes {len(block.arguments)} "
            f"arguments, called with {len(args)}"
        )
    ctx.env.update(zip(block.arguments, args))
    return lower_ops(ctx, list(block.operations))


def lower_ops(ctx: LowerCtx, ops: list) -> list[Value]:
    """Lower ``ops`` in order; returns what they return. Values live in ``ctx.env`` (MLIR
    values are unique in a module, so one map serves every inlined call and region)."""
    env = ctx.env
    for op in ops:
        o = op.operation
        name = canonical_name(o.name)
        operands = []
        for x in o.operands:
            if x not in env:
                raise UnsupportedError(f"{name}: reads a value not defined before it")
            operands.append(env[x])
        if name in RETURNS:
            return operands
        if name in ("func.call", "stablehlo.composite"):
            key = "callee" if name == "func.call" else "decomposition"
            callee_name = str(o.attributes[key]).lstrip("@")
            callee = ctx.program.functions.get(callee_name)
            if callee is None:
                raise UnsupportedError(f"{name} of @{callee_name}, which the module lacks")
            outs = _dim_division(callee_name, operands) or lower_function(ctx, callee, operands)
        else:
            outs = _lower_op(ctx, OpView(op, operands, ctx.program))
        for r, v in zip(o.results, outs):
            env[r] = v
    raise UnsupportedError("a function or region without a return")


_DIM_DIVISIONS = {"floor_divide": floordiv, "remainder": mod}


def _dim_division(callee: str, operands: list[Value]) -> list[Value] | None:
    """jax's private ``@floor_divide`` / ``@remainder`` helpers (written with ``sign`` and
    ``select``) on dims: the floor division or modulo of the dims, when the numerator
    is a dim (never negative) and the divisor a positive constant."""
    fn = _DIM_DIVISIONS.get(callee)
    if fn is None or len(operands) != 2 or any(v.rank != 0 for v in operands):
        return None
    a, b = (v.dims() for v in operands)
    if a is None or b is None or not as_expr(a[0]).nonneg:
        return None
    if not isinstance(as_dim(b[0]), int) or as_dim(b[0]) <= 0:
        return None
    return [Value.of_known((as_dim(fn(as_expr(a[0]), as_dim(b[0]))),), operands[0].dtype, True)]


def _lower_op(ctx: LowerCtx, view: OpView) -> list[Value]:
    fn = RULES.get(view.name)
    if fn is None:
        raise UnsupportedError(
            f"{view.describe()}: op not supported by the StableHLO frontend "
            f"(anyshape.stablehlo.supported_ops() lists those it lowers)"
        )
    try:
        outs = fn(ctx, view)
    except Exception as e:  # named after the op, never a bare traceback
        raise lowering_error(e, view.describe(), view.name, "program") from e.__cause__
    for i, v in enumerate(outs):
        if v is not None and v.fact is None and i < view.num_results:
            _check_declared(ctx, view, i, v)
    return outs


def _check_declared(ctx: LowerCtx, view: OpView, i: int, v: Value) -> None:
    try:
        dtype, dims = view.result_type(i)
    except UnsupportedError:
        return  # a witness, a token: nothing to compare
    if dtype != v.dtype or len(dims) != v.rank:
        raise UnsupportedError(
            f"{view.describe()}: result {i} lowered as {v.dtype}{list(v.shape)}, declared "
            f"{dtype}{['?' if d is None else d for d in dims]} (an anyshape bug)"
        )
    for k, (want, got) in enumerate(zip(dims, v.shape)):
        if want is None:
            continue
        got = as_dim(got)
        if isinstance(got, int):
            if got != want:
                raise UnsupportedError(
                    f"{view.describe()}: result {i} dim {k} lowered as {got}, declared {want} "
                    "(an anyshape bug)"
                )
        else:
            ctx.b.constraints.guard_eq(as_expr(got), want, f"{view.describe()} declares dim {k}")
