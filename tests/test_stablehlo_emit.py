"""StableHLO text from IR graphs (``anyshape.codegen.stablehlo``), checked by MLIR itself.

Every module is parsed and verified by jaxlib's MLIR bindings. Every op of the
op table is emitted by some case below, and every case runs on StableHLO's
reference interpreter (``stablehlo.eval_module``, which executes the dynamic
ops as they are) at two or more sizes against anyshape's own interpreter. Also:
``?`` dims and the dynamic ops for symbolic sizes, weights inline and as
``dense_resource`` blobs, shape assertions that JAX's shape refinement
evaluates, clear errors for what StableHLO cannot express, and PyTorch models
(an MLP, an attention block) captured, lowered and passed through the IR passes.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("jaxlib")

from jaxlib import _jax  # noqa: E402
from jaxlib.mlir import ir, passmanager  # noqa: E402
from jaxlib.mlir._mlir_libs import _jax_mlir_ext  # noqa: E402
from jaxlib.mlir.dialects import chlo, stablehlo  # noqa: E402

from anyshape.codegen.stablehlo import graph_to_stablehlo  # noqa: E402
from anyshape.errors import UnsupportedError  # noqa: E402
from anyshape.ir import DType, GraphBuilder, SymExpr, TensorType  # noqa: E402
from anyshape.ir.constraints import ConstraintStore  # noqa: E402
from anyshape.ir.graph import Graph, Node  # noqa: E402
from anyshape.ir.ops import OPS, UNARY_FLOAT  # noqa: E402
from anyshape.ir.symbolic import floordiv, mod, sym_max, sym_min  # noqa: E402
from anyshape.runtime.binder import InputSpec, ShapeBinder  # noqa: E402
from anyshape.runtime.interpreter import run_graph  # noqa: E402

F16, F32, F64, BF16 = DType.f16, DType.f32, DType.f64, DType.bf16
I32, I64, U8, B8 = DType.i32, DType.i64, DType.u8, DType.b8
S0, S1, S2 = (SymExpr.symbol(f"s{i}") for i in range(3))


# --- MLIR -------------------------------------------------------------------------------

_CONTEXT: list[ir.Context] = []


def _context() -> ir.Context:
    if not _CONTEXT:
        registry = ir.DialectRegistry()
        _jax_mlir_ext.register_dialects(registry)
        ctx = ir.Context()
        ctx.append_dialect_registry(registry)
        ctx.load_all_available_dialects()
        stablehlo.register_dialect(ctx)
        chlo.register_dialect(ctx)
        stablehlo.register_stablehlo_passes()
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


def parse(text: str) -> ir.Module:
    """The module, parsed and verified."""
    with _context():
        module = ir.Module.parse(text)
        assert module.operation.verify()
        return module


def _attr(array: np.ndarray) -> ir.DenseElementsAttr:
    array = np.array(array, order="C")  # (ascontiguousarray would make a scalar 1-d)
    return ir.DenseElementsAttr.get(array, signless=array.dtype.kind != "u")


def _refine_arguments(module: ir.Module, arrays: list[np.ndarray]) -> None:
    types = ",".join(str(_attr(a).type) for a in arrays)
    pipeline = f"builtin.module(stablehlo-refine-arguments{{types='{types}'}})"
    passmanager.PassManager.parse(pipeline).run(module.operation)


def evaluate(text: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The module run by StableHLO's reference interpreter.

    Shape assertions are left out (the interpreter has no custom calls). CHLO ops
    are first expanded into StableHLO, which needs the shapes refined first.
    """
    with _context():
        module = ir.Module.parse(text)
        calls: list[ir.Operation] = []

        def collect(op):
            if op.name == "stablehlo.custom_call":
                calls.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(collect)
        for op in calls:
            op.erase()
        if "chlo." in text:
            _refine_arguments(module, arrays)
            pipeline = (
                "builtin.module(stablehlo-refine-shapes,"
                "func.func(chlo-legalize-to-stablehlo),stablehlo-refine-shapes)"
            )
            passmanager.PassManager.parse(pipeline).run(module.operation)
        results = stablehlo.eval_module(module, [_attr(a) for a in arrays])
        return [np.array(r) for r in results]


def refine(text: str, arrays: list[np.ndarray]) -> bytes:
    """JAX's shape refinement for these arguments, which evaluates the shape assertions."""
    with _context():
        module = ir.Module.parse(text)
        _refine_arguments(module, arrays)
        buffer = io.BytesIO()
        module.operation.write_bytecode(buffer)
    return _jax.mlir.refine_polymorphic_shapes(
        buffer.getvalue(), enable_shape_assertions=True, validate_static_shapes=True
    )


