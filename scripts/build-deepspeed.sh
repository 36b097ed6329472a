#!/usr/bin/env bash
# Install DeepSpeed with its CPU shared-memory op (deepspeed_shm_comm) built in, from a wheel
# built once per machine.
#   scripts/build-deepspeed.sh                 into .venv (what the tests and examples use)
#   scripts/build-deepspeed.sh --python PATH   into the environment of that interpreter (a node's)
#
# Why: PyPI has only DeepSpeed's sdist, and pip builds it without ops. On CPU, DeepSpeed then
# compiles deepspeed_shm_comm in the first job's ranks (about 2 CPU-minutes, one rank
# compiling while the others wait on its lock), and again for every new environment: the
# build folder in ~/.cache/torch_extensions records the environment's paths. Built into the
# wheel (DS_BUILD_SHM_COMM=1, DS_ACCELERATOR=cpu), it is loaded as it is.
#
# The wheel is cached in $JUPYTER_DIST_WHEELS (default ~/.cache/jupyter-dist/wheels), keyed
# by DeepSpeed's version (the one installed) and the Python and torch it was built against.
# It needs a C++ compiler (g++); a build takes about 3 CPU-minutes.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
python=.venv/bin/python
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) python=${2:?--python needs the path of a Python interpreter}; shift 2
                  [[ $python == /* ]] || python=$here/$python ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-deepspeed: unknown argument '$1' (valid: --python PATH)" >&2; exit 2 ;;
    esac
done
[[ -x "$python" ]] || { echo "build-deepspeed: no Python at '$python' (run scripts/setup.sh first, or pass --python PATH)" >&2; exit 2; }
# Exit 0 when the installed DeepSpeed has the op; 1 when it lacks it; 2 when there is none.
has_op() {
    "$python" - <<'EOF'
import sys
try:
    from deepspeed.git_version_info import installed_ops
except ImportError:
    sys.exit(2)
sys.exit(0 if installed_ops.get("deepspeed_shm_comm") else 1)
EOF
}
status=0
has_op >/dev/null 2>&1 || status=$?  # (importing deepspeed logs its accelerator)
[[ $status -eq 0 ]] && exit 0
[[ $status -eq 2 ]] && { echo "build-deepspeed: DeepSpeed is not installed in $python's environment (pip install deepspeed first)" >&2; exit 2; }
versions=$("$python" -c "import sys, torch, deepspeed; print(deepspeed.__version__, torch.__version__, f'cp{sys.version_info[0]}{sys.version_info[1]}')" 2>/dev/null | tail -1)
read -r ds_version torch_version python_tag <<<"$versions"
cache=${JUPYTER_DIST_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-dist/wheels}/deepspeed-$ds_version-shm-$python_tag-torch-$torch_version
shopt -s nullglob
wheels=("$cache"/deepspeed-*.whl)
if [[ ${#wheels[@]} -eq 0 ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "build-deepspeed: building deepspeed $ds_version with its CPU shm op against torch $torch_version ($python_tag); a few minutes"
    # --no-cache-dir: pip's own cache holds the wheel it built without ops, under the same name.
    if ! DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 MAX_JOBS=$(nproc) \
        "$python" -m pip --disable-pip-version-check wheel --no-deps --no-build-isolation \
        --no-cache-dir -w "$work" "deepspeed==$ds_version" >"$work/build.log" 2>&1; then
        echo "build-deepspeed: the build failed; the end of its log:" >&2
        tail -40 "$work/build.log" >&2
        exit 1
    fi
    # Moved beside, then renamed: a copy cut short is never taken for a whole one.
    mkdir -p "$(dirname "$cache")"
    partial=$(mktemp -d "$cache.partial.XXXXXX")
    mv "$work"/deepspeed-*.whl "$partial/"
    chmod 755 "$partial"
    mv -T "$partial" "$cache" 2>/dev/null || rm -rf "$partial"  # another run saved it first
    wheels=("$cache"/deepspeed-*.whl)
fi
"$python" -m pip --disable-pip-version-check -q install --no-deps --force-reinstall "${wheels[0]}"
has_op >/dev/null 2>&1 || { echo "build-deepspeed: the installed deepspeed still lacks deepspeed_shm_comm" >&2; exit 1; }
