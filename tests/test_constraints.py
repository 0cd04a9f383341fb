"""ConstraintStore: equalities, ranges, products, divisibility; prove / guard / hint.

Hand-written cases pin each query, including the inconclusive ones that must
answer False. A property test checks soundness: whatever the store proves holds
for every assignment of the symbols that satisfies the recorded facts.
"""

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from anyshape.ir.constraints import ConstraintStore, Guard
from anyshape.ir.symbolic import SymExpr, floordiv, mod, sym_max, sym_min

S0, S1, S2, S3 = (SymExpr.symbol(f"s{i}") for i in range(4))


def store_with(**ranges) -> ConstraintStore:
    st_ = ConstraintStore()
    for name, (lo, hi) in ranges.items():
        st_.add_symbol(name, lo, hi)
    return st_


# --- equalities --------------------------------------------------------------------


def test_equalities_are_transitive_and_pick_the_simplest_representative():
    s = ConstraintStore()
    s.add_equal(S2, S1)
    s.add_equal(S1, S0)
    assert s.canonical(S2) == S0 and s.canonical(S1) == S0
    assert s.prove_eq(S2, S0) and s.prove_eq(3 * S2 + S1, 4 * S0)
    assert not s.prove_eq(S0, S3)


def test_a_symbol_equal_to_a_constant_gets_that_range():
    s = ConstraintStore()
    s.add_symbol("s0", 0, 100)
    s.add_equal(S0, 7)
    assert s.ranges["s0"] == (7, 7)
    assert s.bounds(S0) == (7, 7) and s.canonical(2 * S0 + 1) == 15


def test_every_symbol_of_a_class_gets_the_constant_range():
    # Order independence: s1 == s0 first, then s0 == 5, must leave the same facts as
    # learning s0 == 5 and s1 == 5 directly (what the parser replays).
    s = ConstraintStore()
    s.add_equal(S1, S0)
    s.add_equal(S0, 5)
    assert s.ranges["s0"] == s.ranges["s1"] == (5, 5)
    t = ConstraintStore()
    t.add_equal(S0, 5)
    t.add_equal(S1, 5)
    assert s.describe() == t.describe()


def test_equal_expressions_map_to_their_symbol():
    s = ConstraintStore()
    s.add_equal(S0 * S1, S2)
    assert s.canonical(S1 * S0) == S2
    assert s.prove_eq(S0 * S1, S2) and s.prove_eq(S2, S1 * S0)


# --- bounds --------------------------------------------------------------------------


def test_an_equated_compound_term_is_rewritten_inside_other_terms():
    # torch sized a view 16 // (s // 2) at an example where s // 2 == 1, and guarded that.
    s = ConstraintStore()
    half = floordiv(S0, 2)
    assert not s.prove_eq(16 * S1, S1 * floordiv(SymExpr.const(16), half))
    s.add_guard(Guard("eq", half, SymExpr.const(1), "torch.export guard"))
    assert [str(g) for g in s.guards] == ["floordiv(s0, 2) == 1"]
    assert s.prove_eq(16 * S1, S1 * floordiv(SymExpr.const(16), half))
    assert s.canonical(half * S1 + mod(half + 3, 2)) == S1
    assert not s.prove_eq(S0, 2)  # s0 is 2 or 3: nothing more follows
    other = ConstraintStore()
    other.add_guard(Guard("le", half, SymExpr.const(1), "an inequality is no fact"))
    assert not other.prove_eq(half, 1)


def test_a_compound_term_plus_a_constant_equated_to_a_constant_is_that_constant_less():
    # A convolution's frame count at an example of one frame: floordiv(s, 5) - 1 == 1; the
    # positional convolution over it records floordiv(s, 5) frames, which is 2.
    s = ConstraintStore()
    s.add_guard(Guard("eq", floordiv(S0, 5) - 1, SymExpr.const(1), "torch.export guard"))
    assert s.prove_eq(floordiv(S0, 5), 2) and s.prove_eq(3 * floordiv(S0, 5), 6)
    assert not s.prove_eq(S0, 10)  # s0 is 10 to 14


def test_a_compound_fact_holds_through_symbol_classes_and_a_zero_divisor_stays():
    s = ConstraintStore()
    s.add_guard(Guard("eq", floordiv(S1, 2), SymExpr.const(1), "a checked guard"))
    s.add_equal(S0, S1)  # s0 becomes the class's representative after the fact arrived
    assert s.canonical(S1) == S0
    assert s.prove_eq(floordiv(S0, 2), 1) and s.prove_eq(S2 * floordiv(S1, 2), S2)
    z = ConstraintStore()
    z.add_guard(Guard("eq", mod(S0, 4), SymExpr.const(0), "divisible by 4"))
    term = floordiv(S1, mod(S0, 4) + 0)
    assert z.canonical(term) == term  # (a divisor that is 0 by the fact: left as written)
    assert z.prove_eq(mod(S0, 4) * S1, 0)


