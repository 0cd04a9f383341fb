"""SymExpr algebra against brute force: evaluation, canonical form, text form, subs.

Random expression trees over a few symbols are built twice: once as SymExprs
(the algebra under test) and once evaluated with plain Python ints (the
oracle). Environments where some divisor of the tree is zero are skipped.
"""

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from anyshape.ir.symbolic import (
    SymExpr,
    as_dim,
    as_expr,
    floordiv,
    format_expr,
    mod,
    parse_expr,
    shape_numel,
    sym_max,
    sym_min,
)

SYMS = ("s0", "s1", "s2")
S0, S1, S2 = (SymExpr.symbol(n) for n in SYMS)
SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)

# --- trees: ("sym", name) | ("const", c) | (op, left, right) ----------------------

leaves = st.one_of(
    st.sampled_from(SYMS).map(lambda s: ("sym", s)),
    st.integers(-4, 6).map(lambda c: ("const", c)),
)
BINOPS = ("add", "sub", "mul", "floordiv", "mod", "max", "min")


def _extend(children):
    nonzero = st.sampled_from([-3, -2, 1, 2, 3, 4, 6]).map(lambda c: ("const", c))
    return st.one_of(
        st.tuples(st.sampled_from(BINOPS), children, children),
        st.tuples(st.sampled_from(("floordiv", "mod")), children, nonzero),
    )


trees = st.recursive(leaves, _extend, max_leaves=6)

# Values substituted for symbols must be >= 0 like the symbols they replace, since
# simplification already relied on that (max(s0, 0) is s0): trees of nonneg parts.
nonneg_trees = st.recursive(
    st.one_of(
        st.sampled_from(SYMS).map(lambda s: ("sym", s)),
        st.integers(0, 6).map(lambda c: ("const", c)),
    ),
    lambda children: st.one_of(
        st.tuples(st.sampled_from(("add", "mul", "max", "min")), children, children),
        st.tuples(
            st.sampled_from(("floordiv", "mod")),
            children,
            st.sampled_from([1, 2, 3, 5]).map(lambda c: ("const", c)),
        ),
    ),
    max_leaves=4,
)
envs = st.fixed_dictionaries({s: st.integers(0, 12) for s in SYMS})


def build(tree, leaf=SymExpr.symbol) -> SymExpr:
    """The tree as a SymExpr; ``leaf`` maps symbol names to expressions."""
    kind = tree[0]
    if kind == "sym":
        return leaf(tree[1])
    if kind == "const":
        return SymExpr.const(tree[1])
    a, b = build(tree[1], leaf), build(tree[2], leaf)
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "floordiv": lambda: floordiv(a, b),
        "mod": lambda: mod(a, b),
        "max": lambda: sym_max(a, b),
        "min": lambda: sym_min(a, b),
    }[kind]()


def oracle(tree, env) -> int:
    """The tree evaluated with Python ints (raises ZeroDivisionError on a zero divisor)."""
    kind = tree[0]
    if kind == "sym":
        return env[tree[1]]
    if kind == "const":
        return tree[1]
    a, b = oracle(tree[1], env), oracle(tree[2], env)
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "floordiv": lambda: a // b,
        "mod": lambda: a % b,
        "max": lambda: max(a, b),
        "min": lambda: min(a, b),
    }[kind]()


def build_or_skip(tree, leaf=SymExpr.symbol) -> SymExpr:
    try:
        return build(tree, leaf)
    except ZeroDivisionError:  # a divisor simplified to the constant 0
        assume(False)


def oracle_or_skip(tree, env) -> int:
    try:
        return oracle(tree, env)
    except ZeroDivisionError:
        assume(False)


# --- properties ------------------------------------------------------------------


@SETTINGS
@given(trees, envs)
def test_evaluate_matches_python_ints(tree, env):
    want = oracle_or_skip(tree, env)
    assert build_or_skip(tree).evaluate(env) == want


