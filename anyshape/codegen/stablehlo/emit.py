"""Print an IR ``Graph`` as a StableHLO MLIR module: ``func.func public @main``.

Sits after the shared IR passes; prints a Graph as StableHLO text for other MLIR
compilers and for anyshape's StableHLO frontend (the bridge a PyTorch model
captured by anyshape takes into MLIR). Not a backend: nothing is compiled here.

The function's arguments are the graph's inputs in order (``%arg0`` ...,
each named by an ``anyshape.name`` attribute), then one ``tensor<i64>`` per
symbol no input dim carries (``anyshape.symbol``); it returns the graph's
outputs in order. A symbolic dim is ``?`` in the types. Every symbol is read
once from the input dim that carries it (``stablehlo.get_dimension_size``, as
``ShapeBinder`` binds it) and dim expressions are computed from those scalars.
What the binder checks on a call (input dims that repeat a symbol or are
expressions of symbols, symbol ranges, the store's guards) becomes a
``stablehlo.custom_call @shape_assertion``, the convention JAX's exported
modules use. Weights (``param``) are constants: inline hex
(``dense<"0x...">``) or ``dense_resource`` blobs in the module's
``dialect_resources`` section (``weights="resource"``).

An op or case StableHLO cannot express raises ``UnsupportedError`` naming it.
"""

from __future__ import annotations

import re

import numpy as np

from ...errors import UnsupportedError
from ...ir.constraints import Guard
from ...ir.dtypes import DType
from ...ir.graph import Graph, Node, graph_symbols
from ...ir.symbolic import SymExpr, format_expr
from ...ir.types import TensorType
from ...runtime.binder import InputSpec, ShapeBinder
from . import index_ops, ops, reduce_ops
from .builder import I64, Builder, literal, mlir_string, tensor_type

RULES: dict[str, ops.Rule] = {**ops.RULES, **index_ops.RULES, **reduce_ops.RULES}
WEIGHT_MODES = ("inline", "resource")
_GUARD_DIRECTIONS = {"eq": "EQ", "ne": "NE", "le": "LE"}


def graph_to_stablehlo(
    graph: Graph, *, weights: str = "inline", output_names: list[str] | None = None
) -> str:
    """The StableHLO module computing ``graph``, as MLIR text.

    ``weights``: ``"inline"`` writes each weight as a hex ``dense`` constant;
    ``"resource"`` as ``dense_resource<name>`` with the bytes in the module's
    ``dialect_resources`` section (what torch-mlir writes for large weights).
    ``output_names`` name the results (``{anyshape.name = ...}``; the StableHLO
    frontend reads them back). Raises ``UnsupportedError`` for an op or case
    StableHLO cannot express.
    """
    if output_names is not None and len(output_names) != len(graph.outputs):
        raise ValueError(f"{len(output_names)} output names for {len(graph.outputs)} outputs")
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {weights!r}")
    return _ModuleEmitter(graph, weights, output_names).run()


