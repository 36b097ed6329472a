#!/usr/bin/env bash
# Build what users install: a wheel (and an sdist) of jupyter-dist with the JupyterLab
# extension compiled inside, in dist/ (or --outdir DIR).
#
#   scripts/build-dist.sh [--clean] [--outdir DIR]
#
# Building needs Python >= 3.10 and node/npm (to compile the lab extension); installing the
# wheel needs neither node nor npm. The front end already built in this tree
# (jupyter_dist/labextension, by scripts/setup.sh) is reused; --clean builds it anew.
set -euo pipefail
cd "$(dirname "$0")/.."
outdir=dist
clean=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --clean) clean=1; shift ;;
        --outdir) outdir=${2:?--outdir needs a folder}; shift 2 ;;
        *) echo "build-dist.sh: unknown option '$1'; valid: --clean, --outdir DIR" >&2; exit 2 ;;
    esac
done
if [[ $clean -eq 1 || ! -f jupyter_dist/labextension/static/style.js ]]; then
    command -v npm >/dev/null 2>&1 || {
        echo "build-dist.sh: building the lab extension needs node and npm (apt-get install nodejs npm)" >&2
        exit 1
    }
    rm -rf jupyter_dist/labextension lib
fi
# The build front end lives in a venv of its own (build/), so no environment of yours changes.
PYTHON=${PYTHON:-python3}
[[ -x build/tools/bin/python ]] || "$PYTHON" -m venv build/tools
build/tools/bin/python -m pip install --disable-pip-version-check -q "build>=1.2"
# An sdist first, then the wheel from it: what an index would serve.
build/tools/bin/python -m build --outdir "$outdir" .
ls -1 "$outdir"/jupyter_dist-*
