"""Jobs on real sshd nodes (network namespaces, own IPs and hostnames) over paramiko."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml
from helpers import (
    EXAMPLES,
    LONG_JOB,
    SAVER,
    not_private,
    result_reports,
    run_cli,
    run_command_line,
    start_cli_run,
)

from jupyter_dist.backends.ssh import CONNECTIONS, Connections, SshProcess, sync_folder
from jupyter_dist.errors import NodeError
from jupyter_dist.nodes import load_inventory
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.run.launch import launch, run
from jupyter_dist.spec import parse_spec

SCRIPTS = Path(__file__).parent / "scripts"
GLOO = "GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: '1'"


def _spec(body: str, base_dir: Path | None = None):
    return parse_spec(textwrap.dedent(body), base_dir=base_dir)


def _launch_two_by_two(ssh_nodes, store, tmp_path, command: str):
    """`command` as 2 nodes x 2 ranks on the sshd nodes (grace 3 s), returned once every
    rank is up (at least its agent, its shell and one more process each) or after 30 s."""
    spec = parse_spec(
        f"command: {json.dumps(command)}\nresources: {{instance_count: 2}}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    job = launch(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path), grace_period=3)
    deadline = time.monotonic() + 30
    while len(ssh_nodes.job_processes(job.job_id)) < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    return job


def test_without_the_network_check_a_loopback_hostname_fails_with_a_hint(
    debian_ssh_nodes, store, tmp_path
):
    """What the network check saves a user from: with it off, gloo on nodes whose hostname
    is on 127.0.1.1 sends the ranks to a loopback address, and the root cause's hint says
    why and what to do; `jupyter distrun plan` (the check on) says what it will set."""
    ssh_nodes = debian_ssh_nodes
    code = tmp_path / "code"  # beside the nodes' own folders, not above them
    code.mkdir()
    (code / "meet.py").write_text(
        "import datetime, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=20))\n"
        "dist.all_reduce(torch.ones(1))\nprint('met')\n"
    )
    body = (
        f"code: {code}\ncommand: python meet.py\n"
        "environment_variables: {OMP_NUM_THREADS: '1'}\nresources: {instance_count: 2}\n"
    )
    spec_file = tmp_path / "job.yml"
    spec_file.write_text(body)
    nodes_file = str(ssh_nodes.write_inventory(tmp_path / "nodes.yml"))
    planned = run_cli("plan", str(spec_file), "--nodes-file", nodes_file, store=store)
    assert planned.returncode == 0, planned.stderr
    assert (
        "Check: node0, node1: GLOO_SOCKET_IFNAME=eth0, the interface that reaches the master "
        f"{ssh_nodes.nodes[0].host}: their hostnames resolve to 127.0.1.1"
    ) in planned.stdout
    result = run(_spec(body + "network_check: false\n"), store=store,
                 inventory=ssh_nodes.load_inventory(tmp_path))  # fmt: skip
    assert not result.ok
    hint = result.root_cause.hint or ""
    assert re.match(
        r"Hint: rank \d was sent to a loopback address to reach another rank "
        r'\("remote=\[127\.0\.1\.1\]"\)',
        hint,
    ), result.describe()
    assert "GLOO_SOCKET_IFNAME" in hint


@pytest.mark.parametrize("launcher", ["per_process", "torchrun"])
def test_ddp_across_two_ssh_nodes(launcher, debian_ssh_nodes, store, tmp_path):
    """The nodes' /etc/hosts are Debian's (each one's hostname on 127.0.1.1), and the job
    names no interface: each node's ranks get the one that reaches the master, said with
    the plan, and gloo's ranks meet."""
    ssh_nodes = debian_ssh_nodes
    spec = _spec(f"""\
        code: {EXAMPLES / "src"}
        command: python ddp_train.py --epochs 2
        environment_variables: {{OMP_NUM_THREADS: '1'}}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2, launcher: {launcher}}}
    """)
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    plan = LaunchPlan.from_dict(store.get(result.job_id).plan())
    assert {p.env.get("GLOO_SOCKET_IFNAME") for p in plan.processes} == {"eth0"}
    assert plan.network_notes == [
        f"node0, node1: GLOO_SOCKET_IFNAME=eth0, the interface that reaches the master "
        f"{ssh_nodes.nodes[0].host}: their hostnames resolve to 127.0.1.1, which gloo would "
        "advertise to the other nodes"
    ]
    # Said once in the header too: the job's summary, which the views print first.
    assert plan.network_choice == (
        "gloo over eth0 on node0, node1 (their hostnames resolve to 127.0.1.1)"
    )
    results = result_reports(store, result.job_id)
    assert sorted(results) == [0, 1, 2, 3]
    node0 = ssh_nodes.nodes[0].host
    for rank, report in results.items():
        assert report["host"] == f"node{rank // 2}"  # really on the other host
        assert report["node_rank"] == rank // 2 and report["local_rank"] == rank % 2
        assert report["env"]["MASTER_ADDR"] == node0
        assert report["allreduce"] == 10.0
    assert len({json.dumps(r["weights"]) for r in results.values()}) == 1
    assert ssh_nodes.job_processes(result.job_id) == []


def test_mpi_across_two_ssh_nodes(ssh_nodes, store, tmp_path):
    spec = _spec(f"""\
        code: {EXAMPLES / "src"}
        command: python mpi_allreduce.py
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, process_count_per_instance: 2}}
    """)
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    results = result_reports(store, result.job_id)
    hosts = [n.host for n in ssh_nodes.nodes]
    for rank, report in results.items():
        assert report["host"] == f"node{rank // 2}"
        assert (report["size"], report["local_rank"], report["local_size"]) == (4, rank % 2, 2)
        assert report["allreduce"] == 10
        assert report["master"][0] == hosts[0]  # AZ_BATCH_MASTER_NODE, as on Azure ML
        assert report["hostfile"] == [f"{hosts[0]} slots=2", f"{hosts[1]} slots=2"]
    assert sorted(results) == [0, 1, 2, 3]


def test_mpi_ranks_on_both_nodes_get_the_whole_grace_period(ssh_nodes, store, tmp_path):
    """Node 0's ranks are mpirun's children: its agent gives them the SIGTERM; node 1's
    were started by Open MPI's daemon there, outside any agent: the launcher's side
    signals them there (`agent.py --term`). Every rank saves in its 2 s, once, and mpirun's
    own second (SIGCONT, a second, SIGTERM, a second, SIGKILL) never cuts one short."""
    (tmp_path / "saver.py").write_text(SAVER)
    spec = _spec(f"""\
        command: python {tmp_path / "saver.py"} {tmp_path}
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, process_count_per_instance: 2}}
    """)
    job = launch(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path), grace_period=6)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{rank}").exists() for rank in range(4)):
        assert time.monotonic() < deadline, "the ranks never said they were ready"
        time.sleep(0.1)
    job.cancel()
    result = job.wait(60)
    assert result is not None and result.state == "cancelled", result.describe()
    for rank in range(4):
        assert (tmp_path / f"rank-{rank}.txt").read_text() == "term\nsaved\n", rank
    assert ssh_nodes.job_processes(job.job_id) == []


