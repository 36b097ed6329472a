"""Horovod jobs for real: horovodrun with its Gloo and its MPI controller, on local nodes and
across the sshd nodes; the seed's own shape (a command that runs horovodrun itself); a
failing rank; a cancel; a notebook cell. Horovod is built by scripts/build-horovod.sh
(tests' set-up: scripts/setup.sh --test)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace

import pytest
from helpers import EXAMPLES, execute_notebook, job_processes, not_private, run_cli, stream_text

from jupyter_dist.backends.ssh import horovodrun_ssh, ssh_config
from jupyter_dist.run.launch import launch, make_plan, run
from jupyter_dist.spec import parse_spec

# horovodrun's controllers: mpi_args go to horovodrun.
CONTROLLERS = {"gloo": "[--gloo]", "mpi": "[]"}


def _spec(controller: str, command: str = "python horovod_train.py", launcher="horovodrun"):
    return parse_spec(
        f"code: {EXAMPLES / 'src'}\ncommand: {json.dumps(command)}\n"
        "resources: {instance_count: 2}\n"
        f"distribution: {{type: mpi, launcher: {launcher}, process_count_per_instance: 2, "
        f"mpi_args: {CONTROLLERS[controller]}}}\n"
    )


def _reports_by_log(store, job_id: str) -> dict[int, dict]:
    """Each rank's RESULT, read from that rank's own log: the line was attributed to it."""
    record = store.get(job_id)
    found = {}
    for rank in range(4):
        lines = [e.text for e in record.iter_log(f"rank-{rank}", "stdout")]
        (line,) = [text for text in lines if text.startswith("RESULT ")]
        found[rank] = json.loads(line.removeprefix("RESULT "))
    return found


def _check_training(reports: dict[int, dict], hosts: list[str] | None) -> None:
    for rank, report in reports.items():
        assert report["rank"] == rank and report["size"] == 4
        assert report["allreduce"] == 10.0  # 1 + 2 + 3 + 4, summed by Horovod
        if hosts is None:  # local nodes: one host, four slots
            assert (report["local_rank"], report["local_size"]) == (rank, 4)
        else:
            assert report["host"] == hosts[rank // 2]
            assert (report["local_rank"], report["local_size"]) == (rank % 2, 2)
    # The gradients were averaged: every rank ends with the same weights from its own data.
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


def test_the_example_runs_as_it_is_on_local_nodes(store):
    """examples/horovod_train.yml: horovodrun's default controller here is MPI."""
    done = run_cli("run", str(EXAMPLES / "horovod_train.yml"), store=store, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " 4 ranks in 1 horovodrun process on 2 nodes (local)" in done.stderr
    (record,) = store.jobs()
    _check_training(_reports_by_log(store, record.job_id), hosts=None)
    for rank in range(4):  # shown live under the rank's own label
        assert f"[rank {rank}] RESULT " in done.stdout
    (proc,) = record.plan()["processes"]
    assert proc["argv"][:4] == ["horovodrun", "-np", "4", "--hostfile"]
    assert job_processes(record.job_id) == []
    assert not_private(store.root) == []


def test_gloo_on_local_nodes(store):
    result = run(_spec("gloo"), store=store)
    assert result.ok, result.describe()
    _check_training(_reports_by_log(store, result.job_id), hosts=None)
    assert job_processes(result.job_id) == []


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_horovod_job_across_two_ssh_nodes(controller, request, store, tmp_path):
    """The MPI controller's on nodes whose /etc/hosts are Debian's (each hostname on
    127.0.1.1): what the refusal of Gloo's there advises."""
    fixture = "debian_ssh_nodes" if controller == "mpi" else "ssh_nodes"
    ssh_nodes = request.getfixturevalue(fixture)
    result = run(_spec(controller), store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    _check_training(_reports_by_log(store, result.job_id), hosts=["node0", "node1"])
    assert ssh_nodes.job_processes(result.job_id) == []


def test_horovods_gloo_controller_is_refused_where_hostnames_are_on_loopback(
    debian_ssh_nodes, store, tmp_path
):
    """The nodes' /etc/hosts are Debian's (each hostname on 127.0.1.1): Horovod's Gloo
    controller would set up its process sets there whatever HOROVOD_GLOO_IFACE says, and
    its ranks failed to connect (after minutes). The job is refused before it starts, in one
    line naming the nodes and the fix (the fixture checks nothing is left on them). Its MPI
    controller runs there (test_a_horovod_job_across_two_ssh_nodes)."""
    nodes_file = str(debian_ssh_nodes.write_inventory(tmp_path / "nodes.yml"))
    spec = tmp_path / "job.yml"
    spec.write_text(_spec("gloo").to_yaml())
    done = run_cli("run", str(spec), "--nodes-file", nodes_file, store=store, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: node0, node1: Horovod's Gloo controller would send the other nodes' ranks to "
        "127.0.1.1, the loopback address their hostnames resolve to (its process sets use the "
        "hostname's address, whatever HOROVOD_GLOO_IFACE says); use Horovod's MPI controller "
        "(leave out --gloo), or map the hostname to the node's own address in /etc/hosts\n"
    )


def test_horovods_gloo_loopback_failure_gets_its_own_hint():
    """Where the check was off: the lines Horovod's gloo printed on such nodes get a hint
    for Horovod (its MPI controller), not torch's GLOO_SOCKET_IFNAME."""
    from jupyter_dist.diagnose.hints import hint_for
    from jupyter_dist.events import RootCause

    for line in ("connect [127.0.1.1]:6058: Connection refused",
                 "Connect timeout [127.0.1.1]:64949"):  # fmt: skip
        cause = RootCause(
            process="rank-0", label="rank 0", role="rank", node="node0", host="10.0.0.2",
            rank=0, exit_code=134, signal=None, stderr_tail=[
                "terminate called after throwing an instance of 'gloo::IoException'",
                f"  what():  [/tmp/horovod-0.28.1/third_party/gloo/gloo/transport/tcp/"
                f"pair.cc:799] {line}",
                "Aborted",
            ],
        )  # fmt: skip
        hint = hint_for(cause) or ""
        assert hint.startswith(
            "Hint: rank 0 was sent to a loopback address to reach another rank "
            f'("{line.split("]")[0]}]"): Horovod\'s Gloo controller'
        ), hint
        assert "leave out --gloo" in hint and "GLOO_SOCKET_IFNAME" not in hint


def test_the_seeds_shape_runs_its_own_horovodrun_once_on_node_0(ssh_nodes, store, tmp_path):
    """Azure ML's Horovod example: the command is horovodrun itself, with the hostfile."""
    spec = _spec(
        "mpi",
        command="horovodrun -np 4 --hostfile $AZUREML_MPI_HOSTFILE python horovod_train.py",
        launcher="mpirun",
    )
    inventory = ssh_nodes.load_inventory(tmp_path)
    plan, _, backend = make_plan(spec, inventory=inventory, store=store)
    backend.release()
    (proc,) = plan.processes
    assert (proc.name, proc.node, proc.ranks) == ("horovodrun", "node0", (0, 1, 2, 3))
    result = run(spec, store=store, inventory=inventory)
    assert result.ok, result.describe()
    _check_training(_reports_by_log(store, result.job_id), hosts=["node0", "node1"])
    assert ssh_nodes.job_processes(result.job_id) == []


def test_a_failing_horovod_rank_is_the_root_cause(store):
    """Rank 2 raises; its peers die of "Horovod has been shut down" (collateral), often
    before rank 2's own exit is seen, and horovodrun --gloo blames whichever ended first.
    (Under its MPI controller, horovodrun's mpirun reports as our mpirun does: test_mpi.)"""
    result = run(_spec("gloo", "FAIL_RANK=2 python horovod_train.py"), store=store)
    assert result.state == "failed"
    cause = result.root_cause
    assert cause.rank == 2, cause.format()
    assert "RuntimeError: rank 2 fails on purpose" in cause.stderr_tail
    assert "rank 2" not in cause.collateral
    assert job_processes(result.job_id) == []


def test_cancelling_a_horovod_job_leaves_nothing_on_any_node(ssh_nodes, store, tmp_path):
    """With Gloo, horovodrun starts node 1's ranks over ssh itself, outside any agent: they
    carry the job's id, and the sweep finds them. (Its MPI controller's ranks run under
    orted, as our mpirun's do: test_ssh.)"""
    command = (
        "python -c \"import time, horovod.torch as hvd; hvd.init(); print('up', hvd.rank()); "
        'time.sleep(300)"'
    )
    inventory = ssh_nodes.load_inventory(tmp_path)
    job = launch(_spec("gloo", command), store=store, inventory=inventory, grace_period=3)
    record = store.get(job.job_id)
    deadline = time.monotonic() + 60
    up = []
    while len(up) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
        up = [
            key for key in record.log_keys()
            if any(e.text.startswith("up ") for e in record.iter_log(key, "stdout"))
        ]  # fmt: skip
    assert len(up) == 4, record.log_keys()
    assert len(ssh_nodes.job_processes(job.job_id)) >= 4
    job.cancel()
    result = job.wait(30)
    assert result is not None and result.state == "cancelled"
    assert ssh_nodes.job_processes(job.job_id) == []


def test_horovodruns_ssh_keeps_the_inventorys_host_key_policy(ssh_nodes, tmp_path):
    """horovodrun runs `ssh -o StrictHostKeyChecking=no HOST ...`: the job's `ssh` drops that
    option, so a host whose key the inventory does not know is refused."""
    from horovod.runner.util.remote import get_ssh_command

    node1 = ssh_nodes.load_inventory(tmp_path).nodes[1]
    folder = tmp_path / "bin"
    folder.mkdir()
    for known_hosts, expected in [(tmp_path / "empty", 255), (None, 0)]:
        if known_hosts is not None:
            known_hosts.write_text("")
            node = replace(node1, access=replace(node1.access, known_hosts=str(known_hosts)))
        else:
            node = node1  # the inventory's own known_hosts: trusted
        config = tmp_path / "ssh_config"
        config.write_text(ssh_config([node]))
        program = folder / "ssh"
        program.write_text(horovodrun_ssh(str(config), str(folder)))
        program.chmod(0o700)
        done = subprocess.run(
            get_ssh_command("echo reached", node.host), shell=True, capture_output=True,
            text=True, timeout=30, env={"PATH": f"{folder}:/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == expected, done.stderr
        if expected:
            assert "Host key verification failed" in done.stderr
        else:
            assert done.stdout == "reached\n"


def test_a_horovod_cell(kernel_env):
    nb = execute_notebook(
        "%%distrun --type mpi --launcher horovodrun --nodes 2 --procs-per-node 2\n"
        "import torch, horovod.torch as hvd\n"
        "hvd.init()\n"
        "total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()\n"
        "print('rank', hvd.rank(), 'of', hvd.size(), 'sum', total)\n"
    )
    text = stream_text(nb.cells[1])
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} of 4 sum 10.0" in text
