"""Jobs that start again after a failure (limits.max_restarts): the attempt is stopped as a
failure is, then the whole job starts again under the same id with fresh ports and
DISTRUN_RESTART_COUNT one higher; the causes are kept; a cancel between attempts ends it;
the fronts (CLI, attach, live view, inspect, logs --attempt) say which attempt runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import EXAMPLES, execute_notebook, job_processes, run_cli

from jupyter_dist.errors import SpecError
from jupyter_dist.options import LaunchOptions
from jupyter_dist.run.launch import prepare_job
from jupyter_dist.run.requests import wait_until_ended
from jupyter_dist.spec import parse_spec

# Each rank prints its attempt and master port; rank 1 fails on the first FAIL attempts,
# after PAUSE seconds (and once a GATE file is there, where one is given).
FLAKY = (
    "command: >-\n"
    "  echo attempt $DISTRUN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT port $MASTER_PORT;\n"
    "  sleep {pause};{gate}\n"
    "  if [ $RANK = 1 ] && [ $DISTRUN_RESTART_COUNT -lt {fail} ]; then\n"
    "  echo rank 1 gives up on attempt $DISTRUN_RESTART_COUNT >&2; exit 3; fi; sleep 0.3\n"
    "resources: {{instance_count: 2}}\n"
    "distribution: {{type: pytorch}}\n"
    "limits: {{max_restarts: {restarts}, restart_delay: {delay}}}\n"
)


def _flaky(
    tmp_path: Path, fail: int, restarts: int, delay: float = 0, pause: float = 0,
    gate: Path | None = None,
) -> Path:  # fmt: skip
    path = tmp_path / "flaky.yml"
    wait = f" while [ ! -e {gate} ]; do sleep 0.05; done;" if gate else ""
    path.write_text(FLAKY.format(fail=fail, restarts=restarts, delay=delay, pause=pause, gate=wait))
    return path


def _wait_for(predicate, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- the headline: a killed rank, a resumed training, the same weights ----------------------


def _ddp_spec(tmp_path: Path, checkpoints: Path, restarts: int) -> Path:
    """examples/pytorch_ddp_restarts.yml, with its checkpoints in `checkpoints`."""
    text = (EXAMPLES / "pytorch_ddp_restarts.yml").read_text()
    text = text.replace("code: src", f"code: {EXAMPLES / 'src'}")
    text = text.replace("/tmp/ddp-restarts-example", str(checkpoints))
    text = text.replace("steps: 60", "steps: 40").replace(
        "max_restarts: 3", f"max_restarts: {restarts}"
    )
    path = tmp_path / f"ddp-{checkpoints.name}.yml"
    path.write_text(text)
    return path


def _final_weights(folder: Path) -> dict:
    import torch

    (final,) = folder.glob("*/final.pt")  # the job's own folder: <checkpoints>/<job id>/
    return torch.load(final)


@pytest.mark.slow
def test_a_rank_killed_mid_training_resumes_from_its_checkpoint_to_the_same_weights(
    store, tmp_path
):
    import torch

    whole = tmp_path / "uninterrupted"
    done = run_cli("run", str(_ddp_spec(tmp_path, whole, 0)), store=store, timeout=180)
    assert done.returncode == 0, done.stderr

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(_ddp_spec(tmp_path, killed, 2)),
         "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Once the first checkpoint is on disk and training goes on, rank 1 is killed.
        _wait_for(lambda: list(killed.glob("*/step-10.pt")), what="the first checkpoint")
        (pid_file,) = killed.glob("*/pid-rank1-restart0")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    job_id = killed.glob("*/final.pt").__next__().parent.name
    assert not list(killed.glob("*/step-40.pt.partial"))

    # The same weights as the run nobody interrupted.
    resumed, reference = _final_weights(killed), _final_weights(whole)
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name

    # The ranks saw the restart count, and attempt 2 resumed from a checkpoint.
    assert {p.name for p in killed.glob("*/pid-*")} == {
        "pid-rank0-restart0", "pid-rank1-restart0", "pid-rank0-restart1", "pid-rank1-restart1",
    }  # fmt: skip
    second = run_cli("logs", job_id, "--attempt", "2", store=store).stdout
    starts = [line for line in second.splitlines() if "starting at step" in line]
    assert len(starts) == 2 and all("restart 1, starting at step" in s for s in starts)
    assert all(int(s.rsplit(" ", 1)[1]) >= 10 for s in starts)  # not from the beginning
    first = run_cli("logs", job_id, "--attempt", "1", store=store).stdout
    assert "restart 0, starting at step 0" in first and "restart 1" not in first

    # The first attempt's root cause is kept, and every front says which attempt ran.
    status = store.get(job_id).status()
    (attempt,) = status["attempts"]
    assert attempt["root_cause"]["label"] == "rank 1"
    assert attempt["root_cause"]["signal"] == "SIGKILL"
    assert (status["state"], status["attempt"], status["attempts_allowed"]) == ("succeeded", 2, 3)
    assert "\u2500\u2500 attempt 2 of 3 \u2500\u2500" in err
    assert "attempt 1 (" in err and "rank 1 on local1 (127.0.0.1) was killed by SIGKILL" in err
    inspected = run_cli("inspect", job_id, store=store, env={**os.environ, "COLUMNS": "200"})
    assert "Attempts" in inspected.stdout and "1 of 3" in inspected.stdout
    assert "2 of 3" in inspected.stdout and "SIGKILL" in inspected.stdout
    assert job_processes(job_id) == []


# -- exhausted, cancelled, followed ---------------------------------------------------------


@pytest.mark.slow
def test_restarts_exhausted_fail_naming_every_attempts_cause(store, tmp_path):
    done = run_cli("run", str(_flaky(tmp_path, fail=9, restarts=2)), store=store, timeout=120)
    assert done.returncode == 1
    (record,) = store.jobs()
    status = record.status()
    assert (status["state"], status["attempt"], len(status["attempts"])) == ("failed", 3, 2)
    # The last attempt's root cause in full, then each earlier one's, one line each.
    assert "Root cause: rank 1 on local1 (127.0.0.1) exited with code 3: rank 1 gives up on " \
        "attempt 2" in done.stderr  # fmt: skip
    assert "It ran 3 times; before this one:" in done.stderr
    for number in (1, 2):
        assert (
            f"  attempt {number} (" in done.stderr
            and f"exited with code 3: rank 1 gives up on attempt {number - 1}" in done.stderr
        )
    # Each attempt's lines apart; the ranks of attempt K saw K-1 in both variables.
    for number in (1, 2, 3):
        lines = run_cli("logs", record.job_id, "--attempt", str(number), store=store).stdout
        said = {line.split(" port ")[0] for line in lines.splitlines() if " port " in line}
        assert said == {f"[rank-0] attempt {number - 1} {number - 1}",
                        f"[rank-1] attempt {number - 1} {number - 1}"}, lines  # fmt: skip
    # plan.json is the last attempt's: the port its ranks were given.
    last = run_cli("logs", record.job_id, "--attempt", "3", "--rank", "0", store=store).stdout
    assert f"port {record.plan()['master_port']}" in last
    wrong = run_cli("logs", record.job_id, "--attempt", "4", store=store)
    assert wrong.returncode == 2
    assert wrong.stderr == f"error: job {record.job_id} has no attempt 4 (it ran attempts 1-3)\n"
    assert job_processes(record.job_id) == []


@pytest.mark.slow
def test_attach_follows_a_detached_job_through_its_restart(store, tmp_path):
    gate = tmp_path / "go"  # the first attempt fails once `attach` follows it, not before
    spec = _flaky(tmp_path, fail=1, restarts=1, delay=1, gate=gate)
    done = run_cli("run", str(spec), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    attach = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "attach", job_id, "--store", str(store.root)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = attach.stderr.readline()
        assert "following it" in first, first
        gate.touch()
        out, err = attach.communicate(timeout=60)
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait()
    followed = subprocess.CompletedProcess(attach.args, attach.returncode, out, first + err)
    assert followed.returncode == 0, followed.stderr
    assert "\u2500\u2500 attempt 2 of 2 \u2500\u2500" in followed.stderr
    assert "It ran 2 times; before this one:" in followed.stderr
    assert "[rank 1] attempt 1 1 port" in followed.stdout
    assert "\u2500\u2500 attempt" not in followed.stdout  # the store's marker is not a line
    # Attached afterwards: the earlier attempts are said first.
    late = run_cli("attach", job_id, store=store, timeout=60)
    assert "attempt 2; earlier:\n  attempt 1 (" in late.stderr


@pytest.mark.slow
def test_a_cancel_between_attempts_ends_the_job_without_another(store, tmp_path):
    spec = _flaky(tmp_path, fail=9, restarts=3, delay=60)
    done = run_cli("run", str(spec), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    record = store.get(job_id)
    supervisor = record.status()["owner_pid"]
    _wait_for(lambda: record.status()["state"] == "restarting", what="the restart")
    status = record.status()
    assert status["message"] == "attempt 1 failed; attempt 2 of 4 starts in 60 s"
    listed = json.loads(run_cli("jobs", "--json", store=store).stdout)
    assert listed[0]["state"] == "restarting"
    cancelled = run_cli("cancel", job_id, "--wait", "15", store=store)
    assert cancelled.returncode == 0 and cancelled.stderr.strip() == f"job {job_id}: cancelled"
    status = record.status()
    assert (status["attempt"], len(status["attempts"])) == (2, 1)
    assert status["message"] == "cancelled from the command line"
    assert wait_until_ended(record, 5) == "cancelled"
    assert status["attempt_ran"] is False
    _wait_for(lambda: not os.path.exists(f"/proc/{supervisor}"), 15, "the supervisor's end")
    assert job_processes(job_id) == []
    attached = run_cli("attach", job_id, store=store, timeout=60)  # the outcome, as stored
    assert "It ran once (attempt 2 did not start):" in attached.stderr, attached.stderr
    assert "It ran 2 times" not in attached.stderr


@pytest.mark.slow
def test_the_live_view_says_which_attempt_runs_and_why_the_earlier_ended(kernel_env):
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --nodes 2 --max-restarts 2 --restart-delay 0\n"
        "import os, sys\n"
        "if os.environ['RANK'] == '1' and os.environ['DISTRUN_RESTART_COUNT'] == '0':\n"
        "    sys.exit('rank 1 fails once')\n"
        "print('done on attempt', os.environ['DISTRUN_RESTART_COUNT'])\n",
        "from jupyter_dist.widgets.live import LiveView\nv = LiveView.last\n"
        "print(v.state, v.attempt, v.attempts, sep='|')",
    )
    text = nb.cells[2].outputs[0].data["text/plain"]
    assert ": succeeded (full logs: " in text
    assert "attempt 2 of 3; earlier: attempt 1 (" in text
    state, attempt, earlier = nb.cells[3].outputs[0].text.strip().split("|")
    assert (state, attempt) == ("succeeded", "attempt 2 of 3")
    assert "rank 1 on local1 (127.0.0.1) exited with code 1: rank 1 fails once" in earlier


# -- what restarts cannot keep ---------------------------------------------------------------


def test_restarts_are_refused_where_a_new_attempt_would_lose_what_the_job_serves(store):
    session = parse_spec("script: ''\nlimits: {max_restarts: 1}\n")
    with pytest.raises(SpecError, match="does not apply to a warm session"):
        prepare_job(session, store=store, messages=("@@", lambda *_: None))
    cluster = parse_spec("distribution: {type: dask}\nlimits: {max_restarts: 1}\n")
    with pytest.raises(SpecError, match="does not apply to an interactive Dask cluster"):
        prepare_job(cluster, store=store)
    assert store.jobs() == []  # refused before anything was recorded
    with pytest.raises(SpecError, match="max_restarts"):
        LaunchOptions(max_restarts=-1).to_spec("print(1)", base_dir=".")
    spec = LaunchOptions(max_restarts=2, restart_delay=7).to_spec("print(1)", base_dir=".")
    assert (spec.max_restarts, spec.restart_delay) == (2, 7)


def test_every_process_of_every_type_gets_the_restart_count():
    from jupyter_dist.nodes import Node
    from jupyter_dist.plan import plan, port_requests

    nodes = [Node(f"n{i}", f"10.0.0.{i}", "local", "python", "/w") for i in range(2)]
    for dist in ("pytorch", "tensorflow", "mpi", "dask"):
        spec = parse_spec(
            f"command: x\nresources: {{instance_count: 2}}\ndistribution: {{type: {dist}}}\n"
        )
        ports = {r.key: 2000 + i for i, r in enumerate(port_requests(spec, nodes))}
        for count in (0, 3):
            planned = plan(spec, nodes, "j", ports, restart_count=count)
            for proc in planned.processes:
                assert proc.env["DISTRUN_RESTART_COUNT"] == str(count), (dist, proc.name)
                assert proc.env["TORCHELASTIC_RESTART_COUNT"] == str(count)


# -- a lost node ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_lost_ssh_node_is_replaced_by_a_spare_where_one_may_and_can(store, tmp_path):
    """node1's links drop and its sshd stops: the attempt fails as a lost node, and the
    next one runs on node0 and the spare node2, in node1's place (its node rank). A job
    that names its nodes gets no spare, nor one whose spares are all down: each fails
    saying why."""
    import netns
    import sshnodes

    from jupyter_dist.run.launch import launch

    cluster = sshnodes.start(3, tmp_path / "nodes", tag=netns.tag(second=True))
    command = (
        "echo on $(hostname) as node $DISTRUN_NODE_RANK attempt $DISTRUN_RESTART_COUNT; "
        "sleep $([ $DISTRUN_RESTART_COUNT = 0 ] && echo 60 || echo 0.5)"
    )

    def run_losing(node_index: int, count: int, names: list[str] | None = None):
        """The job on `count` nodes (or the named ones), once it runs on the node of
        `node_index`, loses that node; its result."""
        body = (
            f"command: {json.dumps(command)}\nresources: {{instance_count: {count}}}\n"
            "distribution: {type: pytorch}\nlimits: {max_restarts: 1, restart_delay: 0}\n"
            + (f"nodes: {json.dumps(names)}\n" if names else "")
        )
        inventory = cluster.load_inventory(tmp_path)
        job = launch(parse_spec(body), store=store, inventory=inventory, grace_period=2)
        node = cluster.nodes[node_index]
        _wait_for(lambda: set(cluster.pids(node)) & set(cluster.job_processes(job.job_id)),
                  what=f"the ranks on {node.name}")  # fmt: skip
        cluster.lose(node)
        result = job.wait(120)
        assert result is not None
        _wait_for(lambda: not cluster.job_processes(job.job_id), 15, "the job's end")
        return job, result

    try:
        job, result = run_losing(1, 2)
        assert result.state == "succeeded", result.describe()
        assert result.replaced == ["node2 in place of node1"]
        (first,) = result.attempts
        assert first.root_cause.node == "node1"
        record = store.get(job.job_id)
        second = [text for _, key, _, text in record.read_logs(record.log_keys(), attempt=2)]
        assert sorted(second) == ["on node0 as node 0 attempt 1", "on node2 as node 1 attempt 1"]
        assert [n["name"] for n in record.plan()["nodes"]] == ["node0", "node2"]
        assert "It ran 2 times" in result.describe()
        assert "node2 in place of node1" in result.describe()

        # Named nodes: node2 is lost, and no spare may take its place.
        _, result = run_losing(2, 2, ["node0", "node2"])
        assert result.state == "failed" and result.replaced == []
        assert result.message.startswith(
            "attempt 2 could not start: a node cannot be reached (node2: "
        ) and result.message.endswith(
            "and the job names its nodes, so no spare may take its place; bring it back, or "
            "ask for nodes by count"
        )

        # By count, but every spare is down too.
        _, result = run_losing(0, 1)
        assert result.state == "failed"
        assert result.message.startswith("attempt 2 could not start: a node cannot be reached")
        assert result.message.endswith(
            "and no healthy spare is left in the inventory to take its place (tried: node1, node2)"
        )
    finally:
        leftovers = sshnodes.stop(cluster)
    assert leftovers == []