def test_more_processes_on_a_node_than_one_connection_has_sessions(ssh_nodes, store, tmp_path):
    """The test nodes keep OpenSSH's default of 10 sessions per connection; 12 processes run
    on one node at once (each holds a session until it ends), so a second connection opens."""
    spec = _spec("""\
        command: sleep 3 && echo rank $RANK of $WORLD_SIZE
        resources: {instance_count: 1}
        distribution: {type: pytorch, process_count_per_instance: 12}
    """)
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    record = store.get(result.job_id)
    for rank in range(12):
        assert [line.text for line in record.iter_log(f"rank-{rank}", "stdout")] == [
            f"rank {rank} of 12"
        ]
    assert ssh_nodes.job_processes(result.job_id) == []


def test_nothing_is_sent_on_a_session_once_sshd_said_it_ended(ssh_nodes, tmp_path):
    """sshd drops a whole connection, with every session on it, when a message comes for a
    channel it has freed; paramiko sends an EOF or data outside the channel's lock, so one
    sent as sshd closes the channel can arrive after our side's CLOSE. That is how a kept
    connection closed under load (issue 28): the EOF that followed each exit status. A
    process sends nothing once its session said it ended: no stop, no EOF."""
    node = load_inventory(ssh_nodes.write_inventory(tmp_path / "nodes.yml")).nodes[0]
    pool = Connections()
    try:
        # The hazard: one late EOF, and the other session loses its exit status.
        keeper = pool.open_session(node)
        keeper.exec_command("echo $$; exec sleep 30")
        sleeper = keeper.makefile().readline().strip()  # its pid: the drop leaves it running
        ended = pool.open_session(node)
        ended.exec_command("true")
        assert ended.recv_exit_status() == 0
        deadline = time.monotonic() + 10
        while not ended.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # our side's CLOSE has reached sshd: the channel is freed there
        late = paramiko.Message()
        late.add_byte(paramiko.common.cMSG_CHANNEL_EOF)
        late.add_int(ended.remote_chanid)
        keeper.get_transport()._send_user_message(late)
        assert keeper.recv_exit_status() == -1  # the connection went, and its status with it
        assert not keeper.get_transport().is_active()
        assert pool.run(node, ["kill", sleeper])[0] == 0  # on a new connection
        # A process whose session ended: a stop that comes then, and the EOF that wait()
        # gives its stdin, send nothing.
        channel = pool.open_session(node)
        channel.exec_command("true")
        process = SshProcess(channel, "true on node0")
        sent = []
        for method in ("sendall", "shutdown_write"):
            setattr(channel, method, lambda *args, name=method: sent.append(name))
        assert channel.recv_exit_status() == 0
        process.terminate()
        assert process.wait() == 0
        assert sent == []
    finally:
        pool.close_all()