def test_bounds_of_polynomials():
    s = store_with(s0=(2, 10), s1=(0, 3))
    assert s.bounds(2 * S0 - S1 + 1) == (2, 21)
    assert s.bounds(S0 * S1) == (0, 30)
    assert s.bounds(S0 * S0) == (4, 100)
    assert s.bounds(7) == (7, 7)
    assert s.bounds(S2) == (0, None)
    assert s.bounds(-S2) == (None, 0)
    assert s.bounds(S0 - S2) == (None, 10)


def test_bounds_of_compound_atoms_are_conservative():
    s = store_with(s0=(0, 100))
    assert s.bounds(mod(S0, 4)) == (0, 3)
    assert s.bounds(floordiv(S0, 3)) == (0, None)
    assert s.bounds(sym_max(S0, S1)) == (0, None)
    # mod by a negative constant lies in (d, 0]: no [0, d - 1] bound.
    lo, hi = s.bounds(mod(S0, -3))
    assert (lo is None or lo <= -2) and (hi is None or hi >= 0)
    assert not s.prove_le(mod(S0, -3), -4)


# --- prove --------------------------------------------------------------------------


def test_prove_le_and_lt():
    s = store_with(s0=(0, 8), s1=(8, 20))
    assert s.prove_le(S0, 8) and not s.prove_le(S0, 7)
    assert s.prove_lt(S0, 9) and not s.prove_lt(S0, 8)
    assert s.prove_le(S0, S1) and not s.prove_lt(S0, S1)
    assert s.prove_le(S2, S2 + 1) and s.prove_lt(S2, S2 + 1)
    assert not s.prove_le(S2, S3)  # inconclusive: no facts relate them
    assert not s.prove_le(S2, 1000)  # s2 is unbounded


def test_prove_ne_nonzero_not_one():
    s = store_with(s0=(1, None), s1=(2, None))
    assert s.prove_nonzero(S0) and not s.prove_not_one(S0)
    assert s.prove_not_one(S1) and s.prove_nonzero(S1)
    assert not s.prove_nonzero(S2) and not s.prove_not_one(S2)
    assert s.prove_ne(S2 + 1, S2) and not s.prove_ne(S2, S3)
    assert not s.prove_ne(S0, S0)


def test_prove_eq_inconclusive_is_false():
    s = store_with(s0=(0, 4), s1=(0, 4))
    assert s.prove_eq(S0 + S1, S1 + S0)
    assert not s.prove_eq(S0, S1)
    assert not s.prove_eq(S0, 2)
    assert store_with(s0=(3, 3)).prove_eq(S0, 3)


def test_prove_eq_uses_product_equalities():
    # reshape [s0, s1] -> [s2] records s0*s1 == s2.
    s = ConstraintStore()
    s.add_product_equal([S0, S1], [S2])
    assert s.prove_eq(S0 * S1, S2)
    assert not s.prove_eq(S0, S2)
    # Neither side a symbol: kept as a product equality only.
    t = ConstraintStore()
    t.add_product_equal([S0, S1], [S2, S3])
    assert t.product_eqs == [((S0, S1), (S2, S3))]
    assert t.prove_eq(S0 * S1, S2 * S3) and t.prove_eq(S3 * S2, S1 * S0)
    assert not t.prove_eq(S0, S2)


def test_prove_divisible():
    s = ConstraintStore()
    s.add_divisible("s0", 8)
    assert s.prove_divisible(S0, 4) and s.prove_divisible(3 * S0 + 12, 4)
    assert s.prove_divisible(S0 * S1, 8) and s.prove_divisible(2 * S1, 2)
    assert not s.prove_divisible(S0 + 1, 4)
    assert not s.prove_divisible(S1, 2)
    assert not s.prove_divisible(S0, 16)
    s.add_divisible("s1", 4)
    s.add_divisible("s1", 6)
    assert s.divisors["s1"] == 12 and s.prove_divisible(S1, 12)


# --- guard ---------------------------------------------------------------------------


