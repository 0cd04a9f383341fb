"""The ordered text checker the backend tests use on generated sources (tests/filecheck.py).

Each method is pinned both ways: what it accepts, and what it must reject with an
AssertionError naming the pattern and showing where the search started. The order a
chain states is the order in the text; check_not covers exactly the range between two
positive matches (or to the end of the text); check_count counts exactly.
"""

from __future__ import annotations

import re

import pytest
from filecheck import Checker

SOURCE = """\
static int k_a(void* const* P) {
  const float t0 = load(P[1]);
  const float t1 = as_exp(t0);
  store(P[0], t1);
  return 0;
}
static int k_b(void* const* P) {
  const float t0 = load(P[1]);
  store(P[0], t0);
  return 0;
}
int anyshape_main() {
  int e = k_a(P);
  int e = k_b(P);
  return 0;
}
"""


def test_methods_chain_and_move_forward():
    c = Checker(SOURCE)
    assert c.check("k_b") is c
    assert c.check_next("load") is c
    assert c.check_same("P[1]") is c
    assert c.check_not("as_exp") is c
    assert c.check_count("int e = ", 2) is c
    assert c.end() is c
    assert SOURCE[c.last[0] : c.last[1]] == "int e = "
    assert c.pos == SOURCE.index("int e = k_b") + len("int e = ")


# --- check ---------------------------------------------------------------------------


def test_check_finds_patterns_in_order():
    Checker(SOURCE).check("static int k_a").check("as_exp").check("static int k_b").check(
        "anyshape_main"
    )


def test_check_rejects_patterns_out_of_order():
    c = Checker(SOURCE).check("static int k_b")
    with pytest.raises(AssertionError, match=r"check\('as_exp'\): not found"):
        c.check("as_exp")  # only in k_a, before the current position


def test_check_starts_after_the_previous_match_not_at_it():
    c = Checker("ab ab").check("ab").check("ab")
    with pytest.raises(AssertionError, match="not found"):
        c.check("ab")


def test_check_takes_regexes():
    c = Checker(SOURCE).check(re.compile(r"^static int (k_\w+)\(", re.M))
    assert SOURCE[c.last[0] : c.last[1]] == "static int k_a("
    c.check(re.compile(r"as_\w+\(t\d\)"))
    with pytest.raises(AssertionError, match=r"regex 'as_\\\\w\+"):
        c.check(re.compile(r"as_\w+\(t\d\)"))


def test_check_regex_anchors_are_line_anchors_not_the_search_start():
    c = Checker("xint main\nint main\n").check("x")
    c.check(re.compile(r"^int main$", re.M))
    assert c.last == (10, 18)


def test_failure_message_shows_pattern_position_and_context():
    c = Checker(SOURCE).check("k_b").check("store")
    with pytest.raises(AssertionError) as err:
        c.check("as_exp")
    message = str(err.value)
    lines = SOURCE.split("\n")
    assert "check('as_exp'): not found" in message
    assert "search started at line 9, column 8" in message
    assert f">  9 | {lines[8]}\n" in message  # the line the search started on, marked
    assert "\n       |        ^\n" in message  # and the column
    for n in (7, 8, 10, 11):  # and two lines either side
        assert f"    {n:>2} | {lines[n - 1]}" in message
    assert "k_a" not in message  # nothing from further away


# --- check_next ----------------------------------------------------------------------


def test_check_next_accepts_the_following_line():
    Checker(SOURCE).check("static int k_b").check_next("load(P[1])").check_next("store(P[0], t0)")


def test_check_next_rejects_a_later_line():
    c = Checker(SOURCE).check("static int k_a")
    with pytest.raises(AssertionError, match=r"not on the line after .*found first at line 4"):
        c.check_next("store")


def test_check_next_rejects_the_same_line():
    c = Checker("a b\nc\n").check("a")
    with pytest.raises(AssertionError, match="not on the line after"):
        c.check_next("b")


def test_check_next_looks_only_at_the_next_line():
    c = Checker("a b\nb c\n").check("a").check_next("b")
    assert c.last == (4, 5)  # not the b after a on its own line


def test_check_next_on_the_last_line_fails():
    c = Checker("a\nb").check("b")
    with pytest.raises(AssertionError, match="no line after the previous match"):
        c.check_next("b")


def test_check_next_needs_an_earlier_match():
    with pytest.raises(ValueError, match="earlier positive match"):
        Checker(SOURCE).check_next("static")


# --- check_same ----------------------------------------------------------------------


def test_check_same_accepts_the_rest_of_the_line():
    Checker(SOURCE).check("int e = ").check_same("k_a").check_same("(P);")


def test_check_same_rejects_the_next_line():
    c = Checker(SOURCE).check("int e = ")
    with pytest.raises(AssertionError, match=r"not on the line of the previous match .*line 14"):
        c.check_same("k_b")


def test_check_same_rejects_text_before_the_match_on_its_line():
    c = Checker("k_a k_b\n").check("k_b")
    with pytest.raises(AssertionError, match="not on the line of the previous match"):
        c.check_same("k_a")


def test_check_same_needs_an_earlier_match():
    with pytest.raises(ValueError, match="earlier positive match"):
        Checker(SOURCE).check_same("static")


# --- check_not -----------------------------------------------------------------------


