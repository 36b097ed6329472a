"""Every rank's stack of a hung job, grouped (issue 15, part 1): real torch.distributed jobs
in which rank 2 sleeps in `load_batch` while the others wait in `all_reduce`, read with py-spy
and with the faulthandler fallback, on local nodes, under torchrun and mpirun, over SSH, in a
warm session; asked from the job's owner and from another process (the CLI)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers import HANG_SCRIPT, execute_notebook, job_processes, run_cli, stream_text

from jupyter_dist.diagnose.stacks import STACKS_SOURCE, StackDump
from jupyter_dist.errors import DistrunError
from jupyter_dist.run.launch import launch
from jupyter_dist.run.session import Session, SessionEnded
from jupyter_dist.spec import parse_spec

pytestmark = pytest.mark.torch


def _hang_spec(launcher: str = "per_process", env: dict | None = None):
    return parse_spec(yaml.safe_dump({
        "script": HANG_SCRIPT,
        "environment_variables": {"OMP_NUM_THREADS": "1", **(env or {})},
        "resources": {"instance_count": 2},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2,
                         "launcher": launcher},
    }))  # fmt: skip


def _wait_ready(job, ranks: int = 4, timeout: float = 90) -> None:
    """Until every rank printed READY (each then sleeps or blocks in all_reduce)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = sum(
            1 for key in job.record.log_keys()
            for line in job.record.iter_log(key, "stdout") if line.text == "READY"
        )  # fmt: skip
        if ready >= ranks:
            time.sleep(0.5)  # from print to all_reduce
            return
        time.sleep(0.2)
    pytest.fail(f"the ranks never all said READY: {job.record.log_keys()}")


def _assert_hang_grouped(dump: StackDump, method: str, nodes: tuple[str, str]) -> None:
    """Rank 2 alone, first, in load_batch; ranks 0, 1, 3 together in all_reduce."""
    ranks = [g for g in dump.groups() if all(m.rank is not None for m in g.members)]
    assert [sorted(m.rank for m in g.members) for g in ranks] == [[2], [0, 1, 3]], dump.format()
    odd, rest = ranks
    assert odd.summary().startswith(f"rank 2 ({nodes[1]}): script.py:6 in load_batch ← "), (
        dump.format()
    )
    assert rest.summary().startswith(
        f"ranks 0-1, 3 ({nodes[0]}, {nodes[1]}): torch/distributed/distributed_c10d.py:"
    )
    assert " in all_reduce ← " in rest.summary() and "script.py:12 in <module>" in rest.summary()
    assert {m.method for g in ranks for m in g.members} == {method}
    main = odd.sample.threads[0]
    assert main["main"] and main["frames"][0]["code"].startswith("time.sleep(3600)")
    # jupyter-dist's own runner is not part of what the user sees
    assert all("cell_runner" not in f["file"] for g in ranks for f in g.sample.threads[0]["frames"])
    text = dump.format()
    assert text.index("rank 2 (") < text.index("ranks 0-1, 3 (")  # the odd one first
    assert f"read with {method}" in text.splitlines()[0] or "and" in text.splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "method"),
    [("per_process", "faulthandler"), ("per_process", "py-spy"), ("torchrun", "auto")],
)
def test_stacks_of_a_hung_job_on_local_nodes(launcher, method, store):
    job = launch(_hang_spec(launcher), store=store, grace_period=2)
    try:
        _wait_ready(job)
        dump = job.watch.stacks(method)
        _assert_hang_grouped(dump, "py-spy" if method == "auto" else method, ("local0", "local1"))
        if launcher == "torchrun":  # the two elastic agents are Python too: read, not skipped
            agents = [p for p in dump.processes if p.label == "torchrun"]
            assert len(agents) == 2 and all(a.method == "py-spy" for a in agents), dump.format()
        # stored with the job: the CLI's --last and inspect print it
        last = run_cli("stacks", job.job_id, "--last", "--brief", store=store)
        assert last.returncode == 0, last.stderr
        assert "rank 2 (local1): script.py:6 in load_batch" in last.stdout
        assert "\n    " not in last.stdout  # --brief: one line per group
    finally:
        job.cancel()
        job.wait(60)
    assert job_processes(job.job_id) == []
    inspect = run_cli("inspect", job.job_id, store=store)
    assert "rank 2 (local1): script.py:6 in load_batch" in inspect.stdout
    ended = run_cli("stacks", job.job_id, store=store)  # asking an ended job: one line
    assert ended.returncode == 2 and "stacks are read from a running job" in ended.stderr
    assert "Traceback" not in ended.stderr