def reference(graph: Graph, arrays: list[np.ndarray], env: dict | None = None) -> list:
    specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in graph.inputs]
    env = ShapeBinder(specs, graph.constraints).bind([a.shape for a in arrays], None, env)
    with np.errstate(all="ignore"):
        return run_graph(graph, arrays, env)


def check_numerics(graph: Graph, runs: list[list[np.ndarray]], tol: float = 2e-5) -> str:
    """Emit, verify, and compare every output with the interpreter at every run's sizes."""
    text = graph_to_stablehlo(graph)
    parse(text)
    for arrays in runs:
        want = reference(graph, arrays)
        got = evaluate(text, arrays)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            w = np.asarray(w)
            assert g.shape == w.shape, (i, g.shape, w.shape)
            assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
    return text


# --- graphs -----------------------------------------------------------------------------


def _builder() -> GraphBuilder:
    store = ConstraintStore()
    for i in range(3):
        store.add_symbol(f"s{i}")
    return GraphBuilder(store)


def _full(b: GraphBuilder, value, dtype: DType, shape) -> Node:
    return b.op("broadcast_in_dim", b.constant(value, dtype), shape=shape, dims=())


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@dataclass
class Case:
    graph: Graph
    runs: list[list[np.ndarray]]
    tol: float = 2e-5


def case_float_elementwise() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 6)))
    y = b.input("y", TensorType(F32, (S0, 6)))
    shape = x.shape
    unit = b.op("mul", b.op("tanh", x), _full(b, 0.9, F32, shape))
    big = b.op("add", b.op("abs", x), _full(b, 1.0, F32, shape))
    domain = {"asin": unit, "acos": unit, "atanh": unit, "log": big, "sqrt": big}
    domain.update(rsqrt=big, acosh=big, log1p=big)
    outs = [b.op(name, domain.get(name, x)) for name in UNARY_FLOAT]
    outs += [b.op(name, x) for name in "atan neg abs floor ceil round trunc sign".split()]
    outs += [b.op(name, x, y) for name in "add sub mul div rem max min atan2".split()]
    outs += [b.op("pow", big, y), b.op("select", b.op("lt", x, y), x, y)]
    outs += [b.op(name, x, y) for name in "eq ne lt le gt ge".split()]
    outs += [b.op("isnan", y), b.op("isinf", y), b.op("sign", y), b.op("convert", x, dtype=I32)]
    outs += [b.op("convert", y, dtype=B8), b.op("convert", x, dtype=F16)]

    def run(n: int, seed: int) -> list[np.ndarray]:
        x = _rng(seed).normal(size=(n, 6)).astype(np.float32) * 2
        x[0, :4] = [0.5, -2.5, 1.5, -0.0]
        y = _rng(seed + 1).normal(size=(n, 6)).astype(np.float32)
        y[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
        return [x, y]

    return Case(b.build(outs), [run(3, 0), run(1, 1)], tol=1e-4)


def case_int_elementwise() -> Case:
    b = _builder()
    x = b.input("x", TensorType(I32, (S0,)))
    y = b.input("y", TensorType(I32, (S0,)))
    s = b.input("s", TensorType(I32, (S0,)))
    outs = [b.op(name, x, y) for name in "add sub mul div rem max min and or xor".split()]
    outs += [b.op("pow", x, y), b.op("shl", x, s), b.op("shr", x, s)]
    outs += [b.op(name, x) for name in "neg abs sign floor ceil round trunc bitwise_not".split()]
    outs += [b.op(name, x, y) for name in "eq ne lt le gt ge".split()]
    outs += [b.op("isnan", x), b.op("isinf", x), b.op("convert", x, dtype=F32)]
    outs += [b.op("convert", x, dtype=B8), b.op("convert", x, dtype=I64)]
    f = b.op("convert", b.op("convert", x, dtype=F32), dtype=F32)
    half = b.op("div", f, _full(b, 2.0, F32, x.shape))
    outs.append(b.op("convert", half, dtype=I32))  # truncation toward zero

    def run(seed: int) -> list[np.ndarray]:
        g = _rng(seed)
        x = g.integers(-9, 10, size=7).astype(np.int32)
        y = g.choice([-3, -2, -1, 1, 2, 3, 5], size=7).astype(np.int32)
        x[:3], y[:3] = [1, -1, 2], [-2, -3, -1]  # negative powers of 1, -1, 2
        return [x, y, g.integers(0, 31, size=7).astype(np.int32)]

    return Case(b.build(outs), [run(0), run(1)])


def case_unsigned_and_bool() -> Case:
    b = _builder()
    u = b.input("u", TensorType(U8, (S0,)))
    v = b.input("v", TensorType(U8, (S0,)))
    p = b.input("p", TensorType(B8, (S0,)))
    q = b.input("q", TensorType(B8, (S0,)))
    outs = [b.op(name, u, v) for name in "add sub max min lt ge div rem".split()]
    outs += [b.op("shr", u, b.op("min", v, _full(b, 7, U8, u.shape)))]
    outs += [b.op(name, u) for name in "abs sign neg bitwise_not".split()]
    outs += [b.op("convert", u, dtype=I32), b.op("pow", u, _full(b, 2, U8, u.shape))]
    outs += [b.op(name, p, q) for name in "and or xor add mul max min eq lt".split()]
    outs += [b.op(name, p) for name in "bitwise_not abs floor".split()]
    outs += [b.op("select", p, u, v), b.op("convert", p, dtype=F32)]

    def run(seed: int, n: int) -> list[np.ndarray]:
        g = _rng(seed)
        u = g.integers(0, 256, size=n).astype(np.uint8)
        v = g.integers(1, 256, size=n).astype(np.uint8)
        return [u, v, g.random(n) < 0.5, g.random(n) < 0.5]

    return Case(b.build(outs), [run(0, 9), run(1, 4)])


def case_half_floats() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F16, (S0, 5)))
    tenth = _full(b, 0.1, F16, x.shape)
    outs = [b.op("add", x, tenth), b.op("exp", x), b.op("reduce", x, kind="sum", axes=(0, 1))]
    outs += [b.op("cumulative", x, kind="sum", axis=1), b.op("convert", x, dtype=F32)]
    runs = [[_rng(s).normal(size=(n, 5)).astype(np.float16)] for s, n in ((0, 4), (1, 2))]
    return Case(b.build(outs), runs, tol=2e-2)


