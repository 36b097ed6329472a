"""The REST API of the server extension, in a real Jupyter server (pytest-jupyter), over
real jobs in the store."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from helpers import LONG_JOB, job_processes, paused_ranks, run_cli, start_cli_run, strict_json
from tornado.httpclient import HTTPClientError

from jupyter_dist.run.launch import run
from jupyter_dist.run.requests import wait_until_ended
from jupyter_dist.spec import load_spec, parse_spec
from jupyter_dist.store import JobStore

pytest_plugins = ["pytest_jupyter.jupyter_server"]

ENDPOINTS = [
    ("GET", "distrun/nodes"),
    ("GET", "distrun/nodes/usage"),
    ("GET", "distrun/nodes/pools"),
    ("GET", "distrun/jobs"),
    ("GET", "distrun/jobs/some-job"),
    ("GET", "distrun/jobs/some-job/logs"),
    ("POST", "distrun/jobs/some-job/cancel"),
    ("POST", "distrun/jobs/some-job/stacks"),
    ("GET", "distrun/jobs/some-job/stacks"),
    ("GET", "distrun/jobs/some-job/debug"),
    ("POST", "distrun/jobs/some-job/debug"),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    """The store the server reads: set before the server starts."""
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "distrun"))
    monkeypatch.delenv("DISTRUN_NODES_FILE", raising=False)
    return tmp_path / "distrun"


@pytest.fixture
def jp_server_config(home):
    return {"ServerApp": {"jpserver_extensions": {"jupyter_dist": True}}}


def _spec(tmp_path: Path, text: str):
    path = tmp_path / f"job{time.monotonic_ns()}.yml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path)


async def _json(jp_fetch, *parts, method="GET", body=None, **kwargs):
    """The reply's code and body, read as strictly as a browser reads JSON."""
    if body is None and method == "POST":
        body = b""
    reply = await jp_fetch(*parts, method=method, body=body, **kwargs)
    return reply.code, strict_json(reply.body)


async def _error(jp_fetch, *parts, method="GET", body=None, **kwargs) -> tuple[int, str]:
    if body is None and method == "POST":
        body = b""
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch(*parts, method=method, body=body, **kwargs)
    response = caught.value.response
    message = json.loads(response.body).get("message", "") if response.body else ""
    return caught.value.code, message


@pytest.mark.parametrize("headers", [{"Authorization": ""}, {"Authorization": "token wrong"}])
async def test_every_endpoint_refuses_a_request_without_the_token(jp_fetch, headers):
    for method, path in ENDPOINTS:
        code, _ = await _error(jp_fetch, path, method=method, headers=headers)
        assert code == 403, f"{method} {path} answered {code} without the token"


