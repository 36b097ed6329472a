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

# Open MPI runs the MPI examples and tests (mpi4py builds against its headers if it must);
# node and npm build the JupyterLab extension from source (a wheel carries it prebuilt).
# The tests also start real sshd servers as nodes, in network namespaces (iproute2), and
# drive JupyterLab in Debian's headless Chromium.
packages=()
command -v mpirun >/dev/null 2>&1 || packages+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || packages+=(libopenmpi-dev)
command -v ssh >/dev/null 2>&1 || packages+=(openssh-client)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
if [[ $want_tests -eq 1 ]]; then
    [[ -x /usr/sbin/sshd ]] || packages+=(openssh-server)
    command -v ip >/dev/null 2>&1 || packages+=(iproute2)
    command -v chromium >/dev/null 2>&1 || packages+=(chromium)
fi
if [[ ${#packages[@]} -gt 0 ]]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
pip() {  # quiet, without this machine's find-links noise; a failure still fails the script
    local log status=0
    log=$(mktemp)
    .venv/bin/python -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
    grep -v "^WARNING: Location" "$log" || true
    rm -f "$log"
    return "$status"
}

pip install --upgrade pip
# Building the package builds the lab extension (npm install, tsc, jupyter-builder) into
# jupyter_dist/labextension when it is not there yet.
# torch 2.13.0 is the CPU build; ask for it by version so pip never pulls a CUDA build.
if [[ $want_tests -eq 1 ]]; then
    pip install "torch==2.13.0" mpi4py -e ".[test,tensorflow,dask]"
else
    pip install "torch==2.13.0" mpi4py -e .
fi
.venv/bin/python -c "import torch, paramiko, jupyter_dist"  # fail loudly if an install went wrong
# The lab extension and the server extension must both be installed and enabled.
.venv/bin/jupyter labextension list 2>&1 | grep -q "jupyter-dist v.*enabled.*OK" || {
    echo "setup: the jupyter-dist lab extension is not installed and enabled" >&2
    exit 1
}
