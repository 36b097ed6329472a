#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, lints, builds the docs,
# runs Jest and pytest. Extra arguments go to pytest (e.g. scripts/test.sh -k spec).
#   scripts/test.sh            everything, as CI runs it
#   scripts/test.sh --quick    lint, Jest and every test that needs no test cluster (sshd
#                              nodes, Slurm), browser or Horovod build and is not marked slow:
#                              the loop while you work (about a minute on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == "--quick" ]]; then
    quick=1
    shift
fi
# The quick loop sets up only on a machine that has never been (the set-up checks a lot).
if [[ $quick -eq 0 ]] || ! .venv/bin/python -c "import jupyter_dist, pytest" 2>/dev/null; then
    scripts/setup.sh --test
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The lab extension's TypeScript units (Jest): node_modules came with the extension build,
# or is this machine's copy for the same lock file (scripts/machine-cache.sh).
if [[ ! -d node_modules ]]; then
    source scripts/machine-cache.sh
    node_key=$(cache_key package.json package-lock.json)
    cache_restore node_modules "$node_key" node_modules || {
        npm ci --no-audit --no-fund
        cache_save node_modules "$node_key" node_modules
    }
fi
npx --no-install jest --silent
# Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), an editable install's
# modules would be compiled again in every process that imports them: a quarter of each CLI
# call's CPU (0.25 of 1.1 s). The run starts hundreds of them; compiled once, here, instead.
.venv/bin/python -m compileall -q jupyter_dist tests >/dev/null
# DISTRUN_TEST_WORKERS=N runs the tests on N workers (pytest-xdist, --dist loadgroup: tests
# that share a cluster or a module's fixture stay on one worker, tests/conftest.py); 1 runs
# them in one process. The quick loop takes one worker per core (at most 4) by default; the
# whole run two where there are two cores or more (it is bound by CPU: more workers only
# make each test slower). docs/development.md has the parallel runs, and what broke streaks.
workers=1
[[ $(nproc) -lt 2 ]] || workers=2
if [[ $quick -eq 1 ]]; then
    workers=$(nproc)
    [[ $workers -le 4 ]] || workers=4
fi
workers=${DISTRUN_TEST_WORKERS:-$workers}
parallel=()
if [[ $workers -gt 1 ]]; then
    parallel=(-n "$workers" --dist loadgroup)
fi
# DISTRUN_TEST_CPU=FOLDER: every Python process of the run notes its CPU there, with the
# test that started it, and the summary ends with where the CPU went (tests/cpu_audit.py).
# The hook is in the venv only while these tests run.
if [[ -n "${DISTRUN_TEST_CPU:-}" ]]; then
    export DISTRUN_TEST_CPU
    .venv/bin/python tests/cpu_audit.py install "$DISTRUN_TEST_CPU"
    trap '.venv/bin/python tests/cpu_audit.py remove' EXIT
fi
if [[ $quick -eq 1 ]]; then
    # The marks come from the fixtures a test uses, and `slow` (tests/conftest.py).
    .venv/bin/python -m pytest "${parallel[@]}" \
        -m "not (ssh or slurm or browser or horovod or slow or gpu)" "$@"
    exit
fi
scripts/docs.sh
# The GPU tests (tests/test_gpu.py) need a GPU, which CI's machines lack: run them where one is.
# --durations: the slowest tests, then each test file's time (tests/conftest.py), in every log.
.venv/bin/python -m pytest "${parallel[@]}" -m "not gpu" --durations=30 "$@"