def test_check_not_covers_the_range_up_to_the_next_match():
    # as_exp occurs in k_a, before k_b: not between k_b's header and anyshape_main.
    Checker(SOURCE).check("static int k_b").check_not("as_exp").check("anyshape_main").end()
    # store occurs in k_b too, but only after its load: fine between header and load.
    Checker(SOURCE).check("static int k_b").check_not("store").check("load").end()


def test_check_not_rejects_an_occurrence_in_its_range():
    c = Checker(SOURCE).check("static int k_a").check_not("as_exp")
    with pytest.raises(AssertionError) as err:
        c.check("static int k_b")
    message = str(err.value)
    assert "check_not('as_exp'): found at line 3, column 20, before line 7, column 1" in message
    assert "search started at line 1" in message and "found here (line 3" in message


def test_several_check_nots_share_one_range():
    c = Checker(SOURCE).check("static int k_b").check_not("as_exp").check_not("t1")
    c.check("anyshape_main")
    c = Checker(SOURCE).check("static int k_a").check_not("k_b").check_not("as_exp")
    with pytest.raises(AssertionError, match=r"check_not\('as_exp'\)"):
        c.check("return 0;")


def test_check_not_before_check_next_and_check_same():
    Checker(SOURCE).check("static int k_b").check_not("t1").check_next("const float t0")
    c = Checker(SOURCE).check("const float t0").check_not("load")
    with pytest.raises(AssertionError, match=r"check_not\('load'\)"):
        c.check_same("P[1]")


def test_trailing_check_not_runs_to_the_end_of_the_text():
    Checker(SOURCE).check("int e = k_a").check_not("as_exp").end()
    c = Checker(SOURCE).check("static int k_a").check_not("anyshape_main")
    with pytest.raises(AssertionError, match="before the end of the text"):
        c.end()


def test_check_not_range_starts_after_the_previous_match():
    # "k_a" is the previous match itself, not in the range after it.
    Checker(SOURCE).check("int e = k_a").check_not("k_a").end()
    with pytest.raises(AssertionError, match=r"check_not\('int e'\)"):
        Checker(SOURCE).check("anyshape_main").check_not("int e").end()


def test_check_not_at_the_start_covers_the_text_before_the_first_match():
    Checker(SOURCE).check_not("anyshape_main").check("static int k_b")
    with pytest.raises(AssertionError, match=r"check_not\('as_exp'\)"):
        Checker(SOURCE).check_not("as_exp").check("static int k_b")


def test_check_not_takes_regexes():
    Checker(SOURCE).check("static int k_b").check_not(re.compile(r"t[1-9]")).end()
    with pytest.raises(AssertionError, match=r"check_not\(regex"):
        Checker(SOURCE).check("static int k_a").check_not(re.compile(r"t[1-9]")).end()


def test_context_manager_ends_the_checks():
    with Checker(SOURCE) as c:
        c.check("static int k_b").check_not("as_exp")
    with pytest.raises(AssertionError, match=r"check_not\('as_exp'\)"), Checker(SOURCE) as c:
        c.check("static int k_a").check_not("as_exp")


# --- check_count ---------------------------------------------------------------------


def test_check_count_counts_from_the_current_position():
    Checker(SOURCE).check_count("load(", 2)
    Checker(SOURCE).check("static int k_b").check_count("load(", 1)
    Checker(SOURCE).check("anyshape_main").check_count("load(", 0)


def test_check_count_rejects_more_or_fewer():
    with pytest.raises(AssertionError, match=r"expected 1 occurrences, found 2 \(at line 2"):
        Checker(SOURCE).check_count("load(", 1)
    with pytest.raises(AssertionError, match="expected 3 occurrences, found 2"):
        Checker(SOURCE).check_count("load(", 3)
    with pytest.raises(AssertionError, match="expected 0 occurrences, found 1"):
        Checker(SOURCE).check("static int k_b").check_count("load(", 0)


def test_check_count_moves_past_the_last_occurrence():
    c = Checker(SOURCE).check_count("return 0;", 3)
    assert c.pos == SOURCE.rindex("return 0;") + len("return 0;")
    with pytest.raises(AssertionError, match="not found"):
        c.check("return")


def test_check_count_counts_non_overlapping_matches_and_regexes():
    Checker("aaaa").check_count("aa", 2)
    Checker(SOURCE).check_count(re.compile(r"int e = k_\w+\(P\);"), 2)
    with pytest.raises(AssertionError, match="found 3"):
        Checker(SOURCE).check_count(re.compile(r"^static int|^int ", re.M), 2)


def test_check_count_tests_pending_check_nots():
    Checker(SOURCE).check("static int k_b").check_not("as_exp").check_count("store(", 1)
    c = Checker(SOURCE).check_not("as_exp")
    with pytest.raises(AssertionError, match=r"check_not\('as_exp'\)"):
        c.check_count("return 0;", 3)


# --- misuse --------------------------------------------------------------------------


def test_misuse_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="empty pattern"):
        Checker(SOURCE).check("")
    with pytest.raises(ValueError, match="empty pattern"):
        Checker(SOURCE).check_not("")
    with pytest.raises(TypeError):
        Checker(SOURCE).check(b"load")
    with pytest.raises(TypeError):
        Checker(SOURCE.encode())
    with pytest.raises(ValueError, match="count"):
        Checker(SOURCE).check_count("load", -1)