async def test_jobs_job_and_logs_of_real_jobs(jp_fetch, home, tmp_path):
    store = JobStore()
    assert store.root == home / "jobs"
    good = _spec(
        tmp_path,
        """\
        command: 'for i in $(seq 1 3000); do echo "line $i of rank $RANK"; done; echo oops >&2'
        resources: {instance_count: 2}
        distribution: {type: pytorch, process_count_per_instance: 2}
        """,
    )
    bad = _spec(
        tmp_path,
        """\
        command: python -c "import os, sys; r = os.environ['RANK']; sys.exit(3 if r == '1' else 0)"
        resources: {instance_count: 1}
        distribution: {type: pytorch, process_count_per_instance: 2}
        display_name: breaks
        """,
    )
    ok_result = run(good, store=store)
    bad_result = run(bad, store=store)
    assert ok_result.ok and not bad_result.ok

    code, jobs = await _json(jp_fetch, "distrun", "jobs")
    assert code == 200
    assert [j["job_id"] for j in jobs] == [bad_result.job_id, ok_result.job_id]  # newest first
    assert [j["state"] for j in jobs] == ["failed", "succeeded"]
    assert jobs[0]["name"] == "breaks" and jobs[0]["type"] == "pytorch"
    assert jobs[0]["root_cause"].startswith("rank 1 on local0 (127.0.0.1) exited with code 3")
    assert jobs[1]["processes"] == 4 and jobs[1]["nodes"] == ["local0", "local1"]
    assert jobs[1]["root_cause"] is None and jobs[1]["ended"] >= jobs[1]["started"]
    code, newest = await _json(jp_fetch, "distrun", "jobs", params={"limit": "1"})
    assert [j["job_id"] for j in newest] == [bad_result.job_id]

    code, job = await _json(jp_fetch, "distrun", "jobs", ok_result.job_id[:-2])  # a prefix
    assert job["job_id"] == ok_result.job_id
    assert [p["rank"] for p in job["processes"]] == ["0", "1", "2", "3"]
    assert {p["status"] for p in job["processes"]} == {"succeeded"}
    assert job["log_keys"] == ["rank-0", "rank-1", "rank-2", "rank-3"]
    assert "process_count_per_instance: 2" in job["spec"]

    # Read rank 2's log in pages: every line exactly once, in order, stderr merged in.
    seen, cursor = [], "0.0"
    for _ in range(10):
        params = {"rank": "2", "offset": cursor, "limit": "700"}
        code, page = await _json(
            jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params=params
        )
        assert page["key"] == "rank-2" and page["state"] == "succeeded"
        seen += page["lines"]
        cursor = page["next"]
        if not page["lines"]:
            break
    # Each stream in order, every line once; where stderr falls among stdout lines is the
    # time it was read, which two pipes cannot order exactly.
    stdout = [line["text"] for line in seen if line["stream"] == "stdout"]
    assert stdout == [f"line {i} of rank 2" for i in range(1, 3001)]
    assert [line["text"] for line in seen if line["stream"] == "stderr"] == ["oops"]
    assert len(seen) == 3001

    params = {"rank": "3", "limit": "20000"}
    code, whole = await _json(jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params=params)
    assert len(whole["lines"]) == 3001
    params = {"rank": "3", "tail": "3"}
    code, last = await _json(jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params=params)
    assert last["lines"] == whole["lines"][-3:] and last["next"] == whole["next"]
    params = {"rank": "3", "offset": last["next"]}
    code, after = await _json(jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params=params)
    assert after["lines"] == [] and after["next"] == last["next"]

    code, message = await _error(jp_fetch, "distrun", "jobs", "nope")
    assert code == 404 and "no job 'nope'" in message
    code, message = await _error(
        jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params={"rank": "9"}
    )
    assert code == 400 and "rank-0, rank-1, rank-2, rank-3" in message
    code, message = await _error(
        jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params={"rank": "0", "offset": "x"}
    )
    assert code == 400 and "log cursor 'x' is not valid" in message
    code, message = await _error(
        jp_fetch, "distrun", "jobs", ok_result.job_id, "logs", params={"rank": "0", "limit": "0"}
    )
    assert code == 400 and "limit='0' is not valid" in message
    code, message = await _error(jp_fetch, "distrun", "jobs", params={"limit": "many"})
    assert code == 400 and "limit='many' is not valid; give a number 1-20000" in message


@pytest.mark.slow
async def test_cancel_reaches_the_process_that_owns_the_job(jp_fetch, home, tmp_path):
    spec = tmp_path / "long.yml"
    spec.write_text(LONG_JOB)
    store = JobStore()
    proc, job_id = await asyncio.to_thread(start_cli_run, spec, store, stderr=subprocess.PIPE)
    assert len(job_processes(job_id)) >= 8
    code, jobs = await _json(jp_fetch, "distrun", "jobs")
    assert [j["state"] for j in jobs] == ["running"]

    code, reply = await _json(jp_fetch, "distrun", "jobs", job_id, "cancel", method="POST")
    assert code == 202 and reply["message"] == "asked to stop"
    _out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert "cancelled from JupyterLab" in err
    assert job_processes(job_id) == []
    code, job = await _json(jp_fetch, "distrun", "jobs", job_id)
    assert job["state"] == "cancelled"
    assert {p["status"] for p in job["processes"]} == {"stopped"}

    code, reply = await _json(jp_fetch, "distrun", "jobs", job_id, "cancel", method="POST")
    assert code == 200 and reply["state"] == "cancelled"
    # Ended, its outputs still being copied by a live owner (this process stands in; the
    # copy's own cancel is test_outputs'): the cancel is taken, and said to stop the copy.
    record = store.get(job_id)
    status = {**record.status(), "copying_outputs": True, "owner_pid": os.getpid(),
              "owner_host": socket.gethostname()}  # fmt: skip
    record.write_status(status)
    code, reply = await _json(jp_fetch, "distrun", "jobs", job_id, "cancel", method="POST")
    assert (code, reply["message"]) == (202, "asked to stop copying its outputs")
    assert (record.path / "cancel.json").is_file()


