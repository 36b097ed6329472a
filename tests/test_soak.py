"""Nothing of a job is left running, however it is stopped and however its ranks try to
escape (a few trials of bench/soak.py's scenarios; the bench runs 20 of each): a rank that
ignores SIGTERM, a grandchild, a `setsid -f` daemon, and a `setsid -f env -i` daemon that
carries no marker of the job."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from jupyter_dist.node_side.agent import Cgroup

_SPEC = importlib.util.spec_from_file_location(
    "soak", Path(__file__).resolve().parents[1] / "bench" / "soak.py"
)
soak = importlib.util.module_from_spec(_SPEC)
sys.modules["soak"] = soak  # its dataclasses look themselves up there
_SPEC.loader.exec_module(soak)

LOCAL = soak.Nodes("local", ["--nodes", "1", "--procs-per-node", "2"])


def _env(tmp_path: Path, cgroup: str = "auto") -> dict[str, str]:
    env = {**os.environ, "DISTRUN_HOME": str(tmp_path / "home"), "DISTRUN_CGROUP": cgroup}
    env.pop("DISTRUN_NODES_FILE", None)
    return env


def _assert_clean(outcome) -> None:
    assert outcome.started, "the ranks never said READY"
    assert not outcome.hung, "the launcher did not end after the stop"
    assert dict(outcome.left) == {}, f"left running: {dict(outcome.left)}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario",
    ["ctrl-c", "launcher-sigkill", "cancel", "kernel-sigkill", "fail-fast", "agent-sigkill"],
)
def test_nothing_is_left_on_local_nodes(scenario, tmp_path):
    _assert_clean(soak.run_trial(scenario, LOCAL, tmp_path, _env(tmp_path)))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["launcher-sigkill", "cancel"])
def test_without_a_cgroup_the_agent_adopts_what_daemonizes(scenario, tmp_path):
    """The fallback: the agent is its tree's child subreaper, so even a daemon with a
    cleared environment stays its child and is stopped with the rest."""
    _assert_clean(soak.run_trial(scenario, LOCAL, tmp_path, _env(tmp_path, "off")))


@pytest.mark.parametrize("scenario", ["dropped-ssh", "launcher-sigkill", "cancel", "agent-sigkill"])
def test_nothing_is_left_on_ssh_nodes(scenario, ssh_nodes, tmp_path):
    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    nodes = soak.Nodes(
        "ssh", ["--nodes", "2", "--procs-per-node", "1", "--nodes-file", str(inventory)],
        cluster=ssh_nodes,
    )  # fmt: skip
    _assert_clean(soak.run_trial(scenario, nodes, tmp_path, _env(tmp_path)))


def test_each_rank_runs_in_a_cgroup_of_its_own_which_is_removed_after(store, tmp_path):
    """Where a cgroup v2 can be made (root here), every process a rank starts is born in
    the agent's `distrun-JOB-TOKEN` cgroup; it is gone once the job is."""
    from jupyter_dist.run.launch import launch
    from jupyter_dist.spec import parse_spec

    probe = Cgroup.make("probe", str(os.getpid()))
    assert probe is not None, "no cgroup v2 can be made on this machine"
    probe.remove()
    spec = parse_spec(
        "command: 'grep ^0:: /proc/self/cgroup; sh -c \"grep ^0:: /proc/self/cgroup\"'\n"
        "resources: {instance_count: 1}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    job = launch(spec, store=store, cwd=tmp_path)
    result = job.wait(60)
    assert result is not None and result.state == "succeeded"
    record = store.get(job.job_id)
    groups = {}
    for key in record.log_keys():
        lines = [line.text for line in record.iter_log(key, "stdout")]
        assert len(lines) == 2 and lines[0] == lines[1], lines  # the grandchild too
        groups[key] = lines[0].removeprefix("0::")
    assert len(set(groups.values())) == 2, groups  # one per rank
    for path in groups.values():
        assert Path(path).name.startswith(f"distrun-{job.job_id}-"), path
    assert Cgroup.of_job(job.job_id) == []


def test_the_sweep_stops_what_a_killed_agent_left_in_its_cgroup(tmp_path):
    """An agent killed outright (the OOM killer) leaves its tree; the launcher's sweep
    finds the job's cgroups by name and empties them, cleared environments included."""
    import signal
    import subprocess
    import time

    from jupyter_dist.node_side import agent

    tag = f"soak-sweep{os.getpid()}"
    env = {**os.environ, "DISTRUN_JOB_ID": "sweeptest-1", "DISTRUN_CGROUP": "auto"}
    command = f"setsid -f env -i {sys.executable} -c 'import time; time.sleep(300)' {tag}"
    proc = subprocess.Popen(
        [sys.executable, str(agent.__file__), "--", "sh", "-c", f"{command}; sleep 300"],
        env=env, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not soak.leftovers(tag, tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert soak.leftovers(tag, tmp_path), "the daemon never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert soak.leftovers(tag, tmp_path), "the daemon died with its agent: nothing to sweep"
    assert len(Cgroup.of_job("sweeptest-1")) == 1
    killed = agent.sweep("sweeptest-1")
    assert killed and Cgroup.of_job("sweeptest-1") == []
    deadline = time.monotonic() + 5
    while soak.leftovers(tag, tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert soak.leftovers(tag, tmp_path) == {}