def case_sources() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, S1)))
    z = b.input("z", TensorType(F32, (S2,)))
    exprs = [S0 * S1 + 3, floordiv(S0 - S1, S2), mod(S0 - S1, S2), floordiv(7, S0 - S1)]
    exprs += [mod(7, S0 - S1), sym_max(S0, S1), sym_min(S0, 3), floordiv(S0 + 1, 2)]
    outs = [b.op("shape_scalar", expr=e, dtype=I64) for e in exprs]
    outs += [b.op("shape_scalar", expr=S0 * 2, dtype=F32), b.op("shape_scalar", expr=S1, dtype=B8)]
    outs += [b.constant(v, F32) for v in (float("inf"), float("-inf"), float("nan"), 1e-5)]
    outs += [b.constant(2**40, I64), b.constant(255, U8), b.constant(True, B8)]
    outs += [b.constant(-1.5, F64), b.constant(0.1, F16)]
    outs += [b.op("iota", shape=(3, 4), dim=1, dtype=I32)]
    outs += [b.op("iota", shape=(S0, 3), dim=0, dtype=F32)]
    outs += [b.op("add", x, b.op("iota", shape=(S0, S1), dim=1, dtype=F32)), z]

    def run(n0: int, n1: int, n2: int) -> list[np.ndarray]:
        return [np.ones((n0, n1), np.float32), np.zeros(n2, np.float32)]

    return Case(b.build(outs), [run(2, 5, 3), run(7, 4, 2), run(5, 6, 1)])


def case_shapes() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 4)))
    col = b.input("col", TensorType(F32, (S0, 1)))
    row = b.input("row", TensorType(F32, (S1,)))
    w = b.param("w", np.arange(12, dtype=np.float32).reshape(2, 6))
    zero = b.constant(0.0, F32)
    outs = [
        b.op("broadcast_in_dim", col, shape=(S0, S1), dims=(0, 1)),
        b.op("broadcast_in_dim", row, shape=(2, S0, S1), dims=(2,)),
        b.op("broadcast_in_dim", w, shape=(3, 2, 6), dims=(1, 2)),
        b.op("reshape", x, shape=(S0 * 2, 2)),
        b.op("reshape", w, shape=(3, 4)),
        b.op("transpose", b.op("reshape", x, shape=(S0, 2, 2)), perm=(2, 0, 1)),
        b.op("slice", w, start=(0, 1), limit=(2, 6), stride=(1, 2)),
        b.op("slice", x, start=(1, 0), limit=(S0 - 1, 4), stride=(2, 3)),
        b.op("slice", x, start=(0, 1), limit=(1, 3), stride=(1, 1)),
        b.op("concatenate", x, b.op("reshape", w, shape=(3, 4)), x, axis=0),
        b.op("concatenate", w, w, axis=1),
        b.op("pad", w, zero, low=(1, -2), high=(-1, 3)),
        b.op("pad", x, zero, low=(S1, -1), high=(1, 2)),
        b.op("pad", x, zero, low=(0, 1), high=(2, -1)),
    ]

    def run(n0: int, n1: int) -> list[np.ndarray]:
        g = _rng(n0)
        sizes = [(n0, 4), (n0, 1), (n1,)]
        return [g.normal(size=s).astype(np.float32) for s in sizes]

    return Case(b.build(outs), [run(3, 2), run(6, 1), run(2, 3)])


