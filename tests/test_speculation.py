"""Speculation: kernel variants chosen per call by predicates on the bound sizes.

Two kinds of variant, each run here on shapes that select it and shapes that do
not, against NumPy:

- no run-time broadcast: a dim that may be 1 costs a select per index; the
  variant assumes it is not 1;
- extents vs threads: when a kernel has fewer rows (outputs) than threads, the
  variant splits each row (reduction) over the threads instead of handing whole
  rows to them;
- vector width divisible vs tail: a stitch kernel's row loops run 16-lane
  vectors, then (when the row length is not a multiple of 16) one masked block.

The executables here run on 3 threads, so 1 and 2 rows take the split variant
and 3 or more do not. Rows of 5000 elements pass the parallel threshold of a
loop nest; a stitch kernel splits rows of 40000 (not 5000).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from anyshape.codegen.cpu.executable import CpuExecutable
from anyshape.ir.parser import parse_graph

THREADS = 3

SOFTMAX_AND_EXP = """graph @spec(%x: f32[s0, s1], %y: f32[s2, s1]) {
  %0 = broadcast_in_dim(%y) {dims=[0, 1], shape=[s0, s1]} : f32[s0, s1]
  %1 = add(%x, %0) : f32[s0, s1]
  %2 = reduce(%1) {axes=[1], kind="max"} : f32[s0]
  %3 = broadcast_in_dim(%2) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %4 = sub(%1, %3) : f32[s0, s1]
  %5 = exp(%4) : f32[s0, s1]
  %6 = reduce(%5) {axes=[1], kind="sum"} : f32[s0]
  %7 = broadcast_in_dim(%6) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %8 = div(%5, %7) : f32[s0, s1]
  %9 = exp(%1) : f32[s0, s1]
  return %8, %9
}
"""

REDUCTIONS = """graph @red(%x: f32[s0, s1]) {
  %0 = reduce(%x) {axes=[0, 1], kind="sum"} : f32[]
  %1 = mul(%x, %x) : f32[s0, s1]
  %2 = reduce(%1) {axes=[1], kind="max"} : f32[s0]
  %3 = reduce(%x) {axes=[1], kind="min"} : f32[s0]
  return %0, %2, %3
}
"""


@pytest.fixture(scope="module")
def softmax_exe():
    return CpuExecutable(parse_graph(SOFTMAX_AND_EXP), [], num_threads=THREADS)


def test_variants_and_their_predicates_are_described(softmax_exe):
    stitch, pointwise = softmax_exe.kernel_descriptions
    assert stitch.startswith("stitch:"), stitch
    assert stitch.endswith(
        "[variants: s2 != 1 (no run-time broadcast) and s0 rows < threads and rows longer "
        "than 29127: each row's reductions and pass split over threads | s2 != 1 (no "
        "run-time broadcast), else whole rows per thread | general] [row tail: s1 % 16 != 0: "
        "the last s1 % 16 as one masked block]"
    ), stitch
    assert pointwise.endswith(
        "[variants: s2 != 1 (no run-time broadcast) and s0 rows < threads: the last dim "
        "split over threads | s2 != 1 (no run-time broadcast), else whole rows per thread "
        "| general]"
    ), pointwise
    assert softmax_exe.source.count("< omp_get_max_threads()") == 2


@pytest.mark.parametrize(
    "rows, yrows, width",
    [
        (1, 1, 5000),  # s2 is 1: the general variant
        (2, 2, 40000),  # no broadcast, split variants, parallel inside the row
        (2, 2, 5000),  # split loop nest, stitch rows too short to split
        (2, 1, 5000),  # broadcast: the general variant
        (3, 3, 5000),  # as many rows as threads: rows handed to threads
        (5, 5, 7),  # short rows
        (1, 1, 7),  # split variant below the parallel threshold
        (2, 2, 1),
        (0, 0, 9),
    ],
)
def test_every_variant_matches_numpy(softmax_exe, rows, yrows, width):
    rng = np.random.default_rng(rows * 100 + width)
    x = (4 * rng.standard_normal((rows, width))).astype(np.float32)
    y = rng.standard_normal((yrows, width)).astype(np.float32)
    soft, ex = softmax_exe([x, y], [])
    z = x + y
    want = np.exp(z - z.max(1, keepdims=True)) if rows else z
    np.testing.assert_allclose(soft, want / want.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ex, np.exp(z), rtol=1e-5)


def test_reductions_split_when_outputs_are_fewer_than_threads():
    exe = CpuExecutable(parse_graph(REDUCTIONS), [], num_threads=THREADS)
    total, square_max, row_min = exe.kernel_descriptions
    assert "[variants: 1 outputs < threads: each reduction split over threads" in total
    assert "s0 outputs < threads" in square_max and "s0 outputs < threads" in row_min
    rng = np.random.default_rng(0)
    for rows, width in [(1, 40000), (2, 30000), (3, 20000), (7, 3), (1, 1)]:
        x = rng.standard_normal((rows, width)).astype(np.float32)
        x[0, width // 2] = 9.0  # the max sits in the second thread's share
        s, m, lo = exe([x], [])
        np.testing.assert_allclose(s, x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
        np.testing.assert_array_equal(m, (x * x).max(1))
        np.testing.assert_array_equal(lo, x.min(1))


def test_split_max_propagates_nan():
    exe = CpuExecutable(parse_graph(REDUCTIONS), [], num_threads=THREADS)
    x = np.ones((1, 50000), np.float32)
    x[0, 49000] = np.nan
    s, m, lo = exe([x], [])
    assert np.isnan(s) and np.isnan(m).all() and np.isnan(lo).all()


def test_a_short_static_row_has_no_split_variant():
    graph = parse_graph(
        """graph @short(%x: f32[s0, 64]) {
  %0 = exp(%x) : f32[s0, 64]
  return %0
}
"""
    )
    exe = CpuExecutable(graph, [], num_threads=THREADS)
    assert "[variants" not in exe.kernel_descriptions[0]
    x = np.linspace(-3, 3, 128, dtype=np.float32).reshape(2, 64)
    np.testing.assert_allclose(exe([x], [])[0], np.exp(x), rtol=1e-6)


def test_one_long_row_is_split_and_a_short_one_is_not():
    graph = parse_graph(
        """graph @row(%x: f32[s0]) {
  %0 = reduce(%x) {axes=[0], kind="max"} : f32[]
  %1 = broadcast_in_dim(%0) {dims=[], shape=[s0]} : f32[s0]
  %2 = sub(%x, %1) : f32[s0]
  %3 = exp(%2) : f32[s0]
  %4 = reduce(%3) {axes=[0], kind="sum"} : f32[]
  %5 = broadcast_in_dim(%4) {dims=[], shape=[s0]} : f32[s0]
  %6 = div(%3, %5) : f32[s0]
  return %6
}
"""
    )
    exe = CpuExecutable(graph, [], num_threads=THREADS)
    (stitch,) = exe.kernel_descriptions
    assert "1 rows < threads and rows longer than" in stitch, stitch
    rng = np.random.default_rng(1)
    for n in [1, 7, 100, 60000]:
        x = (3 * rng.standard_normal(n)).astype(np.float32)
        (got,) = exe([x], [])
        want = np.exp(x - x.max())
        np.testing.assert_allclose(got, want / want.sum(), rtol=1e-5, atol=1e-9)


LAYER_NORM_SOFTMAX = """graph @ln(%x: f32[s0, s1]) {
  %0 = reduce(%x) {axes=[1], kind="sum"} : f32[s0]
  %1 = broadcast_in_dim(%0) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %2 = sub(%x, %1) : f32[s0, s1]
  %3 = mul(%2, %2) : f32[s0, s1]
  %4 = reduce(%3) {axes=[1], kind="sum"} : f32[s0]
  %5 = broadcast_in_dim(%4) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %6 = div(%2, %5) : f32[s0, s1]
  %7 = reduce(%x) {axes=[1], kind="max"} : f32[s0]
  %8 = broadcast_in_dim(%7) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %9 = sub(%x, %8) : f32[s0, s1]
  %10 = exp(%9) : f32[s0, s1]
  %11 = reduce(%10) {axes=[1], kind="sum"} : f32[s0]
  %12 = broadcast_in_dim(%11) {dims=[0], shape=[s0, s1]} : f32[s0, s1]
  %13 = div(%10, %12) : f32[s0, s1]
  return %6, %13
}
"""


@pytest.fixture(scope="module")
def row_exe():
    return CpuExecutable(parse_graph(LAYER_NORM_SOFTMAX), [], num_threads=THREADS)


@pytest.mark.parametrize("width", [1, 5, 15, 16, 17, 31, 32, 33, 100, 257])
def test_rows_with_and_without_a_masked_tail_match_numpy(row_exe, width):
    """Widths below, at and past multiples of 16; the row's max sits in its tail, so a
    tail lane that were dropped (or a lane past the row that were read) shows."""
    assert all("[row tail: s1 % 16 != 0" in d for d in row_exe.kernel_descriptions)
    rng = np.random.default_rng(width)
    x = rng.standard_normal((6, width)).astype(np.float32)
    x[:, -1] = 8.0
    norm, soft = row_exe([x], [])
    z = x.astype(np.float64)
    c = z - z.sum(1, keepdims=True)
    with np.errstate(invalid="ignore"):  # rows of 1: 0 / 0 on both sides
        want_norm = c / (c * c).sum(1, keepdims=True)
    np.testing.assert_allclose(norm, want_norm, rtol=1e-4, atol=1e-6)
    e = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


PARTIAL_SUMS = re.compile(r"float (acc\d+)v\[64\];")


@pytest.mark.parametrize("width", [63, 64, 65, 511, 512, 513, 575, 1000, 4100])
def test_cheap_row_sums_add_into_partial_sums(row_exe, width):
    """The layer norm's two sums (no transcendental fused) run in blocks of 64 lanes,
    each into its own partial sum, where a row of run-time length holds 8 blocks or
    more (checked per row), then the rest of the row into the sum; the softmax's sum of
    exps keeps one accumulator. Widths below, at and past the bar and a block, with
    large values at both ends of the row, so a lane dropped from a block, from the rest
    or from the final fold shows."""
    parts = PARTIAL_SUMS.findall(row_exe.source)
    assert len(parts) == 2, parts  # one kernel variant with whole rows: its two sums
    assert row_exe.source.count("if (r0n >= 8) {") == 1  # (rows of 512 or more)
    rng = np.random.default_rng(width)
    x = rng.standard_normal((5, width)).astype(np.float32)
    x[:, 0], x[:, -1] = -20.0, 30.0
    norm, soft = row_exe([x], [])
    z = x.astype(np.float64)
    c = z - z.sum(1, keepdims=True)
    np.testing.assert_allclose(norm, c / (c * c).sum(1, keepdims=True), rtol=2e-5, atol=1e-8)
    e = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("width, partial, rest", [(40, 0, False), (100, 0, False),
                                                  (128, 2, False), (200, 2, True)])  # fmt: skip
def test_static_rows_take_partial_sums_from_two_blocks(width, partial, rest):
    """A static row shorter than two blocks sums into one accumulator (setting up and
    folding the partial sums cost more than they saved); a static row of whole blocks
    has no rest loop. Results as NumPy's either way."""
    graph = LAYER_NORM_SOFTMAX.replace("s1]", f"{width}]")
    exe = CpuExecutable(parse_graph(graph), [], THREADS)
    assert len(PARTIAL_SUMS.findall(exe.source)) == partial
    assert ("= r0n * 64; r0 <" in exe.source) == rest
    x = np.random.default_rng(width).standard_normal((4, width)).astype(np.float32)
    x[:, -1] = 25.0
    z = x.astype(np.float64)
    c = z - z.sum(1, keepdims=True)
    want = c / (c * c).sum(1, keepdims=True)
    np.testing.assert_allclose(exe([x], [])[0], want, rtol=2e-5, atol=1e-8)


