#!/usr/bin/env bash
# The main job, on a fresh machine: set up, then run the example notebook
# (examples/pytorch_ddp.ipynb) in a real Jupyter kernel: its %%distrun cell is a real
# 2-node x 2-rank PyTorch DDP job on local nodes (gloo on the CPU), every rank's output
# printed live. Then it says how to open the notebook in JupyterLab.
#   scripts/demo.sh          run the notebook here, in the terminal
#   scripts/demo.sh --lab    then open it in JupyterLab (with the jupyter-dist extension)
set -euo pipefail
cd "$(dirname "$0")/.."
open_lab=0
case "${1:-}" in
    "") ;;
    --lab) open_lab=1 ;;
    *) echo "demo.sh: unknown option '$1'; valid: --lab (open the notebook in JupyterLab)" >&2
       exit 2 ;;
esac
scripts/setup.sh
.venv/bin/python scripts/demo.py examples/pytorch_ddp.ipynb
if [[ $open_lab -eq 1 ]]; then
    exec .venv/bin/jupyter lab examples/pytorch_ddp.ipynb
fi
echo
echo "Open it in JupyterLab, with the live view and the jobs sidebar:"
echo "    .venv/bin/jupyter lab examples/pytorch_ddp.ipynb     (or: scripts/demo.sh --lab)"
