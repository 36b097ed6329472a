"""The Slurm backend inside an allocation, on the real test cluster: `jupyter distrun run`
where SLURM_JOB_ID is set (as under `salloc`) runs every process as a job step on the
allocation's nodes, with the same environment as anywhere, live output, fail-fast with the
root cause, and nothing left on a node."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers import (
    DASK_JOB,
    EXAMPLES,
    LONG_JOB,
    POOL_PROBE,
    SAVER,
    await_text,
    interrupt_and_reply,
    not_private,
    paused_ranks,
    result_reports,
    run_cli,
    running_kernel,
)

from jupyter_dist.run.requests import effective_state

pytestmark = pytest.mark.slurm


@pytest.fixture
def allocation(slurm_cluster):
    """Two nodes held by a Slurm job (salloc --no-shell), given back afterwards; yields the
    environment a process inside that allocation has."""
    granted = slurm_cluster.run("salloc", "--no-shell", "-N2", "--ntasks-per-node=2")
    found = re.search(r"Granted job allocation (\d+)", granted.stderr)
    assert found, granted.stderr
    job = found.group(1)
    yield {**slurm_cluster.env, "SLURM_JOB_ID": job}
    slurm_cluster.run("scancel", job)
    _wait_until_nothing_is_left(slurm_cluster, jobs_too=True)


def _wait_until_nothing_is_left(slurm_cluster, timeout: float = 30, jobs_too: bool = False):
    """Wait until no process is left on any node (with `jobs_too`, no Slurm job either);
    fail naming what is left. Slurm ends steps asynchronously (KillWait is 5 s), so a job
    that has ended may still have processes on its nodes for a few seconds."""
    deadline = time.monotonic() + timeout
    while (jobs_too and slurm_cluster.jobs()) or any(
        slurm_cluster.pids(n) for n in slurm_cluster.nodes
    ):
        if time.monotonic() > deadline:
            left = {n.name: _described(slurm_cluster.pids(n)) for n in slurm_cluster.nodes}
            pytest.fail(f"left on the nodes after {timeout:.0f} s: {slurm_cluster.jobs()} {left}")
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def no_slurm_client_is_left(request):
    """After each test, no salloc (or other Slurm client) of the cluster runs on this
    machine: the backend's allocation holder ends with the job that asked for it."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    deadline = time.monotonic() + 30
    while cluster.clients():
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm clients left on this machine: {cluster.clients()}")
        time.sleep(0.2)


def _four_reports(done: subprocess.CompletedProcess, store) -> dict[int, dict]:
    """The four ranks' reports of a `run` that succeeded with one job (each rank wrote one)."""
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = store.jobs()
    reports = result_reports(store, record.job_id)
    assert sorted(reports) == [0, 1, 2, 3]
    return reports


def _described(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        try:
            found.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
        except OSError:
            continue
    return found


def _run_in_background(spec: Path, slurm_cluster, tmp_path: Path, *extra: str) -> subprocess.Popen:
    """`jupyter distrun run SPEC --backend slurm` from outside any allocation, started."""
    import signal

    env = {k: v for k, v in slurm_cluster.env.items() if k != "SLURM_JOB_ID"}
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--backend", "slurm",
         "--store", str(tmp_path / "jobs"), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("launcher", ["per_process", "torchrun"])
def test_ddp_runs_as_job_steps_on_the_allocations_nodes(
    launcher, allocation, slurm_cluster, store, tmp_path
):
    spec = _spec(
        tmp_path,
        f"""\
        code: {EXAMPLES / "src"}
        command: python ddp_train.py --epochs 2
        environment_variables: {{GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: "1"}}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2, launcher: {launcher}}}
    """,
    )
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=180)
    reports = _four_reports(done, store)
    said = re.match(
        r"job \S+: 4 ranks (in 2 torchrun processes )?on 2 nodes \(slurm\); ", done.stderr
    )
    assert said and bool(said.group(1)) == (launcher == "torchrun")
    node0 = slurm_cluster.nodes[0].host
    for rank, report in reports.items():
        assert report["host"] == f"sln{rank // 2 + 1}"  # really on that node
        assert report["world_size"] == 4 and report["env"]["MASTER_ADDR"] == node0
        assert report["allreduce"] == 10.0  # 1 + 2 + 3 + 4: every rank took part
    assert "[rank 3] " in done.stdout
    assert not_private(store.root) == []  # what the agents wrote on the nodes too


