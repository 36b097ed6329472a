"""A stopped rank gets one SIGTERM and the whole grace period to save its work, whether or
not a shell wraps its command (`/bin/sh -c` is dash here, which does not exec the command):
on cancel, on a kernel interrupt and when a peer fails; one that ignores SIGTERM is
SIGKILLed once the grace period is over."""

from __future__ import annotations

import json
import queue
import sys
import time
from pathlib import Path

import pytest
from helpers import SAVER, interrupt_and_reply, job_processes, running_kernel

from jupyter_dist.run.launch import launch
from jupyter_dist.spec import parse_spec


@pytest.fixture
def saver(tmp_path: Path) -> Path:
    (tmp_path / "saver.py").write_text(SAVER)
    return tmp_path


def _spec(command: str, grace: int = 5, ranks: int = 2, kind: str = "pytorch", nodes: int = 1):
    return parse_spec(
        f"command: {json.dumps(command)}\nresources: {{instance_count: {nodes}}}\n"
        f"distribution: {{type: {kind}, process_count_per_instance: {ranks}}}\n"
        f"limits: {{grace_period: {grace}}}\n"
    )


def _wait_for(paths: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never written: {[p for p in paths if not p.exists()]}"
        time.sleep(0.05)


def _saved_once(folder: Path, ranks: list[int]) -> None:
    for rank in ranks:
        assert (folder / f"rank-{rank}.txt").read_text() == "term\nsaved\n", rank


@pytest.mark.slow
def test_a_cancelled_rank_under_a_shell_saves_its_work_in_the_grace_period(saver, store):
    job = launch(_spec(f"{sys.executable} saver.py {saver}"), store=store, cwd=saver)
    _wait_for([saver / "ready-0", saver / "ready-1"])
    job.cancel()
    result = job.wait(30)
    assert result is not None and result.state == "cancelled"
    _saved_once(saver, [0, 1])  # one SIGTERM each, and 2 s to save
    assert job_processes(job.job_id) == []


@pytest.mark.slow
@pytest.mark.mpi
def test_mpiruns_ranks_get_the_whole_grace_period_not_open_mpis_second(saver, store):
    """mpirun would give its ranks SIGCONT, a second, SIGTERM, a second, SIGKILL; its ranks
    on the agent's node get one SIGTERM from the agent instead, and the grace period."""
    spec = _spec(f"{sys.executable} saver.py {saver}", kind="mpi", nodes=2)
    job = launch(spec, store=store, cwd=saver)
    _wait_for([saver / f"ready-{rank}" for rank in range(4)])
    job.cancel()
    result = job.wait(30)
    assert result is not None and result.state == "cancelled", result.describe()
    _saved_once(saver, [0, 1, 2, 3])  # one SIGTERM each, and 2 s to save
    assert job_processes(job.job_id) == []


@pytest.mark.slow
def test_when_a_peer_fails_the_others_still_save_their_work(saver, store):
    command = (
        f'if [ "$RANK" = 1 ]; then while [ ! -e {saver}/ready-0 ]; do sleep 0.1; done; '
        f"exit 3; fi; {sys.executable} saver.py {saver}"
    )
    job = launch(_spec(command), store=store, cwd=saver)
    result = job.wait(60)
    assert result is not None and result.state == "failed"
    assert result.root_cause.rank == 1
    _saved_once(saver, [0])


@pytest.mark.slow
def test_a_rank_that_ignores_sigterm_is_killed_when_the_grace_period_ends(store):
    job = launch(_spec("trap '' TERM; echo READY; while true; do sleep 0.1; done", grace=2,
                       ranks=1), store=store)  # fmt: skip
    deadline = time.monotonic() + 30
    while "READY" not in "".join(line.text for line in store.get(job.job_id).iter_log(
            "rank-0", "stdout")):  # fmt: skip
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    job.cancel()
    result = job.wait(30)
    took = time.monotonic() - started
    (proc,) = result.processes
    assert proc.signal == "SIGKILL" and 1.5 < took < 15  # the grace period, then no more
    assert job_processes(job.job_id) == []


@pytest.mark.slow
def test_an_interrupted_cell_gives_its_ranks_the_grace_period(saver):
    with running_kernel() as (km, kc):
        msg_id = kc.execute(
            "%%distrun --nodes 1 --procs-per-node 2 --grace-period 5\n"
            "import os, signal, sys, time\n"
            f"folder = {str(saver)!r}\n" + SAVER.split("folder = sys.argv[1]\n", 1)[1]
        )
        _wait_for([saver / "ready-0", saver / "ready-1"], timeout=60)
        while True:  # the job's id, from its banner
            try:
                text = kc.get_iopub_msg(timeout=1)["content"].get("text", "")
            except queue.Empty:
                continue
            if "job " in text:
                job_id = text.split("job ", 1)[1].split(":", 1)[0]
                break
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["status"] == "error"
        _saved_once(saver, [0, 1])
        assert job_processes(job_id) == []
