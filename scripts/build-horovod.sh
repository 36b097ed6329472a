#!/usr/bin/env bash
# Build Horovod 0.28.1 for PyTorch (Gloo and MPI controllers) into a wheel, once per
# machine, and install it into a Python environment.
#   scripts/build-horovod.sh                 into .venv (what the tests and examples use)
#   scripts/build-horovod.sh --python PATH   into the environment of that interpreter (a node's)
#   scripts/build-horovod.sh --wheel-only    build (or find) the wheel; print its path
#
# Why a build at all: PyPI has no horovod wheel, only the sdist, and that sdist compiles
# with -std=c++14, which torch 2.x's headers reject (std::optional and friends). Two
# changes are made to it: CMAKE_CXX_STANDARD 14 -> 17 in CMakeLists.txt and
# horovod/torch/CMakeLists.txt, and the build type RelWithDebInfo -> Release (debug info
# for every template of torch's headers triples the build time and serves nobody here).
#
# The wheel is cached in $JUPYTER_DIST_WHEELS (default ~/.cache/jupyter-dist/wheels), keyed
# by the Python and torch it was built against: a second run on the same machine, or on a
# node that shares the cache, installs in seconds. The build needs cmake, a C++ compiler,
# make and Open MPI's headers (apt: cmake g++ make libopenmpi-dev), and takes about 3
# minutes on 2 cores (10 with the sdist's debug info).
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
python=.venv/bin/python
wheel_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) python=${2:?--python needs the path of a Python interpreter}; shift 2
                  [[ $python == /* ]] || python=$here/$python ;;
        --wheel-only) wheel_only=1; shift ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-horovod: unknown argument '$1' (valid: --python PATH, --wheel-only)" >&2; exit 2 ;;
    esac
done
[[ -x "$python" ]] || { echo "build-horovod: no Python at '$python' (run scripts/setup.sh first, or pass --python PATH)" >&2; exit 2; }

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
quiet_pip() {  # pip's output only when it fails
    local log status=0
    log=$(mktemp)
    "$python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
    [[ $status -eq 0 ]] || grep -v "^WARNING: Location" "$log" >&2 || true
    rm -f "$log"
    return "$status"
}

torch_version=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null) || {
    echo "build-horovod: torch is not installed in $python's environment (Horovod builds against it)" >&2
    exit 2
}
python_tag=$("$python" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
cache=${JUPYTER_DIST_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-dist/wheels}/horovod-$HOROVOD_VERSION-$python_tag-torch-$torch_version
shopt -s nullglob
wheels=("$cache"/horovod-*.whl)

if [[ ${#wheels[@]} -eq 0 ]]; then
    packages=()
    command -v cmake >/dev/null 2>&1 || packages+=(cmake)
    command -v g++ >/dev/null 2>&1 || packages+=(g++)
    command -v make >/dev/null 2>&1 || packages+=(make)
    command -v mpicxx >/dev/null 2>&1 || packages+=(libopenmpi-dev openmpi-bin)
    if [[ ${#packages[@]} -gt 0 ]]; then
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    fi
    # setup.py imports these; the build must see the torch that is installed, not a copy.
    quiet_pip install wheel setuptools cloudpickle psutil pyyaml packaging cffi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "build-horovod: building horovod $HOROVOD_VERSION against torch $torch_version ($python_tag); a few minutes"
    quiet_pip download --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    source_dir=$work/horovod-$HOROVOD_VERSION
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$source_dir/CMakeLists.txt" "$source_dir/horovod/torch/CMakeLists.txt"
    sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$source_dir/setup.py"
    # Fail here, not with a compiler error ten minutes in, if the sdist ever changes shape.
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$source_dir/horovod/torch/CMakeLists.txt" &&
        grep -q "else 'Release'" "$source_dir/setup.py" || {
        echo "build-horovod: the horovod $HOROVOD_VERSION sdist no longer has the lines this script patches" >&2
        exit 1
    }
    mkdir -p "$work/out"
    log=$work/build.log
    # The system cmake: a cmake 4 from PyPI refuses the bundled gloo's cmake_minimum_required.
    # MAKEFLAGS: horovod's default is -j8, which only thrashes a small machine.
    if ! HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CMAKE=$(command -v cmake) \
        MAKEFLAGS="-j$(nproc)" \
        "$python" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps \
        -w "$work/out" "$source_dir" >"$log" 2>&1; then
        echo "build-horovod: the build failed; the end of its log:" >&2
        tail -40 "$log" >&2
        exit 1
    fi
    mkdir -p "$cache"
    mv "$work"/out/horovod-*.whl "$cache/"
    wheels=("$cache"/horovod-*.whl)
fi

if [[ $wheel_only -eq 1 ]]; then
    echo "${wheels[0]}"
    exit 0
fi
"$python" -c "import horovod.torch" 2>/dev/null && exit 0  # installed already
quiet_pip install "${wheels[0]}"
# horovodrun --check-build lists what the installed horovod can do; both controllers must be there.
check=$("$(dirname "$python")/horovodrun" --check-build)
grep -q "\[X\] PyTorch" <<<"$check" && grep -q "\[X\] MPI" <<<"$check" && grep -q "\[X\] Gloo" <<<"$check" || {
    echo "build-horovod: the installed horovod lacks PyTorch, MPI or Gloo:" >&2
    echo "$check" >&2
    exit 1
}
