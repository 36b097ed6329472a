"""What a job's command says about how it starts its ranks: whether it is an MPI launcher
itself (`horovodrun -np 16 ...`, `mpirun ...`) and how many ranks it asks for, or how many
processes torch's launcher starts on each node (`--nproc_per_node 4`). Read by the MPI
planner (plan/mpi.py) and the proposal's dialect (spec_dialect.py)."""

from __future__ import annotations

import itertools
import posixpath
import re
import shlex

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# A command starting with one of these starts the ranks itself.
SELF_LAUNCHERS = ("horovodrun", "mpirun", "mpiexec")
_NPROC = re.compile(r"--nproc[_-]per[_-]node(?:=|\s+)(\d+)\b")


def own_launcher(command: str | None) -> str | None:
    """The launcher a command runs itself ("horovodrun", "mpirun"), or None."""
    try:
        words = shlex.split(command or "")
    except ValueError:
        return None
    program = next((w for w in words if not _ASSIGNMENT.match(w)), "")  # after any VAR=value
    program = posixpath.basename(program)
    return program if program in SELF_LAUNCHERS else None


def own_world(command: str, default: int) -> int:
    """The ranks a self-launching command asks for (-np N, -n N), else `default`."""
    try:
        words = shlex.split(command)
    except ValueError:
        return default
    for flag, value in itertools.pairwise(words):
        if flag in ("-np", "-n", "--np") and value.isdigit():
            return int(value)
    return default


def torch_processes_per_node(command: str) -> int | None:
    """The processes torch's launcher in the command starts on each node
    (`--nproc_per_node N`, `--nproc-per-node=N`), or None."""
    found = _NPROC.search(command)
    return int(found.group(1)) if found else None
