"""The op table is the source of truth: every table covers it, every rule rejects bad input.

Each op has one clearly bad construction here. Type errors are ``IRTypeError``
(from the rule or from the builder's arity/attribute checks); a static size
mismatch is a ``ValueError`` from ``guard_eq``, since it can never hold at run
time and so must not become a prologue guard.
"""

import numpy as np
import pytest

from anyshape.ir import OPS, DType, GraphBuilder, SymExpr, TensorType
from anyshape.ir.ops import (
    BINARY_ARITH,
    BINARY_BITWISE,
    BINARY_FLOAT,
    COMPARE,
    TRAITS,
    UNARY_ANY,
    UNARY_FLOAT,
    UNARY_INT,
    UNARY_PRED,
    IRTypeError,
    check_op_table,
    ops_with,
)
from anyshape.runtime.interpreter import INTERPRETER, run_graph

S0 = SymExpr.symbol("s0")
F32, I64, B8 = DType.f32, DType.i64, DType.b8


def test_interpreter_covers_exactly_the_op_table():
    # Graph inputs are bound by run_graph from its arguments, not by a table entry.
    assert set(OPS) - set(INTERPRETER) == {"input"}
    assert sorted(set(INTERPRETER) - set(OPS)) == []
    assert "frobnicate" not in INTERPRETER
    b = GraphBuilder()
    x = b.input("x", TensorType(F32, (S0,)))
    arr = np.arange(3, dtype=np.float32)
    (out,) = run_graph(b.build([x]), [arr], {"s0": 3})
    assert out is arr


def test_op_table_is_well_formed():
    assert check_op_table() == []
    for name, d in OPS.items():
        assert d.name == name and callable(d.rule)
        assert d.arity is None or d.arity >= 0


def test_traits_are_declared_and_queried_from_the_table():
    assert all(d.traits <= TRAITS.keys() for d in OPS.values())
    assert ops_with("view") == {"broadcast_in_dim", "reshape", "transpose", "slice"}
    assert ops_with("elementwise") >= set(UNARY_FLOAT) | set(BINARY_ARITH) | {"select", "convert"}
    assert ops_with("reduction") == {"reduce", "argreduce"}
    with pytest.raises(KeyError, match="unknown op trait 'pointwise'"):
        ops_with("pointwise")


def test_planner_classifies_every_op_and_the_cpu_backend_renders_each_class():
    from anyshape.codegen.cpu.expr import BINARY, UNARY, KernelScope
    from anyshape.codegen.cpu.kernels import EMITTERS
    from anyshape.schedule import op_classes as cpu
    from anyshape.schedule.costs import TargetCosts

    # Each op's class follows from its traits; an op none of them covers is a KeyError.
    classes = {op: cpu.op_class(op) for op in OPS}
    assert set(classes.values()) == {cls for _, cls in cpu.CLASS_OF_TRAIT}
    assert cpu.SOURCE_OPS == {"input", "param"}
    assert cpu.LIBRARY_OPS == {"cumulative", "dot", "convolution", "pool", "scatter"}
    assert cpu.NOT_RECOMPUTED == {"concatenate", "pad", "gather", "take_along_axis"}
    # Each class has its code: every root an emitter, every fused op a C++ expression.
    assert set(EMITTERS) == cpu.ROOT_OPS
    assert set(UNARY) | set(BINARY) | {"div", "rem", "select", "convert"} == cpu.ELEMENTWISE_OPS
    fused_by_name = cpu.INDEX_OPS | cpu.NOT_RECOMPUTED
    assert all(hasattr(KernelScope, f"_op_{op}") for op in fused_by_name)
    # The target's cost tables name ops of the table, of the class they assume.
    assert set(TargetCosts().expensive_ops) <= cpu.ELEMENTWISE_OPS
    assert set(TargetCosts().memory_operands) <= cpu.LIBRARY_OPS


def test_cpu_backend_renders_every_op_or_says_why_not():
    from anyshape.codegen.cpu.expr import FUSED, UNSUPPORTED, KernelScope
    from anyshape.codegen.cpu.kernels import EMITTERS
    from anyshape.codegen.cpu.stitch_emit import StitchScope
    from anyshape.schedule import op_classes as cpu

    # Like the interpreter: each op of the table is rendered (an expression in a loop
    # nest, a kernel of its own, or a load of an input) or listed with its reason.
    rendered = set(FUSED) | set(EMITTERS) | cpu.SOURCE_OPS
    assert rendered | set(UNSUPPORTED) == set(OPS)
    assert not rendered & set(UNSUPPORTED) and all(UNSUPPORTED.values())
    # Everything the planner fuses into a loop nest has an expression.
    assert cpu.POINTWISE_OPS | cpu.NOT_RECOMPUTED <= set(FUSED)
    # Each entry names a method; the stitch scope renders reductions in its rows.
    assert all(callable(getattr(KernelScope, m)) for m in FUSED.values())
    assert StitchScope._op_reduce is not KernelScope._op_reduce


def test_builder_rejects_an_unknown_op():
    with pytest.raises(IRTypeError, match="unknown op 'frobnicate'"):
        GraphBuilder().op("frobnicate")


@pytest.fixture
def v():
    b = GraphBuilder()
    t = lambda dt, *shape: TensorType(dt, shape)  # noqa: E731
    return {
        "b": b,
        "x": b.input("x", t(F32, S0, 8)),
        "x3": b.input("x3", t(F32, S0, 8, 2)),
        "xs": b.input("xs", t(F32, 2, 3)),
        "ys": b.input("ys", t(F32, 2, 5)),
        "i": b.input("i", t(I64, S0, 8)),
        "m": b.input("m", t(B8, S0, 8)),
        "img": b.input("img", t(F32, 1, 3, 8, 8)),
        "k": b.param("k", np.ones((4, 2, 3, 3), np.float32)),
    }