def case_broadcast_of_a_runtime_one() -> Case:
    """A symbolic operand dim that is 1 on a call broadcasts, as the IR allows."""
    b = _builder()
    x = b.input("x", TensorType(F32, (S0,)))
    y = b.input("y", TensorType(F32, (S1, 2)))
    out = b.op("broadcast_in_dim", x, shape=(S1, 2), dims=(0,))
    g = b.build([b.op("add", out, y)])
    runs = [[np.array([2.0], np.float32), np.ones((3, 2), np.float32)]]
    runs.append([np.arange(4, dtype=np.float32), np.ones((4, 2), np.float32)])
    return Case(g, runs)


def case_indexing() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 4, S1)))
    i = b.input("i", TensorType(I32, (S2,)))
    t = b.input("t", TensorType(I64, (2, 3)))
    k = b.input("k", TensorType(I64, ()))
    w = b.param("w", np.arange(20, dtype=np.float32).reshape(5, 4))
    outs = [
        b.op("gather", x, i, axis=1),  # kept dims symbolic: dynamic_gather
        b.op("gather", w, t, axis=0),
        b.op("gather", w, k, axis=1),
        b.op("take_along_axis", w, t, axis=1),  # indices cover a corner of w
        b.op(
            "take_along_axis", x, b.op("broadcast_in_dim", i, shape=(S0, S2, S1), dims=(1,)), axis=1
        ),
        b.op(
            "take_along_axis",
            b.op("reshape", w, shape=(20,)),
            b.op("reshape", t, shape=(6,)),
            axis=0,
        ),
    ]

    def run(n0: int, n1: int, n2: int, seed: int) -> list[np.ndarray]:
        g = _rng(seed)
        return [
            g.normal(size=(n0, 4, n1)).astype(np.float32),
            g.integers(-4, 4, size=n2).astype(np.int32),
            g.integers(-4, 4, size=(2, 3)).astype(np.int64),
            np.array(-1, np.int64),
        ]

    return Case(b.build(outs), [run(2, 3, 5, 0), run(1, 2, 1, 1), run(3, 1, 4, 2)])


def case_scatter() -> Case:
    b = _builder()
    base = b.input("base", TensorType(F32, (S0, 3)))
    idx = b.input("idx", TensorType(I64, (S1,)))
    upd = b.input("upd", TensorType(F32, (S1, 3)))
    wide = b.input("wide", TensorType(F32, (3, S0)))
    idx2 = b.input("idx2", TensorType(I32, (2, 2)))
    upd2 = b.input("upd2", TensorType(F32, (3, 2, 2)))
    flags = b.op("gt", upd, _full(b, 0.0, F32, upd.shape))
    outs = [
        b.op("scatter", base, idx, upd, axis=0, mode="add"),
        b.op("scatter", base, idx, upd, axis=0, mode="set"),
        b.op("scatter", wide, idx2, upd2, axis=1, mode="add"),
        b.op("scatter", wide, idx2, upd2, axis=1, mode="set"),
        b.op("scatter", b.op("lt", base, base), idx, flags, axis=0, mode="add"),
        b.op(
            "scatter",
            b.op("convert", base, dtype=I32),
            idx,
            b.op("convert", upd, dtype=I32),
            axis=0,
            mode="set",
        ),
    ]

    def run(n0: int, n1: int, seed: int) -> list[np.ndarray]:
        g = _rng(seed)
        return [
            g.normal(size=(n0, 3)).astype(np.float32),
            g.integers(0, n0, size=n1).astype(np.int64),  # with duplicates
            g.normal(size=(n1, 3)).astype(np.float32) * 3,
            g.normal(size=(3, n0)).astype(np.float32),
            g.integers(0, n0, size=(2, 2)).astype(np.int32),
            g.normal(size=(3, 2, 2)).astype(np.float32),
        ]

    return Case(b.build(outs), [run(4, 9, 0), run(2, 5, 1), run(5, 0, 2)])


