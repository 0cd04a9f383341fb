"""The graph text form: print_graph(parse_graph(text)) == text, for every op.

Graphs are built through ``GraphBuilder`` (so types and facts come from the op
table's rules), printed, parsed back and printed again; the parsed graph must
also pass the verifier. One small graph is checked against its expected text
with ordered substring checks.
"""

import math

import numpy as np
import pytest

from anyshape.ir import OPS, ConstraintStore, DType, GraphBuilder, SymExpr, TensorType
from anyshape.ir.ops import (
    BINARY_ARITH,
    BINARY_BITWISE,
    BINARY_FLOAT,
    COMPARE,
    UNARY_ANY,
    UNARY_FLOAT,
    UNARY_INT,
    UNARY_PRED,
)
from anyshape.ir.parser import parse_graph
from anyshape.ir.printer import print_graph
from anyshape.ir.symbolic import floordiv
from anyshape.ir.verifier import VerificationError, verify_graph

S = {f"s{i}": SymExpr.symbol(f"s{i}") for i in range(9)}
F32, I64, B8 = DType.f32, DType.i64, DType.b8
W = np.ones((8, 4), np.float32)


def make_inputs(b: GraphBuilder) -> dict:
    s0, s1, s2 = S["s0"], S["s1"], S["s2"]
    return {
        "x": b.input("x", TensorType(F32, (s0, 8))),
        "y": b.input("y", TensorType(F32, (s1, 8))),
        "i": b.input("i", TensorType(I64, (s0, 8))),
        "m": b.input("m", TensorType(B8, (s0, 8))),
        "img": b.input("img", TensorType(F32, (1, 3, s2, 10))),
        "idx": b.input("idx", TensorType(I64, (S["s3"],))),
        "z": b.input("z", TensorType(F32, (S["s4"], S["s5"]))),
        "row": b.input("row", TensorType(F32, (8,))),
    }


def _unary(name, arg):
    return lambda b, v: b.op(name, v[arg])


def _binary(name, arg, other=None):
    return lambda b, v: b.op(name, v[arg], v[other or arg])


# One way to build each op; test_every_op_has_a_builder keeps this table complete.
BUILDERS = {
    **{n: _unary(n, "x") for n in UNARY_FLOAT + UNARY_ANY + UNARY_PRED},
    **{n: _unary(n, "i") for n in UNARY_INT},
    **{n: _binary(n, "x", "y") for n in BINARY_ARITH + BINARY_FLOAT + COMPARE},
    **{n: _binary(n, "i") for n in BINARY_BITWISE},
    "select": lambda b, v: b.op("select", v["m"], v["x"], v["y"]),
    "convert": lambda b, v: b.op("convert", v["x"], dtype=DType.bf16),
    "input": lambda b, v: v["x"],
    "param": lambda b, v: b.param("w", W),
    "constant": lambda b, v: b.constant(-math.inf, F32),
    "shape_scalar": lambda b, v: b.op("shape_scalar", expr=S["s0"] * 8 - 1, dtype=I64),
    "iota": lambda b, v: b.op("iota", shape=(S["s0"], 8), dim=1, dtype=I64),
    "broadcast_in_dim": lambda b, v: b.op(
        "broadcast_in_dim", v["row"], shape=(S["s0"], 8), dims=(1,)
    ),
    "reshape": lambda b, v: b.op("reshape", v["z"], shape=(S["s6"],)),
    "transpose": lambda b, v: b.op("transpose", v["x"], perm=(1, 0)),
    "slice": lambda b, v: b.op("slice", v["x"], start=(1, 0), limit=(S["s0"], 8), stride=(2, 3)),
    "concatenate": lambda b, v: b.op("concatenate", v["x"], v["y"], v["x"], axis=0),
    "pad": lambda b, v: b.op("pad", v["x"], b.constant(0.5, F32), low=(1, -2), high=(0, 3)),
    "gather": lambda b, v: b.op("gather", v["x"], v["idx"], axis=0),
    "take_along_axis": lambda b, v: b.op("take_along_axis", v["x"], v["i"], axis=1),
    "scatter": lambda b, v: b.op(
        "scatter", v["x"], v["idx"], b.op("gather", v["x"], v["idx"], axis=0), axis=0, mode="add"
    ),
    "reduce": lambda b, v: b.op("reduce", v["m"], kind="any", axes=(0, 1)),
    "argreduce": lambda b, v: b.op("argreduce", v["x"], kind="argmax", axis=1),
    "cumulative": lambda b, v: b.op("cumulative", v["x"], kind="sum", axis=0),
    "dot": lambda b, v: b.op("dot", v["x"], b.param("w", W)),
    "convolution": lambda b, v: b.op(
        "convolution",
        v["img"],
        b.param("k", np.ones((4, 3, 3, 3), np.float32)),
        stride=(2, 1),
        padding=(1, 0),
        dilation=(1, 2),
        groups=1,
    ),
    "pool": lambda b, v: b.op(
        "pool",
        v["img"],
        kind="avg",
        kernel=(3, 2),
        stride=(2, 2),
        padding=(1, 0),
        dilation=(1, 1),
        count_include_pad=False,
    ),
}