def _op(op, *args, **attrs):
    return lambda v: v["b"].op(op, *(v[a] for a in args), **attrs)


_WINDOW = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1))
# op -> (bad construction, expected exception, message pattern)
BAD = {
    **{n: (_op(n, "i"), IRTypeError, "needs a float operand") for n in UNARY_FLOAT},
    **{n: (_op(n, "x", "x"), IRTypeError, "takes 1 operands, got 2") for n in UNARY_ANY},
    **{n: (_op(n, "x"), IRTypeError, "needs an integer or bool operand") for n in UNARY_INT},
    **{n: (_op(n), IRTypeError, "takes 1 operands, got 0") for n in UNARY_PRED},
    **{n: (_op(n, "x", "i"), IRTypeError, "operand dtypes differ") for n in BINARY_ARITH},
    **{n: (_op(n, "i", "i"), IRTypeError, "needs float operands") for n in BINARY_FLOAT},
    **{
        n: (_op(n, "x", "x"), IRTypeError, "needs integer or bool operands") for n in BINARY_BITWISE
    },
    **{n: (_op(n, "x", "x3"), IRTypeError, "rank mismatch") for n in COMPARE},
    "select": (_op("select", "x", "x", "x"), IRTypeError, "predicate must be b8"),
    "convert": (_op("convert", "x"), IRTypeError, r"missing attributes \['dtype'\]"),
    "input": (_op("input", name="q", dtype=F32), IRTypeError, "missing attributes"),
    "param": (_op("param", "x", name="w", dtype=F32, shape=()), IRTypeError, "takes 0 operands"),
    "constant": (_op("constant", value=1.0), IRTypeError, "missing attributes"),
    "shape_scalar": (_op("shape_scalar", dtype=I64), IRTypeError, "missing attributes"),
    "iota": (_op("iota", shape=(S0, 4), dim=2, dtype=I64), IRTypeError, "out of range"),
    "broadcast_in_dim": (
        _op("broadcast_in_dim", "xs", shape=(2, 4), dims=(0, 1)),
        IRTypeError,
        "cannot broadcast dim 1",
    ),
    "reshape": (_op("reshape", "xs", shape=(5,)), ValueError, "6 == 5 can never hold"),
    "transpose": (_op("transpose", "x", perm=(1, 1)), IRTypeError, "not a permutation"),
    "slice": (
        _op("slice", "x", start=(0, 0), limit=(S0, 8), stride=(1, 0)),
        IRTypeError,
        "stride must be a positive int",
    ),
    "concatenate": (_op("concatenate", "x", "x3", axis=0), IRTypeError, "differ in rank"),
    "pad": (_op("pad", "x", "x", low=(0, 0), high=(0, 0)), IRTypeError, "pad value must be"),
    "gather": (_op("gather", "x", "x", axis=0), IRTypeError, "indices must be integers"),
    "scatter": (
        _op("scatter", "x", "x", "x", axis=0, mode="add"),
        IRTypeError,
        "indices must be integers",
    ),
    "take_along_axis": (
        _op("take_along_axis", "x", "x3", axis=0),
        IRTypeError,
        "needs integer indices",
    ),
    "reduce": (_op("reduce", "x", kind="sum", axes=(1, 1)), IRTypeError, "axes"),
    "argreduce": (_op("argreduce", "x", kind="argmax", axis=2), IRTypeError, "bad argreduce"),
    "cumulative": (_op("cumulative", "x", kind="sum"), IRTypeError, "missing attributes"),
    "dot": (_op("dot", "xs", "ys"), ValueError, "dot contraction dim: 3 == 2 can never hold"),
    "convolution": (
        _op("convolution", "img", "k", groups=1, **_WINDOW),
        ValueError,
        "convolution input channels: 3 == 2 can never hold",
    ),
    "pool": (
        _op("pool", "x", kind="max", kernel=(2, 2, 2), count_include_pad=True, **_WINDOW),
        IRTypeError,
        "needs rank >= 4",
    ),
}


def test_every_op_has_a_bad_case():
    assert set(BAD) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_rule_rejects_bad_input(op, v):
    build, exc, pattern = BAD[op]
    before = list(v["b"].constraints.guards)
    with pytest.raises(exc, match=pattern):
        build(v)
    # A rejected op leaves no guard behind.
    assert v["b"].constraints.guards == before


@pytest.mark.parametrize(
    "build, pattern",
    [
        (_op("add", "xs", "ys"), "add operands dim 1: 3 == 5 can never hold"),
        (_op("concatenate", "xs", "ys", axis=0), "concatenate operands dim 1: 3 == 5"),
        (_op("dot", "x", "ys"), "dot contraction dim: 8 == 2"),
    ],
)
def test_static_mismatch_is_never_a_guard(build, pattern, v):
    with pytest.raises(ValueError, match=pattern):
        build(v)
    assert v["b"].constraints.guards == []


def test_symbolic_mismatch_becomes_a_guard(v):
    b = v["b"]
    y = b.input("y", TensorType(F32, (SymExpr.symbol("s1"), 8)))
    out = b.op("add", v["x"], y)
    assert out.type == TensorType(F32, (S0, 8))
    assert [str(g) for g in b.constraints.guards] == ["s0 == s1"]
    # A symbolic dim against a static one is a guard too, not a type error.
    w = b.input("w", TensorType(F32, (8, 3)))
    assert b.op("dot", b.op("transpose", v["x"], perm=(1, 0)), b.op("transpose", w, perm=(1, 0)))
    assert str(b.constraints.guards[-1]) == "s0 == 3"