@SETTINGS
@given(trees, trees, trees)
def test_ring_identities_give_equal_canonical_forms(ta, tb, tc):
    a, b, c = build_or_skip(ta), build_or_skip(tb), build_or_skip(tc)
    pairs = [
        (a * (b + c), a * b + a * c),
        ((a + b) + c, a + (b + c)),
        ((a * b) * c, a * (b * c)),
        (a + b, b + a),
        (a * b, b * a),
        (a - b, -(b - a)),
        (a - a, SymExpr.const(0)),
        ((a + b) * (a - b), a * a - b * b),
        (sym_max(a, b), sym_max(b, a)),
        (sym_min(a, b), sym_min(b, a)),
        (sym_max(sym_max(a, b), c), sym_max(a, sym_max(b, c))),
        (sym_min(sym_min(a, b), c), sym_min(a, sym_min(b, c))),
    ]
    for x, y in pairs:
        assert x == y, f"{x} != {y}"
        assert hash(x) == hash(y)
        assert format_expr(x) == format_expr(y)


@SETTINGS
@given(trees)
def test_text_form_round_trips(tree):
    e = build_or_skip(tree)
    text = format_expr(e)
    back = parse_expr(text)
    assert back == e, f"{text!r} parsed as {back}"
    assert format_expr(back) == text


@SETTINGS
@given(trees, st.fixed_dictionaries({s: nonneg_trees for s in SYMS}), envs)
def test_subs_agrees_with_evaluation_and_rebuilding(tree, mapping, env):
    inner = {s: build(t) for s, t in mapping.items()}
    assert all(e.nonneg for e in inner.values())
    want = oracle_or_skip(tree, {s: oracle(t, env) for s, t in mapping.items()})
    e = build_or_skip(tree)
    try:
        substituted = e.subs(inner)
    except ZeroDivisionError:  # a substituted divisor became the constant 0
        assume(False)
    assert substituted.evaluate(env) == want


renamings = st.fixed_dictionaries(
    {s: st.one_of(st.sampled_from(SYMS).map(SymExpr.symbol), st.integers(1, 6)) for s in SYMS}
)


@SETTINGS
@given(trees, renamings)
def test_subs_renaming_or_specializing_equals_rebuilding(tree, mapping):
    # Merging symbols or fixing them to constants keeps every simplification valid,
    # so substituting into the canonical form must give the canonical form of the
    # substituted tree.
    try:
        substituted = build_or_skip(tree).subs(mapping)
    except ZeroDivisionError:
        assume(False)
    assert substituted == build_or_skip(tree, leaf=lambda s: as_expr(mapping[s]))


@SETTINGS
@given(trees, envs)
def test_subs_of_constants_is_evaluation(tree, env):
    want = oracle_or_skip(tree, env)
    got = build_or_skip(tree).subs(env)
    assert got.is_constant and got.constant_value == want


# --- hand-written cases ---------------------------------------------------------


def test_products_of_constants_are_canonical():
    assert S0 * 768 == S0 * 12 * 64
    assert hash(S0 * 768) == hash(64 * (12 * S0))
    assert 2 * S0 * S1 + S0 - 3 == S1 * S0 * 2 - 3 + S0
    assert format_expr(2 * S0 * S1 + S0 - 3) == "2*s0*s1 + s0 - 3"


def test_equal_degree_monomials_sort_by_their_powers():
    a, b = S0 * S0 * S1, S0 * S1 * S1
    assert a + b == b + a
    assert format_expr(a + b) == format_expr(b + a) == "s0*s1**2 + s0**2*s1"


def test_constant_exprs_equal_and_hash_like_ints():
    assert SymExpr.const(3) == 3 and hash(SymExpr.const(3)) == hash(3)
    assert (S0 - S0) == 0 and hash(S0 - S0) == hash(0)
    assert {3: "x"}[SymExpr.const(3)] == "x"
    assert S0 != 3 and S0 + 1 != S0


