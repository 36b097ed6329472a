"""What runs on the nodes themselves, shipped there as source: standard library only,
Python 3.8+, no import of jupyter_dist (a node may have none).

- agent.py: every process of a job runs under it (stdin/stdout protocol, stopping, sweep).
- cell_runner.py: runs a notebook cell as `__main__` and writes back its `--out` values.
- dask_wait.py: waits until a Dask cluster's workers registered, before its command.
- debugger.py: `breakpoint()` pauses a rank in a pdb served on a Unix socket in the job's
  folder (shipped as `distrun_debug.py`, PYTHONBREAKPOINT's target); and, run on a node,
  lists the paused ranks and sends one a command.
- netcheck.py: the network check before launch: listens, connects, reads interfaces.
- pool_server.py: a node's pool, which imported the job's `preload` modules once and forks
  its Python ranks (shipped as `distrun_pool.py`); pool_front.py: what the job's `python`
  is there (`distrun_pool_front.py`); pool_agent.py: the agent's part, which starts the
  pool and puts the front first on PATH (`distrun_pool_agent.py`); pool_protocol.py: what
  the three agree on (`distrun_pool_protocol.py`), and, run alone, lists or stops pools.
- ports.py: free ports on a node, and why a given port is taken.
- report.py: `report(step=..., **values)`, a rank's metrics (shipped as `distrun.py` beside
  the stack hook, so `from distrun import report` works in every rank).
- session_worker.py: one rank of a warm session, running the cells it is sent.
- stack_hook.py: every Python process of a job registers a stack dump signal (its
  sitecustomize), so that stacks.py can read it without py-spy.
- stacks.py: every Python stack of a job's processes on a node (py-spy or faulthandler).

`path(name)` is the file here and `source(name)` its text: the one way to load them.
`SHIPPED` names what goes into each job's folder under another name (`shipped_path`);
the agent, shipped alone, keeps its own copies of those names, and so do the other
stand-alone files of what they share (the stack hook's machine tag and signals):
tests/test_architecture.py holds every copy to its source here.
"""

from __future__ import annotations

import functools
from pathlib import Path

FOLDER = Path(__file__).parent
NAMES = (
    "agent.py",
    "cell_runner.py",
    "dask_wait.py",
    "debugger.py",
    "netcheck.py",
    "pool_agent.py",
    "pool_front.py",
    "pool_protocol.py",
    "pool_server.py",
    "ports.py",
    "report.py",
    "session_worker.py",
    "stack_hook.py",
    "stacks.py",
)


# The job's startup hook folder, in its folder on each node: first on every rank's PYTHONPATH.
HOOK_FOLDER = "pyhook"
# What goes there, as what: the stack hook as the ranks' sitecustomize, report.py as what
# `from distrun import report` imports, the debugger as PYTHONBREAKPOINT's target, and the
# pool's programs (POOL_FILES, where the job preloads modules), which import each other by
# these names.
SHIPPED = {
    "stack_hook.py": "sitecustomize.py",
    "report.py": "distrun.py",
    "debugger.py": "distrun_debug.py",
    "pool_protocol.py": "distrun_pool_protocol.py",
    "pool_server.py": "distrun_pool.py",
    "pool_front.py": "distrun_pool_front.py",
    "pool_agent.py": "distrun_pool_agent.py",
}
POOL_FILES = ("pool_protocol.py", "pool_server.py", "pool_front.py", "pool_agent.py")


def shipped_path(name: str) -> str:
    """Where script `name` (a key of SHIPPED) goes in a job's folder: `pyhook/...`."""
    return f"{HOOK_FOLDER}/{SHIPPED[name]}"


def path(name: str) -> Path:
    """The script `name` (one of NAMES) on this machine."""
    if name not in NAMES:
        raise ValueError(f"no node-side script {name!r}; they are {', '.join(NAMES)}")
    return FOLDER / name


@functools.cache
def source(name: str) -> str:
    """The text of the script `name`, read once per process."""
    return path(name).read_text()
