"""Which rank printed a line, for launchers that start several ranks (torchrun, mpirun)."""

from __future__ import annotations

import re
from collections.abc import Callable

from jupyter_dist.plan.model import ProcessPlan

_TORCHRUN = re.compile(r"\[default(\d+)\]:(.*)\Z", re.S)
_MPI = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:\s?(.*)\Z", re.S)

# (log key, label, text) for a line.
Attribution = tuple[str, str, str]


def attributor(proc: ProcessPlan) -> Callable[[str], Attribution]:
    """A function mapping one line of `proc`'s output to the rank that printed it."""
    own = (proc.name, proc.label)

    if proc.output == "torchrun":
        first = proc.ranks[0]

        def torchrun_line(text: str) -> Attribution:
            match = _TORCHRUN.match(text)
            if not match:
                return (*own, text)
            rank = first + int(match.group(1))
            return f"rank-{rank}", f"rank {rank}", match.group(2)

        return torchrun_line

    if proc.output == "mpi":

        def mpi_line(text: str) -> Attribution:
            match = _MPI.match(text)
            if not match:
                return (*own, text)
            rank = int(match.group(1))
            return f"rank-{rank}", f"rank {rank}", match.group(2)

        return mpi_line

    return lambda text: (*own, text)


# torch prefixes a rank's uncaught exception with "[rank<N>]: " once its process group is up.
_TRACEBACK = re.compile(r"(\[rank\d+\]:\s?)?Traceback \(most recent call last\)")


def starts_traceback(text: str) -> bool:
    return _TRACEBACK.match(text) is not None


# What launchers print about the rank that failed first.
_TORCHRUN_FAILED = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
_MPI_FAILED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")


def failed_rank(
    proc: ProcessPlan, launcher_lines: list[str], first_stderr: dict[str, tuple[float, bool]]
) -> int | None:
    """The rank that failed first inside a launcher (torchrun, mpirun).

    The launcher's own report wins where it gives one; else the rank that printed a
    traceback first; else the rank that wrote to stderr first. `first_stderr` maps a log
    key to (time of its first stderr line, whether its stderr holds a traceback)."""
    pattern = {"torchrun": _TORCHRUN_FAILED, "mpi": _MPI_FAILED}.get(proc.output)
    if pattern is None:
        return proc.rank
    if proc.output == "torchrun":  # its report lists every failure; the cause comes last
        marks = [i for i, line in enumerate(launcher_lines) if "Root Cause" in line]
        launcher_lines = launcher_lines[marks[-1] :] if marks else []
    for line in launcher_lines:
        match = pattern.search(line)
        if match:
            return int(match.group(1))
    candidates = [
        (not traceback, when, int(key.split("-")[1]))
        for key, (when, traceback) in first_stderr.items()
        if key.startswith("rank-") and int(key.split("-")[1]) in proc.ranks
    ]
    return min(candidates)[2] if candidates else None
