#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for jupyter-dist: system packages, a virtual
# environment in .venv, torch (CPU build) and the package itself.
#   scripts/setup.sh          what running jobs needs
#   scripts/setup.sh --test   plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
[[ "${1:-}" == "--test" ]] && want_tests=1

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# Open MPI runs the MPI examples and tests; mpi4py builds against its headers if it must.
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

pip install --upgrade pip
# torch 2.13.0 is the CPU build; ask for it by version so pip never pulls a CUDA build.
if [[ $want_tests -eq 1 ]]; then
    pip install "torch==2.13.0" mpi4py -e ".[test]"
else
    pip install "torch==2.13.0" mpi4py -e .
fi
.venv/bin/python -c "import torch, jupyter_dist" # fail loudly if an install went wrong
