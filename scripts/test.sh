#!/usr/bin/env bash
# Set up, check style with ruff, then run the test suite on every core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check anyshape tests examples benchmarks tools
.venv/bin/ruff format --check anyshape tests examples benchmarks tools
exec .venv/bin/python -m pytest -n "${ANYSHAPE_TEST_WORKERS:-2}" "$@"
