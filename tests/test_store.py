"""The store is private and never breaks a listing: job folders 0700 and files 0600
whatever the umask; a damaged job shows as damaged while the others list normally; a
progress bar's "\\r" stays inside its line; an id that cannot be one is not looked for."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli

from jupyter_dist.errors import DamagedJob
from jupyter_dist.plan.model import LaunchPlan
from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec
from jupyter_dist.store import JobStore, UnknownJob


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _job(store, command: str | None = "echo hi", extra: str = ""):
    code = f"command: {json.dumps(command)}\n" if command else ""
    spec = parse_spec(
        f"{code}environment_variables: {{API_TOKEN: s3cr3t}}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: 2}}\n{extra}"
    )
    return run(spec, store=store, grace_period=1)


def test_the_store_is_private_whatever_the_umask(store):
    old = os.umask(0o022)
    try:
        result = _job(store, None, extra="script: print('x')\n")
    finally:
        os.umask(old)
    assert result.state == "succeeded", result.describe()
    job = store.get(result.job_id).path
    assert _mode(store.root) == _mode(job) == _mode(job / "logs") == 0o700
    files = [job / "spec.yml", job / "plan.json", job / "status.json",
             *sorted((job / "logs").iterdir())]  # fmt: skip
    assert len(files) > 4 and {_mode(f) for f in files} == {0o600}
    assert (job / "script.py").exists()  # the cell, inside the private folder
    # Each Python process's stack dump file goes with it when nothing was dumped into it
    # (every rank of every attempt left one, empty).
    assert list((job / "stacks").glob("*")) == []


@pytest.mark.slow
def test_a_store_that_cannot_be_a_folder_is_one_line(tmp_path):
    """A file where the store should be, or under it: one line naming the store and what to
    change, from the CLI and from DISTRUN_HOME; nothing is written."""
    spec = tmp_path / "job.yml"
    spec.write_text("command: echo hi\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("kept\n")
    change = "; choose another with --store, or DISTRUN_HOME\n"
    done = run_cli("run", str(spec), "--store", str(a_file))
    assert (done.returncode, done.stderr) == (
        2, f"error: the job store {a_file} is a file, not a folder{change}"
    )  # fmt: skip
    done = run_cli("run", str(spec), env={**os.environ, "DISTRUN_HOME": str(a_file)})
    assert (done.returncode, done.stderr) == (
        2, f"error: the job store {a_file}/jobs cannot be made (Not a directory){change}"
    )  # fmt: skip
    assert a_file.read_text() == "kept\n"


@pytest.mark.slow
def test_every_feature_keeps_the_store_private(kernel_env):
    """Jobs of every kind and feature on local nodes, whose job folders are the store's: a
    cell with -o, a session with -i/-o (its history of cells), stacks of a hung job through
    the startup hook (pyhook/, stacks/), an MPI job (its hostfile), a Dask job, a job that
    started again (its plan rewritten, its logs marked), a detached session, a job with
    outputs (a folder with a subfolder, a file), a job forked from a pool (its shims, the
    script it ships, its list of forked ranks) and the pools' own folder. Then nothing in the whole
    store is open to the group or others (pyhook/ and stacks/ were 0755 with 0644 files).
    (A paused rank's debug/ files, there only while it is paused, are walked by
    tests/test_debug.py meanwhile.)"""
    from helpers import DASK_JOB, HANG_SCRIPT, execute_notebook, not_private

    from jupyter_dist.run.launch import launch

    old = os.umask(0o022)  # what most machines have
    try:
        nb = execute_notebook(
            "y = 41",
            "%%distrun --nodes 2 -i y -o x\nfrom distrun import report\nreport(step=1, y=y)\n"
            "x = y",  # its metrics.jsonl too
            "%distrun session start --nodes 1 --procs-per-node 2",
            "%%distrun -i y -o z\nz = y + 1",
            "%distrun session stop",
            "%%distrun --type dask --nodes 1 -p 1 --threads 1\n",  # an interactive cluster
            "print(client.submit(lambda: 6 * 7).result())",
            "%distrun dask stop",
            "%%distrun --detach --nodes 2\nprint('detached')",  # its supervisor's log too
            "%distrun session start --detach --nodes 1 --name kept",  # its session/ folder
            "%%distrun\nprint('in a detached session')",
            "%distrun session stop kept",
            "%%distrun --nodes 2 --preload json\nprint('forked')",  # pyhook/distrun_pool.py,
            "%distrun pool stop",  # distrun-pool-bin/, pool-forks/ (and the pool's folder)
            # the store's preload.json gone: the Python jobs below start cold, no pool left
            "%%distrun --nodes 1 --preload none\nprint('cold')",
        )
        assert "forked" in str(nb.cells[13].outputs) and "json" in str(nb.cells[14].outputs)
        assert nb.cells[7].outputs[0]["text"] == "42\n"  # the cluster served its client
        store = JobStore(kernel_env)
        hang = parse_spec(json.dumps({
            "script": HANG_SCRIPT, "environment_variables": {"OMP_NUM_THREADS": "1"},
            "resources": {"instance_count": 2},
            "distribution": {"type": "pytorch", "process_count_per_instance": 2},
        }))  # fmt: skip
        job = launch(hang, store=store, grace_period=1)
        try:
            deadline = time.monotonic() + 90
            while sum(line.text == "READY" for key in job.record.log_keys()
                      for line in job.record.iter_log(key, "stdout")) < 4:  # fmt: skip
                assert time.monotonic() < deadline, "the hung job never said READY"
                time.sleep(0.2)
            time.sleep(0.5)  # from print to the wait
            dump = job.watch.stacks(method="faulthandler")
            assert len(dump.groups()) >= 1
        finally:
            job.cancel()
            job.wait(60)
        mpi = parse_spec(
            "command: hostname\nresources: {instance_count: 2}\n"
            "distribution: {type: mpi, process_count_per_instance: 1}\n"
        )
        torchrun = parse_spec(  # its per-worker logs, as torchrun writes them
            "command: 'true'\nresources: {instance_count: 2}\n"
            "distribution: {type: pytorch, process_count_per_instance: 2, launcher: torchrun}\n"
        )
        restarted = parse_spec(  # fails once, then succeeds: a second attempt's files
            "command: '[ $RANK = 0 ] || [ $DISTRUN_RESTART_COUNT = 1 ]'\n"
            "resources: {instance_count: 2}\nlimits: {max_restarts: 1, restart_delay: 0}\n"
        )
        outputs = parse_spec(  # a folder and a file, written with the umask above
            "command: mkdir -p ${{outputs.model}}/part && echo w > ${{outputs.model}}/part/w "
            "&& echo s > ${{outputs.summary}}\n"
            "outputs: {model: {}, summary: {type: uri_file}}\nresources: {instance_count: 2}\n"
        )
        for spec in (mpi, parse_spec(DASK_JOB), torchrun, restarted, outputs):
            result = run(spec, store=store, grace_period=1)
            assert result.ok, result.describe()
            if spec is restarted:
                assert len(result.attempts) == 1  # it started again
    finally:
        os.umask(old)
    from jupyter_dist.run.requests import wait_until_ended

    assert [wait_until_ended(record, 60) for record in store.jobs()].count("succeeded") >= 10
    jobs = [record.path for record in store.jobs()]
    assert len(jobs) == 13, jobs
    made = {p.name for job in jobs for p in job.rglob("*")}
    assert {
        "pyhook",
        "stacks",
        "out",
        "push.b64",
        "sitecustomize.py",
        "torchrun-1",
        "supervisor.log",
        "session.json",
        "cells.jsonl",  # a session's history (run/session_history.py)
        "metrics.jsonl",
        "outputs",
        "part",
        "summary",
        "distrun_pool.py",
        "distrun_pool_protocol.py",
        "distrun_pool_front.py",
        "distrun_pool_agent.py",
        "distrun-pool-bin",  # a job forked from a pool (node_side/pool_agent.py)
    } <= made, made
    assert any(name.startswith("cell-") for name in made) and "hostfile" in " ".join(made)
    assert not_private(store.root) == []
    from jupyter_dist.node_side.pool_protocol import pools_folder

    assert not_private(Path(pools_folder())) == []  # its socket, lock and description


@pytest.mark.slow
def test_a_damaged_job_shows_as_damaged_and_the_others_list(store):
    good = _job(store).job_id
    bad = _job(store).job_id
    broken_plan = _job(store).job_id
    (store.root / bad / "status.json").write_bytes(b"\xff\xfe\x00garbage")
    (store.root / broken_plan / "plan.json").write_text('{"processes": [{"name": 3}]}')
    listed = run_cli("jobs", "--json", store=store)
    assert listed.returncode == 0, listed.stderr
    states = {job["job_id"]: job["state"] for job in json.loads(listed.stdout)}
    assert states == {good: "succeeded", bad: "damaged", broken_plan: "succeeded"}
    table = run_cli("jobs", store=store)
    assert table.returncode == 0 and "damaged" in table.stdout
    for command in (["inspect", broken_plan], ["cancel", bad]):
        done = run_cli(*command, store=store)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "damaged" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(DamagedJob, match=r"plan\.json is damaged"):
        LaunchPlan.from_dict(store.get(broken_plan).plan())
    (store.root / good / "status.json").write_text('{"state": "failed", "root_cause": "x"}')
    assert store.get(good).status()["state"] == "damaged"  # not a root cause: not shown


@pytest.mark.slow
def test_a_progress_bar_stays_in_its_line_and_logs_show_its_last_state(store):
    bar = "import sys; sys.stdout.write('10%\\r50%\\r100%\\n'); print('done')"
    result = _job(store, f"{sys.executable} -c {json.dumps(bar)}")
    record = store.get(result.job_id)
    assert [line.text for line in record.iter_log("rank-0", "stdout")] == [
        "10%\r50%\r100%", "done",
    ]  # fmt: skip
    done = run_cli("logs", result.job_id, "--rank", "0", store=store)
    assert done.stdout == "100%\ndone\n"


@pytest.mark.parametrize("job_id", ["x" * 5000, "..", "a/../b", "a b"])
def test_an_id_that_cannot_be_one_is_unknown_not_an_error(store, job_id):
    _job(store)
    with pytest.raises(UnknownJob, match="a job id is letters, digits"):
        store.get(job_id)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 60])  # lines under one chunk, and over many
def test_usage_since_reads_the_end_of_a_long_file_and_gives_what_the_whole_does(
    store, monkeypatch, processes
):
    """The sidebar asks for the last two minutes of a job's usage.jsonl every few seconds:
    read from the end back, it must give what filtering the whole file gives."""
    import jupyter_dist.store as store_module

    record = store.create(store.new_job_id(), "command: x\n", {"processes": []})
    ranks = {str(r): [1.5, 2**20] for r in range(8)}
    for step in range(200):  # 1000 s of samples, every 5 s per process, a little out of order
        for p in range(processes):
            t = 1000.0 + step * 5 + (p % 3) * 0.7
            record.append_usage({"t": t, "p": f"rank-{p}", "cpu": step, "rss": 1, "ranks": ranks})
    read = []
    real_tail = store_module._tail_since
    monkeypatch.setattr(store_module, "_tail_since", lambda h, s: read.append(
        len(data := real_tail(h, s))) or data)  # fmt: skip
    size = (record.path / "usage.jsonl").stat().st_size
    for since in (1000.0, 1500.0, 1950.0, 1994.5, 5000.0):
        whole = [s for s in record.usage() if s["t"] >= since]
        assert record.usage(since=since) == whole, since
    assert read[-2] < size / 10 or processes == 1  # the last 5 s: not the whole file


# Damage that is valid JSON (or a file of the wrong kind): each broke `jobs` for every job,
# or inspect, cancel, stacks or logs of the job (found by the probe).
_DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000
DAMAGE = {
    "root cause with an unknown field": (
        "status.json",
        {"state": "failed", "root_cause": {"bogus": 1}},
    ),
    "root cause missing fields": (
        "status.json",
        {"state": "failed", "root_cause": {"process": "rank-0"}},
    ),
    "an owner pid past any pid": ("status.json", {"state": "running", "owner_pid": 2**31}),
    "a start far in the future": ("status.json", {"started": 1e300}),
    "a start that is not a number": ("status.json", {"started": float("nan")}),
    "a process that is a number": ("status.json", {"processes": {"rank-0": 3}}),
    "a status nested 100k deep": ("status.json", _DEEP),
    "garbage usage": ("usage.jsonl", '3\n[]\n{"t": "x"}\n{"p": 1, "t": 5}\n{\n'),
    "garbage stacks": ("stacks.json", '{"job_id": 1, "processes": [3]}'),
    "stacks that are a list": ("stacks.json", "[]"),
    "a folder named like a log": ("logs/rank-0.stdout.log", "folder"),
    "a FIFO named like a log": ("logs/rank-0.stderr.log", "fifo"),
}


def _damage(job: Path, where: str, what) -> None:
    path = job / where
    if what in ("folder", "fifo"):
        path.unlink(missing_ok=True)
        path.mkdir() if what == "folder" else os.mkfifo(path)
    elif isinstance(what, dict):
        status = json.loads((job / "status.json").read_text())
        path.write_text(json.dumps({**status, **what}))
    else:
        path.write_text(what)


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_that_is_valid_json_never_breaks_a_command(kind, store, capsys):
    """Each kind of damage: jobs (table and JSON) still lists every job, the damaged one
    as damaged where its status is; inspect, cancel, stacks --last and logs of it answer
    with their usual exit codes and at most one line of error, never a traceback."""
    import shutil

    from jupyter_dist import cli

    good = _job(store).job_id
    damaged = good[:-6] + "dddddd"
    shutil.copytree(
        store.root / good, store.root / damaged, ignore=shutil.ignore_patterns(".*.tmp")
    )
    for name in ("status.json", "plan.json"):  # a job of its own, then damaged
        path = store.root / damaged / name
        path.write_text(path.read_text().replace(good, damaged))
    _damage(store.root / damaged, *DAMAGE[kind])
    for argv in (["jobs"], ["jobs", "--json"], ["inspect", damaged], ["stacks", damaged, "--last"],
                 ["logs", damaged], ["cancel", damaged, "--wait", "0"]):  # fmt: skip
        code = cli.main([*argv, "--store", str(store.root)])
        out, err = capsys.readouterr()
        assert code in (0, 1, 2), (argv, code)
        assert "Traceback" not in err and err.count("\n") <= 1, (argv, err)
        if argv[0] == "jobs":
            assert good in out and damaged in out, (argv, out)


@pytest.mark.slow
def test_a_fifo_in_place_of_any_store_file_never_holds_a_reader(store):
    """A FIFO where status.json, plan.json, spec.yml, metrics.jsonl, usage.jsonl or
    stacks.json should be: every command that reads it answers (the job shows as damaged,
    or without what that file held; a folder without a plan is no job), none waits for a
    writer that never comes."""
    names = ["status.json", "plan.json", "spec.yml", "metrics.jsonl", "usage.jsonl",
             "stacks.json"]  # fmt: skip
    jobs = {}
    for name in names:
        job_id = _job(store).job_id
        path = store.root / job_id / name
        path.unlink(missing_ok=True)
        os.mkfifo(path, 0o600)
        jobs[name] = job_id
    listed = run_cli("jobs", "--json", store=store, timeout=30)
    assert listed.returncode == 0, listed.stderr
    states = {job["job_id"]: job["state"] for job in json.loads(listed.stdout)}
    assert states[jobs["status.json"]] == "damaged"
    assert jobs["plan.json"] not in states  # a folder without a plan is no job
    others = [n for n in names if n not in ("status.json", "plan.json")]
    assert {states[jobs[n]] for n in others} == {"succeeded"}
    for name, job_id in jobs.items():
        for command in ("inspect", "metrics", "logs", "stacks"):
            done = run_cli(command, job_id, store=store, timeout=30)  # a hang fails here
            assert "Traceback" not in done.stderr, (name, command, done.stderr)
            assert done.returncode in (0, 2), (name, command, done.stderr)
    metrics = run_cli("metrics", jobs["metrics.jsonl"], store=store, timeout=30)
    assert metrics.returncode == 2
    assert metrics.stderr == (
        f"error: job {jobs['metrics.jsonl']}: its metrics.jsonl is not a regular file\n"
    )
    shown = run_cli("inspect", jobs["usage.jsonl"], store=store, timeout=30)
    assert shown.returncode == 0, shown.stderr


@pytest.mark.slow
@pytest.mark.parametrize("detached", [False, True], ids=["attached", "detached"])
def test_a_store_that_fills_up_stops_the_job_in_one_line_and_leaves_nothing(tmp_path, detached):
    """The store's disk fills while the ranks print (a tmpfs of 1 MiB): the job is stopped
    and fails, saying the store cannot be written and why, where the reader stopped
    reading and the rank hung on a full pipe until killed; no process is left, nor a
    half-written file. Detached, the supervisor's outcome is stored all the same (over the
    old status's blocks: no new file fits), where the job read "lost" once it exited."""
    import re
    import subprocess

    from helpers import job_processes

    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)],
                   check=True)  # fmt: skip
    try:
        store = JobStore(small / "jobs")
        spec = tmp_path / "job.yml"
        command = "python3 -c \"while True: print('x' * 200)\""
        spec.write_text(
            f"command: {json.dumps(command)}\n"
            "distribution: {type: pytorch, process_count_per_instance: 2}\n"
        )
        if detached:
            started = run_cli("run", str(spec), "--detach", store=store, timeout=60)
            assert started.returncode == 0, started.stderr
            job_id = started.stdout.strip()
            done = run_cli("attach", job_id, store=store, timeout=60)  # a hang fails here
        else:
            done = run_cli("run", str(spec), store=store, timeout=60)  # a hang fails here
            job_id = re.match(r"job (\S+):", done.stderr).group(1)
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            rf"Job {job_id} failed: the job store cannot be written \({store.root / job_id}"
            r"\S*: No space left on device\); the job was stopped: free space there, or make "
            r"it writable",
            last,
        ), done.stderr
        assert "Traceback" not in done.stderr
        assert store.get(job_id).status()["state"] == "failed"
        assert job_processes(job_id) == []
        assert list(store.root.rglob("*.tmp")) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
