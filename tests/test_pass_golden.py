"""Golden before/after IR for every graph-level pass: what each rewrite produces, exactly.

Each ``tests/golden/passes/<pass>/<case>.ir`` holds ``#`` lines saying what the case
pins, a graph in the IR text form (``anyshape/ir/printer.py``), the line
``=== expected ===``, and the graph that ``anyshape.passes.<pass>.run`` must turn it
into. For every file the input is parsed, the pass runs, and its printed result must
equal the expected text exactly (a unified diff on mismatch). Both halves must be the
printer's own form (they print back unchanged) and pass the verifier; the pass run again
on the expected graph must change nothing (one run reaches the fixpoint); a case whose
expected graph is its input must get the very input graph back. Every pass of the
pipeline and every layout pass has cases, one of them a graph the pass leaves alone.

After a deliberate change to a pass, regenerate the expected halves from the pass's
current output (descriptions and inputs stay as they are), then read every diff before
keeping it::

    ANYSHAPE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q -p no:xdist tests/test_pass_golden.py
"""

from __future__ import annotations

import difflib
import importlib
import os
from pathlib import Path

import pytest

from anyshape.config import Options
from anyshape.ir.parser import parse_graph
from anyshape.ir.printer import print_graph
from anyshape.ir.verifier import verify_graph
from anyshape.passes.pipeline import LAYOUT_PASSES, PIPELINE

GOLDEN = Path(__file__).parent / "golden" / "passes"
SEPARATOR = "=== expected ==="
UPDATE = os.environ.get("ANYSHAPE_UPDATE_GOLDEN") == "1"
PASSES = [name for name, _ in PIPELINE] + list(LAYOUT_PASSES)
FILES = sorted(GOLDEN.glob("*/*.ir"))


class Case:
    """One golden file, split into its description, input and expected output."""

    def __init__(self, path: Path):
        self.path = path
        self.pass_name = path.parent.name
        lines = path.read_text().splitlines(keepends=True)
        n = 0
        while n < len(lines) and lines[n].startswith("#"):
            n += 1
        self.header = "".join(lines[:n])
        body = "".join(lines[n:])
        marker = f"\n{SEPARATOR}\n"
        assert body.count(marker) == 1, f"{path}: needs exactly one {SEPARATOR!r} line"
        before, _, after = body.partition(marker)
        self.before, self.after = before + "\n", after

    def write_expected(self, text: str) -> None:
        self.path.write_text(f"{self.header}{self.before}{SEPARATOR}\n{text}")
        self.after = text


def _run(pass_name: str, text: str):
    """(input graph, the pass's result) for graph text."""
    graph = parse_graph(text)
    module = importlib.import_module(f"anyshape.passes.{pass_name}")
    return graph, module.run(graph, Options(verify=True))


def _diff(expected: str, actual: str, label: object, got: str = "pass output") -> str:
    lines = difflib.unified_diff(
        expected.splitlines(keepends=True),
        actual.splitlines(keepends=True),
        fromfile=f"{label} (expected)",
        tofile=got,
    )
    return "".join(lines)


def _assert_printer_form(text: str, what: str) -> None:
    graph = parse_graph(text)
    printed = print_graph(graph)
    assert printed == text, (
        f"{what} is not in printed form:\n{_diff(text, printed, what, 'printed')}"
    )
    verify_graph(graph)


def _ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_pass_output_matches_golden(path):
    case = Case(path)
    assert case.header.strip(), f"{path}: say what the case pins in '#' lines first"
    assert case.pass_name in PASSES, f"{path}: no pass {case.pass_name!r} in the pipeline"
    _assert_printer_form(case.before, f"{path} input")
    graph, out = _run(case.pass_name, case.before)
    verify_graph(out)
    actual = print_graph(out)
    if UPDATE and actual != case.after:
        case.write_expected(actual)
    _assert_printer_form(case.after, f"{path} expected")
    if actual != case.after:
        pytest.fail(
            f"{case.pass_name} output differs from {path} "
            f"(ANYSHAPE_UPDATE_GOLDEN=1 rewrites it):\n{_diff(case.after, actual, path)}",
            pytrace=False,
        )
    if case.after == case.before:
        assert out is graph, f"{case.pass_name} changed nothing but returned a new graph"


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_pass_changes_nothing_on_its_own_output(path):
    case = Case(path)
    graph, out = _run(case.pass_name, case.after)
    again = print_graph(out)
    assert again == case.after, (
        f"{case.pass_name} rewrote its own output again:\n{_diff(case.after, again, path)}"
    )
    assert out is graph


@pytest.mark.parametrize("pass_name", PASSES)
def test_every_pass_has_golden_cases(pass_name):
    """At least three cases per pass, one of them a graph the pass must leave alone."""
    cases = [Case(p) for p in FILES if p.parent.name == pass_name]
    assert len(cases) >= 3, f"{pass_name}: {len(cases)} golden cases under {GOLDEN}"
    assert any(c.after == c.before for c in cases), f"{pass_name}: no case it leaves alone"
    assert any(c.after != c.before for c in cases), f"{pass_name}: no case it rewrites"


def test_golden_folders_name_passes():
    folders = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
    assert folders == sorted(PASSES)
