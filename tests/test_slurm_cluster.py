"""The test Slurm cluster itself (tests/slurmnodes.py): two idle nodes with their own
hostnames, job steps spread over both with Slurm's variables, and a cancelled job that
leaves nothing on a node. The Slurm backend's tests stand on this."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slurm


def test_two_idle_nodes_run_a_job_step_across_both(slurm_cluster):
    info = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c")
    assert info.stdout.split("\n")[:2] == ["sln1 idle 2", "sln2 idle 2"]
    step = slurm_cluster.run(
        "srun", "-N2", "-n4", "--label", "sh", "-c",
        'echo "$(hostname) $SLURM_PROCID/$SLURM_NTASKS node $SLURM_NODEID local $SLURM_LOCALID"',
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    lines = sorted(line.split(": ", 1)[1] for line in step.stdout.splitlines())
    assert lines == [
        "sln1 0/4 node 0 local 0", "sln1 1/4 node 0 local 1",
        "sln2 2/4 node 1 local 0", "sln2 3/4 node 1 local 1",
    ]  # fmt: skip


def test_a_cancelled_job_leaves_nothing_on_the_nodes(slurm_cluster, tmp_path):
    submitted = slurm_cluster.run(
        "sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--output={tmp_path}/%j.out",
        "--wrap",
        "srun sh -c 'sleep 300 & sleep 300'",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    deadline = time.monotonic() + 30
    while not all(slurm_cluster.pids(n) for n in slurm_cluster.nodes):
        assert time.monotonic() < deadline, "the job's steps never ran on both nodes"
        time.sleep(0.2)
    assert slurm_cluster.jobs() == [job]
    slurm_cluster.run("scancel", job)
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs() or any(slurm_cluster.pids(n) for n in slurm_cluster.nodes):
        assert time.monotonic() < deadline, (
            f"left after scancel: {slurm_cluster.jobs()} "
            f"{[slurm_cluster.pids(n) for n in slurm_cluster.nodes]}"
        )
        time.sleep(0.2)