def facts() -> ConstraintStore:
    store = ConstraintStore()
    store.add_symbol("s0", 1, 512, hint=4)
    store.add_symbol("s2", 3, None)
    store.add_divisible("s2", 2)
    store.add_product_equal([S["s4"], S["s5"]], [S["s6"]])  # what reshape checks
    store.add_equal(S["s8"], S["s7"])
    store.add_equal(S["s7"], 16)  # s8 gets the range too, as replaying the text gives
    return store


def round_trip(graph) -> str:
    text = print_graph(graph)
    parsed = parse_graph(text, params=graph.params)
    assert print_graph(parsed) == text
    verify_graph(parsed)
    assert print_graph(parse_graph(print_graph(parsed))) == text
    return text


def test_every_op_has_a_builder():
    assert set(BUILDERS) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_op_round_trips(op):
    b = GraphBuilder(facts(), name=f"one_{op}")
    node = BUILDERS[op](b, make_inputs(b))
    assert node.op == op
    graph = b.build([node])
    verify_graph(graph)
    text = round_trip(graph)
    if op != "input":
        assert f" = {op}" in text


def test_graph_with_every_op_round_trips():
    b = GraphBuilder(facts())
    values = make_inputs(b)
    outs = [BUILDERS[op](b, values) for op in sorted(OPS)]
    graph = b.build(outs)
    # The rules recorded guards (s0 == s1 from x + y) and kept the given facts.
    assert [str(g) for g in graph.constraints.guards] == ["s0 == s1"]
    verify_graph(graph)
    text = round_trip(graph)
    parsed = parse_graph(text)
    assert parsed.op_counts() == graph.op_counts()
    assert parsed.constraints.describe() == graph.constraints.describe()
    assert [n.type for n in parsed.outputs] == [n.type for n in graph.outputs]
    for line in (
        "range s0 in [1, 512]",
        "range s2 in [3, inf]",
        "divisible s2 by 2",
        "equal s1 == s0",
        "equal s4*s5 == s6",
        "range s8 in [16, 16]",
        "equal s7 == 16",
        "equal s8 == 16",
        "product s4 * s5 == s6",
        'guard eq s0 ; s1 ; "add operands dim 0"',
    ):
        assert f"    {line}\n" in text


def test_attribute_values_round_trip():
    s0 = S["s0"]
    tag = (
        1,
        -2,
        (0.1, -0.0, 1e-07, 1e16, 2.5e-300, math.inf, -math.inf, math.nan),
        ('quote " brace } comma, semi ; ', "ünïcode", ""),
        (True, False, None),
        (DType.bf16, DType.b8, 2 * s0 + 1, floordiv(s0, 4) - s0, s0 - s0 + 3),
        ((), ((1,), (s0, (2.0,)))),
    )
    b = GraphBuilder()
    b.input("x", TensorType(F32, (s0,)))
    c = b.op("constant", value=math.nan, dtype=F32, tag=tag, flag=True, label="a b")
    graph = b.build([c])
    text = round_trip(graph)
    assert 'label="a b"' in text and "value=nan" in text
    back = parse_graph(text).outputs[0]
    assert math.isnan(back.attr("value")) and back.attr("flag") is True
    got = back.attr("tag")
    assert got[:2] == (1, -2) and all(type(v) is int for v in got[:2])
    floats = got[2]
    assert floats[:2] == (0.1, -0.0) and math.copysign(1, floats[1]) == -1
    assert floats[2:7] == (1e-07, 1e16, 2.5e-300, math.inf, -math.inf)
    assert math.isnan(floats[7]) and all(type(v) is float for v in floats)
    assert got[3] == tag[3] and got[4] == (True, False, None)
    assert got[5] == (DType.bf16, DType.b8, 2 * s0 + 1, floordiv(s0, 4) - s0, 3)
    assert type(got[5][4]) is int
    assert got[6] == ((), ((1,), (s0, (2.0,))))


