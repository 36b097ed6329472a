"""Which rank printed a line, for launchers that start several ranks (torchrun, mpirun,
horovodrun)."""

from __future__ import annotations

import re
from collections.abc import Callable

from jupyter_dist.plan.model import ProcessPlan, rank_key

# torchrun: "[default<local rank>]:".
_TORCHRUN_TAG = re.compile(r"\[default(\d+)\]:")
# mpirun --tag-output: "[JOB,RANK]<stdout>:"; horovodrun --gloo: "[RANK]<stdout>:".
_MPI_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")

# (log key, label, text) for a line.
Attribution = tuple[str, str, str]


def attributor(proc: ProcessPlan) -> Callable[[str], list[Attribution]]:
    """A function mapping one line of `proc`'s output to the rank lines it completes.

    Make one per output stream: it keeps each rank's unfinished text between lines."""
    own = (proc.name, proc.label)
    if proc.line_tags == "torchrun":  # its tags count from the node's first rank
        return _TagDemux(own, _TORCHRUN_TAG, first_rank=proc.ranks[0])
    if proc.line_tags == "mpi":
        return _TagDemux(own, _MPI_TAG)
    return lambda text: [(*own, text)]


class _TagDemux:
    """Reassembles rank lines from a launcher that tags what each rank writes: mpirun's
    `--tag-output` (and horovodrun's tags), torchrun's "[default<N>]:".

    They tag every fragment they read from a rank, not every line: a rank that writes
    "text" and "\n" separately (unbuffered Python does) comes out as
    "[1,3]<stdout>:text" then "[1,3]<stdout>:\n", possibly with another rank's fragment
    between them on the same line (torchrun: "[default1]:text[default1]:"). So: split each
    line at the tags, keep each rank's unfinished text, and complete it when a fragment of
    that rank ends a line."""

    def __init__(self, own: tuple[str, str], tag: re.Pattern[str], first_rank: int = 0):
        self.own = own
        self.tag = tag
        self.first_rank = first_rank
        self.pending: dict[int, str] = {}

    def __call__(self, text: str) -> list[Attribution]:
        tags = list(self.tag.finditer(text))
        if not tags:
            return [(*self.own, text)]
        out: list[Attribution] = []
        if tags[0].start() > 0:
            out.append((*self.own, text[: tags[0].start()]))
        for i, tag in enumerate(tags):
            rank = self.first_rank + int(tag.group(1))
            end = tags[i + 1].start() if i + 1 < len(tags) else len(text)
            fragment = self.pending.pop(rank, "") + text[tag.end() : end]
            if i + 1 < len(tags):
                self.pending[rank] = fragment  # cut off by another tag: not a whole line yet
            else:
                out.append((*rank_key(rank), fragment))
        return out


# torch prefixes a rank's uncaught exception with "[rank<N>]: " once its process group is up.
_TRACEBACK = re.compile(r"(\[rank\d+\]:\s?)?Traceback \(most recent call last\)")


def starts_traceback(text: str) -> bool:
    return _TRACEBACK.match(text) is not None


# What launchers print about the rank that failed first.
_TORCHRUN_FAILED = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
# mpirun's report of the first rank to fail; horovodrun --gloo's, once it stops the rest.
_MPI_FAILED = re.compile(
    r"Process name:\s*\[\[\d+,\d+\],(\d+)\]"
    r"|Terminating remaining workers after failure of Process (\d+)"
)


def failed_rank(
    proc: ProcessPlan, launcher_lines: list[str], first_stderr: dict[str, tuple[float, bool]]
) -> int | None:
    """The rank that failed first inside a launcher (torchrun, mpirun).

    The launcher's own report wins where it gives one; else the rank that printed a
    traceback first; else the rank that wrote to stderr first. `first_stderr` maps a log
    key to (time of its first stderr line, whether its stderr holds a traceback)."""
    pattern = {"torchrun": _TORCHRUN_FAILED, "mpi": _MPI_FAILED}.get(proc.line_tags)
    if pattern is None:
        return proc.rank
    if proc.line_tags == "torchrun":  # its report lists every failure; the cause comes last
        marks = [i for i, line in enumerate(launcher_lines) if "Root Cause" in line]
        launcher_lines = launcher_lines[marks[-1] :] if marks else []
    for line in launcher_lines:
        match = pattern.search(line)
        if match:
            return int(next(group for group in match.groups() if group is not None))
    candidates = [
        (not traceback, when, int(key.split("-")[1]))
        for key, (when, traceback) in first_stderr.items()
        if key.startswith("rank-") and int(key.split("-")[1]) in proc.ranks
    ]
    return min(candidates)[2] if candidates else None
