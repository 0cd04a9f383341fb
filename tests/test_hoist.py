"""The loop-nest level (codegen/cpu/loop_ir.py) and the invariant pass over it (hoist.py)."""

from anyshape.codegen.cpu.hoist import hoist_invariants
from anyshape.codegen.cpu.loop_ir import (
    Const,
    For,
    Loop,
    block,
    const,
    if_,
    loop,
    prune,
    stmt,
    text,
    write,
)


def _row_loop():
    # for row { #pragma simd  for r0 { t1 (mask, reads i2) t2 (reads r0) t3 (constant) t4 } step i2 }
    inner = loop(
        For("r0", "0", "D_1"),
        [
            const("bool", "t1", "(((const uint8_t*)p1)[(i2) * D_1 + 0] != 0)"),
            const("float", "t2", "((const float*)p2)[(i2) * D_1 + r0]"),
            const("float", "t3", "((float)0.125)"),
            const("float", "t4", "(t1 ? t2 * t3 : t3)"),
            stmt("acc += t4;", "acc"),
        ],
        ["#pragma omp simd reduction(+:acc)"],
    )
    return loop(For("row", "lo", "hi"), [inner, stmt("if (++i2 == D_1) { i2 = 0; }", "i2")])


def test_invariant_values_move_before_the_loop_and_its_pragmas():
    out = hoist_invariants([_row_loop()])
    # t3 reads nothing that varies: it leaves both loops, first.
    assert isinstance(out[0], Const) and out[0].name == "t3"
    row = out[1]
    assert isinstance(row, Loop) and row.heads[0].var == "row"
    # t1 reads only i2, which the r0 loop does not change: it moves out of that loop, but
    # i2 is assigned in the row loop, so it stays inside that one.
    assert [n.name for n in row.body if isinstance(n, Const)] == ["t1"]
    r0 = row.body[1]
    assert [n.name for n in r0.body if isinstance(n, Const)] == ["t2", "t4"]
    lines = write(out)
    assert lines.index("  const bool t1 = (((const uint8_t*)p1)[(i2) * D_1 + 0] != 0);") < (
        lines.index("  #pragma omp simd reduction(+:acc)")
    )
    assert lines[0] == "const float t3 = ((float)0.125);"
    assert lines[1] == "for (int64_t row = lo; row < hi; ++row) {"


def test_scratch_error_state_stores_branches_and_hand_written_code_stay():
    body = [
        const("float", "t0", "rb[0]"),  # per-thread scratch
        const("int64_t", "t1", "as_index((int64_t)(k), n, err)"),  # sets the error flag
        const("float", "t2", "((const float*)p0)[3]"),  # p0 is stored to in this loop
        if_("c", [const("float", "t3", "((const float*)p1)[0]")]),  # conditional: stays
        stmt("((float*)p0)[i] = t0 + t2;", "p0"),
    ]
    nodes = [loop(For("i", "0", "n"), body)]
    assert hoist_invariants(nodes) == tuple(nodes)
    # A loop holding hand-written code (effects not stated) keeps even a constant.
    opaque = [loop(For("i", "0", "n"), [const("float", "t9", "1.0f"), text("x[i] = 2;")])]
    assert hoist_invariants(opaque) == tuple(opaque)
    stated = [loop(For("i", "0", "n"), [const("float", "t9", "1.0f"), stmt("f();")])]
    assert hoist_invariants(stated)[0] == stated[0].body[0]  # f() states it writes nothing


def test_the_writer_prints_collapsed_nests_branches_blocks_and_guards():
    from anyshape.codegen.cpu.loop_ir import Guarded

    tree = [
        block(
            [
                loop(
                    [For("i0", "0", "D_0"), For("i1", "0", "4")],
                    [if_("i1 < 2", [stmt("a();")], [stmt("b();")])],
                    ["#pragma omp parallel for collapse(2)"],
                ),
                loop(For("done", None, test="done < D_0"), [stmt("c();")]),
            ],
            ["#pragma omp parallel"],
        ),
        Guarded("ANYSHAPE_DNNL", (text("d();"),)),
    ]
    assert write(tree) == [
        "#pragma omp parallel",
        "{",
        "  #pragma omp parallel for collapse(2)",
        "  for (int64_t i0 = 0; i0 < D_0; ++i0) for (int64_t i1 = 0; i1 < 4; ++i1) {",
        "    if (i1 < 2) {",
        "      a();",
        "    } else {",
        "      b();",
        "    }",
        "  }",
        "  for (; done < D_0; ++done) {",
        "    c();",
        "  }",
        "}",
        "#ifdef ANYSHAPE_DNNL",
        "d();",
        "#endif",
    ]


def test_prune_drops_tagged_statements_at_any_depth():
    store = stmt("rb[0] = t1;", "rb", tag=("row store", 0))
    tree = [loop(For("i", "0", "n"), [store, if_("i < n", [store, stmt("x();")])])]
    pruned = prune(tree, lambda n: getattr(n, "tag", None) == ("row store", 0))
    assert "rb[0] = t1;" not in "\n".join(write(pruned))
    assert "x();" in "\n".join(write(pruned))