@pytest.mark.slow
def test_the_cli_asks_the_jobs_owner_from_another_process(store):
    """`jupyter distrun stacks JOB` in a terminal: the owner (this process) reads the stacks
    and hands them over through the store, all of it, with source lines."""
    job = launch(_hang_spec(), store=store, grace_period=2)
    try:
        _wait_ready(job)
        done = run_cli("stacks", job.job_id, "--method", "faulthandler", store=store)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"Stacks of job {job.job_id}: 4 Python processes on 2 nodes")
        assert "rank 2 (local1): script.py:6 in load_batch ← script.py:11 in <module>" in lines
        assert "        time.sleep(3600)  # this rank's data never comes" in lines
        as_json = json.loads(run_cli("stacks", job.job_id, "--json", store=store).stdout)
        assert sorted(p["rank"] for p in as_json["processes"]) == [0, 1, 2, 3]
    finally:
        job.cancel()
        job.wait(60)


@pytest.mark.slow
def test_a_command_jobs_own_python_answers_the_fallback_too(store, tmp_path):
    """`python script.py` under torchrun, not a cell: the startup hook every Python of the
    job imports (its sitecustomize) registered the stack signal, so faulthandler reads
    every rank, and the torchrun agents too; a sitecustomize of the user's still runs."""
    (tmp_path / "script.py").write_text(HANG_SCRIPT)
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    spec = parse_spec(yaml.safe_dump({
        "code": str(tmp_path),
        "command": "python -c 'import os; print(\"site:\", os.environ.get(\"USER_SITE_RAN\"))'"
                   " && python script.py",
        "environment_variables": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(own)},
        "resources": {"instance_count": 2},
        "distribution": {"type": "pytorch", "process_count_per_instance": 2,
                         "launcher": "torchrun"},
    }))  # fmt: skip
    job = launch(spec, store=store, grace_period=2)
    try:
        _wait_ready(job)
        dump = job.watch.stacks("faulthandler")
        _assert_hang_grouped(dump, "faulthandler", ("local0", "local1"))
        agents = [p for p in dump.processes if p.label == "torchrun"]
        assert len(agents) == 2 and all(a.method == "faulthandler" for a in agents)
    finally:
        job.cancel()
        job.wait(60)
    for rank in range(4):
        lines = [e.text for e in job.record.iter_log(f"rank-{rank}", "stdout")]
        assert lines[0] == "site: yes", lines  # the hidden sitecustomize ran as well
    assert job_processes(job.job_id) == []