class _ModuleEmitter:
    """One module's emission: arguments, symbol bindings, checks, nodes, return."""

    def __init__(self, graph: Graph, weights: str, output_names: list[str] | None = None):
        self.output_names = output_names
        self.graph = graph
        self.weights = weights
        self.b = Builder(graph.constraints)
        specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in graph.inputs]
        self.binder = ShapeBinder(specs, graph.constraints, what=f"graph @{graph.name}")
        self.extra = sorted(graph_symbols(graph) - self.binder.origin.keys())
        self.values: dict[int, str] = {}
        self.resources: dict[str, str] = {}  # resource key -> hex blob
        self._resource_keys: dict[str, str] = {}  # param name -> resource key
        self._dim_sizes: dict[tuple[int, int], str] = {}

    # --- the module ----------------------------------------------------------
    def run(self) -> str:
        args = self._arguments()
        self._bind_symbols()
        self._checks()
        for node in self.graph.nodes():
            if id(node) not in self.values:
                self.values[id(node)] = self._node(node)
        results = [self.values[id(o)] for o in self.graph.outputs]
        result_types = [tensor_type(o.dtype, o.shape) for o in self.graph.outputs]
        self.b.emit(
            f"return {', '.join(results)} : {', '.join(result_types)}" if results else "return"
        )
        name = _symbol_name(self.graph.name)
        lines = [
            f"module @{name} {{",
            f"  func.func public @main({', '.join(args)}) -> ({', '.join(self._results(result_types))}) {{",
            *self.b.lines,
            "  }",
            "}",
        ]
        return "\n".join(lines) + "\n" + self._resource_section()

    def _results(self, result_types: list[str]) -> list[str]:
        if self.output_names is None:
            return result_types
        return [
            f"{t} {{anyshape.name = {mlir_string(n)}}}"
            for t, n in zip(result_types, self.output_names)
        ]

    def _arguments(self) -> list[str]:
        out = []
        for i, node in enumerate(self.graph.inputs):
            name = f"%arg{i}"
            self.values[id(node)] = name
            attr = f"anyshape.name = {mlir_string(node.attr('name'))}"
            out.append(f"{name}: {tensor_type(node.dtype, node.shape)} {{{attr}}}")
        for j, sym in enumerate(self.extra, start=len(self.graph.inputs)):
            self.b.symbols[sym] = f"%arg{j}"
            out.append(f"%arg{j}: {tensor_type(I64, ())} {{anyshape.symbol = {mlir_string(sym)}}}")
        return out

    def _input_dim(self, i: int, d: int) -> str:
        """The run-time size of dim ``d`` of input ``i``, as an i64 scalar."""
        key = (i, d)
        if key not in self._dim_sizes:
            node = self.graph.inputs[i]
            size = self.b.op(
                f"stablehlo.get_dimension_size %arg{i}, dim = {d} : "
                f"({tensor_type(node.dtype, node.shape)}) -> tensor<i32>"
            )
            self._dim_sizes[key] = self.b.convert(size, DType.i32, I64, ())
        return self._dim_sizes[key]

    def _bind_symbols(self) -> None:
        for i, d, sym in self.binder.binds:
            self.b.symbols[sym] = self._input_dim(i, d)
        scalar = tensor_type(I64, ())
        for i, d, sym, dim in self.binder.solves:
            # dim == base + coeff * sym: sym = (size - base) / coeff, checked below.
            base = dim.subs({sym: 0})
            coeff = (dim.subs({sym: 1}) - base).constant_value
            rest = self.b.binary("subtract", self._input_dim(i, d), self.b.dim(base), scalar)
            self.b.symbols[sym] = self.b.binary("divide", rest, self.b.dim(coeff), scalar)

    # --- checks ----------------------------------------------------------------
    def _assert(self, pred: str, message: str, values: list[str]) -> None:
        """``shape_assertion(pred)``: the message's ``{i}`` is the value of ``values[i]``."""
        operands = ", ".join([pred, *values])
        types = ", ".join(["tensor<i1>"] + [tensor_type(I64, ())] * len(values))
        self.b.emit(
            f"stablehlo.custom_call @shape_assertion({operands}) {{api_version = 2 : i32, "
            f"error_message = {mlir_string(message)}, has_side_effect = true}} : ({types}) -> ()"
        )

    def _compare(self, direction: str, lhs, rhs) -> str:
        return self.b.compare(direction, self.b.dim(lhs), self.b.dim(rhs), I64, ())

    def _where(self, sym: str) -> str:
        if sym not in self.binder.origin:
            return "an argument"
        i, d = self.binder.origin[sym]
        return f"input {self.binder.specs[i].name!r} dim {d}"

    def _checks(self) -> None:
        specs = self.binder.specs
        for i, d, sym, _ in self.binder.solves:
            pred = self._compare("GE", SymExpr.symbol(sym), 0)
            message = _escape(f"input {specs[i].name!r} dim {d}: got ") + "{0}"
            message += _escape(f", which no value of {sym} fits")
            self._assert(pred, message, [self._input_dim(i, d)])
        # A dim solved for its symbol holds by construction when the division was exact.
        exact = {(i, d) for i, d, sym, dim in self.binder.solves if _unit_coefficient(dim, sym)}
        for i, d, dim in self.binder.checks:
            if isinstance(dim, int) or (i, d) in exact:
                continue  # the argument's type holds it, or the binding did
            size = self._input_dim(i, d)
            pred = self.b.compare("EQ", size, self.b.dim(dim), I64, ())
            message = _escape(f"input {specs[i].name!r} dim {d}: expected {format_expr(dim)}")
            self._assert(pred, message + " = {1}, got {0}", [size, self.b.dim(dim)])
        known = self.binder.origin.keys() | set(self.extra)
        for sym in sorted(known):
            lo, hi = self.graph.constraints.ranges.get(sym, (0, None))
            bound = f"[{lo}, {'inf' if hi is None else hi}]"
            message = (
                _escape(f"{self._where(sym)} = ")
                + "{0}"
                + _escape(f" is outside the range {sym} in {bound} the graph was compiled for")
            )
            value, symbol = self.b.dim(SymExpr.symbol(sym)), SymExpr.symbol(sym)
            if lo == hi:
                self._assert(self._compare("EQ", symbol, lo), message, [value])
                continue
            if lo > 0:
                self._assert(self._compare("GE", symbol, lo), message, [value])
            if hi is not None:
                self._assert(self._compare("LE", symbol, hi), message, [value])
        for guard in self.graph.constraints.guards:
            if (guard.lhs.free_symbols | guard.rhs.free_symbols) <= known:
                self._guard(guard)

    def _guard(self, guard: Guard) -> None:
        pred = self._compare(_GUARD_DIRECTIONS[guard.op], guard.lhs, guard.rhs)
        symbols = sorted(guard.lhs.free_symbols | guard.rhs.free_symbols)
        parts = [
            _escape(f"{s} = ") + f"{{{k}}}" + _escape(f" from {self._where(s)}")
            for k, s in enumerate(symbols)
        ]
        message = _escape(f"shape constraint {guard} ({guard.reason}) does not hold")
        if parts:
            message += ": " + ", ".join(parts)
        self._assert(pred, message, [self.b.dim(SymExpr.symbol(s)) for s in symbols])

    # --- nodes ---------------------------------------------------------------------
    def _node(self, node: Node) -> str:
        if node.op == "param":
            return self._param(node)
        rule = RULES.get(node.op)
        if rule is None:
            raise UnsupportedError(f"op {node.op!r} has no StableHLO form in this emitter")
        args = [self.values[id(i)] for i in node.inputs]
        try:
            return rule(self.b, node, args)
        except UnsupportedError as e:
            raise UnsupportedError(f"{node.op} ({node.type}): {e}") from None

    def _param(self, node: Node) -> str:
        name = node.attr("name")
        key = ("param", name, node.type)
        return self.b.cached(key, lambda: self._weight(node, name))

    def _weight(self, node: Node, name: str) -> str:
        array = self.graph.params.get(name)
        if array is None:
            raise ValueError(f"param {name!r} has no value in the graph's params")
        array = np.asarray(array)
        want = TensorType(node.dtype, node.shape)
        if not want.is_static or tuple(array.shape) != want.shape:
            raise ValueError(f"param {name!r} holds shape {array.shape}, the graph says {want}")
        if DType.from_numpy(array.dtype) is not node.dtype:
            raise ValueError(f"param {name!r} holds {array.dtype}, the graph says {node.dtype}")
        ty = tensor_type(node.dtype, node.shape)
        if array.size == 0:
            return self.b.op(f"stablehlo.constant dense<> : {ty}")
        flat = array.reshape(-1)
        data = _little_endian_bytes(array)
        first = data[: array.dtype.itemsize]
        if array.size > 1 and data == first * array.size and not _has_nan(flat[:1]):
            # One value repeated (a zero bias, say): a splat.
            return self.b.op(
                f"stablehlo.constant dense<{literal(flat[0].item(), node.dtype)}> : {ty}"
            )
        if self.weights == "inline":
            return self.b.op(f'stablehlo.constant dense<"0x{data.hex().upper()}"> : {ty}')
        key = self._resource_key(name)
        align = max(array.dtype.itemsize, 1)
        self.resources[key] = "0x" + align.to_bytes(4, "little").hex().upper() + data.hex().upper()
        return self.b.op(f"stablehlo.constant dense_resource<{key}> : {ty}")

    def _resource_key(self, name: str) -> str:
        if name in self._resource_keys:
            return self._resource_keys[name]
        key = re.sub(r"[^A-Za-z0-9_.]", "_", name)
        if not re.match(r"[A-Za-z_]", key):
            key = "_" + key
        base, n = key, 1
        while key in self.resources or key in self._resource_keys.values():
            key, n = f"{base}_{n}", n + 1
        self._resource_keys[name] = key
        return key

    def _resource_section(self) -> str:
        if not self.resources:
            return ""
        blobs = [f'      {key}: "{blob}"' for key, blob in self.resources.items()]
        return "\n".join(
            [
                "{-#",
                "  dialect_resources: {",
                "    builtin: {",
                ",\n".join(blobs),
                "    }",
                "  }",
                "#-}",
                "",
            ]
        )


def _unit_coefficient(dim: SymExpr, sym: str) -> bool:
    return abs((dim.subs({sym: 1}) - dim.subs({sym: 0})).constant_value) == 1


def _little_endian_bytes(array: np.ndarray) -> bytes:
    dtype = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def _has_nan(flat: np.ndarray) -> bool:
    return flat.dtype.kind == "f" and bool(np.isnan(flat).any())


def _escape(text: str) -> str:
    """Text for a shape assertion message, whose ``{i}`` are placeholders: braces doubled."""
    return text.replace("{", "{{").replace("}", "}}")


def _symbol_name(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name):
        return name
    return mlir_string(name)