def test_a_preload_inside_an_allocation_forks_the_ranks_from_a_pool_step_on_each_node(
    allocation, slurm_cluster, store, tmp_path
):
    """`preload: [torch]` inside an allocation: each node's pool runs as a job step of its
    own (`distrun-pool`), which the job's steps do not end (a pool one rank's agent
    started would end with that rank's step, and take the node's other ranks with it).
    Two jobs: DDP meets across the nodes with every rank forked from its node's pool, the
    second job's from the same pools; `pool list` inside the allocation shows them, `pool
    stop` ends them and their steps: nothing is left on a node, and no srun here."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(POOL_PROBE, code / "probe.py")
    pools = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # short: a socket's path must be
    env = {**allocation, "TMPDIR": str(pools)}  # where `pool list` looks, as the ranks do
    spec = _spec(
        tmp_path,
        f"""\
        code: {code}
        command: python probe.py
        environment_variables: {{GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: "1",
                                 TMPDIR: {pools}}}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
        preload: [torch]
    """,
    )
    try:
        planned = run_cli("plan", str(spec), store=store, env=env)
        assert planned.returncode == 0, planned.stderr
        assert "DISTRUN_PRELOAD=torch" in planned.stdout and "not used" not in planned.stdout
        parents = []
        for _ in range(2):
            done = run_cli("run", str(spec), store=store, env=env, timeout=180)
            assert done.returncode == 0, done.stderr[-3000:]
            assert "no pool" not in done.stderr, done.stderr  # no rank started cold
            reports = result_reports(store, store.jobs()[0].job_id)
            assert sorted(reports) == [0, 1, 2, 3]
            for rank, report in reports.items():
                assert report["host"] == f"sln{rank // 2 + 1}" and report["allreduce"] == 10
                assert report["torch_before"] and report["cmdline"] == ["probe.py"]
            # Each node's two ranks have one parent, its pool: one per node.
            by_node = [{reports[r]["ppid"] for r in (0, 1)}, {reports[r]["ppid"] for r in (2, 3)}]
            assert [len(p) for p in by_node] == [1, 1] and by_node[0] != by_node[1]
            parents.append(by_node)
        assert parents[0] == parents[1]  # the second job forked from the same pools
        steps = slurm_cluster.run("squeue", "-h", "-s", "-o", "%j %N").stdout.split("\n")
        assert sorted(line for line in steps if line.startswith("distrun-pool")) == [
            "distrun-pool sln1",
            "distrun-pool sln2",
        ], steps  # its own steps, one per node, after both jobs ended
        listed = run_cli("pool", "list", env=env)  # inside an allocation: its nodes
        assert listed.returncode == 0, listed.stderr
        for node, (pid,) in zip(("sln1", "sln2"), parents[0], strict=True):
            row = next(line for line in listed.stdout.splitlines() if node in line)
            assert "torch" in row and str(pid) in row, listed.stdout
        outside = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}  # names it instead
        stopped = run_cli("pool", "stop", "--slurm-job", env["SLURM_JOB_ID"], "sln2", env=outside)
        assert stopped.returncode == 0 and "sln2" in stopped.stdout, stopped.stderr
        assert "sln1" not in stopped.stdout  # only the node named
        assert run_cli("pool", "stop", "--backend", "slurm", env=env).returncode == 0
        _wait_until_nothing_is_left(slurm_cluster)  # the pools, and their steps
        assert not [line for line in slurm_cluster.run("squeue", "-h", "-s", "-o", "%j")
                    .stdout.split() if line == "distrun-pool"]  # fmt: skip
        assert list(pools.glob("distrun-pools-*/*.sock")) == []
        assert not_private(store.root) == []
    finally:
        run_cli("pool", "stop", "--backend", "slurm", env=env)
        shutil.rmtree(pools, ignore_errors=True)


def test_a_failing_rank_stops_the_others_with_the_root_cause(allocation, store, tmp_path):
    spec = _spec(
        tmp_path,
        """\
        command: if [ "$RANK" = 2 ]; then sleep 1; echo "rank 2 gives up" >&2; exit 3; fi; sleep 300
        resources: {instance_count: 2}
        distribution: {type: pytorch, process_count_per_instance: 2}
    """,
    )
    started = time.monotonic()
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=120)
    assert done.returncode == 1 and time.monotonic() - started < 60
    assert "Root cause: rank 2 on sln2 " in done.stderr and "exited with code 3" in done.stderr
    assert "rank 2 gives up" in done.stderr
    status = json.loads((store.jobs()[0].path / "status.json").read_text())
    assert status["state"] == "failed" and status["root_cause"]["rank"] == 2


def test_the_network_check_runs_through_slurm_steps(allocation, slurm_cluster, store, tmp_path):
    """Before any rank starts, an interface the job names that a node lacks is one line;
    so is a node with no route to the master (an `unreachable` route in sln2's
    namespace)."""
    named = _spec(
        tmp_path,
        """\
        command: echo started
        resources: {instance_count: 2}
        environment_variables: {NCCL_SOCKET_IFNAME: ib}
    """,
    )
    done = run_cli("run", str(named), store=store, env=allocation, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "error: sln1: NCCL_SOCKET_IFNAME=ib names no interface there with an address (no such "
        "interface; its interfaces: eth0, lo)\n"
    )
    sln1, sln2 = slurm_cluster.nodes
    route = ["ip", "netns", "exec", sln2.namespace, "ip", "route"]
    subprocess.run([*route, "add", "unreachable", f"{sln1.host}/32"], check=True)
    try:
        plain = _spec(tmp_path, "command: echo started\nresources: {instance_count: 2}\n")
        done = run_cli("run", str(plain), store=store, env=allocation, timeout=120)
    finally:
        subprocess.run([*route, "del", "unreachable", f"{sln1.host}/32"], check=True)
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(
        rf"error: sln2 cannot reach sln1's master {re.escape(sln1.host)}:\d+ \(no route to host: "
        r"sln2 has no route to it: check sln1's address, or the network between them\)\n",
        done.stderr,
    ), done.stderr
    assert store.jobs() == []  # nothing was recorded, nothing started


def test_mpi_allreduce_starts_its_ranks_through_slurm(allocation, slurm_cluster, store, tmp_path):
    """mpirun, a step on node 0, starts the other node's ranks through Slurm (no SSH
    exists in these nodes), on the job's nodes only, with the Azure ML variables."""
    spec = _spec(
        tmp_path,
        f"""\
        code: {EXAMPLES / "src"}
        command: python mpi_allreduce.py
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, process_count_per_instance: 2}}
    """,
    )
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=180)
    reports = _four_reports(done, store)
    node0, node1 = (n.host for n in slurm_cluster.nodes)
    for rank, report in reports.items():
        assert report["mpi_rank"] == rank and report["size"] == 4
        assert report["allreduce"] == 10  # really one communicator across both nodes
        assert report["host"] == f"sln{rank // 2 + 1}"
        assert report["master"][0] == node0
        assert report["hostfile"] == [f"{node0} slots=2", f"{node1} slots=2"]
    assert not_private(store.root) == []  # the nodes' job folders are the store's here