def test_a_nan_in_the_tail_propagates_through_max(row_exe):
    x = np.zeros((3, 21), np.float32)
    x[1, 19] = np.nan
    soft = row_exe([x], [])[1]
    assert np.isnan(soft[1]).all()
    np.testing.assert_allclose(soft[[0, 2]], np.full((2, 21), 1 / 21, np.float32), rtol=1e-6)


def test_a_static_row_of_whole_vectors_has_no_tail():
    sixteen = LAYER_NORM_SOFTMAX.replace("s1]", "48]")
    exe = CpuExecutable(parse_graph(sixteen), [], num_threads=THREADS)
    assert not any("row tail" in d for d in exe.kernel_descriptions)
    assert "& ~(int64_t)15" not in exe.source
    odd = CpuExecutable(parse_graph(LAYER_NORM_SOFTMAX.replace("s1]", "40]")), [], THREADS)
    tail = "[row tail: rows of 40: the last 8 elements as one masked block]"
    assert all(d.endswith(tail) for d in odd.kernel_descriptions)
    x = np.random.default_rng(1).standard_normal((4, 40)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(odd([x], [])[1], e / e.sum(1, keepdims=True), rtol=1e-5)


def test_no_broadcast_variants_are_planned_printed_and_verified():
    from dataclasses import replace

    from anyshape.schedule.plan import plan_schedule
    from anyshape.schedule.printer import print_plan
    from anyshape.schedule.verifier import PlanError, verify_plan

    graph = parse_graph(SOFTMAX_AND_EXP)
    sched = plan_schedule(graph)
    text = print_plan(sched)
    # Both kernels read %y through a broadcast of s2 rows: each assumes s2 != 1.
    assert text.count("speculate(s2 != 1: no run-time broadcast)") == 2, text
    verify_plan(sched)
    # An assumption none of the kernel's broadcasts decides per call is refused.
    root = sched.kernels[0]
    bogus = replace(sched.no_broadcast[id(root)], assumed=(graph.inputs[0].shape[1],))
    sched.no_broadcast[id(root)] = bogus
    with pytest.raises(PlanError, match="assumes s1 != 1"):
        verify_plan(sched)


def test_a_size_proved_not_one_reads_through_without_a_variant():
    # s2 >= 2: the broadcast of %y can only be the identity, so no select and no variant.
    graph = parse_graph(SOFTMAX_AND_EXP)
    graph.constraints.add_symbol("s2", 2)
    exe = CpuExecutable(graph, [], num_threads=THREADS)
    assert not any("no run-time broadcast" in d for d in exe.kernel_descriptions)
    assert "== 1 ? 0 :" not in exe.source
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    soft, ex = exe([x, x[::-1].copy()], [])
    z = x + x[::-1]
    np.testing.assert_allclose(ex, np.exp(z), rtol=1e-5)
    w = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(soft, w / w.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_broadcast_the_emitter_matches_away_leaves_no_variant():
    # x ** 2 through a broadcast of a constant sized s3 (which may be 1): the plan assumes
    # s3 != 1, but the kernel multiplies x by itself and reads no broadcast per call.
    graph = parse_graph(
        """graph @p(%x: f32[s0], %k: f32[s3]) {
  %c = constant {dtype=f32, value=2.0} : f32[]
  %0 = broadcast_in_dim(%c) {dims=[], shape=[s3]} : f32[s3]
  %1 = broadcast_in_dim(%0) {dims=[0], shape=[s0]} : f32[s0]
  %2 = pow(%x, %1) : f32[s0]
  return %2
}"""
    )
    exe = CpuExecutable(graph, [], num_threads=THREADS)
    assert not any("no run-time broadcast" in d for d in exe.kernel_descriptions)
    assert "!= 1" not in exe.source.split("AS_KERNEL int")[1]
    x = np.arange(5, dtype=np.float32)
    (y,) = exe([x, np.ones(5, np.float32)], [])
    np.testing.assert_allclose(y, x * x)


def _softmax_ir(x: str, rows: str, shape: str, first: int) -> str:
    """IR lines of a softmax over the last dim of ``%x`` (``shape``: its dims; ``rows``:
    all but the last), values numbered from ``first``."""
    r, n = f"f32[{rows}]", f"f32[{shape}]"
    v = [f"%{first + k}" for k in range(7)]
    return f"""  {v[0]} = reduce(%{x}) {{axes=[3], kind="max"}} : {r}
  {v[1]} = broadcast_in_dim({v[0]}) {{dims=[0, 1, 2], shape=[{shape}]}} : {n}
  {v[2]} = sub(%{x}, {v[1]}) : {n}
  {v[3]} = exp({v[2]}) : {n}
  {v[4]} = reduce({v[3]}) {{axes=[3], kind="sum"}} : {r}
  {v[5]} = broadcast_in_dim({v[4]}) {{dims=[0, 1, 2], shape=[{shape}]}} : {n}
  {v[6]} = div({v[3]}, {v[5]}) : {n}
"""


ATTENTION_SOFTMAX = (
    "graph @scores(%x: f32[s0, 4, s1, s1], %y: f32[s0, 4, s2, s1]) {\n"
    + _softmax_ir("x", "s0, 4, s1", "s0, 4, s1, s1", 0)
    + _softmax_ir("y", "s0, 4, s2", "s0, 4, s2, s1", 7)
    + "  return %6, %13\n}\n"
)


def test_rows_that_count_their_own_length_get_no_split_variant():
    """Self-attention's scores [B, H, S, S]: a row long enough to split comes with that
    many rows or more, so the split variant could never run and is not compiled; a
    cross-attention's [B, H, T, S] (T queries, S keys) keeps it."""
    exe = CpuExecutable(parse_graph(ATTENTION_SOFTMAX), [], num_threads=THREADS)
    self_attention, cross_attention = exe.kernel_descriptions
    assert "split over threads" not in self_attention, self_attention
    assert "4*s0*s2 rows < threads and rows longer than" in cross_attention, cross_attention
    assert exe.source.count("< omp_get_max_threads()") == 1
    rng = np.random.default_rng(2)
    for b, s, t in [(1, 7, 1), (2, 33, 3), (0, 5, 2), (1, 1, 1)]:
        x = (3 * rng.standard_normal((b, 4, s, s))).astype(np.float32)
        y = (3 * rng.standard_normal((b, 4, t, s))).astype(np.float32)
        for got, z in zip(exe([x, y], []), (x, y)):
            want = np.exp(z - z.max(-1, keepdims=True)) if z.size else z
            want = want / want.sum(-1, keepdims=True) if z.size else z
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
