#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, lints, runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k spec).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
