"""The culprit, not its victims: which failed rank started a job's failure.

When one rank dies, its peers soon fail too, of communication errors (gloo's "Connection
closed by peer", NCCL's watchdog timeout, "Broken pipe"), and which exit the launcher sees
first is a race. So once every process is gone, each rank that ended badly is judged by its
evidence, and the culprit is the best one; its victims are listed apart.

A suspect's standing, best first:
  0. it raised a real exception (a traceback whose last lines are not a communication
     error), or the system killed it (SIGKILL, SIGSEGV, SIGABRT... that jupyter-dist did not
     send: a process is only SIGKILLed by us once its grace period is over);
  1. it failed with no evidence either way (a non-zero exit, nothing on stderr);
  2. collateral: its last stderr lines are a communication error.
A process jupyter-dist stopped (SIGTERM, or SIGKILL after the grace period) is no suspect.
Ties go to the one whose stderr spoke first, then to the one that ended first.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from jupyter_dist.events import ProcessState
from jupyter_dist.plan.model import ProcessPlan, rank_key

# What a rank prints when a peer, not itself, went wrong.
COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Connection refused"
    r"|Watchdog caught collective operation timeout|NCCL communicator was aborted"
    r"|ProcessGroup\w* .*abort|has been shut down|Timed out waiting \d+\s*ms"
    r"|DistNetworkError|recvValue failed|sendBytes failed|Socket Timeout"
    r"|failed to recv, got 0 bytes|ECONNRESET|EPIPE"
    r"|remote process exited or there was a network error|ncclRemoteError",
    re.IGNORECASE,
)
# Signals only the system (or the program itself) sends; ours are SIGTERM, then SIGKILL.
_OS_SIGNALS = {"SIGKILL", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"}
_LAST_LINES = 6  # where a traceback's exception is


@dataclass(frozen=True)
class Suspect:
    key: str  # the log key its evidence is under ("rank-1", or the process's own name)
    proc: ProcessPlan
    rank: int | None
    standing: int  # 0 real failure, 1 no evidence, 2 collateral
    spoke: float  # when its stderr first spoke (inf if never)
    ended: float

    @property
    def label(self) -> str:
        return rank_key(self.rank)[1] if self.rank is not None else self.proc.label


def is_collateral(tail: Iterable[str]) -> bool:
    """Whether a rank's last stderr lines are a peer's failure seen from here."""
    lines = [line for line in tail if line.strip()][-_LAST_LINES:]
    return any(COLLATERAL.search(line) for line in lines)


def suspects(
    processes: list[tuple[ProcessPlan, ProcessState]],
    tails: dict[str, list[str]],
    first: dict[str, tuple[float, bool]],
    stop_started: float | None,
    grace: float,
) -> list[Suspect]:
    """Every rank that ended badly with what speaks against it, best suspect first.

    `processes`: each process with its final state; `tails`: each log key's last stderr
    lines; `first`: each key's (first stderr time, traceback seen); `stop_started`: when
    jupyter-dist began stopping the job (epoch seconds; None if it never did)."""
    found = []
    for proc, state in processes:
        if state.exit_code in (None, 0) and state.signal is None:
            continue
        ours = _stopped_by_us(state, stop_started, grace)
        keys = [rank_key(r)[0] for r in proc.ranks] if len(proc.ranks) > 1 else [proc.name]
        for key in keys:
            tail = tails.get(key, [])
            spoke, traceback = first.get(key, (float("inf"), False))
            if is_collateral(tail):
                standing = 2
            elif traceback:
                standing = 0
            elif len(keys) > 1 or ours:
                continue  # a launcher's quiet rank, or a process we stopped: no evidence
            elif state.signal in _OS_SIGNALS:
                standing = 0
            else:
                standing = 1
            rank = int(key.split("-")[1]) if len(keys) > 1 else proc.rank
            found.append(Suspect(key, proc, rank, standing, spoke, state.ended or float("inf")))
    return sorted(found, key=lambda s: (s.standing, s.spoke, s.ended))


def _stopped_by_us(state: ProcessState, stop_started: float | None, grace: float) -> bool:
    """Whether its end is our doing: SIGTERM after we began stopping, or SIGKILL once the
    grace period was over (a SIGKILL before that came from elsewhere: the OOM killer)."""
    if stop_started is None or state.ended is None or state.ended < stop_started:
        return False
    if state.signal == signal.Signals.SIGTERM.name:
        return True
    if state.signal == signal.Signals.SIGKILL.name:
        return state.ended >= stop_started + grace * 0.9
    return False
