"""ONNX's own backend tests, every one, through ``AnyshapeBackend``.

``onnx.backend.test.loader.load_model_tests(kind="node")`` (1 884 tests with onnx
1.23), and the 23 simple and 117 PyTorch-converted model tests, each prepare (compile) a model and run it on its data sets; the outputs are judged
as ONNX's ``BackendTest`` judges them (count, shape, dtype, ``assert_allclose`` with the
test's rtol/atol; ``tools/onnx_node_tests.py`` holds that runner). A test must pass unless
``onnx_node_expected.EXPECTED_FAILURES`` lists it with a reason, and then it must fail with
an ``UnsupportedError`` (a numeric mismatch only where the reason says ``mismatch:``): an
unexpected pass fails too, so the table stays true.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from onnx_node_expected import EXPECTED_FAILURES, WIDER_TOLERANCE

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location(
        "onnx_node_tests", ROOT / "tools/onnx_node_tests.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()
# node tests, then the small models and the PyTorch-converted models ONNX ships
KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")
CASES = [case for kind in KINDS for case in RUNNER.load_cases(None, kind)]
EXPECTED = {name: reason for reason, names in EXPECTED_FAILURES.items() for name in names}


@pytest.fixture(autouse=True)
def _seed():
    """Replaces conftest's torch seeding: these tests need no torch."""


def test_the_table_names_only_tests_that_exist():
    assert len(CASES) > 1800 + 100
    assert len({c.name for c in CASES}) == len(CASES)
    unknown = sorted((set(EXPECTED) | set(WIDER_TOLERANCE)) - {c.name for c in CASES})
    assert not unknown, f"the tables name tests onnx does not have: {unknown}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node(case):
    if case.name in WIDER_TOLERANCE:  # (float16 references NumPy computes as the suite loads)
        case = dataclasses.replace(case, rtol=WIDER_TOLERANCE[case.name])
    result = RUNNER.run_case(case)
    outcome, reason = result["outcome"], result["reason"]
    expected = EXPECTED.get(case.name)
    if expected is None:
        assert outcome == "pass", f"{outcome}: {reason}"
        return
    assert outcome != "pass", f"passes now: remove it from EXPECTED_FAILURES ({expected!r})"
    allowed = ("unsupported", "mismatch") if expected.startswith("mismatch:") else ("unsupported",)
    assert outcome in allowed, f"expected {allowed[-1]} ({expected}), got {outcome}: {reason}"
