#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, lints, runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k spec).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The lab extension's TypeScript units (Jest); node_modules came with the extension build.
[[ -d node_modules ]] || npm ci --no-audit --no-fund
npx --no-install jest --silent
exec .venv/bin/python -m pytest "$@"