def test_mpi_ranks_on_both_nodes_get_the_grace_period(allocation, store, tmp_path):
    """Every rank under mpirun on both nodes saves in the grace period, once. (Node 2's
    ranks run under Open MPI's daemon, a job step mpirun started there. These test nodes
    share one PID namespace and srun passes the environment on, so node 1's agent sees
    them too, as its own; on separate machines the launcher's `agent.py --term` step
    reaches them, which the SSH test checks.)"""
    (tmp_path / "saver.py").write_text(SAVER)
    spec = _spec(
        tmp_path,
        f"""\
        command: python {tmp_path / "saver.py"} {tmp_path}
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, process_count_per_instance: 2}}
    """,
    )
    ready = [tmp_path / f"ready-{rank}" for rank in range(4)]
    code, err = _cancelled_when_ready(spec, store, allocation, ready)
    assert code == 130, err
    for rank in range(4):
        assert (tmp_path / f"rank-{rank}.txt").read_text() == "term\nsaved\n", rank


def _cancelled_when_ready(spec: Path, store, allocation: dict, ready: list[Path]):
    """`jupyter distrun run SPEC` inside the allocation, Ctrl-C once every `ready` file
    exists: its exit code and stderr."""
    import os
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--store", str(store.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **allocation},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not all(path.exists() for path in ready):
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks never got ready"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("mpi_args", ["[--gloo]", "[]"])
def test_horovodrun_reaches_the_other_node_through_slurm(
    mpi_args, allocation, slurm_cluster, store, tmp_path
):
    """horovodrun --gloo starts its remote ranks with `ssh`: the job's own `ssh`, which is
    srun (no SSH exists in these nodes); its MPI controller's mpirun uses Slurm's launcher."""
    spec = _spec(
        tmp_path,
        f"""\
        code: {EXAMPLES / "src"}
        command: python horovod_train.py
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, launcher: horovodrun, process_count_per_instance: 2,
                       mpi_args: {mpi_args}}}
    """,
    )
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=180)
    reports = _four_reports(done, store)
    for rank, report in reports.items():
        assert report["size"] == 4 and report["allreduce"] == 10.0
        assert report["host"] == f"sln{rank // 2 + 1}" and report["local_rank"] == rank % 2
        assert f"[rank {rank}] RESULT " in done.stdout
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