def test_a_failing_rank_on_node_1_stops_node_0(ssh_nodes, store, tmp_path):
    spec = _spec(f"""\
        command: python {SCRIPTS / "ddp_fail.py"}
        environment_variables: {{{GLOO}}}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
    """)
    started = time.monotonic()
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path), grace_period=3)
    assert time.monotonic() - started < 90
    assert result.state == "failed"
    cause = result.root_cause
    assert (cause.rank, cause.node, cause.host) == (2, "node1", ssh_nodes.nodes[1].host)
    assert cause.stderr_tail[-1].endswith("RuntimeError: rank 2 lost its data shard")
    assert sorted(cause.stopped + cause.collateral) == ["rank 0", "rank 1", "rank 3"]
    assert ssh_nodes.job_processes(result.job_id) == []


def test_cancel_stops_every_remote_process(ssh_nodes, store, tmp_path):
    job = _launch_two_by_two(
        ssh_nodes, store, tmp_path, "setsid sleep 300 & echo started; sleep 300"
    )
    assert len(ssh_nodes.job_processes(job.job_id)) >= 12  # agents, shells, sleeps
    job.cancel()
    result = job.wait(30)
    assert result is not None and result.state == "cancelled"
    assert ssh_nodes.job_processes(job.job_id) == []


def test_killing_the_launcher_stops_remote_ranks(ssh_nodes, store, tmp_path):
    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    job_file = tmp_path / "job.yml"
    job_file.write_text(LONG_JOB)
    proc, job_id = start_cli_run(job_file, store, "--nodes-file", str(inventory))
    assert len(ssh_nodes.job_processes(job_id)) >= 8
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while ssh_nodes.job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ssh_nodes.job_processes(job_id) == []


def test_hostile_environment_values_arrive_byte_for_byte(ssh_nodes, store, tmp_path):
    marker = tmp_path / "pwned"
    hostile = f'$(touch {marker}); echo "a\'b" `touch {marker}` ; \\n \\\\ $HOME'
    spec = parse_spec(
        yaml.safe_dump(
            {
                "command": "python -c \"import os; print(repr(os.environ['HOSTILE']))\"",
                "environment_variables": {"HOSTILE": hostile},
                "resources": {"instance_count": 2},
            }
        )
    )
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    record = store.get(result.job_id)
    for rank in (0, 1):
        (line,) = [entry.text for entry in record.iter_log(f"rank-{rank}", "stdout")]
        assert line == repr(hostile)
    assert not marker.exists()
    for node in ssh_nodes.nodes:  # the job's folder there is its owner's alone, all of it
        assert (node.workdir / result.job_id).stat().st_mode & 0o777 == 0o700
        assert (node.workdir / result.job_id / "pyhook" / "sitecustomize.py").exists()
        assert not_private(node.workdir / result.job_id) == []