def case_reductions() -> Case:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 3, 4)))
    n = b.input("n", TensorType(I32, (S0, 5)))
    p = b.input("p", TensorType(B8, (S0, 5)))
    outs = [b.op("reduce", x, kind=k, axes=a) for k, a in (("sum", (0, 2)), ("prod", (1,)))]
    outs += [b.op("reduce", x, kind=k, axes=a) for k, a in (("max", (2,)), ("min", (0, 1, 2)))]
    outs += [b.op("reduce", x, kind="any", axes=(1,)), b.op("reduce", p, kind="all", axes=(0,))]
    outs += [b.op("reduce", n, kind=k, axes=(1,)) for k in ("sum", "max", "min", "prod")]
    outs += [b.op("reduce", p, kind=k, axes=(1,)) for k in ("sum", "max", "prod", "any")]
    outs += [
        b.op("argreduce", x, kind="argmax", axis=1),
        b.op("argreduce", x, kind="argmin", axis=0),
    ]
    outs += [
        b.op("argreduce", n, kind="argmax", axis=1),
        b.op("argreduce", n, kind="argmin", axis=1),
    ]
    outs += [
        b.op("argreduce", p, kind="argmax", axis=1),
        b.op("argreduce", x, kind="argmax", axis=2),
    ]
    outs += [b.op("cumulative", x, kind="sum", axis=2), b.op("cumulative", x, kind="prod", axis=0)]
    outs += [b.op("cumulative", n, kind="sum", axis=0), b.op("cumulative", n, kind="prod", axis=1)]
    outs += [b.op("cumulative", p, kind="sum", axis=0), b.op("cumulative", x, kind="sum", axis=1)]

    def run(n0: int, seed: int) -> list[np.ndarray]:
        g = _rng(seed)
        x = g.integers(-3, 4, size=(n0, 3, 4)).astype(np.float32)  # ties
        x[0, 1, :2] = np.nan
        x[-1, :, 3] = -np.inf
        return [x, g.integers(-3, 4, size=(n0, 5)).astype(np.int32), g.random((n0, 5)) < 0.7]

    return Case(b.build(outs), [run(3, 0), run(1, 1), run(6, 2)])


def case_contractions() -> Case:
    b = _builder()
    a = b.input("a", TensorType(F32, (S0, 8)))
    u = b.input("u", TensorType(F32, (2, S0, 4)))
    v = b.input("v", TensorType(F32, (2, 4, S1)))
    m = b.input("m", TensorType(I32, (3, 4)))
    img = b.input("img", TensorType(F32, (S0, 4, S1, 7)))
    seq = b.input("seq", TensorType(F32, (2, 3, S1)))
    w = b.param("w", _rng(0).normal(size=(8, 3)).astype(np.float32))
    k2 = b.param("k2", _rng(1).normal(size=(6, 2, 3, 3)).astype(np.float32))
    k1 = b.param("k1", _rng(2).normal(size=(4, 3, 2)).astype(np.float32))
    conv = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    last = b.op("transpose", img, perm=(0, 2, 3, 1))
    outs = [
        b.op("dot", a, w),
        b.op("dot", u, v),
        b.op("dot", m, b.op("transpose", m, perm=(1, 0))),
        b.op("dot", b.op("gt", m, m), b.op("transpose", b.op("ge", m, m), perm=(1, 0))),
        b.op("convolution", img, k2, **conv),
        b.op("convolution", last, k2, channels_last=True, **conv),
        b.op("convolution", seq, k1, stride=(1,), padding=(1,), dilation=(1,), groups=1),
    ]
    pool = dict(kernel=(3, 2), stride=(2, 2), padding=(1, 0), dilation=(1, 1))
    for kind, count in (("max", False), ("avg", False), ("avg", True)):
        outs.append(b.op("pool", img, kind=kind, count_include_pad=count, **pool))
        outs.append(
            b.op("pool", last, kind=kind, count_include_pad=count, channels_last=True, **pool)
        )
    dilated = dict(kernel=(2,), stride=(1,), padding=(1,), dilation=(2,))
    outs.append(b.op("pool", seq, kind="max", count_include_pad=False, **dilated))
    outs.append(
        b.op(
            "pool", b.op("convert", seq, dtype=I32), kind="max", count_include_pad=False, **dilated
        )
    )

    def run(n0: int, n1: int, seed: int) -> list[np.ndarray]:
        g = _rng(seed)
        sizes = [(n0, 8), (2, n0, 4), (2, 4, n1)]
        out = [g.normal(size=s).astype(np.float32) for s in sizes]
        out.append(g.integers(-5, 5, size=(3, 4)).astype(np.int32))
        out += [g.normal(size=s).astype(np.float32) * 3 for s in ((n0, 4, n1, 7), (2, 3, n1))]
        return out

    return Case(b.build(outs), [run(2, 5, 0), run(1, 6, 1), run(3, 4, 2)], tol=1e-4)


