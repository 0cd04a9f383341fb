"""Hypothesis-drawn shapes for every kernel family and two small models: one compilation each.

Each family of ``shape_families`` (pointwise, broadcast, reductions, stitch softmax and
LayerNorm, pools, convolutions, GEMMs, gather/embedding, a BERT-style block and a conv
block) is compiled once with ``anyshape.optimize``; hypothesis then draws sizes for every
dim (0 and 1, primes, larger values) and each draw must give eager's result, or an
exception where eager raises one, without compiling again. ``scripts/fuzz_shapes.py``
runs the same families for many more shapes, each family in a child process.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shape_families import FAMILIES, check, compile_family

import anyshape

EDGE, PRIMES, LARGER = [0, 1], [2, 3, 5, 7, 11, 13], [17, 31, 37, 64, 67]
SIZE = st.one_of(
    st.sampled_from(EDGE), st.sampled_from(PRIMES), st.sampled_from(LARGER), st.integers(0, 24)
)
CI = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Draws with more elements than this shrink (the whole file runs in CI time on one core).
MAX_ELEMENTS = 300_000


def _bounded(sizes: list[int]) -> list[int]:
    sizes = list(sizes)
    while _numel(sizes) > MAX_ELEMENTS:
        sizes[sizes.index(max(sizes))] //= 2
    return sizes


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= max(s, 1)
    return n


@pytest.mark.parametrize("name", list(FAMILIES))
def test_drawn_shapes_match_eager_with_one_compilation(name):
    family = FAMILIES[name]
    before = anyshape.stats()["compilations"]
    model, opt = compile_family(family)
    assert anyshape.stats()["compilations"] == before + 1

    @CI
    @given(st.lists(SIZE, min_size=family.n_sizes, max_size=family.n_sizes))
    def run(sizes):
        check(family, model, opt, _bounded(sizes))

    run()
    assert anyshape.stats()["compilations"] == before + 1, "a drawn shape recompiled"