def test_slurm_job_names_the_allocation_to_run_in(allocation, slurm_cluster, store, tmp_path):
    """From outside any allocation (no SLURM_JOB_ID), `--slurm-job ID` runs in that one; an
    id Slurm does not know is one line, and nothing starts."""
    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 2}\n")
    env = {k: v for k, v in allocation.items() if k != "SLURM_JOB_ID"}
    held = allocation["SLURM_JOB_ID"]
    done = run_cli("run", str(spec), "--slurm-job", held, store=store, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["[rank 0] sln1", "[rank 1] sln2"]
    assert slurm_cluster.jobs() == [held]  # named, not asked for: still held afterwards
    gone = run_cli("run", str(spec), "--slurm-job", "99999", store=store, env=env, timeout=120)
    assert gone.returncode == 2 and len(store.jobs()) == 1
    line = gone.stderr.strip()
    assert "\n" not in line and line.startswith("error: slurm: ") and "99999" in line, line


def test_without_slurm_commands_the_slurm_backend_says_so_in_one_line(store, tmp_path):
    import os
    import sys

    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 2}\n")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, no Slurm
    env.pop("SLURM_JOB_ID", None)
    done = run_cli("run", str(spec), "--backend", "slurm", store=store, env=env)
    assert done.returncode == 2 and store.jobs() == []
    assert done.stderr.strip() == (
        "error: slurm: salloc not found on PATH (is Slurm's client installed?)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("front", ["flag", "spec"])
def test_a_time_limit_slurm_would_refuse_is_one_line_before_slurm_is_asked(front, store, tmp_path):
    """--time (`backend: {time: ...}`) is checked when the job is planned, against Slurm's
    formats: a run, a plan and an sbatch export all refuse it alike, where salloc (or the
    exported script, once submitted) refused it later. Slurm's own forms pass."""
    body = "command: hostname\nresources: {instance_count: 2}\n"
    for limit in ("90", "1:30", "01:00:00", "2-12", "2-12:30", "2-12:30:15", "UNLIMITED"):
        spec = _spec(tmp_path, body + f"backend: {{type: slurm, time: '{limit}'}}\n")
        done = run_cli("export", str(spec), "--to", "sbatch", store=store)
        assert done.returncode == 0, (limit, done.stderr)
        assert f"#SBATCH --time={limit}" in done.stdout, limit
    expected = (
        "error: backend: time: '1h' is not valid; expected MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM, D-HH:MM:SS or UNLIMITED (--time)\n"
    )
    if front == "flag":
        spec = _spec(tmp_path, body)
        asked = [("run", str(spec), "--backend", "slurm", "--time", "1h"),
                 ("plan", str(spec), "--backend", "slurm", "--time", "1h"),
                 ("export", str(spec), "--to", "sbatch", "--time", "1h")]  # fmt: skip
    else:
        spec = _spec(tmp_path, body + "backend: {type: slurm, time: 1h}\n")
        asked = [("run", str(spec)), ("plan", str(spec)), ("export", str(spec), "--to", "sbatch")]
    for argv in asked:
        done = run_cli(*argv, store=store)
        assert (done.returncode, done.stderr) == (2, expected), argv
    assert store.jobs() == []


def _long_job_inside(allocation: dict, store, tmp_path: Path) -> subprocess.Popen:
    """`jupyter distrun run` of LONG_JOB inside the allocation, once its 4 ranks started
    (its stderr piped)."""

    from helpers import LONG_JOB

    spec = tmp_path / "long.yml"
    spec.write_text(LONG_JOB)
    proc, _ = _started_inside(allocation, spec, store, stderr=subprocess.PIPE)
    return proc


def _started_inside(allocation: dict, spec: Path, store, **kwargs):
    """helpers.start_cli_run of `spec`, its launcher inside the allocation."""
    import os

    from helpers import start_cli_run

    saved = dict(os.environ)
    os.environ.update(allocation)
    try:
        return start_cli_run(spec, store, **kwargs)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_ctrl_c_stops_every_step_and_leaves_nothing(allocation, slurm_cluster, store, tmp_path):
    import signal

    proc = _long_job_inside(allocation, store, tmp_path)
    assert all(slurm_cluster.pids(n) for n in slurm_cluster.nodes)  # ranks on both nodes
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "cancelled: every process was stopped" in proc.stderr.read()
    _wait_until_nothing_is_left(slurm_cluster, timeout=20)


def test_a_killed_node_agent_fails_the_job_and_leaves_nothing(
    allocation, slurm_cluster, store, tmp_path
):
    """SIGKILL to the agent of one job step: the job fails at once naming the lost agent,
    the other steps are stopped, and nothing is left on either node."""
    import os
    import signal

    proc = _long_job_inside(allocation, store, tmp_path)
    node = slurm_cluster.nodes[1]
    agents = [
        line.split(":", 1)[0]
        for line in _described(slurm_cluster.pids(node))
        if "agent" in line and " -- " in line
    ]
    assert agents, _described(slurm_cluster.pids(node))
    os.kill(int(agents[0]), signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    said = proc.stderr.read()
    assert "lost its node agent" in said and f"on {node.name}" in said, said
    _wait_until_nothing_is_left(slurm_cluster, timeout=20)
    from jupyter_dist.node_side.agent import Cgroup

    # the node was swept: the dead agent's cgroup is gone too (it stayed, empty, before)
    assert [c.folder for c in Cgroup.of_job(store.jobs()[0].job_id)] == []


def test_a_notebook_cell_inside_an_allocation_runs_on_its_nodes(
    allocation, monkeypatch, kernel_env
):
    """A kernel started inside the allocation (as JupyterLab under salloc would start it):
    a plain %%distrun cell runs its ranks as job steps there, with live prefixed output."""
    for name in ("SLURM_CONF", "SLURM_JOB_ID"):
        monkeypatch.setenv(name, allocation[name])
    text = _run_cell_on_slurm(
        "%%distrun --nodes 2 --procs-per-node 2\n"
        "import os, socket\n"
        "print(os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'on', socket.gethostname())\n"
    )
    for rank in range(4):
        assert f"[rank {rank}] {rank} of 4 on sln{rank // 2 + 1}" in text


@pytest.mark.tensorflow
def test_tensorflow_workers_run_as_job_steps_with_their_tf_config(allocation, store, tmp_path):
    spec = _spec(
        tmp_path,
        f"""\
        code: {EXAMPLES / "src"}
        command: python tf_mwms_train.py
        environment_variables: {{OMP_NUM_THREADS: '1'}}
        resources: {{instance_count: 2}}
        distribution: {{type: tensorflow, worker_count: 2}}
    """,
    )
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = result_reports(store, store.jobs()[0].job_id)
    assert [reports[i]["host"] for i in (0, 1)] == ["sln1", "sln2"]
    assert {r["allreduce"] for r in reports.values()} == {3.0}  # both replicas took part
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


@pytest.mark.dask
def test_a_dask_job_runs_its_scheduler_and_workers_as_job_steps(allocation, store, tmp_path):
    spec = _spec(tmp_path, DASK_JOB)
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    record = store.jobs()[0]
    lines = [line.text for line in record.iter_log("client", "stdout")]
    assert lines == ["workers 4 on ['sln1', 'sln2']", "total 328350"]


def test_outside_an_allocation_one_is_asked_for_used_and_given_back(slurm_cluster, store, tmp_path):
    spec = _spec(
        tmp_path,
        """\
        command: echo "rank $RANK on $(hostname) in job $SLURM_JOB_ID"
        resources: {instance_count: 2}
        distribution: {type: pytorch, process_count_per_instance: 2}
    """,
    )
    done = run_cli(
        "run", str(spec), "--backend", "slurm", "--partition", "debug", "--time", "00:05:00",
        store=store, env=slurm_cluster.env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = set(re.findall(r"in job (\d+)", done.stdout))
    assert len(jobs) == 1  # every rank in the one allocation asked for
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} on sln{rank // 2 + 1}" in done.stdout
    assert slurm_cluster.jobs() == []  # given back when the job ended


def test_a_restart_runs_in_the_same_allocation_and_gives_it_back_at_the_end(
    slurm_cluster, store, tmp_path
):
    """A job that asked for its allocation fails once and starts again in it: both attempts'
    ranks run in the one Slurm job, on its nodes, which is given back once the job ends.
    Rank 3 fails its first attempt once every rank has said where it runs (a file each, in
    this test's folder, which the nodes share): failing at once, it could stop a rank that
    had not printed yet."""
    seen = tmp_path / "seen"
    seen.mkdir()
    spec = _spec(
        tmp_path,
        f"""\
        command: >-
          echo "rank $RANK attempt $DISTRUN_RESTART_COUNT on $(hostname) in job $SLURM_JOB_ID";
          touch {seen}/$DISTRUN_RESTART_COUNT-$RANK;
          if [ $RANK = 3 ] && [ $DISTRUN_RESTART_COUNT = 0 ]; then
          for i in $(seq 600); do [ $(ls {seen} | grep -c ^0-) = 4 ] && break; sleep 0.1; done;
          false; fi
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
        limits: {{max_restarts: 1, restart_delay: 0}}
    """,
    )
    done = run_cli(
        "run", str(spec), "--backend", "slurm", "--partition", "debug", "--time", "00:05:00",
        store=store, env=slurm_cluster.env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\u2500\u2500 attempt 2 of 2 \u2500\u2500" in done.stderr
    assert "rank 3 on sln2" in done.stderr  # the first attempt's cause
    jobs = set(re.findall(r"in job (\d+)", done.stdout))
    assert len(jobs) == 1  # both attempts in the one allocation
    for attempt in (0, 1):
        for rank in range(4):
            assert f"rank {rank} attempt {attempt} on sln{rank // 2 + 1} in job" in done.stdout
    assert slurm_cluster.jobs() == []  # given back when the job ended
    _wait_until_nothing_is_left(slurm_cluster)


def test_a_detached_jobs_allocation_never_outlives_its_supervisor(slurm_cluster, store, tmp_path):
    """A detached job asks for its allocation from its supervisor, which holds it (salloc
    runs HOLDER while it lives). A detached job that ends gives it back; so does a killed
    supervisor (SIGKILL: no chance to scancel), and nothing is left on the nodes."""
    import os
    import signal

    spec = tmp_path / "long.yml"
    spec.write_text(LONG_JOB)
    env = slurm_cluster.env
    options = ("--backend", "slurm", "--partition", "debug", "--time", "00:05:00")
    started = run_cli("run", str(spec), "--detach", *options, store=store, env=env, timeout=120)
    assert started.returncode == 0, started.stderr[-3000:]
    record = store.get(started.stdout.strip())
    assert len(slurm_cluster.jobs()) == 1  # its allocation
    os.kill(record.status()["owner_pid"], signal.SIGKILL)
    # given back, by salloc, when its holder's pipe closed; nothing on the nodes
    _wait_until_nothing_is_left(slurm_cluster, jobs_too=True)
    assert effective_state(record.status()) == "lost"


def test_an_salloc_that_stays_after_its_allocation_is_given_back_is_stopped(tmp_path, monkeypatch):
    """release() gives the allocation back (scancel) and ends salloc's command (its input
    closes). An salloc that stays even so (one was found orphaned, spinning a core, 45
    minutes after its test) is stopped: SIGTERM, then SIGKILL. Here salloc is a stand-in
    that ignores both its input's end and SIGTERM; the real one's path is the tests above."""
    import os

    from jupyter_dist.backends import slurm
    from jupyter_dist.spec import spec_from_dict

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "salloc").write_text(
        "#!/bin/bash\ntrap '' TERM\necho 'salloc: Granted job allocation 4242' >&2\n"
        "exec 0<&-\nwhile true; do sleep 0.1; done\n"
    )
    (tools / "scancel").write_text("#!/bin/sh\nexit 0\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(slurm, "HOLDER_EXIT_S", 1.0)
    backend = slurm.SlurmBackend()
    spec = spec_from_dict({"command": "hostname", "resources": {"instance_count": 1}}, ".")
    assert backend._allocate(spec) == "4242"
    backend.allocated = True
    salloc = backend._holder
    backend.release()
    assert salloc.poll() == -9  # stopped, and reaped: TERM was ignored, so KILL
    backend.release()  # idempotent: nothing more to stop


def test_a_bad_partition_is_one_line_naming_the_valid_ones(slurm_cluster, store, tmp_path):
    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 1}\n")
    done = run_cli(
        "run", str(spec), "--partition", "gpu", store=store, env=slurm_cluster.env, timeout=60
    )
    assert done.returncode == 2 and store.jobs() == []
    line = done.stderr.strip()
    assert "\n" not in line and "invalid partition" in line.lower(), line
    assert line.endswith("specified ('gpu'); valid partitions: debug"), line
    assert slurm_cluster.jobs() == []


def test_a_request_no_partition_can_hold_is_refused_at_once(slurm_cluster, store, tmp_path):
    """Slurm would keep it pending for ever (PartitionConfig): withdrawn, in one line."""
    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 5}\n")
    done = run_cli(
        "run", str(spec), "--backend", "slurm", store=store, env=slurm_cluster.env, timeout=60
    )
    assert done.returncode == 2 and store.jobs() == []
    assert done.stderr.strip() == (
        "error: slurm: no allocation for 5 nodes of 1 task: it asks for more than the "
        "partition has (Slurm: PartitionConfig); partitions: debug (2 nodes, 2 CPUs each)"
    )
    assert slurm_cluster.jobs() == []


@pytest.mark.parametrize("inside", [False, True], ids=["allocating", "inside-allocation"])
def test_a_dead_controller_is_one_line_and_starts_nothing(inside, slurm_cluster, store, tmp_path):
    """A client whose controller does not answer (its port closed): Slurm's own reason."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    text = re.sub(
        r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={closed}", slurm_cluster.conf.read_text()
    )
    conf.write_text(text)
    env = {**slurm_cluster.env, "SLURM_CONF": str(conf)}
    args = ["run", str(_spec(tmp_path, "command: hostname\n"))]
    if inside:
        env["SLURM_JOB_ID"] = "4242"
    else:
        args += ["--backend", "slurm"]
    done = run_cli(*args, store=store, env=env, timeout=120)
    assert done.returncode == 2 and store.jobs() == []
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("error: slurm: "), line
    assert line.endswith("Unable to contact slurm controller (connect failure)"), line


def test_an_interrupt_while_pending_gives_the_request_back(allocation, slurm_cluster, tmp_path):
    """Both nodes are held (the allocation fixture): a second request waits, says why, and
    Ctrl-C takes it off the queue; nothing of it remains."""
    import os
    import signal

    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 2}\n"
                 "distribution: {type: pytorch, process_count_per_instance: 2}\n")  # fmt: skip
    proc = _run_in_background(spec, slurm_cluster, tmp_path)
    line = proc.stderr.readline()
    assert re.match(r"slurm: job (\d+) is pending \((Resources|Priority|Nodes.*|None)\)", line), (
        line
    )
    pending = re.match(r"slurm: job (\d+)", line).group(1)
    assert pending in slurm_cluster.jobs()
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    deadline = time.monotonic() + 20
    while pending in slurm_cluster.jobs():
        assert time.monotonic() < deadline, "the pending request was not given back"
        time.sleep(0.2)
    assert slurm_cluster.jobs() == [allocation["SLURM_JOB_ID"]]


def test_a_detached_jobs_pending_request_is_shown_and_an_interrupt_gives_it_back(
    allocation, slurm_cluster, tmp_path
):
    """Detached, the request is its supervisor's: its pending reason still reaches the
    terminal, and Ctrl-C there, before the job runs, stops the supervisor, which takes the
    request off the queue. Nothing of it remains, the supervisor included."""
    import os
    import signal

    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 2}\n"
                 "distribution: {type: pytorch, process_count_per_instance: 2}\n")  # fmt: skip
    proc = _run_in_background(spec, slurm_cluster, tmp_path, "--detach")
    line = proc.stderr.readline()
    found = re.match(r"slurm: job (\d+) is pending \((Resources|Priority|Nodes.*|None)\)", line)
    assert found, line
    pending = found.group(1)
    supervisors = _supervisors()
    assert len(supervisors) == 1
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    deadline = time.monotonic() + 20
    while pending in slurm_cluster.jobs() or _supervisors():
        assert time.monotonic() < deadline, (slurm_cluster.jobs(), _supervisors())
        time.sleep(0.2)
    assert slurm_cluster.jobs() == [allocation["SLURM_JOB_ID"]]
    assert list((tmp_path / "jobs").glob("*/status.json")) == []  # never planned: no job


def _supervisors() -> list[int]:
    """This machine's jupyter-dist supervisors."""
    import psutil

    return [
        p.pid for p in psutil.process_iter(["cmdline"])
        if "jupyter_dist.run.supervisor" in (p.info["cmdline"] or [])
    ]  # fmt: skip


def test_a_pending_request_runs_once_the_nodes_are_free(allocation, slurm_cluster, tmp_path):
    """Both nodes are held: the request says why it waits, then, once they are given back,
    that it was granted, and the job runs."""

    spec = _spec(tmp_path, "command: hostname\nresources: {instance_count: 2}\n")
    proc = _run_in_background(spec, slurm_cluster, tmp_path)
    first = proc.stderr.readline()
    pending = re.match(r"slurm: job (\d+) is pending \((Resources|Priority|Nodes.*)\)", first)
    assert pending, first
    slurm_cluster.run("scancel", allocation["SLURM_JOB_ID"])  # the holder gives its nodes back
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, first + err
    assert re.search(rf"^slurm: job {pending.group(1)} granted after \d+ s$", err, re.M), err
    assert sorted(out.splitlines()) == ["[rank 0] sln1", "[rank 1] sln2"], out
    assert slurm_cluster.jobs() == []


def test_a_notebook_cell_asks_for_an_allocation_runs_ddp_and_gives_it_back(
    slurm_cluster, monkeypatch, kernel_env
):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    text = _run_cell_on_slurm(
        "%%distrun --backend slurm --nodes 2 --procs-per-node 2 --env GLOO_SOCKET_IFNAME=eth0\n"
        "import socket, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "total = torch.tensor([float(dist.get_rank())])\n"
        "dist.all_reduce(total)\n"
        "print(dist.get_rank(), 'on', socket.gethostname(), 'sum', total.item())\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    for rank in range(4):
        assert f"[rank {rank}] {rank} on sln{rank // 2 + 1} sum 6.0" in text
    deadline = time.monotonic() + 30  # scancel returns before Slurm ends the job (KillWait)
    while slurm_cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.jobs() == []  # the allocation was given back


def _run_cell_on_slurm(cell: str) -> str:
    """A notebook with this %%distrun cell, run in a real kernel: what the cell printed,
    once its banner said the 2x2 job runs on the slurm backend."""
    from helpers import execute_notebook, stream_text

    text = stream_text(execute_notebook(cell).cells[1])
    assert re.search(r"job \S+: 4 ranks on 2 nodes \(slurm\)\n", text), text
    return text


def test_the_form_asks_slurm_for_its_partition_and_runs_there(
    slurm_cluster, monkeypatch, kernel_env
):
    """The submission form's "Where it runs" controls: backend slurm, a partition and a time
    limit, in the previewed spec and in the allocation the ranks run in."""
    from helpers import execute_notebook, stream_text

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    nb = execute_notebook(
        "from jupyter_dist.widgets.form import SubmitForm\nf = SubmitForm()\n"
        'f.script.value = \'import os, socket\\nprint(os.environ["RANK"], socket.gethostname(),'
        ' os.environ["SLURM_JOB_PARTITION"])\'\n'
        "f.nodes.value = 2\nf.procs_per_node.value = 1\nf.backend.value = 'slurm'\n"
        "f.slurm['partition'].value = 'debug'\nf.slurm['time'].value = '00:05:00'\n"
        "print(f.problem.value == '', f.preview.value)",
        "result = f.submit()\nprint(result.state)\n"
        "from jupyter_dist.widgets.live import LiveView\nprint(LiveView.last.text())",
    )
    preview, ran = (stream_text(cell) for cell in nb.cells[1:])
    assert preview.startswith("True ")
    assert "backend:\n  type: slurm\n  partition: debug\n  time: 00:05:00" in preview
    assert ran.startswith("succeeded\n"), ran
    assert "[rank 0] 0 sln1 debug" in ran and "[rank 1] 1 sln2 debug" in ran
    deadline = time.monotonic() + 30  # scancel returns before Slurm ends the job (KillWait)
    while slurm_cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.jobs() == []  # the allocation was given back


def test_a_kernel_interrupt_stops_every_step_and_the_kernel_lives_on(
    allocation, slurm_cluster, monkeypatch, kernel_env
):
    """A cell's job inside an allocation, interrupted from the notebook (the kernel's
    SIGINT): every step stops, nothing of the job is left on a node, the kernel runs on."""

    for name, value in allocation.items():
        monkeypatch.setenv(name, value)
    with running_kernel() as (km, kc):
        msg_id = kc.execute("%%distrun --nodes 2 --procs-per-node 2\nimport time\n"
                            "print('started', flush=True)\ntime.sleep(300)\n")  # fmt: skip
        assert await_text(kc, "started", 4, timeout=90) == 4
        assert all(slurm_cluster.pids(node) for node in slurm_cluster.nodes)
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        _wait_until_nothing_is_left(slurm_cluster)
        assert kc.execute_interactive("print(6 * 7)", timeout=30)["content"]["status"] == "ok"


def test_stacks_of_a_hung_job_are_read_through_job_steps(allocation, store, tmp_path):
    """Rank 2 hangs in load_batch while the others wait in all_reduce: `jupyter distrun
    stacks` from another terminal reaches the owner (`run` inside the allocation), which
    reads every node through a step of the allocation."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import time\nimport torch\nimport torch.distributed as dist\n\n"
        "def load_batch():\n    time.sleep(3600)\n\n"
        "dist.init_process_group('gloo')\nprint('READY', flush=True)\n"
        "if dist.get_rank() == 2:\n    load_batch()\ndist.all_reduce(torch.ones(1))\n"
    )
    spec = _spec(
        tmp_path,
        f"""\
        code: {tmp_path}
        command: python hang.py
        environment_variables: {{GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: "1"}}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
    """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--store", str(store.root)],
        env=allocation, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            records = store.jobs()
            ready = records and sum(
                1 for key in records[0].log_keys()
                for line in records[0].iter_log(key, "stdout") if line.text == "READY"
            )  # fmt: skip
            if ready == 4:
                break
            time.sleep(0.3)
        else:
            pytest.fail("the ranks never all said READY")
        time.sleep(1)
        done = run_cli("stacks", records[0].job_id, "--brief", store=store, timeout=90)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "rank 2 (sln2): hang.py:6 in load_batch ← hang.py:11 in <module>" in lines, lines
        assert any(
            line.startswith("ranks 0-1, 3 (sln1, sln2): torch/distributed/distributed_c10d.py")
            for line in lines
        ), lines
        assert "read with py-spy" in lines[0]  # a command job: only py-spy reads it
    finally:
        proc.terminate()
        proc.wait(60)


def test_outputs_on_a_clusters_shared_filesystem_are_in_the_store(allocation, store, tmp_path):
    """Slurm's nodes see this machine's files: each rank writes its output straight into the
    store's job folder, which `inspect` names (nothing to copy)."""
    spec = _spec(
        tmp_path,
        """\
        command: echo $SLURMD_NODENAME > ${{outputs.model}}/rank-$RANK
        outputs: {model: {type: uri_folder}}
        resources: {instance_count: 2}
    """,
    )
    done = run_cli("run", str(spec), store=store, env=allocation, timeout=120)
    assert done.returncode == 0, done.stderr
    (record,) = store.jobs()
    model = record.path / "outputs" / "model"
    assert sorted(p.read_text().strip() for p in model.iterdir()) == ["sln1", "sln2"]
    shown = run_cli("inspect", record.job_id, store=store, env={**allocation, "COLUMNS": "300"})
    assert f"Output: outputs.model: {model}" in shown.stdout, shown.stdout
    assert "copied" not in shown.stdout


def test_a_paused_rank_in_a_job_step_is_stepped_from_a_terminal(allocation, store, tmp_path):
    """breakpoint() in rank 3 (on sln2) of a job run inside an allocation: listed on its
    node, `p x` answered through the owner's link to the node, `c`, and the job succeeds.
    Rank 0 spins in a loop: `--interrupt` pauses it there, through the same link."""
    script = tmp_path / "bp.py"
    script.write_text(
        "import os\nrank = int(os.environ['RANK'])\nprint('started', flush=True)\n"
        "x = 40 + rank\nif rank == 3:\n    breakpoint()\n    x += 100\n"
        "spin = rank == 0\nwhile spin:\n    x += 1\nprint('x is', x)\n"
    )
    spec = _spec(
        tmp_path,
        f"""\
        command: python {script}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
    """,
    )
    proc, job_id = _started_inside(allocation, spec, store)
    try:
        found = paused_ranks(store, job_id, 1)
        assert [(p["rank"], p["node"]) for p in found] == [(3, "sln2")], found
        looked = run_cli("debug", job_id, "--rank", "3", "--do", "p x", store=store)
        assert looked.stdout == "43\n", looked.stderr
        run_cli("debug", job_id, "--rank", "3", "--do", "c", store=store)
        stopped = run_cli("debug", job_id, "--interrupt", "--rank", "0", store=store)
        assert stopped.returncode == 0, stopped.stderr
        assert re.fullmatch(r"rank 0 \(sln1\): \S+bp\.py:(9|10) in <module> \(interrupt\)\n",
                            stopped.stdout), stopped.stdout  # fmt: skip
        run_cli("debug", job_id, "--rank", "0", "--do", "spin = False; x = 0", store=store)
        run_cli("debug", job_id, "--rank", "0", "--do", "c", store=store)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = [line.text for line in store.get(job_id).iter_log("rank-3", "stdout")]
    assert said[-1] == "x is 143"
    said = [line.text for line in store.get(job_id).iter_log("rank-0", "stdout")]
    assert said[-1] in ("x is 0", "x is 1"), said  # set, or set and the loop's line ran once