def test_guard_eq_records_a_checked_guard():
    s = ConstraintStore()
    assert s.guard_eq(S0, S1, "add operands dim 0")
    (g,) = s.guards
    assert g == Guard("eq", S0, S1, "add operands dim 0")
    assert g.holds({"s0": 3, "s1": 3}) and not g.holds({"s0": 3, "s1": 4})
    assert g.free_symbols_bound({"s0": 1, "s1": 2}) and not g.free_symbols_bound({"s0": 1})
    assert str(g) == "s0 == s1"
    assert 'guard eq s0 ; s1 ; "add operands dim 0"' in s.describe()
    # From now on the equality is assumed: no second guard.
    assert s.prove_eq(S1, S0)
    s.guard_eq(S1, S0, "again")
    assert len(s.guards) == 1


def test_guard_eq_of_a_guard_a_frontend_recorded_adds_no_second_check():
    # (Dynamo's guard for a view, recorded as a guard only; a type rule asks again)
    s = ConstraintStore()
    s.add_guard(Guard("eq", S0 * S1, 3 * S1 * floordiv(S0, 3), "view"))
    assert not s.prove_eq(S0 * S1, 3 * S1 * floordiv(S0, 3))
    assert s.guard_eq(3 * S1 * floordiv(S0, 3), S0 * S1, "reshape")
    assert len(s.guards) == 1
    assert s.prove_eq(S0 * S1, 3 * S1 * floordiv(S0, 3))  # (assumed from now on)
    s.guard_eq(S0, S1, "another")
    assert len(s.guards) == 2


def test_guard_eq_skips_provable_and_rejects_impossible():
    s = store_with(s0=(5, 5))
    assert s.guard_eq(S0, 5, "fixed") and s.guards == []
    with pytest.raises(ValueError, match="can never hold"):
        s.guard_eq(3, 4, "static mismatch")
    with pytest.raises(ValueError, match="can never hold"):
        s.guard_eq(S1 + 1, S1, "off by one")
    assert s.guards == []


def test_guard_le():
    s = ConstraintStore()
    assert s.guard_le(S0, 16, "fits")
    (g,) = s.guards
    assert g.op == "le" and g.holds({"s0": 16}) and not g.holds({"s0": 17})
    assert str(g) == "s0 <= 16"
    assert s.ranges["s0"] == (0, 16) and s.prove_le(S0, 16)
    s.guard_le(S0, 20, "implied")
    assert len(s.guards) == 1
    with pytest.raises(ValueError, match="can never hold"):
        store_with(s1=(10, 20)).guard_le(S1, 4, "too small")


# --- hint, describe --------------------------------------------------------------------


def test_hint():
    s = ConstraintStore()
    s.add_symbol("s0", hint=5)
    s.add_symbol("s1", 1, 64, hint=3)
    assert s.hint(2 * S0 + 1) == 11 and s.hint(S0 * S1) == 15 and s.hint(4) == 4
    assert s.hint(S0 + S2) is None


def test_describe_is_ordered_and_stable():
    s = ConstraintStore()
    s.add_symbol("s1", 1, None)
    s.add_symbol("s0", 0, 64)
    s.add_divisible("s0", 2)
    s.add_equal(S3, S2)
    s.add_product_equal([S0, S1], [S2, 4])
    s.guard_eq(S0, S1, "why")
    assert s.describe() == [
        "range s0 in [0, 64]",
        "range s1 in [1, inf]",
        "divisible s0 by 2",
        "equal s1 == s0",
        "equal s3 == s2",
        "product s0 * s1 == s2 * 4",
        'guard eq s0 ; s1 ; "why"',
    ]


# --- soundness ------------------------------------------------------------------------

