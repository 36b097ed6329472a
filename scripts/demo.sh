#!/usr/bin/env bash
# The main job, on a fresh machine: set up, then run a real 2-node x 2-rank PyTorch DDP job
# on local nodes (gloo on the CPU), with live per-rank output.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/jupyter distrun run examples/pytorch_ddp.yml "$@"
