#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for jupyter-dist: system packages, a virtual
# environment in .venv with torch, JupyterLab and the package itself (editable).
#   scripts/setup.sh          what running jobs needs
#   scripts/setup.sh --test   plus what the test suite needs
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
[[ "${1:-}" == "--test" ]] && want_tests=1

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# Open MPI runs the MPI examples and tests (mpi4py builds against its headers if it must);
# node and npm build the JupyterLab extension from source (a wheel carries it prebuilt).
# The tests also start real sshd servers and a real Slurm cluster as nodes, in network
# namespaces (iproute2), and drive JupyterLab in Debian's headless Chromium.
packages=()
command -v mpirun >/dev/null 2>&1 || packages+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || packages+=(libopenmpi-dev)
command -v ssh >/dev/null 2>&1 || packages+=(openssh-client)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
if [[ $want_tests -eq 1 ]]; then
    [[ -x /usr/sbin/sshd ]] || packages+=(openssh-server)
    command -v ip >/dev/null 2>&1 || packages+=(iproute2)
    command -v chromium >/dev/null 2>&1 || packages+=(chromium)
    # A real Slurm cluster for the Slurm tests: slurmctld, slurmd and munge (tests/slurmnodes.py).
    command -v slurmctld >/dev/null 2>&1 || packages+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || packages+=(munge)
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
# torch: kept when the venv has one already (a CUDA build you chose, or the CPU build from
# PyTorch's CPU index); otherwise torch==2.13.0 from the index pip uses. On an ordinary
# index that is a CUDA build of several GB (what GPU nodes want); machines that carry a
# local CPU wheel of it get that instead. numpy beside it, or torch warns on every rank.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"
# Building the package builds the lab extension (npm install, tsc, jupyter-builder) into
# jupyter_dist/labextension when it is not there yet: a fresh clone takes this machine's
# copy of the same sources' build instead, when there is one (scripts/machine-cache.sh;
# npm's install is most of two minutes on 2 cores). The `lab` extra is JupyterLab and a
# kernel: what the demo notebook and your own notebooks need.
source scripts/machine-cache.sh
lab_sources=(package.json package-lock.json tsconfig.json install.json
             $(find labextension/src style -type f -not -path "*/__tests__/*" | LC_ALL=C sort))
lab_key=$(cache_key "${lab_sources[@]}")
node_key=$(cache_key package.json package-lock.json)
# Only what this run builds is kept: a clone's older build may be of other sources.
lab_built=0 node_installed=0
[[ -d node_modules ]] || node_installed=1
if [[ ! -f jupyter_dist/labextension/static/style.js ]]; then
    cache_restore labextension "$lab_key" jupyter_dist/labextension || lab_built=1
fi
if [[ $want_tests -eq 1 ]]; then
    pip install numpy mpi4py -e ".[lab,test,tensorflow,dask,docs]"
else
    pip install numpy mpi4py -e ".[lab,stacks]"
fi
if [[ $lab_built -eq 1 && -f jupyter_dist/labextension/static/style.js ]]; then
    cache_save labextension "$lab_key" jupyter_dist/labextension
fi
if [[ $node_installed -eq 1 && -d node_modules ]]; then  # the build's (Jest needs it: test.sh)
    cache_save node_modules "$node_key" node_modules
fi
.venv/bin/python -c "import torch, numpy, paramiko, jupyter_dist"  # fail loudly if an install went wrong
# rfc3987-syntax 1.1, jsonschema's optional checker of the `iri` format (JupyterLab brings it,
# through jupyter-events' jsonschema[format-nongpl]), builds an Earley grammar as it is
# imported: 2.8 s of CPU in every Python that imports jsonschema (a Jupyter server, nbclient,
# and each Ray worker, Ray Client server and Ray driver: Ray imports it as it starts). Nothing
# here checks IRIs, and jsonschema does without it (python-jsonschema/jsonschema#1392).
if .venv/bin/python -c "import importlib.util as u; exit(not u.find_spec('rfc3987_syntax'))"; then
    pip uninstall -y rfc3987-syntax
fi
if [[ $want_tests -eq 1 ]]; then
    # What follows builds into the machine's cache (scripts/machine-cache.sh): two set-ups at
    # once on one machine (two clones) would build the same things into the same places, and
    # one would break the other's half-made SkyPilot venv. The second waits, then reuses.
    mkdir -p "$machine_cache"
    exec 9>"$machine_cache/.setup.lock"
    flock 9
    # Horovod has no wheel on PyPI: built once per machine (a few minutes), then cached.
    scripts/build-horovod.sh
    # DeepSpeed with its CPU shm op built in (once per machine, then cached): else the
    # first DeepSpeed test's ranks compile it, in every fresh clone.
    scripts/build-deepspeed.sh
    # SkyPilot's own loader checks the exported task files (tests/test_export.py). It lives in
    # a venv of its own: its pins (click, uvicorn, ...) are not JupyterLab's. Made once per
    # machine, Python and SkyPilot's version (two minutes on 2 cores), in the machine's cache
    # (scripts/machine-cache.sh), and linked here.
    if ! .venv-skypilot/bin/python -c "import sky" 2>/dev/null; then
        skypilot="skypilot>=0.10"
        sky_python=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')
        sky_venv=$(cache_path venvs "$(echo "$skypilot" | tr -dc '0-9a-z.')-python$sky_python")
        if ! "$sky_venv/bin/python" -c "import sky" 2>/dev/null; then
            rm -rf "$sky_venv"
            mkdir -p "$(dirname "$sky_venv")"
            "$PYTHON" -m venv "$sky_venv"
            log=$(mktemp)
            "$sky_venv/bin/python" -m pip --disable-pip-version-check -q install "$skypilot" \
                >"$log" 2>&1 || { grep -v "^WARNING: Location" "$log"; rm -rf "$sky_venv"; exit 1; }
            rm -f "$log"
        fi
        rm -rf .venv-skypilot
        ln -s "$sky_venv" .venv-skypilot
    fi
    flock -u 9
fi
# The lab extension and the server extension must both be installed and enabled.
lab_extensions=$(.venv/bin/jupyter labextension list 2>&1) || {
    echo "setup: 'jupyter labextension list' failed in .venv:" >&2
    echo "$lab_extensions" | tail -5 >&2
    exit 1
}
grep -q "jupyter-dist v.*enabled.*OK" <<<"$lab_extensions" || {
    echo "setup: JupyterLab in .venv does not list the jupyter-dist extension as enabled:" >&2
    echo "$lab_extensions" >&2
    exit 1
}