@pytest.mark.slow
async def test_a_detached_job_is_listed_read_and_cancelled_like_any(jp_fetch, home, tmp_path):
    """What the sidebar shows of a detached job: it runs, its supervisor (no kernel, no
    terminal) answers the Stacks and Cancel buttons' requests."""
    spec = tmp_path / "long.yml"
    spec.write_text(LONG_JOB)
    store = JobStore()
    done = await asyncio.to_thread(run_cli, "run", str(spec), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    code, jobs = await _json(jp_fetch, "distrun", "jobs")
    assert [(j["job_id"], j["state"]) for j in jobs] == [(job_id, "running")]
    code, dump = await _json(jp_fetch, "distrun", "jobs", job_id, "stacks", method="POST")
    assert code == 200 and dump["heading"].startswith(f"Stacks of job {job_id}")
    code, reply = await _json(jp_fetch, "distrun", "jobs", job_id, "cancel", method="POST")
    assert code == 202 and reply["message"] == "asked to stop"
    state = await asyncio.to_thread(wait_until_ended, store.get(job_id), 30)
    assert state == "cancelled" and job_processes(job_id) == []


@pytest.mark.slow
async def test_stacks_are_read_by_the_jobs_owner_and_kept(jp_fetch, home, tmp_path):
    """The sidebar's and the live view's Stacks button: the owner (a `jupyter distrun run`
    in a terminal) reads every rank and the reply carries the grouped summary."""
    spec = tmp_path / "waits.yml"
    spec.write_text(
        "command: python waits.py\n"
        f"code: {tmp_path}\n"
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    (tmp_path / "waits.py").write_text(
        "import os, time\n"
        "def wait_for_data():\n"
        "    time.sleep(300)\n"
        "print('started', flush=True)\n"
        "if os.environ['RANK'] == '3':\n"
        "    wait_for_data()\n"
        "time.sleep(300)\n"
    )
    store = JobStore()
    proc, job_id = await asyncio.to_thread(start_cli_run, spec, store)
    try:
        code, error = await _error(jp_fetch, "distrun", "jobs", job_id, "stacks")
        assert code == 404 and error == f"no stacks were taken of job {job_id}"
        code, error = await _error(
            jp_fetch, "distrun", "jobs", job_id, "stacks", method="POST", params={"method": "gdb"}
        )
        assert code == 400 and "unknown stack method 'gdb'; use one of auto" in error
        code, dump = await _json(jp_fetch, "distrun", "jobs", job_id, "stacks", method="POST")
        assert code == 200 and sorted(p["rank"] for p in dump["processes"]) == [0, 1, 2, 3]
        assert dump["summary"][0] == (
            "rank 3 (local1): waits.py:3 in wait_for_data ← waits.py:6 in <module>"
        )
        assert dump["summary"][1] == "ranks 0-2 (local0, local1): waits.py:7 in <module>"
        assert dump["heading"].startswith(f"Stacks of job {job_id}: 4 Python processes")
        assert "        time.sleep(300)" in dump["text"]
        code, last = await _json(jp_fetch, "distrun", "jobs", job_id, "stacks")
        assert last["summary"] == dump["summary"]
    finally:
        proc.terminate()  # `kill`: the run stops its job as Ctrl-C would
        await asyncio.to_thread(proc.wait, 30)
    assert proc.returncode == 130 and job_processes(job_id) == []
    code, error = await _error(jp_fetch, "distrun", "jobs", job_id, "stacks", method="POST")
    assert code == 400 and "stacks are read from a running job" in error


@pytest.mark.slow
async def test_the_debug_endpoint_lists_paused_ranks_and_steps_them(jp_fetch, home, tmp_path):
    """The live view's console: rank 1 of a terminal's job waits at breakpoint(); the
    server lists it and sends it pdb commands through the job's owner; bad input is one
    line in a 400; `c` lets the job end as it would have."""
    (tmp_path / "bp.py").write_text(
        "import os\n"
        "rank = int(os.environ['RANK'])\n"
        "print('started', flush=True)\n"
        "x = 40 + rank\n"
        "if rank == 1:\n"
        "    breakpoint()\n"
        "print(f'rank {rank} x {x}', flush=True)\n"
    )
    spec = tmp_path / "bp.yml"
    spec.write_text(f"command: python bp.py\ncode: {tmp_path}\nresources: {{instance_count: 2}}\n")
    store = JobStore()
    proc, job_id = await asyncio.to_thread(start_cli_run, spec, store, ranks=2)
    try:
        await asyncio.to_thread(paused_ranks, store, job_id, 1)
        code, listed = await _json(jp_fetch, "distrun", "jobs", job_id, "debug")
        assert code == 200 and listed["problems"] == []
        assert [
            (p["rank"], p["node"], p["line"], p["function"], p["reason"]) for p in listed["paused"]
        ] == [(1, "local1", 7, "<module>", "breakpoint")]

        async def debug(body):
            return await _json(jp_fetch, "distrun", "jobs", job_id, "debug", method="POST",
                               body=json.dumps(body))  # fmt: skip

        code, reply = await debug({"command": "p x * 2", "ranks": "1"})
        (answered,) = reply["answers"]
        assert code == 200 and answered == {
            "rank": 1, "pid": answered["pid"], "answer": "82\n", "paused": True,
            "state": "paused",
        }  # fmt: skip
        for body, message in (
            (b"{not json", '{"command": "p x", "ranks": "0,2-3"}'),
            (b"\xff\xfe", '{"command": "p x", "ranks": "0,2-3"}'),
            (json.dumps({"command": 3}), '"command" (a pdb command) and "ranks"'),
            (
                json.dumps({"command": "p x", "ranks": "0-x"}),
                "ranks: '0-x' is not a set of ranks (e.g. 3, 0,2-3 or all)",
            ),
            (json.dumps({"command": "p x\np y", "ranks": "1"}), "a pdb command is one line"),
            (
                json.dumps({"command": "p x", "ranks": "0"}),
                f"rank 0 of job {job_id} is not paused (paused: 1)",
            ),
        ):
            code, error = await _error(
                jp_fetch, "distrun", "jobs", job_id, "debug", method="POST", body=body
            )
            assert code == 400 and message in error, (body, code, error)
        code, reply = await debug({"command": "c", "ranks": "all"})
        assert code == 200 and reply["answers"][0]["paused"] is False
        done = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, done
        assert "rank 1 x 41" in done[0]
    finally:
        if proc.poll() is None:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)
    assert job_processes(job_id) == []
    code, error = await _error(jp_fetch, "distrun", "jobs", job_id, "debug")
    assert code == 400 and "only a running job's ranks pause" in error


@pytest.mark.slow
async def test_the_pools_endpoint_lists_this_machines_pools(jp_fetch, home, monkeypatch):
    """The sidebar's pools: after a job that preloads json, the local machine's pool is
    listed with its modules and idle time; once stopped (after the answer is no longer
    reused), none is."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="dp", dir="/tmp")  # short: a socket's path must be
    monkeypatch.setenv("TMPDIR", folder)  # where the listing looks, as the job's
    try:
        spec = parse_spec(
            "command: python -c 'print(1)'\npreload: json\n"
            f"environment_variables: {{TMPDIR: {folder}}}\n"
        )
        result = await asyncio.to_thread(run, spec, store=JobStore())
        assert result.ok, result.describe()
        code, found = await _json(jp_fetch, "distrun", "nodes", "pools")
        assert code == 200
        ((node, pools, problem),) = [(n["node"], n["pools"], n["problem"]) for n in found["nodes"]]
        assert (node, problem) == ("this machine", None)
        assert [(p["modules"], p["ranks"], p["idle_limit"]) for p in pools] == [(["json"], 0, 600)]
        assert pools[0]["rss"] > 0 and pools[0]["idle"] >= 0
        stopped = await asyncio.to_thread(run_cli, "pool", "stop")
        assert stopped.returncode == 0, stopped.stderr
        deadline = time.monotonic() + 20  # the last answer is reused for POOLS_TTL
        while time.monotonic() < deadline:
            code, found = await _json(jp_fetch, "distrun", "nodes", "pools")
            if found["nodes"][0]["pools"] == []:
                break
            await asyncio.sleep(0.5)
        assert found["nodes"][0]["pools"] == [], found
    finally:
        await asyncio.to_thread(run_cli, "pool", "stop")
        shutil.rmtree(folder, ignore_errors=True)


async def test_nodes_without_an_inventory_are_local(jp_fetch):
    code, nodes = await _json(jp_fetch, "distrun", "nodes")
    assert code == 200 and nodes == {"source": None, "local": True, "nodes": []}


async def test_a_slow_node_check_never_blocks_other_requests(jp_fetch, tmp_path, monkeypatch):
    """A node that accepts TCP but never speaks SSH holds the health check; the jobs list
    must still answer meanwhile (the check runs in a thread, not on the event loop)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    nodes_file = tmp_path / "nodes.yml"
    nodes_file.write_text(f"nodes:\n  - {{name: mute, host: 127.0.0.1, port: {port}}}\n")
    monkeypatch.setenv("DISTRUN_NODES_FILE", str(nodes_file))
    check = asyncio.ensure_future(_json(jp_fetch, "distrun", "nodes", request_timeout=60))
    await asyncio.sleep(0.5)
    code, _ = await _json(jp_fetch, "distrun", "jobs")
    assert code == 200
    assert not check.done(), "the node check finished before the jobs list: nothing was proven"
    accepted = silent.accept()[0]  # close both ends: the check fails at once
    accepted.close()
    silent.close()
    code, nodes = await check
    assert nodes["local"] is False and nodes["source"] == str(nodes_file)
    (mute,) = nodes["nodes"]
    assert mute["status"] == "unreachable" and mute["problem"]


@pytest.mark.ssh
async def test_nodes_health_of_real_ssh_nodes(jp_fetch, ssh_nodes, tmp_path, monkeypatch):
    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    monkeypatch.setenv("DISTRUN_NODES_FILE", str(inventory))
    code, nodes = await _json(jp_fetch, "distrun", "nodes")
    assert code == 200
    assert [n["name"] for n in nodes["nodes"]] == [n.name for n in ssh_nodes.nodes]
    assert {n["status"] for n in nodes["nodes"]} == {"ok"}
    assert all(n["python"] and n["latency_ms"] is not None for n in nodes["nodes"])


async def test_a_damaged_job_and_an_impossible_id_never_make_a_500(jp_fetch, home, tmp_path):
    store = JobStore()
    done = run(_spec(tmp_path, "command: echo hi\n"), store=store)
    (store.root / done.job_id / "status.json").write_bytes(b"\xff\xfe\x00")
    code, jobs = await _json(jp_fetch, "distrun", "jobs")
    assert code == 200 and [job["state"] for job in jobs] == ["damaged"]
    # Valid JSON can be damaged too: an owner pid past any pid, a start that is NaN.
    for damage in ({"state": "running", "owner_pid": 2**31}, {"started": float("nan")}):
        other = run(_spec(tmp_path, "command: echo hi\n"), store=store)
        path = store.root / other.job_id / "status.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
        code, jobs = await _json(jp_fetch, "distrun", "jobs")
        assert code == 200 and jobs[0]["state"] == "damaged", jobs
        code, detail = await _json(jp_fetch, "distrun", "jobs", other.job_id)
        assert code == 200 and detail["state"] == "damaged"
    code, message = await _error(jp_fetch, "distrun", "jobs", "x" * 5000)
    assert code == 404 and "a job id is letters, digits" in message
    # A FIFO in place of a file is damage too, never a handler waiting for ever: more
    # requests than the handlers' pool has threads all answer.
    fifo = run(_spec(tmp_path, "command: echo hi\n"), store=store)
    for name in ("status.json", "metrics.jsonl", "usage.jsonl"):
        (store.root / fifo.job_id / name).unlink(missing_ok=True)
        os.mkfifo(store.root / fifo.job_id / name, 0o600)
    for _ in range(8):
        code, jobs = await asyncio.wait_for(_json(jp_fetch, "distrun", "jobs"), 30)
        assert code == 200 and jobs[0]["state"] == "damaged", jobs
    code, detail = await asyncio.wait_for(_json(jp_fetch, "distrun", "jobs", fifo.job_id), 30)
    assert code == 200 and detail["state"] == "damaged"


async def test_the_job_detail_masks_secret_values(jp_fetch, home, tmp_path):
    store = JobStore()
    done = run(_spec(tmp_path, """\
        command: echo hi
        environment_variables: {HF_TOKEN: hf_abcdef123, MY_VAR: visible}
        """), store=store)  # fmt: skip
    code, job = await _json(jp_fetch, "distrun", "jobs", done.job_id)
    text = json.dumps(job)
    assert code == 200 and "hf_abcdef123" not in text
    assert "HF_TOKEN: '****'" in job["spec"] and "visible" in text


@pytest.mark.slow
async def test_nodes_usage_sums_the_running_jobs_processes_per_node(jp_fetch, home, tmp_path):
    """The sidebar's sparklines: node 0's rank spins, node 1's sleeps; a node's CPU and
    memory come from its agents' stored reports, and an ended job's are not shown."""
    spec = tmp_path / "spin.yml"
    command = (
        'echo started; if [ "$NODE_RANK" = 0 ]; then exec python -c "while True: pass"; '
        "else exec sleep 300; fi"
    )
    spec.write_text(
        f"command: {json.dumps(command)}\nresources: {{instance_count: 2}}\n"
        "distribution: {type: pytorch}\n"
    )
    store = JobStore()
    proc, job_id = await asyncio.to_thread(start_cli_run, spec, store, ranks=2)
    try:
        deadline = time.monotonic() + 40
        while True:  # reports are stored every 5 s; two make a share of CPU
            code, usage = await _json(jp_fetch, "distrun", "nodes", "usage")
            cpu = {n: [v for v in s["cpu"] if v is not None] for n, s in usage["nodes"].items()}
            if len(cpu.get("local1", [])) >= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        assert code == 200 and usage["bucket"] == 5.0
        assert sorted(usage["nodes"]) == ["local0", "local1"]
        assert len(usage["nodes"]["local0"]["cpu"]) == 24
        # Spinning vs sleeping: the spinner gets the share of a core the scheduler gives it
        # (34 % was seen with another worker's jobs beside it), the sleeper none at all.
        assert cpu["local0"][-1] > 5 and cpu["local1"][-1] < 5, cpu
        assert all(v > 1 << 20 for v in usage["nodes"]["local0"]["rss"] if v is not None)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
    code, usage = await _json(jp_fetch, "distrun", "nodes", "usage")
    assert usage["nodes"] == {}  # the job ended: nothing runs on the nodes
    assert job_processes(job_id) == []


@pytest.mark.slow
async def test_hostile_requests_get_a_400_and_the_server_keeps_answering(jp_fetch, home, tmp_path):
    """Found by the probe: digits int() refuses (`²`), a 5,000-digit limit, an offset past
    2^63 answered 500; a FIFO named like a log hung a handler thread per read (four hung
    the pool, and every endpoint with it); a mid-line offset returned a cut line; an alias
    bomb in a stored spec.yml took gigabytes to show."""
    result = run(_spec(tmp_path, "command: echo one; echo two\n"), store=JobStore())
    job = result.job_id
    for name, value in (("limit", "²"), ("limit", "9" * 5000), ("offset", f"{2**64}.0"),
                        ("offset", "1.-1"), ("tail", "१")):  # fmt: skip
        params = {"rank": "0", name: value}
        code, message = await _error(jp_fetch, "distrun", "jobs", job, "logs", params=params)
        assert code == 400 and "not valid" in message, (name, value, code, message)
    code, message = await _error(jp_fetch, "distrun", "jobs", params={"limit": "²"})
    assert code == 400 and "limit" in message
    # A cursor in the middle of a line gives the next whole line, never a piece of one.
    first = (home / "jobs" / job / "logs" / "rank-0.stdout.log").read_bytes().split(b"\n")[0]
    params = {"rank": "0", "offset": "5.0"}
    _, page = await _json(jp_fetch, "distrun", "jobs", job, "logs", params=params)
    assert [line["text"] for line in page["lines"]] == ["two"], (first, page)
    # A FIFO where a log should be: a clear answer at once, however often it is asked.
    logs = home / "jobs" / job / "logs"
    (logs / "rank-0.stderr.log").unlink(missing_ok=True)
    import os

    os.mkfifo(logs / "rank-0.stderr.log")
    for _ in range(6):
        code, message = await asyncio.wait_for(
            _error(jp_fetch, "distrun", "jobs", job, "logs", params={"rank": "0"}), timeout=10
        )
        assert code == 400 and "not a regular file" in message, message
    code, _ = await _json(jp_fetch, "distrun", "jobs")
    assert code == 200  # the handler pool is free
    # An alias bomb in spec.yml: the job still shows at once, its spec left out.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    (home / "jobs" / job / "spec.yml").write_text(bomb)
    code, detail = await asyncio.wait_for(_json(jp_fetch, "distrun", "jobs", job), timeout=30)
    assert code == 200 and detail["spec"] == ""


@pytest.mark.slow
async def test_the_job_list_carries_a_running_jobs_latest_metrics_and_progress(
    jp_fetch, home, tmp_path
):
    """What the sidebar shows beside a running job: each metric's latest value (the mean
    over its ranks; one gone to NaN by its name, as JSON has no NaN) and the slowest rank's
    progress; nothing of it once the job ended."""
    spec = tmp_path / "metrics.yml"
    spec.write_text(
        "command: >-\n"
        '  python -c "import os, sys, time; from distrun import report, flush;\n'
        "  rank = int(os.environ['RANK']); report(step=1, loss=1.0 + rank, gone=float('nan'));\n"
        "  flush();\n"
        "  sys.stderr.write(f' {5 + rank}/100 [00:01<00:09, 9.50it/s]|\\n'); sys.stderr.flush();\n"
        '  time.sleep(60)"\n'
        "resources: {instance_count: 2}\n"
    )
    store = JobStore()
    done = await asyncio.to_thread(run_cli, "run", str(spec), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while True:  # the ranks' reports come in one by one: wait for both
            _, (job,) = await _json(jp_fetch, "distrun", "jobs")
            metrics = job.get("metrics")
            if metrics == {"loss": 1.5, "gone": "NaN"} and job.get("progress") == "5/100":
                break
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.2)
    finally:
        await _json(jp_fetch, "distrun", "jobs", job_id, "cancel", method="POST")
    assert await asyncio.to_thread(wait_until_ended, store.get(job_id), 30) == "cancelled"
    _, (job,) = await _json(jp_fetch, "distrun", "jobs")
    assert "metrics" not in job and "progress" not in job
