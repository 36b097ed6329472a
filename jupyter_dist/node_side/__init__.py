"""What runs on the nodes themselves, shipped there as source: standard library only,
Python 3.8+, no import of jupyter_dist (a node may have none).

- agent.py: every process of a job runs under it (stdin/stdout protocol, stopping, sweep).
- cell_runner.py: runs a notebook cell as `__main__` and writes back its `--out` values.
- dask_wait.py: waits until a Dask cluster's workers registered, before its command.
- debugger.py: `breakpoint()` pauses a rank in a pdb served on a Unix socket in the job's
  folder (shipped as `distrun_debug.py`, PYTHONBREAKPOINT's target); and, run on a node,
  lists the paused ranks and sends one a command.
- netcheck.py: the network check before launch: listens, connects, reads interfaces.
- pool.py: a node's pool, which imported the job's `preload` modules once and forks its
  Python ranks (shipped as `distrun_pool.py`; the agent starts it and puts its `python`
  first on PATH).
- ports.py: free ports on a node, and why a given port is taken.
- report.py: `report(step=..., **values)`, a rank's metrics (shipped as `distrun.py` beside
  the stack hook, so `from distrun import report` works in every rank).
- session_worker.py: one rank of a warm session, running the cells it is sent.
- stack_hook.py: every Python process of a job registers a stack dump signal (its
  sitecustomize), so that stacks.py can read it without py-spy.
- stacks.py: every Python stack of a job's processes on a node (py-spy or faulthandler).

`path(name)` is the file here and `source(name)` its text: the one way to load them.
"""

from __future__ import annotations

import functools
from pathlib import Path

FOLDER = Path(__file__).parent
NAMES = (
    "agent.py", "cell_runner.py", "dask_wait.py", "debugger.py", "netcheck.py", "pool.py",
    "ports.py", "report.py", "session_worker.py", "stack_hook.py", "stacks.py",
)  # fmt: skip


def path(name: str) -> Path:
    """The script `name` (one of NAMES) on this machine."""
    if name not in NAMES:
        raise ValueError(f"no node-side script {name!r}; they are {', '.join(NAMES)}")
    return FOLDER / name


@functools.cache
def source(name: str) -> str:
    """The text of the script `name`, read once per process."""
    return path(name).read_text()
