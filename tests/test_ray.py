"""The ray backend on a real Ray cluster (tests/raynodes.py: a head and a worker, each in a
network namespace of its own): DDP across its nodes over Ray Client and over the head's
address, fail-fast, Ctrl-C and a killed notebook leaving nothing, an unplaceable request,
and the backend's own options."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml
from helpers import (
    EXAMPLES,
    POOL_PROBE,
    await_text,
    execute_notebook,
    not_private,
    paused_ranks,
    result_reports,
    run_cli,
    running_kernel,
    stream_text,
)

from jupyter_dist.store import JobStore

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# Which of the job's actors and placement groups Ray still holds (its GCS, read by the
# cluster's kept driver, inside the head's namespace: a head-address driver must be
# reachable by the cluster). An actor of ours that is not DEAD, a group not REMOVED, is
# left over.
CLUSTER_STATE = """
from ray._private import state
actors = [a["State"] for a in state.actors().values()
          if a.get("ActorClassName", a.get("Name", "")).endswith("RayNodeHost")]
groups = [g["state"] for g in ray.util.placement_group_table().values()]
result = {"actors": actors, "groups": groups}
"""


def cluster_state(ray_cluster) -> dict:
    return ray_cluster.ask(CLUSTER_STATE)


def assert_nothing_left(ray_cluster, job_id: str, within: float = 30) -> None:
    """No process of the job on any Ray node, every actor of ours dead and every placement
    group removed (within `within` seconds: Ray removes a gone driver's actors)."""
    deadline = time.monotonic() + within
    while True:
        processes = ray_cluster.job_processes(job_id)
        found = cluster_state(ray_cluster)
        left = [s for s in found["actors"] if s != "DEAD"] + [
            s for s in found["groups"] if s != "REMOVED"
        ]
        if not processes and not left:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left on the cluster: processes {processes}, actors and groups {left}")
        time.sleep(1)


def assert_private_on_the_nodes(ray_cluster, job_id: str) -> None:
    """The job's folder on each Ray node (in its TMPDIR, tests/raynodes.py), and the
    per-node folder holding it: 0700 folders, 0600 files (programs 0700)."""
    folders = sorted(ray_cluster.root.glob(f"*/tmp/distrun-ray-*/{job_id}"))
    assert len(folders) == 2, folders
    for folder in folders:
        assert not_private(folder.parent) == []


# How the notebook reaches the cluster: Ray Client from this machine (outside the cluster's
# network), or the head's address from inside it (the head's namespace: a head-address
# driver must be reachable by the cluster).
MODES = ("client", "head")


def distrun_argv(ray_cluster, mode: str, *args: str) -> list[str]:
    """`jupyter distrun ARGS --backend ray --ray-address ...` for `mode`."""
    inside, address = (
        ([], ray_cluster.client_address) if mode == "client"
        else (ray_cluster.inside(), ray_cluster.head_address)
    )  # fmt: skip
    return [*inside, sys.executable, "-m", "jupyter_dist.cli", *args, "--backend", "ray",
            "--ray-address", address]  # fmt: skip


def distrun(ray_cluster, mode: str, *args: str, store, timeout: float = 300):
    argv = [*distrun_argv(ray_cluster, mode, *args), "--store", str(store.root)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
def test_ddp_across_two_ray_nodes(ray_cluster, store, mode):
    """examples/pytorch_ddp.yml, 2 nodes x 2 ranks: a rank on each Ray node, MASTER_ADDR
    the first bundle's node, identical weights."""
    done = distrun(ray_cluster, mode, "run", str(EXAMPLES / "pytorch_ddp.yml"), store=store)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (record,) = store.jobs()
    reports = result_reports(store, record.job_id)
    assert sorted(reports) == [0, 1, 2, 3]
    first, second = reports[0]["host"], reports[2]["host"]  # where the bundles landed
    assert {first, second} == {"rayhead", "rayworker1"}
    assert reports[1]["host"] == first and reports[3]["host"] == second
    addresses = {node.name: node.host for node in ray_cluster.nodes}
    assert {reports[r]["env"]["MASTER_ADDR"] for r in reports} == {addresses[first]}
    assert len({json.dumps(reports[r]["weights"]) for r in reports}) == 1
    assert "4 ranks on 2 nodes (ray)" in done.stderr
    assert record.status()["nodes"] == [first, second]
    assert_private_on_the_nodes(ray_cluster, record.job_id)
    assert_nothing_left(ray_cluster, record.job_id)


def test_a_nodes_ranks_fork_from_one_pool_and_none_dies_with_another(ray_cluster, store, tmp_path):
    """`preload: [torch]` on Ray: one actor per Ray node starts all of the job's agents
    there and lives until the job ends, so a node's two ranks fork from one pool (the
    first agent's), torch already imported, and neither dies when the other's agent ends
    first (as they did on Slurm, where the pool ended with its starter's job step); DDP
    meets across the nodes; nothing of the job is left. The pools carry no job, like a
    local node's; the test ends them."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(POOL_PROBE, code / "probe.py")
    spec = tmp_path / "job.yml"
    spec.write_text(yaml.safe_dump({
        "code": str(code), "command": "python probe.py",
        "environment_variables": {"OMP_NUM_THREADS": "1"}, "resources": {"instance_count": 2},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2},
        "preload": ["torch"],
    }))  # fmt: skip
    try:
        done = distrun(ray_cluster, "client", "run", str(spec), store=store)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (record,) = store.jobs()
        reports = result_reports(store, record.job_id)
        assert sorted(reports) == [0, 1, 2, 3]
        for report in reports.values():
            assert report["allreduce"] == 10 and report["torch_before"]
        assert reports[0]["host"] == reports[1]["host"] != reports[2]["host"]
        ppids = [reports[rank]["ppid"] for rank in range(4)]
        assert ppids[0] == ppids[1] != ppids[2] == ppids[3]  # one pool per node
        assert_nothing_left(ray_cluster, record.job_id)
    finally:
        for info in ray_cluster.root.glob("*/tmp/distrun-pools-*/*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_rank_stops_the_others_and_is_named(ray_cluster, store, tmp_path, mode):
    spec = tmp_path / "fail.yml"
    spec.write_text(
        'command: >-\n  if [ "$RANK" = 3 ]; then echo gave up >&2; exit 3; fi; sleep 300\n'
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    started = time.monotonic()
    done = distrun(ray_cluster, mode, "run", str(spec), store=store)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - started < 200  # not the 300 s the others would sleep
    assert re.search(r"Root cause: rank 3 on ray(head|worker1) ", done.stdout + done.stderr)
    assert "exited with code 3" in done.stdout + done.stderr
    (record,) = store.jobs()
    assert record.status()["state"] == "failed"
    assert_nothing_left(ray_cluster, record.job_id)


def _start_long_job(
    ray_cluster, store, tmp_path, procs_per_node: int = 1, command: str = "", mode="client"
):
    spec = tmp_path / "long.yml"
    spec.write_text(
        f"command: {json.dumps(command or 'echo started; sleep 300')}\n"
        "resources: {instance_count: 2}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: {procs_per_node}}}\n"
    )
    proc = subprocess.Popen(
        [*distrun_argv(ray_cluster, mode, "run", str(spec)), "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A gone Ray Client's actors go after this grace (the client's setting), not 30 s.
        env={**os.environ, "RAY_CLIENT_RECONNECT_GRACE_PERIOD": "5"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    ranks, seen = 2 * procs_per_node, 0
    deadline = time.monotonic() + 120
    while seen < ranks and time.monotonic() < deadline:
        seen += "started" in proc.stdout.readline()
    assert seen == ranks, proc.stderr.read() if proc.poll() is not None else "no start"
    (record,) = store.jobs()
    assert len(ray_cluster.job_processes(record.job_id)) >= 2 * ranks  # an agent, a shell
    return proc, record


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_cancels_and_leaves_nothing(ray_cluster, store, tmp_path, mode):
    proc, record = _start_long_job(ray_cluster, store, tmp_path, mode=mode)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert record.status()["state"] == "cancelled"
    assert_nothing_left(ray_cluster, record.job_id)


@pytest.mark.parametrize("mode", MODES)
def test_a_killed_notebook_leaves_nothing_on_the_cluster(ray_cluster, store, tmp_path, mode):
    """The launcher SIGKILLed (a kernel's death): Ray drops its actors once its driver is
    gone for good (a Ray Client after its reconnect grace), each agent's input closes, and
    the agent stops its tree."""
    proc, record = _start_long_job(ray_cluster, store, tmp_path, mode=mode)
    proc.kill()
    proc.wait(30)
    assert_nothing_left(ray_cluster, record.job_id, within=90)


def test_a_killed_kernel_leaves_nothing_on_the_cluster(ray_cluster, kernel_env, monkeypatch):
    """A real kernel running a `%%distrun --backend ray` cell over Ray Client, SIGKILLed:
    the same end as a killed launcher (the actors go once the client's grace is over)."""
    monkeypatch.setenv("RAY_CLIENT_RECONNECT_GRACE_PERIOD", "5")  # the kernel inherits it
    with running_kernel() as (km, kc):
        kc.execute(
            f"%%distrun --backend ray --ray-address {ray_cluster.client_address} --nodes 2\n"
            "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"
        )
        assert await_text(kc, "sleeping", 2, timeout=120) == 2
        (record,) = JobStore(kernel_env).jobs()
        assert len(ray_cluster.job_processes(record.job_id)) >= 4  # an agent, a rank each
        km.signal_kernel(signal.SIGKILL)
        assert_nothing_left(ray_cluster, record.job_id, within=90)


def test_each_ranks_sees_the_gpus_of_its_nodes_bundle(ray_cluster, store, tmp_path):
    """--ray-gpus-per-node: Ray gives each bundle's actor its GPUs' ids (CUDA_VISIBLE_DEVICES)
    and every rank of that node inherits them; the plan says when a node's ranks outnumber
    its GPUs. A job that asks for none leaves the variable alone. (The test cluster's GPUs
    are declared, not real: what a rank does on them is tests/test_gpu.py's.)"""
    spec = tmp_path / "gpus.yml"
    spec.write_text(
        'command: echo "sees ${CUDA_VISIBLE_DEVICES-unset} on $(hostname)"\n'
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    done = distrun(ray_cluster, "client", "run", str(spec), "--ray-gpus-per-node", "1",
                   store=store)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    said = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "sees " in line)
    assert said == ["sees 0 on rayhead"] * 2 + ["sees 0 on rayworker1"] * 2, done.stdout
    (record,) = store.jobs()
    checks = run_cli("inspect", record.job_id, store=store).stdout
    nodes = "(rayhead, rayworker1|rayworker1, rayhead)"  # as they were placed
    assert re.search(f"Check: {nodes} have 1 GPU for 2 ranks: ", checks), checks
    plain = distrun(ray_cluster, "client", "run", str(spec), store=store)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert plain.stdout.count("sees unset on ") == 4, plain.stdout
    for record in store.jobs():
        assert_nothing_left(ray_cluster, record.job_id)


@pytest.mark.parametrize("mode", MODES)
def test_a_request_no_node_can_hold_is_one_line(ray_cluster, store, tmp_path, mode):
    spec = tmp_path / "gpus.yml"
    spec.write_text("command: echo hi\nresources: {instance_count: 2}\n")
    done = distrun(ray_cluster, mode, "run", str(spec), "--ray-gpus-per-node", "2", store=store)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "error: ray: the job needs 2 nodes with 1 CPUs and 2 GPUs each, and the cluster has 0 "
        "such of its 2 ("
    ), done.stderr
    assert f"{ray_cluster.head.host}: 2 CPUs and 1 GPUs" in done.stderr
    too_many = distrun(ray_cluster, mode, "run", str(spec), "--nodes", "3", store=store)
    assert "the job needs 3 nodes with 1 CPUs each, and the cluster has 2 such" in too_many.stderr
    assert store.jobs() == []
    state = cluster_state(ray_cluster)
    assert all(s == "REMOVED" for s in state["groups"])


def test_the_backends_own_keys_are_checked_when_planned(tmp_path, store):
    spec = tmp_path / "typo.yml"
    spec.write_text("command: echo hi\nbackend: {type: ray, adress: auto}\n")
    done = run_cli("plan", str(spec), store=store)
    assert done.returncode == 2
    assert done.stderr == (
        "error: backend: 'adress' is not an option of the ray backend (did you mean "
        "'address'?); its options: address, gpus_per_node, cpus_per_node, autoscaling\n"
    )
    spec.write_text("command: echo hi\nbackend: {type: ray, cpus_per_node: many}\n")
    done = run_cli("plan", str(spec), store=store)
    assert done.stderr == (
        "error: backend: cpus_per_node: expected a whole number from 0 to 4096 "
        "(--ray-cpus-per-node)\n"
    ), done.stderr
    spec.write_text("command: echo hi\nbackend: {type: ray, autoscaling: 3}\n")
    done = run_cli("plan", str(spec), store=store)
    assert (
        done.stderr == "error: backend: autoscaling: expected true or false (--ray-autoscaling)\n"
    )


def test_an_address_where_nothing_listens_is_one_line_at_once(store, tmp_path):
    """Ray would retry a head it cannot reach for about 12 minutes (Ray Client for 30 s),
    logging every try to stderr: the address is checked first, and nothing listening there
    is one line naming it and which port was expected. Nothing is started or stored."""
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    spec = tmp_path / "job.yml"
    spec.write_text("command: echo hi\n")
    for address, role in (
        (f"127.0.0.1:{port}", "the head's GCS"),
        (f"ray://127.0.0.1:{port}", "Ray Client's server"),
    ):
        argv = ("run", str(spec), "--backend", "ray", "--ray-address", address)
        done = run_cli(*argv, store=store, timeout=60)
        assert done.returncode == 2
        assert done.stderr == (
            f"error: ray: cannot connect to {address}: nothing listens on 127.0.0.1 port "
            f"{port} (is Ray running there, and is that {role} port?)\n"
        )
    assert store.jobs() == []


@pytest.mark.parametrize("mode", MODES)
def test_tensorflow_multi_worker_mirrored_on_ray(ray_cluster, store, mode):
    done = distrun(ray_cluster, mode, "run", str(EXAMPLES / "tensorflow_mwms.yml"), store=store)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = store.jobs()
    reports = result_reports(store, record.job_id)
    assert sorted(reports) == [0, 1]
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1
    assert set(record.status()["nodes"]) == {"rayhead", "rayworker1"}
    assert_nothing_left(ray_cluster, record.job_id)


@pytest.mark.parametrize("mode", MODES)
def test_a_warm_session_and_a_dask_cluster_from_a_notebook(ray_cluster, kernel_env, mode):
    """In one notebook (over Ray Client, or with its kernel in the head's network and the
    head's address): a warm session whose second cell uses the process group the first
    made, then an interactive Dask cluster with a worker on each Ray node."""
    from test_dask import WHERE_TASKS_RAN

    client = mode == "client"
    address = ray_cluster.client_address if client else ray_cluster.head_address
    where = f"--backend ray --ray-address {address}"
    nb = execute_notebook(
        f"%distrun session start --nodes 2 --procs-per-node 2 {where}",
        "%%distrun\nimport socket, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\nrank = dist.get_rank()",
        "%%distrun\nt = torch.tensor([float(rank)])\ndist.all_reduce(t)\n"
        "print(rank, socket.gethostname(), t.item())",
        "%distrun session stop",
        f"%%distrun --type dask --nodes 2 -p 1 --threads 1 {where}\n",
        WHERE_TASKS_RAN,
        "%distrun dask stop",
        timeout=300,
        kernel_prefix=() if client else ray_cluster.inside(),
    )
    text = stream_text(nb.cells[3])
    hosts = {}
    for rank in range(4):
        found = re.search(rf"\[rank {rank}\] {rank} (ray\w+) 6\.0", text)
        assert found, text
        hosts[rank] = found.group(1)
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2]
    placed = dict(json.loads(stream_text(nb.cells[6]).splitlines()[0]))
    assert {key.split()[0] for key in placed} == {"rayhead", "rayworker1"}, placed
    assert "stopped" in stream_text(nb.cells[7])
    for record in JobStore(kernel_env).jobs():
        assert_nothing_left(ray_cluster, record.job_id)


def test_nodes_lists_the_clusters_nodes_and_what_each_has(ray_cluster, store):
    done = run_cli("nodes", "--backend", "ray", "--ray-address", ray_cluster.client_address,
                   store=store, env={**os.environ, "COLUMNS": "160"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "ray" in line and "10." in line]
    assert len(rows) == 2, done.stdout
    for node in ray_cluster.nodes:
        (row,) = [r for r in rows if f" {node.host} " in r]
        assert node.name in row and " ok " in row and " 2 " in row and "GiB" in row, row
        assert " 1 " in row, row  # its GPU (declared: tests/raynodes.py)
    other = run_cli("nodes", "--backend", "ssh", store=store)
    assert other.returncode == 2
    assert other.stderr.startswith("error: the ssh backend lists no nodes of its own")


def test_a_request_waits_while_the_cluster_is_busy_and_an_interrupt_withdraws_it(
    ray_cluster, store, tmp_path
):
    """A job holding every CPU; a second one waits, says so, and Ctrl-C takes its placement
    group off the cluster at once; the first one's ranks are untouched."""
    proc, record = _start_long_job(ray_cluster, store, tmp_path, procs_per_node=2)
    spec = tmp_path / "second.yml"
    spec.write_text("command: echo second\nresources: {instance_count: 2}\n")
    second = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--backend", "ray",
         "--ray-address", ray_cluster.client_address, "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        said = []  # Ray's own warnings may come first (a slow Ray Client connection's)
        while not (said and said[-1].startswith("ray: ")) and len(said) < 50:
            said.append(second.stderr.readline())
            assert said[-1], said  # it ended before saying it waits
        assert re.fullmatch(r"ray: waiting for 2 nodes with 1 CPUs each \(other work holds "
                            r"the cluster: \d+ of 4 CPUs free\)\n", said[-1]), said  # fmt: skip
        second.send_signal(signal.SIGINT)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 130, [*said, err]
        deadline = time.monotonic() + 15  # the GCS may say REMOVED a moment after
        while True:
            groups = cluster_state(ray_cluster)["groups"]
            if groups.count("CREATED") == 1 and set(groups) <= {"CREATED", "REMOVED"}:
                break
            assert time.monotonic() < deadline, groups
        assert len(ray_cluster.job_processes(record.job_id)) >= 8  # the first job runs on
    finally:  # whatever failed above, the next test gets the cluster free
        for running in (second, proc):
            if running.poll() is None:
                running.send_signal(signal.SIGINT)
                running.communicate(timeout=120)
    assert len(store.jobs()) == 1  # the second never started
    assert_nothing_left(ray_cluster, record.job_id)


def test_a_ray_client_disconnect_that_never_ends_does_not_hold_the_process(ray_cluster):
    """Ray's exit hook waits for Ray Client's data stream to end, with no limit (once, on a
    busy head, a launcher outlived its Ctrl-C so): made to hang for ever here, the process
    still exits once SHUTDOWN_WAIT_S has passed."""
    from jupyter_dist.backends.ray import SHUTDOWN_WAIT_S

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c",
         "import time\n"
         "from ray.util.client.dataclient import DataClient\n"
         "from jupyter_dist.backends.ray import connect\n"
         f"connect({ray_cluster.client_address!r})\n"
         "DataClient.close = lambda self: time.sleep(3600)  # a stream that never ends\n"
         "print('connected', flush=True)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "connected\n", done.stderr[-2000:]
    assert time.monotonic() - started < SHUTDOWN_WAIT_S + 60


def test_an_autoscaling_cluster_is_waited_for_not_refused(ray_cluster, store, tmp_path):
    """--ray-autoscaling: 3 nodes asked of a 2-node cluster wait (for an autoscaler to add
    one), saying why; an interrupt takes the request back."""
    spec = tmp_path / "three.yml"
    spec.write_text("command: echo hi\nresources: {instance_count: 3}\n")
    waiting = subprocess.Popen(
        [*distrun_argv(ray_cluster, "client", "run", str(spec)), "--ray-autoscaling",
         "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        said = []  # Ray's own warnings may come first
        while not (said and said[-1].startswith("ray: ")) and len(said) < 50:
            said.append(waiting.stderr.readline())
            assert said[-1], said  # it ended before saying it waits
        assert said[-1] == (
            "ray: waiting for 3 nodes with 1 CPUs each (the cluster has 2 such nodes now: "
            "waiting for its autoscaler to add more)\n"
        ), said
        waiting.send_signal(signal.SIGINT)
        _, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 130, [*said, err]
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate(timeout=30)
    assert store.jobs() == []
    deadline = time.monotonic() + 15
    while set(cluster_state(ray_cluster)["groups"]) - {"REMOVED"}:
        assert time.monotonic() < deadline, cluster_state(ray_cluster)


def test_one_cluster_per_process_and_no_mpi(ray_cluster, store, tmp_path):
    """Ray allows one cluster per process: a second address is refused in one line (the
    first connection kept); an MPI job is refused before anything is asked of Ray."""
    other = "ray://10.255.255.1:10001"
    done = subprocess.run(
        [sys.executable, "-c",
         "from jupyter_dist.backends.ray import connect\n"
         "from jupyter_dist.errors import NodeError\n"
         f"connect({ray_cluster.client_address!r})\n"
         f"try:\n    connect({other!r})\nexcept NodeError as e:\n    print(e)\n"
         f"connect({ray_cluster.client_address!r})\nprint('still connected')"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout == (
        f"ray: this process is connected to {ray_cluster.client_address}; Ray allows one "
        f"cluster per process (restart the kernel to use {other})\nstill connected\n"
    ), done.stderr[-2000:]
    spec = tmp_path / "mpi.yml"
    spec.write_text("command: echo hi\nresources: {instance_count: 2}\ndistribution: {type: mpi}\n")
    refused = run_cli("run", str(spec), "--backend", "ray", "--ray-address", other, store=store)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ray: MPI jobs do not run on Ray (mpirun starts")
    assert refused.stderr.count("\n") == 1


def test_stacks_and_meters_of_ranks_on_ray_nodes(ray_cluster, store, tmp_path):
    """`stacks` from another process asks the job's owner, which reads every rank through
    its Ray actors (faulthandler: py-spy is not on these nodes); `inspect` shows each rank's
    CPU and memory as the agents measured them."""
    waits = "def wait_here():\n    time.sleep(300)\n"
    (tmp_path / "hang.py").write_text(f"import time\n{waits}print('started', flush=True)\n"
                                      "wait_here()\n")  # fmt: skip
    proc, record = _start_long_job(
        ray_cluster, store, tmp_path, command=f"exec python {tmp_path / 'hang.py'}"
    )
    try:
        done = run_cli("stacks", record.job_id, "--method", "faulthandler", store=store)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"Stacks of job {record.job_id}: 2 Python processes on 2 "
                                      "nodes"), done.stdout  # fmt: skip
        assert done.stdout.count("in wait_here") >= 1 and "hang.py:3" in done.stdout
        assert_private_on_the_nodes(ray_cluster, record.job_id)  # the stacks' files too
        time.sleep(3)  # a few usage reports
        shown = run_cli("inspect", record.job_id, store=store, env={**os.environ, "COLUMNS": "200"})
        assert re.search(r"rank 0 .* \d+(\.\d+)? MiB", shown.stdout), shown.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert_nothing_left(ray_cluster, record.job_id)


def test_torchrun_on_ray_nodes(ray_cluster, store):
    example = str(EXAMPLES / "pytorch_ddp_torchrun.yml")
    done = distrun(ray_cluster, "client", "run", example, store=store)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = result_reports(store, store.jobs()[0].job_id)
    assert sorted(reports) == [0, 1, 2, 3]
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1
    assert {r["host"] for r in reports.values()} == {"rayhead", "rayworker1"}


def test_no_line_is_lost_through_the_actors(ray_cluster, store, tmp_path):
    """200,000 lines from each of 2 ranks, stdout and stderr, written as fast as Python
    can: every one stored, in order."""
    spec = tmp_path / "lines.yml"
    spec.write_text(
        'command: >-\n  python -c "import sys; [print(i) or print(i, file=sys.stderr) '
        'for i in range(200000)]"\nresources: {instance_count: 2}\n'
    )
    done = distrun(ray_cluster, "client", "run", str(spec), "--color", "never", store=store)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = store.jobs()
    for key in ("rank-0", "rank-1"):
        for stream in ("stdout", "stderr"):
            numbers = [int(line.text) for line in record.iter_log(key, stream)]
            assert numbers == list(range(200000)), (key, stream, len(numbers))


def test_plan_places_then_gives_the_placement_back(ray_cluster, store, tmp_path):
    """`plan` (the dry run) asks Ray for the job's nodes to say where each rank runs and
    the exact command its actor starts, then removes the placement group again."""
    spec = tmp_path / "plan.yml"
    spec.write_text("command: echo hi\nresources: {instance_count: 2}\n")
    done = distrun(ray_cluster, "client", "plan", str(spec), store=store)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rayhead" in done.stdout and "rayworker1" in done.stdout, done.stdout
    assert "agent-" in done.stdout and "echo hi" in done.stdout
    assert store.jobs() == []
    assert all(s == "REMOVED" for s in cluster_state(ray_cluster)["groups"])
    assert all(s == "DEAD" for s in cluster_state(ray_cluster)["actors"])


def test_a_restart_runs_again_on_the_placed_nodes(ray_cluster, store, tmp_path):
    """--max-restarts on Ray: a rank fails in attempt 1; the nodes' actors answer the health
    check, and attempt 2 runs on the same placement and succeeds."""
    spec = tmp_path / "restart.yml"
    spec.write_text(
        'command: >-\n  if [ "$DISTRUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 4; '
        "fi; echo attempt $DISTRUN_RESTART_COUNT\nresources: {instance_count: 2}\n"
        "limits: {max_restarts: 1, restart_delay: 1}\n"
    )
    done = distrun(ray_cluster, "client", "run", str(spec), store=store)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[rank 0] attempt 1" in done.stdout and "[rank 1] attempt 1" in done.stdout
    (record,) = store.jobs()
    assert record.status()["attempt"] == 2
    assert_nothing_left(ray_cluster, record.job_id)


def test_a_lost_node_is_placed_anew_for_the_restart(ray_cluster, store, tmp_path):
    """A Ray node dies under a running job (every process on it SIGKILLed, as a machine
    that goes away): the job fails naming it; before the restart its actor does not answer,
    so the placement is given back and the job placed anew on the cluster's live nodes,
    here the worker started again (as an autoscaler would bring one): attempt 2 succeeds."""
    import raynodes

    spec = tmp_path / "lost.yml"
    spec.write_text(
        'command: >-\n  if [ "$DISTRUN_RESTART_COUNT" = 0 ]; then echo started; sleep 300; '
        "fi; echo attempt $DISTRUN_RESTART_COUNT on $(hostname)\n"
        "resources: {instance_count: 2}\nlimits: {max_restarts: 1, restart_delay: 1}\n"
    )
    proc = subprocess.Popen(
        [*distrun_argv(ray_cluster, "client", "run", str(spec)), "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    worker = ray_cluster.nodes[1]
    try:
        seen, deadline = 0, time.monotonic() + 120
        while seen < 2 and time.monotonic() < deadline:
            seen += "started" in proc.stdout.readline()
        assert seen == 2, proc.stderr.read() if proc.poll() is not None else "no start"
        raynodes.lose_node(ray_cluster, worker)
        raynodes.start_node(ray_cluster, worker)  # a node comes back, with a new Ray node id
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=120)
        if worker.process.poll() is not None:  # lost, and not started again above
            raynodes.start_node(ray_cluster, worker)  # the next tests get the whole cluster
    assert proc.returncode == 0, err[-3000:]
    assert "attempt 1 on rayhead" in out and "attempt 1 on rayworker1" in out, out
    (record,) = store.jobs()
    status = record.status()
    assert status["attempt"] == 2, status
    from jupyter_dist.events import Attempt

    first = Attempt.from_dict(status["attempts"][0]).summary()
    assert first.startswith("attempt 1 (") and "rayworker1" in first, first
    assert_nothing_left(ray_cluster, record.job_id)


def test_a_large_code_folder_arrives_whole_in_pieces(ray_cluster, store, tmp_path):
    """A code folder of 40 MiB in one file and 300 small ones: the actor calls carry at most
    PUT_BYTES each, the big file in pieces, and every node's copy is byte for byte the
    folder (each rank hashes what it runs in)."""
    import hashlib

    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    big = os.urandom(40 << 20)
    (code / "data" / "weights.bin").write_bytes(big)
    for i in range(300):
        (code / "data" / f"part-{i}.txt").write_text(f"part {i}\n" * 50)
    (code / "digest.py").write_text(
        "import hashlib, pathlib\n"
        "h = hashlib.sha256()\n"
        "for p in sorted(pathlib.Path('.').rglob('*')):\n"
        "    if p.is_file() and p.name != 'digest.py':\n"
        "        h.update(str(p).encode()); h.update(p.read_bytes())\n"
        "print('DIGEST', h.hexdigest())\n"
    )
    expected = hashlib.sha256()
    for path in sorted(p.relative_to(code) for p in code.rglob("*")):
        if (code / path).is_file() and path.name != "digest.py":
            expected.update(str(path).encode())
            expected.update((code / path).read_bytes())
    spec = tmp_path / "big.yml"
    spec.write_text(f"code: {code}\ncommand: python digest.py\nresources: {{instance_count: 2}}\n")
    done = distrun(ray_cluster, "client", "run", str(spec), "--color", "never", store=store)
    assert done.returncode == 0, done.stderr[-2000:]
    digests = re.findall(r"DIGEST (\w+)", done.stdout)
    assert digests == [expected.hexdigest()] * 2, done.stdout[-2000:]


def test_outputs_come_back_from_ray_nodes_in_pieces_up_to_the_limit(
    ray_cluster, store, tmp_path, monkeypatch
):
    """Each rank writes 5 MiB (two pieces through its actor) and then 2 MiB, with 6 MiB
    allowed from each node: the first arrives byte for byte, the second stays on the node,
    named; the copies are private."""
    monkeypatch.setenv("DISTRUN_OUTPUTS_LIMIT_MB", "6")
    spec = tmp_path / "outputs.yml"
    spec.write_text(
        "command: >-\n"
        "  python -c \"import os, sys; r = int(os.environ['RANK']);\n"
        "  open(sys.argv[1] + '/a.bin', 'wb').write(bytes([r]) * (5 << 20));\n"
        "  open(sys.argv[1] + '/b.bin', 'wb').write(b'b' * (2 << 20))\"\n"
        "  ${{outputs.model}}\n"
        "outputs:\n  model: {type: uri_folder}\nresources: {instance_count: 2}\n"
    )
    done = distrun(ray_cluster, "client", "run", str(spec), "--color", "never", store=store)
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = store.jobs()
    copies = sorted((record.path / "outputs").iterdir())
    assert len(copies) == 2, copies
    contents = sorted((node / "model" / "a.bin").read_bytes()[:1] for node in copies)
    assert contents == [b"\x00", b"\x01"]
    for node in copies:
        assert sorted(p.name for p in (node / "model").iterdir()) == ["a.bin"]
        assert (node / "model" / "a.bin").stat().st_size == 5 << 20
    shown = run_cli("inspect", record.job_id, store=store, env={**os.environ, "COLUMNS": "400"})
    left = [line for line in shown.stdout.splitlines() if "past the 6.0 MiB" in line]
    assert len(left) == 2 and all(line.endswith("/b.bin (2.0 MiB)") for line in left), left
    assert not_private(record.path) == []


def test_a_cluster_that_asks_for_a_token(ray_cluster, store, tmp_path):
    """Token authentication (Ray's default for every cluster from 2.61; the tests' cluster
    asks for one): without the token, one line that says what Ray reads it from; with Ray's
    own variables set, a job runs, over Ray Client and over the head's address."""
    cluster = ray_cluster
    token = cluster.auth_token
    assert token
    plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run(
        distrun_argv(cluster, "client", "nodes"), capture_output=True, text=True,
        timeout=120, env=plain,
    )  # fmt: skip
    assert refused.returncode != 0
    said = (refused.stdout + refused.stderr).strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith(f"error: ray: cannot connect to {cluster.client_address}: ")
    assert "set RAY_AUTH_MODE=token and the token in RAY_AUTH_TOKEN" in said[0], said
    assert token not in refused.stdout + refused.stderr
    spec = tmp_path / "job.yml"
    spec.write_text("command: echo rank $RANK on $(hostname)\n")
    for mode in MODES:
        done = subprocess.run(
            [*distrun_argv(cluster, mode, "run", str(spec)), "--store", str(store.root)],
            capture_output=True, text=True, timeout=300, env={**plain, **cluster.auth_env},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        (line,) = done.stdout.splitlines()
        assert line in [f"[rank 0] rank 0 on {node.name}" for node in cluster.nodes], line


# Connected by the backend, then disconnected (as the exit hook does), then a Ray call (as a
# thread of ours still giving the placement back would make).
AFTER_DISCONNECT = """
import sys
from jupyter_dist.backends.ray import connect
ray = connect(sys.argv[1])
ref = ray.put(1)
ray.shutdown()
try:
    ray.get(ref, timeout=30)
except Exception as exc:
    print("refused:", type(exc).__name__)
print("connected again:", ray.is_initialized())
ray.shutdown()  # a cluster it started of its own (the bug) goes with it
"""


def test_no_ray_call_after_disconnecting_starts_a_cluster_here(ray_cluster, tmp_path):
    """Ray starts a cluster of its own on this machine for a call made while not connected
    (its auto-connect): once the backend connected, a call after the disconnect fails
    instead, and leaves nothing here (no Ray processes, no ~/.ray/auth_token)."""
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", AFTER_DISCONNECT, ray_cluster.client_address],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["refused: RaySystemError", "connected again: False"], (
        done.stdout + done.stderr[-2000:]
    )
    assert not (home / ".ray").exists()


def test_a_paused_rank_on_a_ray_node_is_stepped_through_its_actor(ray_cluster, store, tmp_path):
    """breakpoint() in rank 1 on a Ray node: listed on its node, `p x` answered through the
    node's actor (the owner's link), `c`, and the job succeeds. Rank 0 spins in a loop:
    `--interrupt` pauses it there, through the same link."""
    import signal

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "bp.py").write_text(
        "import os\nx = 40 + int(os.environ['RANK'])\nif x == 41:\n    breakpoint()\n"
        "    x += 100\nspin = x == 40\nwhile spin:\n    x += 1\nprint('x is', x, flush=True)\n"
    )
    spec = tmp_path / "job.yml"
    spec.write_text(f"code: {tmp_path / 'code'}\ncommand: python bp.py\n"
                    "resources: {instance_count: 2}\n")  # fmt: skip
    proc = subprocess.Popen(
        [*distrun_argv(ray_cluster, "head", "run", str(spec)), "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not store.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        job_id = store.jobs()[0].job_id
        (paused,) = paused_ranks(store, job_id, 1)
        assert paused["rank"] == 1 and paused["node"] in ("rayhead", "rayworker1"), paused
        looked = run_cli("debug", job_id, "--rank", "1", "--do", "p x", store=store)
        assert looked.stdout == "41\n", looked.stderr
        going = run_cli("debug", job_id, "--rank", "1", "--do", "c", store=store)
        assert going.stderr == "rank 1 runs on\n"
        stopped = run_cli("debug", job_id, "--interrupt", "--rank", "0", store=store)
        assert stopped.returncode == 0, stopped.stderr
        assert re.fullmatch(
            r"rank 0 \((rayhead|rayworker1)\): \S+bp\.py:(7|8) in <module> \(interrupt\)\n",
            stopped.stdout,
        ), stopped.stdout
        run_cli("debug", job_id, "--rank", "0", "--do", "spin = False; x = 0", store=store)
        run_cli("debug", job_id, "--rank", "0", "--do", "c", store=store)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "[rank 1] x is 141" in out
        assert "[rank 0] x is 0" in out or "[rank 0] x is 1" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_nothing_left(ray_cluster, job_id)
