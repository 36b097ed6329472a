"""Jobs that outlive their front: `run --detach` and `%%distrun --detach` hand the job to a
supervisor of its own and return once every rank runs; `attach` follows it from anywhere
(an interrupt detaches); the job keeps every line through a killed kernel; a killed
supervisor leaves nothing running and the job reads "lost"."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    execute_notebook,
    interrupt_and_reply,
    job_processes,
    not_private,
    run_cli,
    running_kernel,
)

from jupyter_dist.run.requests import request_cancel, wait_until_ended
from jupyter_dist.store import JobStore

pytestmark = pytest.mark.slow  # each starts real jobs and waits for them

# 2 nodes x 2 ranks, each printing `count` numbered lines a tenth of a second apart.
COUNTED = (
    "command: for i in $(seq 1 {count}); do echo line $i of rank $RANK; sleep 0.1; done\n"
    "resources: {{instance_count: 2}}\n"
    "distribution: {{type: pytorch, process_count_per_instance: 2}}\n"
)


def _spec(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "job.yml"
    path.write_text(COUNTED.format(count=count))
    return path


def _every_line(store: JobStore, job_id: str, count: int) -> None:
    record = store.get(job_id)
    for rank in range(4):
        said = [line.text for line in record.iter_log(f"rank-{rank}", "stdout")]
        assert said == [f"line {i} of rank {rank}" for i in range(1, count + 1)], rank


def _detached(tmp_path: Path, store: JobStore, count: int) -> tuple[str, int]:
    done = run_cli("run", str(_spec(tmp_path, count)), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    status = store.get(job_id).status()
    return job_id, status["owner_pid"]


def test_run_detach_returns_while_the_job_runs_and_attach_follows_it_to_its_end(store, tmp_path):
    job_id, supervisor = _detached(tmp_path, store, count=40)
    record = store.get(job_id)
    status = record.status()
    assert status["state"] == "running"  # returned while every rank runs
    assert status["owner_pid"] != os.getpid() and os.path.exists(f"/proc/{supervisor}")
    assert len(job_processes(job_id)) >= 4
    followed = run_cli("attach", job_id, "--tail", "1000", store=store, timeout=60)
    assert followed.returncode == 0, followed.stderr
    for rank in range(4):  # what was stored before it attached, then the rest as it came
        printed = [line for line in followed.stdout.splitlines() if f"of rank {rank}" in line]
        assert printed == [f"[rank {rank}] line {i} of rank {rank}" for i in range(1, 41)]
    assert f"Job {job_id} succeeded" in followed.stderr
    _every_line(store, job_id, 40)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{supervisor}") and time.monotonic() < deadline:
        time.sleep(0.1)  # a supervisor never outlives its job
    assert not os.path.exists(f"/proc/{supervisor}")
    assert not_private(store.root) == []  # its supervisor.log too


def test_an_interrupted_attach_detaches_and_the_job_runs_on(store, tmp_path):
    job_id, _ = _detached(tmp_path, store, count=100)
    attached = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "attach", job_id, "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert "line" in attached.stdout.readline()  # following
    attached.send_signal(signal.SIGINT)
    _, err = attached.communicate(timeout=30)
    assert attached.returncode == 0 and f"detached from job {job_id}; it runs on" in err
    record = store.get(job_id)
    assert record.status()["state"] == "running" and len(job_processes(job_id)) >= 4
    cancelled = run_cli("cancel", job_id, store=store, timeout=60)
    assert cancelled.returncode == 0, cancelled.stderr
    assert record.status()["state"] == "cancelled"
    assert job_processes(job_id) == []


def test_a_killed_supervisor_leaves_nothing_and_the_job_reads_lost(store, tmp_path):
    job_id, supervisor = _detached(tmp_path, store, count=300)
    assert len(job_processes(job_id)) >= 4
    os.kill(supervisor, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes(job_id) == []  # every rank stopped, as when a kernel dies
    listed = json.loads(run_cli("jobs", "--json", store=store).stdout)
    assert [j["state"] for j in listed if j["job_id"] == job_id] == ["lost"]
    followed = run_cli("attach", job_id, "--tail", "3", store=store, timeout=30)
    assert followed.returncode == 1 and f"Job {job_id} lost" in followed.stderr


def test_a_detached_job_that_cannot_start_is_one_line_and_one_that_fails_says_why(store, tmp_path):
    path = tmp_path / "job.yml"
    path.write_text("command: 'true'\ncode: missing-folder\n")
    done = run_cli("run", str(path), "--detach", store=store, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: ") and "missing-folder" in done.stderr
    assert store.jobs() == []  # nothing was started
    path.write_text("command: no-such-program-here\nresources: {instance_count: 2}\n")
    done = run_cli("run", str(path), "--detach", store=store, timeout=60)
    assert done.returncode == 0, done.stderr  # it started: its ranks fail on their own
    followed = run_cli("attach", done.stdout.strip(), store=store, timeout=60)
    assert followed.returncode == 1
    assert "Root cause: rank 0 on local0" in followed.stderr or "Root cause: rank 1" in (
        followed.stderr
    )
    assert "command not found" in followed.stderr
    assert job_processes(done.stdout.strip()) == []


def test_a_detached_cell_outlives_its_kernel_with_every_line(kernel_env):
    """The cell returns while the job runs; the kernel is killed; the job ends on its own
    with every line stored, and another kernel attaches to it and sees its end."""
    store = JobStore(kernel_env)
    with running_kernel() as (km, kc):
        reply = kc.execute_interactive(
            "%%distrun --detach --nodes 2 --procs-per-node 2\n"
            "import os, time\n"
            "for i in range(1, 51):\n"
            "    print(f\"line {i} of rank {os.environ['RANK']}\", flush=True)\n"
            "    time.sleep(0.1)\n",
            timeout=60,
        )
        assert reply["content"]["status"] == "ok"
        (record,) = store.jobs()
        assert record.status()["state"] == "running"  # the cell returned while it runs
        km.shutdown_kernel(now=True)  # the kernel is killed
    assert wait_until_ended(record, 60) == "succeeded"
    _every_line(store, record.job_id, 50)
    nb = execute_notebook(f"%distrun attach {record.job_id} --tail 40")
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "[rank 3] line 50 of rank 3" in text and "succeeded" in text
    assert job_processes(record.job_id) == []


def test_detach_refuses_what_needs_the_kernel(kernel_env):
    nb = execute_notebook(
        "%%distrun --detach -o x\nx = 1",
        "%%distrun --detach --type dask\n",
        "%distrun session attach",
        allow_errors=True,
    )
    errors = [c.outputs[0].get("evalue", "") for c in nb.cells[1:]]
    assert errors[0].startswith("--out needs the cell to wait for the job's end")
    assert errors[1].startswith("--detach applies to a job; an interactive Dask cluster")
    assert errors[2] == (
        "no detached session is open (none is; start one with %distrun session start --detach)"
    )
    assert JobStore(kernel_env).jobs() == []


@contextlib.contextmanager
def _cancelled_at_the_end(store: JobStore):
    """A detached session outlives its kernel by design: one left by a failing test is
    cancelled (its supervisor then stops every rank)."""
    try:
        yield
    finally:
        for record in store.jobs():
            with contextlib.suppress(Exception):
                request_cancel(record, "the test ended")


def test_a_detached_session_keeps_its_ranks_variables_across_a_kernel_restart(kernel_env):
    """`%distrun session start --detach`: its ranks live in a supervisor. A variable set
    by a cell is still there after the kernel restarts and `%distrun session attach`; a
    failing cell fails on its ranks only; -o is refused in one line; `%distrun session
    stop` ends it, and nothing of it is left."""
    store = JobStore(kernel_env)

    def run(kc, code: str) -> tuple[str, dict]:
        out: list[str] = []

        def take(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append(msg["content"]["evalue"])

        reply = kc.execute_interactive(code, timeout=120, output_hook=take)
        return "".join(out), reply["content"]

    with _cancelled_at_the_end(store), running_kernel() as (km, kc):
        said, reply = run(kc, "%distrun session start --detach --nodes 2 --name warm")
        assert reply["status"] == "ok", said
        assert "Session warm ready" in said and "%distrun session attach warm" in said
        said, reply = run(kc, "%%distrun\nimport os\nx = 40 + int(os.environ['RANK'])\n"
                              "print('set', x)")  # fmt: skip
        assert reply["status"] == "ok" and "[rank 1] set 41" in said, said
        (record,) = store.jobs()
        supervisor = record.status()["owner_pid"]
        km.restart_kernel(now=True)  # the kernel goes; the session's ranks do not
        kc.execute_interactive("%load_ext jupyter_dist", timeout=60)
        said, reply = run(kc, "%distrun session attach warm")
        assert reply["status"] == "ok" and "Session warm attached" in said, said
        assert "1 cells run" in said
        said, reply = run(kc, "%%distrun\nprint('x is', x)")
        assert reply["status"] == "ok", said
        assert "[rank 0] x is 40" in said and "[rank 1] x is 41" in said
        said, reply = run(kc, "%%distrun\nimport os\nif os.environ['RANK'] == '1':\n"
                              "    raise ValueError('only rank 1')")  # fmt: skip
        assert reply["status"] == "error" and "rank 1: ValueError: only rank 1" in said, said
        # Post-mortem on that cell, through the supervisor: rank 1's pdb where it raised,
        # with the session's variables, in the notebook's input box; the session goes on.
        typed, shown = iter(["p x", "q", "quit"]), []
        reply = kc.execute_interactive(
            "%distrun debug --rank 1", timeout=120, allow_stdin=True,
            stdin_hook=lambda msg: kc.input(next(typed)),
            output_hook=lambda msg: shown.append(msg["content"].get("text", "")),
        )  # fmt: skip
        lines = "".join(shown).splitlines()
        assert reply["content"]["status"] == "ok", lines
        assert lines[1].startswith("attached to rank 1 (local1): <cell ") and lines[1].endswith(
            " in <module> (post-mortem: ValueError: only rank 1); `detach` comes back"
        ), lines
        assert lines[2:] == ["41", "rank 1 runs on"], lines
        # From a terminal, by script: the session's failed rank listed, and --do there.
        listed = run_cli("debug", record.job_id, "--list", store=store)
        assert "rank 1: its last cell failed (post-mortem)" in listed.stdout, listed
        looked = run_cli("debug", record.job_id, "--rank", "1", "--do", "p x", store=store)
        assert looked.returncode == 0 and looked.stdout == "41\n", looked.stderr
        said, reply = run(kc, "%%distrun -o x\nx")
        assert reply["status"] == "error"
        assert said.startswith("-o/--out: a detached session's values stay on its ranks")
        said, reply = run(kc, "%distrun session")
        assert "warm: 2 ranks on 2 nodes" in said and "3 cells run, detached" in said, said
        said, reply = run(kc, "%distrun session stop")
        assert reply["status"] == "ok" and "Session warm stopped" in said, said
    assert wait_until_ended(record, 30) == "succeeded"
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{supervisor}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{supervisor}")
    assert job_processes(record.job_id) == []
    assert not_private(store.root) == []


def test_the_forms_keep_running_box_detaches_the_job(kernel_env):
    nb = execute_notebook(
        "from jupyter_dist.widgets.form import SubmitForm\nf = SubmitForm()\n"
        "f.script.value = 'print(\"from the form\")'\nf.nodes.value = 2\n"
        "f.controls['detach'].value = True\nimport os\nprint(f.submit(), os.getpid())"
    )
    job_id, kernel = nb.cells[1].outputs[-1]["text"].split()
    record = JobStore(kernel_env).get(job_id)
    assert wait_until_ended(record, 60) == "succeeded"
    assert record.status()["owner_pid"] != int(kernel)  # its supervisor's, not the kernel's
    said = [line.text for line in record.iter_log("rank-1", "stdout")]
    assert said == ["from the form"]


def test_a_detached_cells_live_view_follows_the_job_while_the_kernel_is_free(kernel_env):
    """Under the live view, the detached cell returns while the job runs; the view follows
    it from the store (lines, states, the end) while other cells run. `%distrun attach`
    shows a view of a finished job with its last lines."""
    view = "from jupyter_dist.widgets.live import LiveView\nv = LiveView.last\n"
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --detach --nodes 2 --procs-per-node 2\n"
        "import os, time\n"
        "for i in range(1, 21):\n"
        "    print(f\"line {i} of rank {os.environ['RANK']}\", flush=True)\n"
        "    time.sleep(0.1)\n",
        view + "print(v.state)",  # the kernel is free: this runs while the job does
        view + "import time\ndeadline = time.time() + 60\n"
        "while v.state != 'succeeded' and time.time() < deadline:\n    time.sleep(0.2)\n"
        "print(v.state, v.lines_total, sorted({p['state'] for p in v.processes}))",
        "%distrun attach --tail 5",
        view + "import time\ntime.sleep(1)\nprint(v.state, v.lines_total)",
    )
    said = [cell.outputs[-1]["text"].strip() for cell in nb.cells[3:5]]
    assert said[0] == "running"
    assert said[1] == "succeeded 80 ['succeeded']"  # every line, each rank's end
    assert nb.cells[6].outputs[-1]["text"].strip() == "succeeded 5"


def test_a_detached_sessions_cell_has_its_view_and_an_interrupt_stops_only_that_cell(kernel_env):
    """Under the live view a detached session's cell has its view (its lines, followed
    from the store); the kernel's interrupt reaches the cell's ranks through the
    supervisor, and the session lives on."""
    store = JobStore(kernel_env)
    with _cancelled_at_the_end(store), running_kernel() as (km, kc):
        kc.execute_interactive("%config DistrunMagics.view = 'widget'", timeout=60)
        reply = kc.execute_interactive("%distrun session start --detach --nodes 2", timeout=120)
        assert reply["content"]["status"] == "ok"
        reply = kc.execute_interactive("%%distrun\nprint('in view', flush=True)", timeout=60)
        assert reply["content"]["status"] == "ok"
        shown: list[str] = []
        kc.execute_interactive(
            "from jupyter_dist.widgets.live import LiveView\nv = LiveView.last\n"
            "print(v.state, v.lines_total, v.cell, sorted(p['state'] for p in v.processes))",
            timeout=60, output_hook=lambda m: shown.append(m["content"].get("text", "")),
        )  # fmt: skip
        assert "".join(shown).strip() == "succeeded 2 1 ['succeeded', 'succeeded']"
        msg_id = kc.execute(
            "%%distrun\nimport time\nprint('sleeping', flush=True)\ntime.sleep(120)"
        )
        deadline = time.monotonic() + 60
        (record,) = store.jobs()
        while time.monotonic() < deadline and not any(
            line.text == "sleeping" for line in record.iter_log("rank-1", "stdout")
        ):
            time.sleep(0.1)
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        shown.clear()
        reply = kc.execute_interactive(
            "%%distrun\nprint('still here')", timeout=60,
            output_hook=lambda m: shown.append(str(m["content"])),
        )  # fmt: skip
        assert reply["content"]["status"] == "ok"
        assert record.status()["state"] == "running"
        kc.execute_interactive("%distrun session stop", timeout=60)
    assert wait_until_ended(record, 30) == "succeeded"
    said = [line.text for line in record.iter_log("rank-0", "stdout")]
    assert "still here" in said
    assert job_processes(record.job_id) == []