def test_input_names_are_sanitized_and_unique():
    b = GraphBuilder()
    t = TensorType(F32, (4,))
    a = b.input("in2", t)
    x1 = b.input("x", t)
    x2 = b.input("x", t)
    odd = b.input("l.weight", t)
    graph = b.build([b.op("sub", x2, x1), a, odd])
    text = round_trip(graph)
    assert text.startswith(
        "graph @main(%in2: f32[4], %x: f32[4], %in2_: f32[4], %l_weight: f32[4]) {\n"
    )
    parsed = parse_graph(text)
    sub = parsed.outputs[0]
    assert sub.inputs == (parsed.inputs[2], parsed.inputs[1])
    assert parsed.outputs[1] is parsed.inputs[0]


def assert_in_order(text: str, pieces: list[str]) -> None:
    pos = 0
    for p in pieces:
        found = text.find(p, pos)
        assert found >= 0, f"{p!r} not found after offset {pos} in:\n{text}"
        pos = found + len(p)


def test_small_graph_text():
    store = ConstraintStore()
    store.add_symbol("s0", 1, 64)
    b = GraphBuilder(store, name="small")
    s0 = S["s0"]
    x = b.input("x", TensorType(F32, (s0, 4)))
    w = b.param("w", np.zeros((4, 4), np.float32))
    h = b.op(
        "add",
        b.op("dot", x, w),
        b.op("broadcast_in_dim", b.constant(1.0, F32), shape=(s0, 4), dims=()),
    )
    r = b.op("reduce", b.op("exp", h), kind="sum", axes=(1,))
    graph = b.build([r, h])
    text = round_trip(graph)
    assert_in_order(
        text,
        [
            "graph @small(%x: f32[s0, 4]) {\n",
            "  facts:\n    range s0 in [1, 64]\n",
            '  %0 = param {dtype=f32, name="w", shape=[4, 4]} : f32[4, 4]\n',
            "  %1 = dot(%x, %0) : f32[s0, 4]\n",
            "  %2 = constant {dtype=f32, value=1.0} : f32[]\n",
            "  %3 = broadcast_in_dim(%2) {dims=[], shape=[s0, 4]} : f32[s0, 4]\n",
            "  %4 = add(%1, %3) : f32[s0, 4]\n",
            "  %5 = exp(%4) : f32[s0, 4]\n",
            '  %6 = reduce(%5) {axes=[1], kind="sum"} : f32[s0]\n',
            "  return %6, %4\n",
            "}\n",
        ],
    )
    assert text.endswith("}\n") and "guard" not in text


def test_verifier_rejects_tampered_text():
    store = ConstraintStore()
    b = GraphBuilder(store)
    x = b.input("x", TensorType(F32, (S["s0"], 4)))
    y = b.input("y", TensorType(F32, (S["s1"], 4)))
    text = print_graph(b.build([b.op("exp", b.op("add", x, y))]))
    verify_graph(parse_graph(text))

    bad_type = text.replace("add(%x, %y) : f32[s0, 4]", "add(%x, %y) : f32[s0, 5]")
    with pytest.raises(VerificationError, match="rule gives f32"):
        verify_graph(parse_graph(bad_type))

    no_guard = "".join(
        ln for ln in text.splitlines(True) if "guard" not in ln and "equal" not in ln
    )
    assert no_guard != text
    with pytest.raises(VerificationError, match="unrecorded shape guards"):
        verify_graph(parse_graph(no_guard))

    unknown = text.replace("= add(", "= frobnicate(")
    with pytest.raises(VerificationError) as err:
        verify_graph(parse_graph(unknown))
    assert "unknown op 'frobnicate'" in str(err.value)
    assert "before its definition" not in str(err.value)


def test_parser_rejects_malformed_text():
    with pytest.raises(ValueError):
        parse_graph("graph @g(%x: q32[4]) {\n  return %x\n}\n")
    with pytest.raises(ValueError, match="unknown fact"):
        parse_graph("graph @g(%x: f32[4]) {\n  facts:\n    maybe s0\n  return %x\n}\n")
