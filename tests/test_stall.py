"""Stall detection (issue 15, part 2): a job in which no rank printed and no rank used CPU
for --stall-timeout seconds is flagged with every rank's stack; a job that computes is not;
--on-stall kill stops it and leaves nothing; a session between cells is quiet by design.
Real gloo jobs through the CLI and the engine; StallWatch's arithmetic with a fake clock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import yaml
from helpers import HANG_SCRIPT, job_processes

from jupyter_dist.diagnose.meters import Meters
from jupyter_dist.diagnose.stall import StallWatch
from jupyter_dist.run.launch import launch, run
from jupyter_dist.run.session import Session
from jupyter_dist.spec import parse_spec


def _spec_file(tmp_path, script: str, **limits) -> str:
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump({
        "script": script,
        "environment_variables": {"OMP_NUM_THREADS": "1"},
        "resources": {"instance_count": 2},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2},
        **({"limits": limits} if limits else {}),
    }))  # fmt: skip
    return str(path)


@pytest.mark.slow
@pytest.mark.torch
def test_a_hung_job_is_flagged_with_its_stacks_and_left_running(store, tmp_path):
    """`jupyter distrun run --stall-timeout 10`: the notice comes within 20 s of the ranks
    going quiet, with rank 2 in load_batch first; the job is not stopped; the store says
    it looks stuck (the sidebar's mark)."""
    run_cli = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", _spec_file(tmp_path, HANG_SCRIPT),
         "--store", str(store.root), "--stall-timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready = 0
        while ready < 4:
            line = run_cli.stdout.readline()
            assert line, "the job ended before every rank was ready"
            ready += line.rstrip().endswith("READY")
        quiet_since = time.monotonic()
        said = []
        while not any("looks stuck" in line for line in said):
            said.append(run_cli.stderr.readline())
            assert said[-1], "".join(said)
        assert time.monotonic() - quiet_since < 20, "".join(said)
        notice = next(line for line in said if "looks stuck" in line)
        assert notice.startswith("The job looks stuck: no rank printed or used CPU for 1")
        groups = [run_cli.stderr.readline().strip() for _ in range(2)]
        assert groups[0] == "rank 2 (local1): script.py:6 in load_batch ← script.py:11 in <module>"
        assert groups[1].startswith("ranks 0-1, 3 (local0, local1): torch/distributed/")
        (record,) = store.jobs()
        from jupyter_dist.describe import job_summary

        summary = job_summary(record.status())
        assert summary["state"] == "running" and summary["stalled"].startswith("looks stuck")
        assert record.last_stacks()["reason"] == "stalled"
        assert run_cli.poll() is None  # flagged, never stopped unless asked
    finally:
        run_cli.terminate()
        run_cli.communicate(timeout=60)
    assert job_processes(record.job_id) == []


@pytest.mark.slow
@pytest.mark.torch
def test_computing_is_not_a_stall_even_while_other_ranks_wait(store):
    """Rank 0 computes for 22 s without printing; the others sleep meanwhile (waiting for
    it): with the same 10 s timeout, nothing is flagged."""
    busy = textwrap.dedent("""\
        import os, time
        if os.environ["RANK"] == "0":
            end, x = time.time() + 22, 0
            while time.time() < end:
                x += 1
        else:
            time.sleep(22)
    """)
    spec = parse_spec(yaml.safe_dump({
        "script": busy, "resources": {"instance_count": 2}, "limits": {"stall_timeout": 10},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2},
    }))  # fmt: skip
    job = launch(spec, store=store, grace_period=2)
    seen = []
    while not job.done:
        seen.append(job.watch.stall_notice)
        time.sleep(0.5)
    assert job.wait().state == "succeeded"
    assert set(seen) == {None} and job.record.last_stacks() is None


@pytest.mark.slow
@pytest.mark.torch
def test_on_stall_kill_stops_the_job_with_the_stall_as_its_cause(store):
    spec = parse_spec(yaml.safe_dump({
        "script": HANG_SCRIPT, "environment_variables": {"OMP_NUM_THREADS": "1"},
        "resources": {"instance_count": 2},
        "limits": {"stall_timeout": 5, "on_stall": "kill"},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2},
    }))  # fmt: skip
    result = run(spec, store=store, grace_period=2)
    assert result.state == "failed" and result.root_cause is None
    described = result.describe()
    assert described.startswith(f"Job {result.job_id} failed: stopped because it looks stuck: ")
    assert "rank 2 (local1): script.py:6 in load_batch" in described
    assert job_processes(result.job_id) == []