def test_code_is_shipped_once_and_synced_by_change(ssh_nodes, tmp_path, monkeypatch):
    """Only what changed travels; a file removed goes from the node too, also one removed
    between the folder's listing and its copy (a folder that changes while it ships)."""
    from jupyter_dist.backends import ssh

    node = ssh_nodes.load_inventory(tmp_path).nodes[0]
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    for i in range(5):
        (code / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    (code / "train.py").write_text("print('v1')\n")
    remote = str(ssh_nodes.nodes[0].workdir / "sync-test")
    with CONNECTIONS.open_sftp(node) as sftp:
        assert sync_folder(sftp, code, remote) == (6, 0)
        assert sync_folder(sftp, code, remote) == (0, 6)  # nothing changed: nothing sent
        (code / "train.py").write_text("print('version 2')\n")
        (code / "pkg" / "m0.py").unlink()
        assert sync_folder(sftp, code, remote) == (1, 4)
        listed = ssh.read_code_folder(code, ignore_files=False)
        (code / "pkg" / "m1.py").unlink()
        monkeypatch.setattr(ssh, "read_code_folder", lambda *_args, **_kwargs: listed)
        assert sync_folder(sftp, code, remote) == (0, 4)
    assert (Path(remote) / "train.py").read_text() == "print('version 2')\n"
    assert not (Path(remote) / "pkg" / "m0.py").exists()
    assert not (Path(remote) / "pkg" / "m1.py").exists()
    assert not [p for p in Path(remote).rglob("*") if p.name.endswith(".tmp")]


def test_a_fifo_in_the_code_folder_is_skipped_and_named_and_sigterm_while_starting_cancels(
    ssh_nodes, store, tmp_path
):
    """Copying a FIFO would block for ever: only regular files travel, and the plan names
    what stays behind. SIGTERM while the nodes get their copy cancels the job, as the CLI
    says, with the reason stored."""
    import os
    import signal

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained')\n")
    os.mkfifo(code / "pipe")
    spec_file = tmp_path / "job.yml"
    spec_file.write_text(
        f"code: {code}\ncommand: python train.py\nresources: {{instance_count: 2}}\n"
    )
    nodes = str(ssh_nodes.write_inventory(tmp_path / "nodes.yml"))
    planned = run_cli("plan", str(spec_file), "--nodes-file", nodes, store=store, timeout=60)
    assert (
        f"Check: the nodes' copies of {code} lack pipe (a FIFO), since only regular files travel"
    ) in " ".join(planned.stdout.split()), planned.stdout + planned.stderr
    done = run_cli("run", str(spec_file), "--nodes-file", nodes, store=store, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("trained") == 2
    for n in range(300):  # the next copy takes a while: a signal lands in it
        (code / f"m{n}.py").write_text(f"x = {n}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec_file), "--nodes-file", nodes,
         "--store", str(store.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr.readline().startswith("job ")  # planned: the copy starts now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "cancelled: every process was stopped" in err, err
    latest = max(store.jobs(), key=lambda job: job.job_id)
    status = latest.status()
    assert status["state"] == "cancelled" and status["message"].startswith("interrupted"), status
    assert ssh_nodes.job_processes(latest.job_id) == []


def test_unreachable_node_fails_before_anything_starts(ssh_nodes, store, tmp_path):
    good, bad = ssh_nodes.inventory_entries()
    bad["port"] = 9  # nothing listens there
    path = tmp_path / "nodes.yml"
    path.write_text(yaml.safe_dump({"nodes": [good, bad]}))
    spec = _spec("command: sleep 60\nresources: {instance_count: 2}")
    with pytest.raises(NodeError, match=r"^node node1 \(.*:9\): connection refused"):
        launch(spec, store=store, inventory=load_inventory(path))
    assert store.jobs() == []  # preflight failed: no job, nothing started on node0
    job_file = tmp_path / "job.yml"
    job_file.write_text("command: sleep 60\nresources: {instance_count: 2}\n")
    result = run_cli("run", str(job_file), "--nodes-file", str(path), store=store)
    assert result.returncode == 2
    assert result.stderr.startswith("error: node node1 (") and result.stderr.count("\n") == 1
    assert "connection refused (is sshd running?)" in result.stderr


@contextlib.contextmanager
def _listener(answer: bytes | None):
    """A TCP service on loopback that is not sshd, its port yielded: each connection gets
    `answer` and is closed, or (None) is held and told nothing until the service ends."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):  # the service ended
            while True:
                peer, _ = server.accept()
                if answer is None:
                    held.append(peer)
                else:
                    with peer:
                        peer.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        for peer in held:
            peer.close()


def _one_node(folder: Path, name: str, port: int) -> Path:
    """An inventory of one node on loopback at `port`, its host key accepted when new."""
    node = {
        "name": name,
        "host": "127.0.0.1",
        "port": port,
        "python": "python3",
        "known_hosts": str(folder / "known_hosts"),
        "host_key_policy": "accept-new",
    }
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump({"nodes": [node]}))
    return path


@pytest.mark.slow
def test_a_port_that_is_not_sshd_is_one_line(store, tmp_path, monkeypatch):
    """A web server's port, or a service that never speaks: one line naming the node and
    the port; paramiko's own traceback of the failure never reaches the terminal."""
    spec = _spec("command: hostname")
    monkeypatch.setattr("jupyter_dist.backends.ssh.CONNECT_TIMEOUT", 1.0)
    for name, answer in (("web", b"HTTP/1.1 400 Bad Request\r\n\r\n"), ("mute", None)):
        with _listener(answer) as port:
            with pytest.raises(NodeError) as caught:
                launch(spec, store=store, inventory=load_inventory(_one_node(tmp_path, name, port)))
            assert str(caught.value) == (
                f"node {name} (127.0.0.1:{port}): did not answer as an SSH server (no SSH "
                f"handshake within 1 s); is port {port} the node's sshd?"
            )
    job_file = tmp_path / "job.yml"
    job_file.write_text("command: hostname\n")
    with _listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port:
        path = _one_node(tmp_path, "web", port)
        refused = run_cli("run", str(job_file), "--nodes-file", str(path), store=store)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: node web (127.0.0.1:"), refused.stderr
    assert "did not answer as an SSH server" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr  # no traceback of paramiko's


def test_a_session_sshd_refuses_goes_to_another_connection_quietly(ssh_nodes, tmp_path):
    """sshd refuses an 11th session on a connection (MaxSessions 10) that the pool did not
    count (sshd may still count sessions that just closed): the pool opens another
    connection, and paramiko's log of the refusal stays off the terminal."""
    path = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    script = textwrap.dedent(f"""\
        from jupyter_dist.backends.ssh import Connections
        from jupyter_dist.nodes import load_inventory
        from pathlib import Path
        node = load_inventory(Path({str(path)!r})).nodes[0]
        pool = Connections()
        uncounted = [pool.get(node).get_transport().open_session() for _ in range(10)]
        print(pool.run(node, ["echo", "ran"]), len(pool._live(node)))
        pool.close_all()
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(0, 'ran\\n', '') 2\n"
    assert done.stderr == ""


def test_each_mistake_in_a_nodes_entry_is_named(ssh_nodes, store, tmp_path):
    """A key file that is missing or not a private key, a known_hosts that is a folder, a
    workdir that cannot be made, a python that is not python: each is one line naming
    the node and the thing that is wrong, and nothing starts."""
    node, _ = ssh_nodes.inventory_entries()
    not_a_key = str(ssh_nodes.key_file) + ".pub"
    (tmp_path / "folder").mkdir()
    where = f"node node0 ({node['host']}:{node['port']})"
    mistakes = [
        ("key_file", "/nonexistent/key", f"{where}: key file /nonexistent/key: No such file"),
        ("key_file", not_a_key, f"{where}: key file {not_a_key}: not a valid"),
        ("known_hosts", str(tmp_path / "folder"), f"{where}: known_hosts {tmp_path}/folder: Is a"),
        ("workdir", "/etc/passwd/x", "node node0: cannot make its workdir /etc/passwd/x: Not a"),
        ("python", "/bin/false", "node node0: checking python '/bin/false' failed: exit code 1"),
    ]
    for key, value, message in mistakes:
        path = tmp_path / "nodes.yml"
        path.write_text(yaml.safe_dump({"nodes": [{**node, key: value}]}))
        CONNECTIONS.close_all()  # a kept connection would hide the key and host checks
        with pytest.raises(NodeError) as caught:
            launch(_spec("command: hostname"), store=store, inventory=load_inventory(path))
        assert str(caught.value).startswith(message), (key, str(caught.value))
        assert "\n" not in str(caught.value)
    assert store.jobs() == []


def test_unknown_host_key_is_refused_until_trusted(ssh_nodes, store, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = ssh_nodes.write_inventory(tmp_path / "nodes.yml", known_hosts=str(known))
    CONNECTIONS.close_all()  # no kept connection may hide the check
    spec_file = tmp_path / "job.yml"
    spec_file.write_text("command: hostname\nresources: {instance_count: 2}\n")
    refused = run_cli("run", str(spec_file), "--nodes-file", str(path), store=store)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert line.startswith("error: node node0 (") and "unknown host key" in line
    assert "jupyter distrun nodes --trust node0" in line and "\n" not in line
    assert known.read_text() == ""  # refused, not silently added
    for name in ("node0", "node1"):
        trusted = run_cli("nodes", "--nodes-file", str(path), "--trust", name)
        assert trusted.returncode == 0, trusted.stderr
        assert f"trusted {name}" in trusted.stdout
    ok = run_cli("run", str(spec_file), "--nodes-file", str(path), store=store)
    assert ok.returncode == 0, ok.stderr
    assert sorted(ok.stdout.splitlines()) == ["[rank 0] node0", "[rank 1] node1"]


def test_accept_new_records_the_key_and_refuses_a_changed_one(ssh_nodes, tmp_path):
    known = tmp_path / "known_hosts"
    path = ssh_nodes.write_inventory(
        tmp_path / "nodes.yml", known_hosts=str(known), host_key_policy="accept-new"
    )
    CONNECTIONS.close_all()
    nodes = run_cli("nodes", "--nodes-file", str(path))
    assert nodes.returncode == 0, nodes.stdout + nodes.stderr
    assert ssh_nodes.nodes[0].host in known.read_text()
    # A different key recorded for node0: a changed key is always refused.
    fake = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    other = paramiko.RSAKey.generate(2048) if fake is None else fake
    known.write_text(f"{ssh_nodes.nodes[0].host} {other.get_name()} {other.get_base64()}\n")
    CONNECTIONS.close_all()
    changed = run_cli("nodes", "--nodes-file", str(path), env={**os.environ, "COLUMNS": "300"})
    assert changed.returncode == 1
    assert "host key CHANGED" in changed.stdout


def test_nodes_health_and_missing_python(ssh_nodes, tmp_path):
    path = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    ok = run_cli("nodes", "--nodes-file", str(path), env={**os.environ, "COLUMNS": "200"})
    assert ok.returncode == 0, ok.stderr
    assert "node0" in ok.stdout and "node1" in ok.stdout and ok.stdout.count(" ok ") == 2
    broken = ssh_nodes.write_inventory(tmp_path / "broken.yml", python="/nonexistent/python3")
    bad = run_cli("nodes", "--nodes-file", str(broken), env={**os.environ, "COLUMNS": "250"})
    assert bad.returncode == 1
    assert "python '/nonexistent/python3' not found" in bad.stdout


def test_a_dropped_connection_stops_that_nodes_processes(ssh_nodes, store, tmp_path):
    """Kill node1's sshd sessions (not its listener): the link is gone, so the agents there
    must stop their ranks, and the job fails instead of hanging."""
    job = _launch_two_by_two(ssh_nodes, store, tmp_path, "echo started; sleep 300")
    node1 = ssh_nodes.nodes[1]
    on_node1 = [p for p in ssh_nodes.job_processes(job.job_id) if p in ssh_nodes.pids(node1)]
    assert on_node1
    ssh_nodes.drop_sessions(node1)
    result = job.wait(60)
    assert result is not None and result.state == "failed"
    assert result.root_cause.node == "node1"
    # and says what became of the connection: here its far end went away
    assert "lost its SSH connection (EOFError" in result.root_cause.summary()
    deadline = time.monotonic() + 15
    while ssh_nodes.job_processes(job.job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ssh_nodes.job_processes(job.job_id) == []


@pytest.mark.slow
def test_loopback_fallback_nodes_run_a_job(store, tmp_path):
    """Where network namespaces are not allowed, test nodes are sshd on 127.0.0.x."""
    import sshnodes

    cluster = sshnodes.start(2, tmp_path / "loopback", use_namespaces=False)
    try:
        assert [n.host for n in cluster.nodes] == ["127.0.0.2", "127.0.0.3"]
        spec = _spec("command: echo $DISTRUN_NODE_RANK\nresources: {instance_count: 2}")
        result = run(spec, store=store, inventory=load_inventory(cluster.inventory))
        assert result.ok, result.describe()
        record = store.get(result.job_id)
        for rank in (0, 1):
            assert [e.text for e in record.iter_log(f"rank-{rank}", "stdout")] == [str(rank)]
    finally:
        CONNECTIONS.close_all()
        assert sshnodes.stop(cluster) == []


def test_the_dry_run_command_is_the_one_ssh_runs(ssh_nodes, store, tmp_path):
    """The dry run's line for an SSH node is a plain `ssh` command with the inventory's
    port, key and host-key checking; run by OpenSSH it starts the same process."""
    from jupyter_dist.run.launch import make_plan

    spec = _spec("""\
        command: echo "rank $RANK on $(hostname)"
        resources: {instance_count: 2}
    """)
    inventory = ssh_nodes.load_inventory(tmp_path)
    plan, nodes, backend = make_plan(spec, inventory=inventory, store=store, job_id="dry-1")
    backend.prepare(plan, nodes)  # the agent and the job's folder, as a real start would
    proc = plan.processes[1]
    command = backend.command_line(proc, nodes[1], 5)
    checking = "-o BatchMode=yes -o StrictHostKeyChecking=yes"
    assert command.startswith(f"ssh -p {nodes[1].access.port} {checking} ")
    assert f"UserKnownHostsFile={ssh_nodes.known_hosts}" in command
    assert run_command_line(command) == (0, "rank 1 on node1\n")


def test_the_plan_flags_what_the_preflight_found_different_between_nodes(ssh_nodes, tmp_path):
    """node1's python starts with another GLOO_SOCKET_IFNAME and sees another torch (its
    metadata first on its path): the SSH preflight reads both, and the plan says so."""
    fake = tmp_path / "fake-site" / "torch-9.9.9.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\nexport GLOO_SOCKET_IFNAME=eth1 NCCL_DEBUG=INFO\n"
        f'export PYTHONPATH={fake.parent}\nexec {ssh_nodes.python} "$@"\n'
    )
    wrapper.chmod(0o755)
    entries = ssh_nodes.inventory_entries()
    entries[1]["python"] = str(wrapper)
    inventory = tmp_path / "nodes.yml"
    inventory.write_text(yaml.safe_dump({"nodes": entries}))
    spec = tmp_path / "job.yml"
    spec.write_text(
        "command: python t.py\nresources: {instance_count: 2}\n"
        "environment_variables: {NCCL_DEBUG: WARN}\ndistribution: {type: pytorch}\n"
    )
    done = run_cli("plan", str(spec), "--nodes-file", str(inventory),
                   env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    checks = [line for line in done.stdout.splitlines() if line.startswith("Check: ")]
    import torch

    assert checks == [
        f"Check: torch differs between nodes ({torch.__version__} on node0; 9.9.9 on node1): "
        "ranks of different versions can fail or hang in their first collective; install one "
        "version everywhere",
        "Check: GLOO_SOCKET_IFNAME differs between nodes (unset on node0; eth1 on node1), as "
        "their environments set it: NCCL and gloo must reach every node alike; set it for the "
        "job (--env GLOO_SOCKET_IFNAME=...) or alike on every node",
    ]  # NCCL_DEBUG differs too, but the job sets it for every rank


# -- the network check before launch ------------------------------------------------------


def test_a_node_that_cannot_reach_the_master_is_one_line_before_any_rank_starts(
    ssh_nodes, store, tmp_path
):
    """node1 has no route to node0 (an `unreachable` route in its namespace; its SSH from
    here still works): the job fails before anything starts, naming both nodes, the
    master's address and the likely fix. With --no-preflight the check is skipped (a job
    that needs no network then runs)."""
    node0, node1 = ssh_nodes.nodes
    assert node1.namespace, "the test nodes need network namespaces"
    route = ["ip", "netns", "exec", node1.namespace, "ip", "route"]
    subprocess.run([*route, "add", "unreachable", f"{node0.host}/32"], check=True)
    try:
        spec = _spec("command: echo started\nresources: {instance_count: 2}")
        inventory = ssh_nodes.load_inventory(tmp_path)
        with pytest.raises(NodeError) as caught:
            launch(spec, store=store, inventory=inventory)
        assert re.fullmatch(
            rf"node1 cannot reach node0's master {re.escape(node0.host)}:\d+ \(no route to "
            r"host: node1 has no route to it: check node0's address, or the network between "
            r"them\)",
            str(caught.value),
        ), str(caught.value)
        assert store.jobs() == []  # nothing was recorded, nothing started
        # A blackhole route: Linux answers "invalid argument", which said nothing.
        subprocess.run([*route, "replace", "blackhole", f"{node0.host}/32"], check=True)
        with pytest.raises(NodeError) as caught:
            launch(spec, store=store, inventory=inventory)
        assert "(no route to host: node1 has no route to it" in str(caught.value)
        subprocess.run([*route, "replace", "unreachable", f"{node0.host}/32"], check=True)
        # Where TensorFlow's workers and a Dask cluster meet: checked the same way.
        for kind, what in (("tensorflow, worker_count: 2", "TensorFlow worker 0"),
                           ("dask", "Dask scheduler")):  # fmt: skip
            other = _spec(f"command: echo started\nresources: {{instance_count: 2}}\n"
                          f"distribution: {{type: {kind}}}")  # fmt: skip
            with pytest.raises(NodeError) as caught:
                launch(other, store=store, inventory=inventory)
            assert str(caught.value).startswith(
                f"node1 cannot reach node0's {what} {node0.host}:"
            ), str(caught.value)
        assert store.jobs() == []
        nodes_file = str(tmp_path / "nodes.yml")
        spec_file = tmp_path / "job.yml"
        spec_file.write_text("command: echo started\nresources: {instance_count: 2}\n")
        done = run_cli("run", str(spec_file), "--nodes-file", nodes_file, store=store)
        assert done.returncode == 2
        assert done.stderr.startswith("error: node1 cannot reach node0's master ")
        assert done.stderr.count("\n") == 1
        skipped = run_cli("run", str(spec_file), "--nodes-file", nodes_file, "--no-preflight",
                          store=store)  # fmt: skip
        assert skipped.returncode == 0, skipped.stderr
        assert skipped.stdout.count("started") == 2
    finally:
        subprocess.run([*route, "del", "unreachable", f"{node0.host}/32"], check=True)
    assert ssh_nodes.job_processes(store.jobs()[0].job_id) == []


def test_an_interface_the_job_names_that_a_node_lacks_is_one_line(ssh_nodes, store, tmp_path):
    spec = _spec(
        "command: echo started\nresources: {instance_count: 2}\n"
        "environment_variables: {GLOO_SOCKET_IFNAME: eth9}"
    )
    with pytest.raises(NodeError) as caught:
        launch(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert str(caught.value) == (
        "node0: GLOO_SOCKET_IFNAME=eth9 names no interface there with an address (no such "
        "interface; its interfaces: eth0, lo)"
    )
    assert store.jobs() == []
    fine = _spec(
        "command: echo started\nresources: {instance_count: 2}\n"
        "environment_variables: {GLOO_SOCKET_IFNAME: eth0, NCCL_SOCKET_IFNAME: eth}"
    )
    assert run(fine, store=store, inventory=ssh_nodes.load_inventory(tmp_path)).ok


def test_report_works_on_nodes_without_jupyter_dist(ssh_nodes, store, tmp_path):
    """The nodes' Python is the system's (no jupyter-dist, no torch): `from distrun import
    report` still works in every rank, and the metrics reach the store."""
    from jupyter_dist.run.metrics import read_metrics

    inventory = ssh_nodes.load_inventory(tmp_path, python="/usr/bin/python3")
    probe = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", "import jupyter_dist"], capture_output=True, cwd=tmp_path
    )
    assert probe.returncode != 0  # the point of the test: it is not installed there
    spec = _spec(
        """\
        command: >-
          python3 -c "from distrun import report; import os;
          report(step=1, rank=float(os.environ['RANK']))"
        resources: {instance_count: 2}
        distribution: {type: pytorch, process_count_per_instance: 2}
        """
    )
    result = run(spec, store=store, inventory=inventory)
    assert result.ok, result.describe()
    records, _ = read_metrics(store.get(result.job_id))
    assert sorted((r["k"], r["s"], r["m"]["rank"]) for r in records) == [
        (f"rank-{rank}", 1, float(rank)) for rank in range(4)
    ]


def test_what_a_job_leaves_in_a_nodes_workdir_is_private(ssh_nodes, store, tmp_path):
    """The privacy walk on the nodes: the agent, the code cache and each job's folder (its
    snapshot of the code) are 0600 files in 0700 folders, whatever the code folder's own
    modes (0644, a 0755 script); a later attempt's snapshot replaces the first, where it
    was nested inside it."""
    code = tmp_path / "src"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "mod.py").write_text("X = 1\n")
    (code / "run.sh").write_text("#!/bin/sh\necho ran on $(hostname)\n")
    (code / "run.sh").chmod(0o755)
    spec = _spec(f"""\
        code: {code}
        command: '[ "$DISTRUN_RESTART_COUNT" = 0 ] && exit 3; ./run.sh'
        resources: {{instance_count: 2}}
        limits: {{max_restarts: 1}}
    """)
    # Workdirs that do not exist yet: each is made by the job, and private, parent too.
    entries = ssh_nodes.inventory_entries()
    for entry in entries:
        entry["workdir"] = f"{entry['workdir']}-made/work"
    (tmp_path / "nodes.yml").write_text(yaml.safe_dump({"nodes": entries}))
    inventory = load_inventory(tmp_path / "nodes.yml")
    old = os.umask(0o022)  # what most machines have: what the job makes is private anyway
    try:
        result = run(spec, store=store, inventory=inventory)
    finally:
        os.umask(old)
    assert result.ok and len(result.attempts) == 1, result.describe()
    for entry in entries:
        work = Path(entry["workdir"])
        assert (work / "code").is_dir() and any(work.glob("agent*"))
        assert not_private(work.parent) == []  # the workdir itself, and the folder made for it
        snapshot = work / result.job_id / "code"
        assert sorted(p.name for p in snapshot.iterdir()) == ["pkg", "run.sh"]
        assert os.access(snapshot / "run.sh", os.X_OK)