SYMS = ("s0", "s1", "s2")
leaves = st.one_of(st.sampled_from(SYMS).map(SymExpr.symbol), st.integers(-3, 5).map(SymExpr.const))
exprs = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.builds(lambda a, b: a + b, kids, kids),
        st.builds(lambda a, b: a - b, kids, kids),
        st.builds(lambda a, b: a * b, kids, kids),
        st.builds(floordiv, kids, st.sampled_from([2, 3, -2])),
        st.builds(mod, kids, st.sampled_from([2, 3, -3])),
        st.builds(sym_max, kids, kids),
        st.builds(sym_min, kids, kids),
    ),
    max_leaves=5,
)
ranges = st.tuples(st.integers(0, 4), st.integers(0, 3))
FACTS = {
    "s0 == s1": lambda v: v["s0"] == v["s1"],
    "s2 == s0*s1": lambda v: v["s2"] == v["s0"] * v["s1"],
    "s2 == 3": lambda v: v["s2"] == 3,
    "s0*s1 == 2*s2": lambda v: v["s0"] * v["s1"] == 2 * v["s2"],
    "s1 % 2": lambda v: v["s1"] % 2 == 0,
    "s0 // 2 == 1": lambda v: v["s0"] // 2 == 1,
    "(s0 // 2)*(s1 // 2) == 2": lambda v: (v["s0"] // 2) * (v["s1"] // 2) == 2,
}


def _record(store: ConstraintStore, fact: str) -> None:
    if fact == "s0 == s1":
        store.add_equal(S0, S1)
    elif fact == "s2 == s0*s1":
        store.add_equal(S2, S0 * S1)
    elif fact == "s2 == 3":
        store.add_equal(S2, 3)
    elif fact == "s0*s1 == 2*s2":
        store.add_product_equal([S0, S1], [2, S2])
    elif fact == "s0 // 2 == 1":
        store.add_guard(Guard("eq", floordiv(S0, 2), SymExpr.const(1), "a checked guard"))
    elif fact == "(s0 // 2)*(s1 // 2) == 2":
        grid = floordiv(S0, 2) * floordiv(S1, 2)
        store.add_guard(Guard("eq", grid, SymExpr.const(2), "a checked guard"))
    else:
        store.add_divisible("s1", 2)


def _models(rng: dict, facts) -> list[dict]:
    """Every assignment within the ranges that satisfies the facts."""
    names = sorted(rng)
    out = []
    spans = [range(rng[n][0], rng[n][0] + rng[n][1] + 1) for n in names]
    for values in itertools.product(*spans):
        env = dict(zip(names, values))
        if all(FACTS[f](env) for f in facts):
            out.append(env)
    return out


def _store(rng: dict, facts) -> ConstraintStore:
    s = ConstraintStore()
    for name, (lo, w) in rng.items():
        s.add_symbol(name, lo, lo + w)
    for f in sorted(facts):
        _record(s, f)
    return s


stores = st.tuples(
    st.fixed_dictionaries({n: ranges for n in SYMS}), st.sets(st.sampled_from(sorted(FACTS)))
)


@settings(max_examples=200, deadline=None)
@given(stores, exprs, exprs)
def test_proofs_are_sound(facts, a, b):
    rng, fs = facts
    models = _models(rng, fs)
    assume(models)
    s = _store(rng, fs)
    claims = {
        "le": (s.prove_le(a, b), lambda x, y: x <= y),
        "lt": (s.prove_lt(a, b), lambda x, y: x < y),
        "eq": (s.prove_eq(a, b), lambda x, y: x == y),
        "ne": (s.prove_ne(a, b), lambda x, y: x != y),
    }
    for env in models:
        x, y = a.evaluate(env), b.evaluate(env)
        for name, (proved, check) in claims.items():
            assert not proved or check(x, y), f"prove_{name}({a}, {b}) is wrong at {env}"


@settings(max_examples=200, deadline=None)
@given(stores, exprs)
def test_bounds_and_divisibility_are_sound(facts, e):
    rng, fs = facts
    models = _models(rng, fs)
    assume(models)
    s = _store(rng, fs)
    lo, hi = s.bounds(e)
    div2 = s.prove_divisible(e, 2)
    for env in models:
        v = e.evaluate(env)
        assert lo is None or lo <= v, f"bounds({e}) = {(lo, hi)} but {v} at {env}"
        assert hi is None or v <= hi, f"bounds({e}) = {(lo, hi)} but {v} at {env}"
        assert not div2 or v % 2 == 0, f"{e} proved even but is {v} at {env}"


def test_canonical_shapes_write_equal_dims_one_way_and_loops_then_fuse():
    """``add(x, y)`` makes s2 == s0: afterwards sin(y) is f32[s0, s1] like exp(x), and the
    three loop nests over one shape become one kernel; inputs keep their own dims."""
    from anyshape.codegen.cpu.executable import CpuExecutable
    from anyshape.config import Options
    from anyshape.errors import InputError
    from anyshape.ir.dtypes import DType
    from anyshape.ir.graph import GraphBuilder
    from anyshape.ir.types import TensorType
    from anyshape.passes import canonical_shapes

    b = GraphBuilder(name="canon")
    x = b.input("x", TensorType(DType.f32, (S0, S1)))
    y = b.input("y", TensorType(DType.f32, (S2, S1)))
    graph = b.build([b.op("exp", x), b.op("sin", y), b.op("add", x, y)])
    assert str(graph.outputs[1].type) == "f32[s2, s1]"
    out = canonical_shapes.run(graph, Options())
    rep = out.outputs[0].type
    assert all(o.type == rep for o in out.outputs), [str(o.type) for o in out.outputs]
    assert [str(i.type) for i in out.inputs] == ["f32[s0, s1]", "f32[s2, s1]"]
    assert canonical_shapes.run(out, Options()) is out  # a fixpoint
    exe = CpuExecutable(out, [])
    assert exe.kernel_descriptions[0].startswith("horizontal loop x3"), exe.kernel_descriptions
    x, y = np.full((2, 3), 0.5, np.float32), np.full((2, 3), 0.25, np.float32)
    e, s, a = exe([x, y], [])
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(s, np.sin(y), rtol=1e-6)
    np.testing.assert_allclose(a, x + y)
    with pytest.raises(InputError, match="s0 == s2|s2 == s0|dim 0"):
        exe([x, np.zeros((3, 3), np.float32)], [])


def test_passes_walk_graphs_deeper_than_the_recursion_limit():
    """A chain of 5000 ops (ViT-base lowers to chains of over a thousand) goes through
    every pass; a cast pair that simplify removes at its far end shows the walk reached it."""
    import sys

    from anyshape.config import Options
    from anyshape.ir.dtypes import DType
    from anyshape.ir.graph import GraphBuilder
    from anyshape.ir.types import TensorType
    from anyshape.passes.pipeline import run_pipeline

    b = GraphBuilder(name="deep")
    v = b.input("x", TensorType(DType.f32, (S0,)))
    for _ in range(5000):
        v = b.op("neg", v)
    assert 5000 > sys.getrecursionlimit()
    wide = b.op("convert", v, dtype=DType.f64)
    graph = b.build([b.op("convert", wide, dtype=DType.f32)])
    out = run_pipeline(graph, Options())
    assert out.outputs[0].op == "neg"
    assert sum(n.op == "neg" for n in out.nodes()) == 5000


def test_a_power_equated_to_a_constant_gives_its_root():
    """``floordiv(s, 8)**2 == 16`` (a torch.export guard of ViT's patch grid) implies
    ``floordiv(s, 8) == 4``, so every product over the grid is known: a graph relying on
    ``32*b*floordiv(s, 8)**2 == 512*b`` needs no guard of its own."""
    s, b = SymExpr.symbol("s"), SymExpr.symbol("b")
    store = ConstraintStore()
    grid = floordiv(s, 8)
    store.add_equal(grid * grid, 16)
    assert store.prove_eq(grid, 4)
    assert store.prove_eq(32 * b * grid * grid, 512 * b)
    assert store.prove_eq(32 * b * grid * grid + 32 * b, 544 * b)
    for value in (15, 17):  # no exact root: nothing more is known
        other = ConstraintStore()
        other.add_equal(grid * grid, value)
        assert not other.prove_eq(grid, 4) and not other.prove_eq(grid, 3)
    cube = ConstraintStore()
    cube.add_equal(2 * grid * grid * grid, 54)  # 2 * g**3 == 54: g == 3
    assert cube.prove_eq(grid, 3)


def test_a_product_of_two_sizes_equated_to_a_constant_holds_inside_other_terms():
    """ViT's patch grid of a non-square image: torch guards ``floordiv(h, 8)*floordiv(w,
    8) == 16``. The tokens, one more, are 17, in a batch of ``b`` 17*b rows: the graph
    relies on no guard of its own for either."""
    h, w, b = (SymExpr.symbol(n) for n in ("h", "w", "b"))
    grid = floordiv(h, 8) * floordiv(w, 8)
    store = ConstraintStore()
    store.add_guard(Guard("eq", grid, SymExpr.const(16), "torch.export guard"))
    assert store.prove_eq(grid + 1, 17)
    assert store.prove_eq(32 * b * grid, 512 * b)
    assert store.prove_eq(64 * b * grid + 64 * b, 1088 * b)
    assert store.prove_eq(b * grid * floordiv(h, 8), 16 * b * floordiv(h, 8))
    assert not store.prove_eq(floordiv(h, 8), 4)  # (2 x 8 or 4 x 4 or ...: no one factor)
    twice = ConstraintStore()
    twice.add_guard(Guard("eq", 2 * grid, SymExpr.const(7), "never holds"))
    assert not twice.prove_eq(grid, 3) and not twice.prove_eq(grid, 4)


def test_a_guard_dividing_by_a_size_of_0_does_not_hold():
    """``mod(1, s) != 0`` at s = 0 divides by 0: the guard fails (a variant is compiled for
    that case), it does not raise ZeroDivisionError into the caller."""
    from anyshape.ir.symbolic import as_expr

    s = SymExpr.symbol("s")
    assert not Guard("ne", mod(as_expr(1), s), as_expr(0), "t").holds({"s": 0})
    assert Guard("ne", mod(as_expr(1), s), as_expr(0), "t").holds({"s": 3})
    assert not Guard("le", as_expr(1), floordiv(as_expr(16), s), "t").holds({"s": 0})