@pytest.mark.slow
def test_a_session_between_cells_is_not_stalled_but_a_quiet_cell_is(store):
    spec = parse_spec(
        "command: unused\nresources: {instance_count: 1}\nlimits: {stall_timeout: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    session = Session.start(spec, store=store, grace_period=2)
    try:
        assert session.run_cell("x = 1").ok
        time.sleep(5)  # idle between cells, far past the timeout
        assert session.job.watch.stall_notice is None
        assert session.run_cell("import time\ntime.sleep(6)").ok
        assert session.job.record.last_stacks()["reason"] == "stalled"
    finally:
        session.stop()


def test_stall_watch_arithmetic():
    """Quiet for the timeout flags once; CPU above the threshold or output resumes it; a
    process's first report only sets its baseline; quiet by design is never a stall."""
    now = [0.0]
    events = []
    watching = [True]
    watch = StallWatch(
        10, lambda quiet: events.append(("stall", quiet)), lambda: events.append("resume"),
        watching=lambda: watching[0], clock=lambda: now[0],
    )  # fmt: skip
    meters = Meters()

    def report(process, sample):  # as the job feeds it: the readings Meters made of it
        watch.usage(process, meters.update(process, sample, now=now[0]))

    report("rank-0", {"cpu": 5.0, "ranks": {}})  # baseline only
    now[0] = 9.9
    report("rank-0", {"cpu": 5.1, "ranks": {}})  # 1% of a core: idle
    watch.check()
    assert events == []
    now[0] = 10.0
    watch.check()
    watch.check()
    assert events == [("stall", 10.0)]
    now[0] = 11.0
    report("rank-0", {"cpu": 5.7, "ranks": {}})  # 54% since its last report: working
    assert events == [("stall", 10.0), "resume"] and not watch.stalled
    now[0] = 30.0
    watching[0] = False
    watch.check()  # a session between cells: quiet is fine, and counts from now
    watching[0] = True
    now[0] = 39.0
    watch.check()
    assert len(events) == 2
    now[0] = 40.0
    report("torchrun-0", {"cpu": 9.0, "ranks": {"0": [1.0, 0], "1": [1.0, 0]}})
    now[0] = 41.0  # the launcher busy, its ranks idle: ranks decide
    report("torchrun-0", {"cpu": 10.0, "ranks": {"0": [1.0, 0], "1": [1.0, 0]}})
    watch.check()
    assert events[-1] == ("stall", 11.0)
    watch.output()
    assert events[-1] == "resume"
    # a rank idle on its CPU while its GPU computes (nvidia-smi's reading) is working
    now[0] = 60.0
    watch.check()
    assert events[-1] == ("stall", 19.0)
    now[0] = 61.0
    report("torchrun-0", {"cpu": 10.1, "ranks": {"0": [1.0, 0]}, "gpus": {"0": [97.0, 1]}})
    assert events[-1] == "resume"
    now[0] = 80.0
    report("torchrun-0", {"cpu": 10.1, "ranks": {"0": [1.0, 0]}, "gpus": {"0": [None, 1]}})
    watch.check()  # a device that does not say its utilisation is not taken as busy
    assert events[-1] == ("stall", 19.0)


@pytest.mark.slow
def test_a_quiet_cell_says_it_looks_stuck_in_the_notebook(kernel_env):
    """`%%distrun --stall-timeout 3` on a cell whose ranks sleep: the notice and the grouped
    stacks come out in the cell, and the cell still succeeds (flagged, never stopped)."""
    from helpers import execute_notebook, stream_text

    nb = execute_notebook(
        "%%distrun --nodes 1 --procs-per-node 2 --stall-timeout 3\n"
        "import time\nprint('begins', flush=True)\ntime.sleep(9)\nprint('ends')\n"
    )
    text = stream_text(nb.cells[1])
    assert "The job looks stuck: no rank printed or used CPU for " in text, text
    assert "  ranks 0-1 (local0): script.py:3 in <module>" in text, text
    assert text.index("looks stuck") < text.index("The job moves again.")
    assert text.index("looks stuck") < text.index("[rank 0] ends")