def case_operands_typed_apart() -> Case:
    """Operands of one op where one knows a dim the other has as a symbol (guarded equal)."""
    b = _builder()
    x = b.input("x", TensorType(I32, (4,)))
    y = b.input("y", TensorType(I32, (S0,)))
    f = b.op("convert", y, dtype=F32)
    outs = [b.op("add", x, y), b.op("pow", y, x), b.op("select", b.op("lt", y, x), y, x)]
    outs += [
        b.op("concatenate", x, y, axis=0),
        b.op("erf", b.op("mul", f, b.op("convert", x, dtype=F32))),
    ]
    runs = [[np.array([1, -2, 3, 0], np.int32), np.array([2, 2, -1, 5], np.int32)]]
    return Case(b.build(outs), runs)


CASES = {
    "float_elementwise": case_float_elementwise,
    "int_elementwise": case_int_elementwise,
    "unsigned_and_bool": case_unsigned_and_bool,
    "half_floats": case_half_floats,
    "sources": case_sources,
    "shapes": case_shapes,
    "broadcast_of_a_runtime_one": case_broadcast_of_a_runtime_one,
    "operands_typed_apart": case_operands_typed_apart,
    "indexing": case_indexing,
    "scatter": case_scatter,
    "reductions": case_reductions,
    "contractions": case_contractions,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_verifies_and_matches_the_interpreter(name):
    case = CASES[name]()
    check_numerics(case.graph, case.runs, case.tol)


def test_every_op_of_the_table_is_emitted():
    seen = {n.op for make in CASES.values() for n in make().graph.nodes()}
    assert set(OPS) - seen == set()


def test_bfloat16_verifies_and_computes():
    """NumPy has no bf16 (nor has the interpreter): checked against f32 arithmetic."""
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 4)))
    h = b.op("convert", x, dtype=BF16)
    y = b.op("add", h, _full(b, 0.1, BF16, x.shape))
    top = b.op("max", y, _full(b, float("-inf"), BF16, x.shape))
    outs = [b.op("reduce", top, kind="max", axes=(1,)), b.op("reduce", y, kind="sum", axes=(1,))]
    outs.append(b.op("cumulative", h, kind="sum", axis=0))
    text = graph_to_stablehlo(b.build([b.op("convert", o, dtype=F32) for o in outs]))
    parse(text)
    assert "dense<0xFF80> : tensor<bf16>" in text and "dense<0.1> : tensor<bf16>" in text
    x0 = _rng(0).normal(size=(3, 4)).astype(np.float32)
    want = [(x0 + 0.1).max(axis=1), (x0 + 0.1).sum(axis=1), np.cumsum(x0, axis=0)]
    for got, w in zip(evaluate(text, [x0]), want):
        np.testing.assert_allclose(got, w, rtol=3e-2, atol=3e-2)


# --- structure --------------------------------------------------------------------------


def test_symbolic_dims_are_question_marks_and_use_the_dynamic_ops():
    text = graph_to_stablehlo(case_shapes().graph)
    parse(text)
    assert "%arg0: tensor<?x4xf32>" in text
    for op in ("dynamic_broadcast_in_dim", "dynamic_reshape", "real_dynamic_slice", "dynamic_pad"):
        assert f"stablehlo.{op} " in text, op
    assert "stablehlo.get_dimension_size %arg0, dim = 0" in text
    assert "stablehlo.dynamic_iota " in graph_to_stablehlo(case_sources().graph)
    assert '"stablehlo.dynamic_gather"' in graph_to_stablehlo(case_indexing().graph)


def test_static_graphs_use_the_static_ops_only():
    b = _builder()
    x = b.input("x", TensorType(F32, (4, 6)))
    y = b.op("reshape", b.op("slice", x, start=(0, 1), limit=(4, 5), stride=(1, 2)), shape=(8,))
    z = b.op("pad", y, b.constant(0.0, F32), low=(1,), high=(2,))
    out = b.op("add", z, b.op("iota", shape=(11,), dim=0, dtype=F32))
    g = b.build([out, b.op("broadcast_in_dim", out, shape=(2, 11), dims=(1,))])
    text = check_numerics(g, [[np.arange(24, dtype=np.float32).reshape(4, 6)]])
    assert "?" not in text and "dynamic" not in text and "get_dimension_size" not in text


def test_scan_over_a_bounded_symbolic_axis_takes_log2_steps():
    b = _builder()
    b.constraints.add_symbol("s0", 1, 8)
    x = b.input("x", TensorType(I32, (2, S0)))
    g = b.build([b.op("cumulative", x, kind="sum", axis=1)])
    text = check_numerics(g, [[np.arange(2 * n, dtype=np.int32).reshape(2, n)] for n in (1, 5, 8)])
    assert text.count("stablehlo.dynamic_pad ") == 3  # shifts by 1, 2 and 4