@pytest.mark.slow
def test_a_process_jupyter_dist_did_not_wrap_is_reported_and_left_alive(store, tmp_path):
    """A `python -I` rank ignores PYTHONPATH, so it registered no stack signal: without
    py-spy its stack is reported unreadable (not skipped), and nothing is signalled that
    would kill it."""
    spec = parse_spec(
        "command: python -I -c 'import time; print(\"READY\", flush=True); time.sleep(300)'\n"
        "resources: {instance_count: 1}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    job = launch(spec, store=store, grace_period=2)
    try:
        _wait_ready(job, ranks=2)
        dump = job.watch.stacks("faulthandler")
        assert sorted(p.rank for p in dump.processes) == [0, 1]
        for proc in dump.processes:
            assert proc.method is None and "registered no stack signal" in proc.error
        (group,) = dump.groups()
        assert group.summary().startswith("ranks 0-1 (local0): stack not read: ")
        time.sleep(0.5)
        assert job.state == "running" and all(p.state == "running" for p in job.processes.values())
        by_py_spy = job.watch.stacks("py-spy")
        assert all(p.method == "py-spy" and p.threads for p in by_py_spy.processes)
    finally:
        job.cancel()
        job.wait(60)


@pytest.mark.slow
def test_stacks_of_ranks_under_mpirun(store):
    """mpirun's ranks (found by the job id mpirun forwards), labelled by their MPI rank;
    mpirun itself is named as not Python."""
    spec = parse_spec(yaml.safe_dump({
        "script": textwrap.dedent("""\
            import time
            from mpi4py import MPI

            def load_batch():
                time.sleep(3600)

            comm = MPI.COMM_WORLD
            print("READY", flush=True)
            if comm.Get_rank() == 1:
                load_batch()
            comm.barrier()
        """),
        "resources": {"instance_count": 2},
        "distribution": {"type": "mpi", "process_count_per_instance": 2},
    }))  # fmt: skip
    job = launch(spec, store=store, grace_period=2)
    try:
        _wait_ready(job)
        dump = job.watch.stacks("faulthandler")
        groups = dump.groups()
        assert [sorted(m.rank for m in g.members) for g in groups] == [[1], [0, 2, 3]]
        assert groups[0].summary().startswith("rank 1 (local0): script.py:5 in load_batch")
        assert any(o.startswith("mpirun (local0, pid ") for o in dump.others), dump.others
    finally:
        job.cancel()
        job.wait(60)
    assert job_processes(job.job_id) == []


def test_stacks_across_ssh_nodes(ssh_nodes, store, tmp_path):
    """The same hang over SSH: the collector runs on each node through the job's
    connections; ranks 2 and 3 are on node1."""
    spec = _hang_spec(env={"GLOO_SOCKET_IFNAME": "eth0"})
    inventory = ssh_nodes.load_inventory(tmp_path)
    job = launch(spec, store=store, inventory=inventory, grace_period=2)
    try:
        _wait_ready(job)
        dump = job.watch.stacks("auto")
        assert dump.problems == []
        _assert_hang_grouped(dump, "py-spy", ("node0", "node1"))
        fallback = job.watch.stacks("faulthandler")
        _assert_hang_grouped(fallback, "faulthandler", ("node0", "node1"))
    finally:
        job.cancel()
        job.wait(60)


def test_stacks_of_a_warm_session_while_a_cell_runs(store):
    """A session's ranks (session workers) answer too; the cell's frames are there."""
    session = Session.start(
        parse_spec(yaml.safe_dump({
            "command": "unused",
            "environment_variables": {"OMP_NUM_THREADS": "1"},
            "resources": {"instance_count": 1},
            "distribution": {"type": "pytorch", "process_count_per_instance": 2},
        })),
        store=store,
    )  # fmt: skip
    try:
        import threading

        code = "import time\ndef wait_here():\n    time.sleep(3600)\nwait_here()\n"

        def run_cell() -> None:
            with contextlib.suppress(SessionEnded):  # it never ends: the session is stopped
                session.run_cell(code)

        runner = threading.Thread(target=run_cell, daemon=True)
        runner.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            dump = session.job.watch.stacks("faulthandler")
            if all(p.threads and p.threads[0]["frames"] for p in dump.processes):
                frames = [p.threads[0]["frames"] for p in dump.processes]
                if all(f[0]["function"] == "wait_here" for f in frames):
                    break
            time.sleep(0.3)
        else:
            pytest.fail(dump.format())
        (group,) = dump.groups()
        assert group.who() == "ranks 0-1 (local0)"
        assert all("session_worker" not in f["file"] for f in frames[0])
    finally:
        session.stop()


def test_the_collector_never_signals_a_process_without_the_handler(tmp_path):
    """Run on a node as it is: a process that carries the job's id and a stacks file but
    no handler for the signal is reported, and lives on."""
    job_id = "stacks-unit-test"
    env = {**os.environ, "DISTRUN_JOB_ID": job_id, "DISTRUN_JOB_DIR": str(tmp_path)}
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        (tmp_path / "stacks").mkdir()
        tag = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:13]
        (tmp_path / "stacks" / f"{tag}-{victim.pid}-sig40.txt").touch()
        time.sleep(0.3)
        out = subprocess.run(
            [sys.executable, "-c", STACKS_SOURCE, job_id, "faulthandler"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        (found,) = json.loads(out)["processes"]
        assert found["pid"] == victim.pid and "no longer handled" in found["error"]
        assert victim.poll() is None
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


def test_an_unknown_method_is_one_line(store):
    from jupyter_dist.diagnose.stacks import take_stacks

    with pytest.raises(DistrunError, match="unknown stack method 'gdb'; use one of auto, py-spy"):
        take_stacks(lambda *a: (0, "", ""), [], "x", "gdb")


@pytest.mark.slow
def test_percent_distrun_stacks_from_another_kernel(kernel_env):
    """`%distrun stacks JOB` in a notebook whose kernel did not start the job (a second
    notebook beside the hung one): its owner answers through the store."""
    from jupyter_dist.store import JobStore

    job = launch(_hang_spec(), store=JobStore(kernel_env), grace_period=2)
    try:
        _wait_ready(job)
        nb = execute_notebook(
            f"%distrun stacks {job.job_id} --brief", "%distrun stacks", allow_errors=True
        )
        text = stream_text(nb.cells[1])
        assert "rank 2 (local1): script.py:6 in load_batch ← script.py:11 in <module>" in text
        assert "ranks 0-1, 3 (local0, local1): torch/distributed/distributed_c10d.py:" in text
        error = nb.cells[2].outputs[0]  # no JOB, and none ran in that kernel: one line
        assert error.ename == "DistrunError" and "no job has run in this kernel" in error.evalue
    finally:
        job.cancel()
        job.wait(60)
