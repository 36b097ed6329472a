"""Real torch.distributed (gloo on CPU): 2 local nodes x 2 ranks, per_process and torchrun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import EXAMPLES, job_processes, run_cli

from jupyter_dist.run.launch import launch, run
from jupyter_dist.spec import parse_spec

pytestmark = pytest.mark.torch
SCRIPTS = Path(__file__).parent / "scripts"


def _results(store, job_id: str) -> dict[int, dict]:
    """Each rank's RESULT line, read back through `jupyter distrun logs --rank R`."""
    results = {}
    for rank in range(4):
        logs = run_cli("logs", job_id, "--rank", str(rank), "--stream", "stdout", store=store)
        assert logs.returncode == 0, logs.stderr
        (line,) = [x for x in logs.stdout.splitlines() if x.startswith("RESULT ")]
        results[rank] = json.loads(line.removeprefix("RESULT "))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("example", ["pytorch_ddp.yml", "pytorch_ddp_torchrun.yml"])
def test_ddp_on_two_local_nodes(example: str, store):
    done = run_cli("run", str(EXAMPLES / example), store=store, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(4):  # live output, prefixed by the rank that printed it
        assert f"[rank {rank}] RESULT " in done.stdout
    job_id = store.jobs()[0].job_id
    results = _results(store, job_id)
    master = {(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in results.values()}
    assert len(master) == 1 and next(iter(master))[0] == "127.0.0.1"
    for rank, report in results.items():
        env = report["env"]
        assert report["rank"] == rank and report["world_size"] == 4
        assert report["local_rank"] == rank % 2 and report["node_rank"] == rank // 2
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == str(rank // 2)
        assert env["DISTRUN_JOB_ID"] == job_id
        assert report["allreduce"] == 1 + 2 + 3 + 4
    weights = {json.dumps(r["weights"]) for r in results.values()}
    assert len(weights) == 1  # DDP kept every replica identical
    assert job_processes(job_id) == []


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["per_process", "torchrun"])
def test_a_failing_rank_stops_the_job(launcher: str, store):
    spec = parse_spec(
        f"command: python {SCRIPTS / 'ddp_fail.py'}\nresources: {{instance_count: 2}}\n"
        "environment_variables: {OMP_NUM_THREADS: 1}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: 2, launcher: {launcher}}}"
    )
    started = time.monotonic()
    result = run(spec, store=store, grace_period=3)
    assert time.monotonic() - started < 90
    assert result.state == "failed"
    cause = result.root_cause
    assert cause.rank == 2 and cause.node == "local1", cause.format()
    assert cause.stderr_tail[-1].endswith("RuntimeError: rank 2 lost its data shard")
    assert "Traceback (most recent call last):" in cause.stderr_tail[0]
    if launcher == "per_process":
        assert sorted(cause.stopped + cause.collateral) == ["rank 0", "rank 1", "rank 3"]
    else:
        # torchrun on node 0: stopped with its ranks, or, when they saw rank 2 go first
        # (gloo's connection reset), ended of that itself; no one else is named.
        others = set(cause.stopped + cause.collateral)
        assert others <= {"node 0", "rank 0", "rank 1", "rank 3"}, cause.format()
        assert "node 0" in cause.stopped or not cause.stopped, cause.format()
    assert job_processes(result.job_id) == []


@pytest.mark.slow
def test_cancel_a_torchrun_job_leaves_nothing(store):
    spec = parse_spec(
        f"command: python {SCRIPTS / 'ddp_forever.py'}\nresources: {{instance_count: 2}}\n"
        "environment_variables: {OMP_NUM_THREADS: 1}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2, launcher: torchrun}"
    )
    job = launch(spec, store=store, grace_period=5)
    deadline = time.monotonic() + 90
    record = job.record
    while time.monotonic() < deadline:
        seen = [k for k in record.log_keys() if any(record.iter_log(k, "stdout"))]
        if len(seen) == 4:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"ranks never started: {record.log_keys()}")
    assert len(job_processes(job.job_id)) >= 6  # 2 torchrun agents, 4 workers
    job.cancel()
    result = job.wait(60)
    assert result is not None and result.state == "cancelled"
    assert job_processes(job.job_id) == []


@pytest.mark.slow
def test_a_taken_master_port_fails_with_a_hint(store, tmp_path):
    """Rank 0 finds MASTER_PORT taken (here by its own socket, as a leftover server would
    hold it): the root cause is rank 0's EADDRINUSE, and a hint says what to do."""
    (tmp_path / "taken.py").write_text(
        "import os, socket\n"
        "import torch.distributed as dist\n"
        "if os.environ['RANK'] == '0':\n"
        "    held = socket.socket()\n"
        "    held.bind(('', int(os.environ['MASTER_PORT'])))\n"
        "    held.listen()\n"
        "dist.init_process_group('gloo')\n"
    )
    spec = parse_spec(
        f"code: {tmp_path}\ncommand: python taken.py\nresources: {{instance_count: 2}}\n"
        "distribution: {type: pytorch}"
    )
    result = run(spec, store=store, grace_period=2)
    assert result.state == "failed" and result.root_cause.rank == 0
    report = result.root_cause.format()
    assert report.splitlines()[-1].startswith(
        'Hint: a port rank 0 needed on local0 was taken ("address already in use")'
    ), report


@pytest.mark.slow
def test_a_collective_timeout_names_the_rank_that_never_arrived(store, tmp_path):
    """Rank 1 never joins the all_reduce; the others give up after the group's 3 s timeout
    (gloo's "Timed out waiting 3000ms"): the hint says a collective timed out and that
    rank 1, still running then, is the likely one that never arrived."""
    (tmp_path / "late.py").write_text(
        "import datetime, time\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
        "if dist.get_rank() == 1:\n"
        "    time.sleep(120)\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    spec = parse_spec(
        f"code: {tmp_path}\ncommand: python late.py\nresources: {{instance_count: 2}}\n"
        "environment_variables: {OMP_NUM_THREADS: '1'}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    result = run(spec, store=store, grace_period=2)
    cause = result.root_cause
    assert result.state == "failed" and cause.rank in (0, 2, 3), cause.format()
    hint = cause.format().splitlines()[-1]
    assert hint.startswith(f'Hint: a collective timed out on rank {cause.rank} ("Timed out'), hint
    assert "rank 1 still ran when it gave up: the likely one(s) that never arrived" in hint