WEIGHTS = {
    "layers.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "0bad-name": np.array([[1, -2], [3, 2**40]], dtype=np.int64),
    "mask": np.array([True, False, True]),
    "half": np.array([0.5, -1.25, 3.0], dtype=np.float16),
    "zeros": np.zeros((2, 3), np.float32),
    "empty": np.zeros((0, 4), np.float32),
    "small": np.array([200, 3], dtype=np.uint8),
}


def _weights_graph() -> Graph:
    b = _builder()
    x = b.input("x", TensorType(F32, (S0, 3)))
    params = {name: b.param(name, value) for name, value in WEIGHTS.items()}
    outs = [b.op("dot", x, params["layers.0.weight"]), *params.values()]
    return b.build([*outs, params["mask"]])  # a weight returned twice


def test_weights_inline_as_hex_parse_and_compute():
    text = check_numerics(_weights_graph(), [[np.ones((2, 3), np.float32)]])
    assert 'dense<"0x' in text and "dense_resource" not in text and "dialect_resources" not in text
    assert "dense<0.0> : tensor<2x3xf32>" in text  # a repeated value: a splat


def test_weights_as_resource_blobs_parse_and_hold_the_bytes():
    text = graph_to_stablehlo(_weights_graph(), weights="resource")
    module = parse(text)
    blobs = dict(re.findall(r"^\s+([\w.]+): \"0x([0-9A-F]*)\"", text, re.MULTILINE))
    keys = re.findall(r"dense_resource<([\w.]+)>", text)
    assert (
        sorted(blobs)
        == sorted(keys)
        == sorted(["layers.0.weight", "_0bad_name", "mask"] + ["half", "small"])
    )
    for key, name in [("layers.0.weight", "layers.0.weight"), ("_0bad_name", "0bad-name")]:
        data = bytes.fromhex(blobs[key])
        value = WEIGHTS[name]
        assert int.from_bytes(data[:4], "little") == value.dtype.itemsize  # the alignment
        assert data[4:] == value.astype(value.dtype.newbyteorder("<")).tobytes()
    printed = str(module)  # MLIR prints the blobs it read: the same bytes
    for key, blob in blobs.items():
        assert f'{key}: "0x{blob}"' in printed
    with pytest.raises(ValueError, match="weights must be one of"):
        graph_to_stablehlo(_weights_graph(), weights="external")


def _checked_graph() -> Graph:
    b = _builder()
    b.constraints.add_symbol("s0", 2, 64)
    x = b.input("x", TensorType(F32, (S0, 4)))
    y = b.input("y", TensorType(F32, (S1,)))
    z = b.input("z", TensorType(F32, (S0,)))  # repeats s0
    b.input("w", TensorType(F32, (S2 + 1,)))  # the only carrier of s2
    b.constraints.guard_eq(S1, S0 * 2, "y holds two rows per row of x")
    return b.build([x, y, z, b.op("shape_scalar", expr=S2, dtype=I64)])


@pytest.mark.parametrize(
    "shapes, error",
    [
        ([(3, 4), (6,), (3,), (5,)], None),
        ([(1, 4), (2,), (1,), (5,)], r"input 'x' dim 0 = 1 is outside the range s0 in \[2, 64\]"),
        ([(65, 4), (130,), (65,), (5,)], "input 'x' dim 0 = 65 is outside the range"),
        (
            [(3, 4), (7,), (3,), (5,)],
            r"shape constraint s1 == 2\*s0 \(y holds two rows per row of x\) does not hold: "
            "s0 = 3 from input 'x' dim 0, s1 = 7 from input 'y' dim 0",
        ),
        ([(3, 4), (6,), (4,), (5,)], "input 'z' dim 0: expected s0 = 3, got 4"),
        ([(3, 4), (6,), (3,), (0,)], "input 'w' dim 0: got 0, which no value of s2 fits"),
    ],
)
def test_shape_checks_are_shape_assertions_jax_evaluates(shapes, error):
    graph = _checked_graph()
    text = graph_to_stablehlo(graph)
    parse(text)
    assert text.count("stablehlo.custom_call @shape_assertion(") == 5
    arrays = [np.zeros(s, np.float32) for s in shapes]
    if error is None:
        refine(text, arrays)
        assert evaluate(text, arrays)[3] == 4
        return
    with pytest.raises(Exception, match=error):
        refine(text, arrays)


