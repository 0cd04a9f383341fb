"""The loop-invariant pass over generated kernel lines (codegen/cpu/hoist.py)."""

from anyshape.codegen.cpu.hoist import hoist_invariants


def test_invariant_statements_move_before_the_loop_and_its_pragmas():
    lines = [
        "for (int64_t row = lo; row < hi; ++row) {",
        "  #pragma omp simd reduction(+:acc)",
        "  for (int64_t r0 = 0; r0 < D_1; ++r0) {",
        "    const bool t1 = (((const uint8_t*)p1)[(i2) * D_1 + 0] != 0);",
        "    const float t2 = ((const float*)p2)[(i2) * D_1 + r0];",
        "    const float t3 = ((float)0.125);",
        "    const float t4 = (t1 ? t2 * t3 : t3);",
        "    acc += t4;",
        "  }",
        "  if (++i2 == D_1) { i2 = 0; }",
        "}",
    ]
    out = hoist_invariants(lines)
    pragma = out.index("  #pragma omp simd reduction(+:acc)")
    # t1 reads only i2, which the inner loop does not change: it moves out of the r0 loop;
    # t3 is a constant and moves all the way out; t2 and t4 depend on r0 and stay.
    assert out.index("  const bool t1 = (((const uint8_t*)p1)[(i2) * D_1 + 0] != 0);") < pragma
    assert out[0] == "const float t3 = ((float)0.125);"
    assert out.index("    const float t2 = ((const float*)p2)[(i2) * D_1 + r0];") > pragma
    assert any("t4 = (t1 ? t2 * t3 : t3)" in ln for ln in out[pragma:])
    # i2 is assigned inside the row loop: t1 must not leave it.
    assert out.index("for (int64_t row = lo; row < hi; ++row) {") < out.index(
        "  const bool t1 = (((const uint8_t*)p1)[(i2) * D_1 + 0] != 0);"
    )
    assert len(out) == len(lines)


def test_scratch_error_state_stores_and_nested_blocks_stay():
    lines = [
        "for (int64_t i = 0; i < n; ++i) {",
        "  const float t0 = rb[0];",  # per-thread scratch
        "  const int64_t t1 = as_index((int64_t)(k), n, err);",  # sets the error flag
        "  const float t2 = ((const float*)p0)[3];",  # p0 is stored to in this loop
        "  if (c) {",
        "    const float t3 = ((const float*)p1)[0];",  # conditional: stays in its block
        "  }",
        "  ((float*)p0)[i] = t0 + t2;",
        "}",
    ]
    assert hoist_invariants(lines) == lines
