#!/usr/bin/env bash
# Set up, then compile a BERT model once and serve a stream of different shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/serve_bert.py "$@"