def test_symbols_no_input_carries_are_scalar_arguments():
    b = _builder()
    x = b.input("x", TensorType(F32, (S0,)))
    n = b.op("shape_scalar", expr=S1 * 2 + S0, dtype=F32)
    g = b.build([b.op("add", x, b.op("broadcast_in_dim", n, shape=(S0,), dims=()))])
    text = graph_to_stablehlo(g)
    parse(text)
    assert '%arg1: tensor<i64> {anyshape.symbol = "s1"}' in text
    x0 = np.arange(3, dtype=np.float32)
    (got,) = evaluate(text, [x0, np.array(5, np.int64)])
    np.testing.assert_array_equal(got, reference(g, [x0], {"s1": 5})[0])
    # A shape of such a symbol is a shape computed from an argument's value.
    sized = b.build([b.op("iota", shape=(S1, S0), dim=0, dtype=I32)])
    text = graph_to_stablehlo(sized)
    parse(text)
    assert "stablehlo.reshape %arg1 : (tensor<i64>) -> tensor<1xi64>" in text
    assert "stablehlo.dynamic_iota" in text


def test_function_signature_names_and_orders_arguments_and_results():
    b = _builder()
    x = b.input("x", TensorType(F32, (S0,)))
    y = b.input('odd "name"', TensorType(I64, (2,)))
    w = b.param("w", np.ones(2, np.float32))
    g = b.build([y, w, x, x, b.op("exp", x)])
    text = check_numerics(g, [[np.arange(3, dtype=np.float32), np.array([4, 5])]])
    assert '%arg0: tensor<?xf32> {anyshape.name = "x"}' in text
    assert '{anyshape.name = "odd \\22name\\22"}' in text
    assert re.search(r"return %arg1, %\d+, %arg0, %arg0, %\d+ : tensor<2xi64>, tensor<2xf32>", text)
    assert text == graph_to_stablehlo(g)  # deterministic


@pytest.mark.parametrize(
    "op, dtype, message",
    [
        ("rem", B8, "rem .*: rem is not defined on b8 operands"),
        ("sub", B8, "sub is not defined on b8"),
        ("neg", B8, "neg is not defined on b8"),
        ("convolution", B8, "convolution of b8 tensors"),
    ],
)
def test_what_stablehlo_cannot_express_raises_a_clear_error(op, dtype, message):
    b = _builder()
    x = b.input("x", TensorType(dtype, (1, 1, 3)))
    if op == "convolution":
        out = b.op(op, x, x, stride=(1,), padding=(0,), dilation=(1,), groups=1)
    else:
        out = b.op(op, *([x] * OPS[op].arity))
    with pytest.raises(UnsupportedError, match=message):
        graph_to_stablehlo(b.build([out]))


def test_an_op_without_a_rule_is_named():
    b = _builder()
    x = b.input("x", TensorType(F32, (3,)))
    mystery = Node("mystery_op", (x,), (), x.type)
    with pytest.raises(UnsupportedError, match="op 'mystery_op' has no StableHLO form"):
        graph_to_stablehlo(Graph([x], [mystery], {}, b.constraints))


# --- PyTorch models ---------------------------------------------------------------------


def _torch_graph(model, example) -> Graph:
    """A model as anyshape captures and lowers it, after the shared IR passes."""
    from anyshape.config import Options
    from anyshape.frontends.torch.capture import capture_export
    from anyshape.passes.pipeline import run_pipeline
    from anyshape.standalone.export import lower_whole_graph

    graph, _ = lower_whole_graph(capture_export(model.eval(), example), "model")
    return run_pipeline(graph, Options(backend="cpu", verify=True))


def _mlp():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.down = torch.nn.Linear(32, 8)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.norm(self.up(x)))
            return torch.softmax(self.down(h), dim=-1)

    return MLP()


def _attention():
    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (y.reshape(b, t, 2, 8).transpose(1, 2) for y in self.qkv(x).split(16, dim=-1))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, 16))

    return Attention()


@pytest.mark.parametrize("make", [_mlp, _attention], ids=["mlp", "attention"])
def test_torch_model_through_the_passes_matches_eager(make):
    import torch

    model = make()
    graph = _torch_graph(model, (torch.randn(3, 5, 16),))
    runs = [
        [np.random.default_rng(i).normal(size=s).astype(np.float32)]
        for i, s in enumerate([(2, 7, 16), (1, 1, 16), (4, 3, 16)])
    ]
    text = check_numerics(graph, runs, tol=1e-5)
    for weights in ("inline", "resource"):
        parse(graph_to_stablehlo(graph, weights=weights))
    assert "tensor<?x?x16xf32>" in text
    with torch.no_grad():
        for (x,) in runs:
            (got,) = evaluate(text, [x])
            want = model(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