def test_floordiv_by_constant_splits_off_the_exact_part():
    assert floordiv(4 * S0 + 3, 2) == 2 * S0 + 1
    assert floordiv(6 * S0 + 4 * S1, 2) == 3 * S0 + 2 * S1
    assert floordiv(S0, 1) == S0
    assert floordiv(7, -2) == -4
    e = floordiv(-S0, 2)
    assert [e.evaluate({"s0": v}) for v in range(6)] == [-v // 2 for v in range(6)]


def test_mod_by_constant():
    e = mod(6 * S0 + 5, 4)
    assert [e.evaluate({"s0": v}) for v in range(10)] == [(6 * v + 5) % 4 for v in range(10)]
    assert mod(4 * S0 + 8, 4) == 0
    assert mod(S0, 1) == 0
    e = mod(S0, -3)
    assert [e.evaluate({"s0": v}) for v in range(7)] == [v % -3 for v in range(7)]


def test_symbolic_division():
    assert floordiv(S0 * S1, S1) == S0
    assert floordiv(6 * S0 * S1 + 3 * S1, 3 * S1) == 2 * S0 + 1
    assert floordiv(S0, S0) == 1
    assert floordiv(0, S0 + S1) == 0 and mod(0, S0 + S1) == 0
    assert mod(S0 * S1, S1) == 0
    e = floordiv(S0, S1)
    assert e.free_symbols == {"s0", "s1"} and not e.is_constant
    assert e.evaluate({"s0": 7, "s1": 2}) == 3


def test_max_min_drop_dominated_arguments():
    assert sym_max(S0, S0 + 1) == S0 + 1
    assert sym_min(S0, S0 + 1) == S0
    assert sym_min(S0, 0) == 0
    assert sym_max(S0, 0) == S0
    assert sym_max(3, -2, 1) == 3
    assert sym_max(S0, S1) == sym_max(S1, S0) != S0
    assert sym_max(S0, sym_max(S1, S2)) == sym_max(sym_max(S0, S1), S2)


def test_nonneg_is_structural_and_sound():
    assert (S0 * S1 + 2).nonneg and floordiv(S0, 2).nonneg and mod(S0 - 5, 3).nonneg
    assert not (S0 - 1).nonneg and not mod(S0, -3).nonneg and not SymExpr.const(-1).nonneg


def test_subs_re_simplifies_compound_atoms():
    e = floordiv(S0 * S2, S1)
    assert e.subs({"s2": S1}) == S0
    assert mod(S0, S1).subs({"s0": 3 * S1}) == 0
    assert sym_max(S0, S1).subs({"s1": S0 + 2}) == S0 + 2
    assert e.subs({}) is e


def test_parse_expr_reads_the_printed_forms():
    assert parse_expr("2*s0*s1 + s0 - 3") == 2 * S0 * S1 + S0 - 3
    assert parse_expr("s0**2") == S0 * S0
    assert parse_expr("-s0 + floordiv(s1, 4) + max(s0, s2)") == (
        -S0 + floordiv(S1, 4) + sym_max(S0, S2)
    )
    assert parse_expr("(s0 + 1) * 2 // 4") == floordiv(2 * S0 + 2, 4)
    assert parse_expr("s0 % 3") == mod(S0, 3)


def test_helpers():
    assert as_dim(S0 - S0 + 4) == 4 and isinstance(as_dim(S0 - S0 + 4), int)
    assert as_dim(S0) is S0
    assert shape_numel([2, S0, 3]) == 6 * S0
    assert shape_numel([2, 3]) == 6 and isinstance(shape_numel([2, 3]), int)
    assert S0.is_symbol and S0.symbol_name == "s0" and not (2 * S0).is_symbol


def test_a_floordiv_of_a_floordiv_by_constants_is_one_floordiv():
    """(y // b + c) // d == (y + c*b) // (b*d): a strided layer's output size written two
    ways (a 4x then 2x downsampling, or 8x at once) has one canonical form."""
    twice = floordiv(floordiv(S0 + 3, 4) + 1, 2)
    assert twice == floordiv(S0 + 7, 8)
    for y, b, c, d in [(S0, 2, -3, 5), (S0 + 2 * S1, 3, 4, 2), (S0 - 1, 4, 0, 3)]:
        nested = floordiv(floordiv(y, b) + c, d)
        assert format_expr(nested).count("floordiv") == 1
        for v0 in range(-13, 14):
            for v1 in (0, 5):
                env = {"s0": v0, "s1": v1}
                assert nested.evaluate(env) == (y.evaluate(env) // b + c) // d
