"""The debugger (issue 43): `breakpoint()` and `pdb.set_trace()` in a rank pause it instead of
killing the job; `jupyter distrun debug JOB` lists the paused ranks and sends one a pdb
command, from another process, through the job's owner; the stall watch leaves a paused job
alone; nothing is left after it."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import not_private, paused_ranks, run_cli, start_cli_run

from jupyter_dist.describe import job_summary
from jupyter_dist.events import RootCause
from jupyter_dist.run.requests import wait_until_ended

pytestmark = pytest.mark.slow  # every test runs real jobs, seconds each: the full run's

SCRIPT = """\
import os, pdb
rank = int(os.environ["RANK"])
print("started", os.environ["DISTRUN_JOB_DIR"], flush=True)
x = 40 + rank
if rank == 1:
    breakpoint()
    x += 100
if rank == 3:
    pdb.set_trace()
    x += 300
print(f"rank {rank} x {x}", flush=True)
"""


def _reply(kc, msg_id: str) -> dict:
    """The content of the kernel's reply to execute request `msg_id`."""
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    return reply["content"]


def _local_job(tmp_path: Path, nodes: int) -> tuple[Path, Path]:
    """A spec running SCRIPT on `nodes` local nodes, 2 ranks each; (spec, script)."""
    script = tmp_path / "bp.py"
    script.write_text(SCRIPT)
    spec = tmp_path / "job.yml"
    spec.write_text(
        f"command: python {script}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
        f"resources: {{instance_count: {nodes}}}\n"
    )
    return spec, script


def test_a_breakpoint_pauses_its_rank_and_a_terminal_steps_it_then_the_job_succeeds(
    tmp_path, store
):
    """2 nodes x 2 ranks: rank 1 at breakpoint(), rank 3 at pdb.set_trace(). Both listed
    (one line each, and as JSON); `p x` and `n` answered; a rank that is not paused, and bad
    input, in one line; the stall watch (--on-stall kill, 3 s) leaves the paused job alone;
    `c` lets each go on; the job succeeds with the values changed after the pause; every
    file of the pause private while it lasts, and none left."""
    spec, script = _local_job(tmp_path, nodes=2)
    old = os.umask(0o022)  # what most machines have: the pause's files are private anyway
    said_on_stderr = tmp_path / "stderr.txt"
    try:
        with said_on_stderr.open("w") as stderr:
            proc, job_id = start_cli_run(spec, store, "--stall-timeout", "3",
                                         "--on-stall", "kill", stderr=stderr)  # fmt: skip
    finally:
        os.umask(old)
    record = store.get(job_id)
    try:
        found = paused_ranks(store, job_id, 2)
        paused_at = time.monotonic()
        assert found == [
            {"rank": 1, "node": "local0", "file": str(script), "line": 7,
             "function": "<module>", "reason": "breakpoint", "exception": None},
            {"rank": 3, "node": "local1", "file": str(script), "line": 10,
             "function": "<module>", "reason": "breakpoint", "exception": None},
        ]  # fmt: skip

        # The job's status says where each waits (what the views show), step by step.
        def paused_in_status(expected: dict, timeout: float = 10) -> None:
            deadline, seen = time.monotonic() + timeout, None
            while time.monotonic() < deadline:
                seen = {p["rank"]: [(q["node"], q["line"], q["reason"]) for q in p["paused"]]
                        for p in record.status()["processes"].values() if p["paused"]}  # fmt: skip
                if seen == expected:
                    return
                time.sleep(0.05)
            raise AssertionError((seen, expected))

        paused_in_status({1: [("local0", 7, "breakpoint")], 3: [("local1", 10, "breakpoint")]})
        inspected = run_cli("inspect", job_id, store=store).stdout
        assert (
            f"Paused in the debugger (jupyter distrun debug {job_id}):\n"
            f"rank 1 (local0): {script}:7 in <module> (breakpoint)\n"
            f"rank 3 (local1): {script}:10 in <module> (breakpoint)\n"
        ) in inspected, inspected
        jobs = run_cli("jobs", store=store, env={**os.environ, "COLUMNS": "200"}).stdout
        assert "running · 2 paused" in jobs, jobs  # `jobs`, and the sidebar's list:
        assert job_summary(record.status())["paused"] == [1, 3]  # describe.job_summary
        listed = run_cli("debug", job_id, "--list", store=store)
        assert listed.stdout.splitlines() == [
            f"rank 1 (local0): {script}:7 in <module> (breakpoint)",
            f"rank 3 (local1): {script}:10 in <module> (breakpoint)",
        ], listed.stdout

        def do(rank: int, command: str):
            return run_cli("debug", job_id, "--rank", str(rank), "--do", command, store=store)

        assert do(1, "p x").stdout == "41\n"
        stepped = do(1, "n")
        assert stepped.stdout == f"> {script}(8)<module>()\n-> if rank == 3:\n", stepped.stdout
        assert do(1, "p x").stdout == "141\n"
        paused_in_status({1: [("local0", 8, "breakpoint")], 3: [("local1", 10, "breakpoint")]})
        assert do(3, "p x, rank").stdout == "(43, 3)\n"
        # A command that outlives --timeout: said so (not "runs on"), and the rank waits in
        # pdb again once it ends.
        busy = run_cli("debug", job_id, "--rank", "3", "--do", "!import time; time.sleep(3)",
                       "--timeout", "1", store=store)  # fmt: skip
        assert busy.returncode == 1 and busy.stderr.startswith(
            "rank 3 still runs the command after 1 s"
        ), busy
        assert paused_ranks(store, job_id, 2)[1]["rank"] == 3
        assert do(3, "p x").stdout == "43\n"

        # What is not paused, and what is not a command: one line each, the job untouched.
        refused = {
            "not paused": do(0, "p x"),
            "no rank": run_cli("debug", job_id, "--do", "p x", store=store),
            "empty": do(1, "  "),
            "not a set": run_cli("debug", job_id, "--ranks", "1-x", "--do", "p x", store=store),
            "rank and set": run_cli(
                "debug", job_id, "--rank", "1", "--ranks", "1,3", "--do", "p x", store=store
            ),
            "set, one not paused": run_cli(
                "debug", job_id, "--ranks", "0-1", "--do", "p x", store=store
            ),
            "not utf-8": do(1, "p '\udcff'"),  # a terminal's byte 0xff, as Python has it
            "no such rank": do(9, "p x"),
            "a negative rank": do(-1, "p x"),
        }
        for case, done in refused.items():
            assert done.returncode != 0, case
            assert len(done.stderr.strip().splitlines()) == 1, (case, done.stderr)
            assert "Traceback" not in done.stderr, case
        for case in ("not paused", "set, one not paused"):  # nothing sent to rank 1 either
            assert refused[case].stderr.strip() == (
                f"error: rank 0 of job {job_id} is not paused (paused: 1, 3)"
            ), case
        assert refused["not utf-8"].stderr.strip() == (
            "error: a pdb command is text: this one holds bytes that are not UTF-8"
        ), refused["not utf-8"].stderr
        for case, rank in (("no such rank", 9), ("a negative rank", -1)):
            assert refused[case].stderr.strip() == (
                f"error: job {job_id} has ranks 0 to 3, not {rank}"
            ), refused[case].stderr
        for value in ("-1", "nan", "0"):  # argparse's usage, then the line that says why
            done = run_cli("debug", job_id, "--rank", "1", "--do", "p x", "--timeout", value,
                           store=store)  # fmt: skip
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert done.stderr.strip().splitlines()[-1] == (
                f"jupyter distrun debug: error: argument --timeout: '{value}' is not a "
                "positive number of seconds"
            ), done.stderr
        assert refused["not a set"].stderr.strip() == (
            "error: --ranks: '1-x' is not a set of ranks (e.g. 3, 0,2-3 or all)"
        )

        # The pause's socket and record are private, on the node, while they last.
        job_dirs = sorted({Path(line.split()[1]) for line in _started_lines(record)})
        kept = sorted(p.suffix for d in job_dirs for p in (d / "debug").iterdir())
        assert kept == [".json", ".json", ".sock", ".sock"], kept
        for job_dir in job_dirs:
            assert not_private(job_dir) == []

        # The stall watch (3 s) saw nothing printed and no CPU used for longer: not a stall.
        time.sleep(max(0.0, paused_at + 6 - time.monotonic()))
        status = record.status()
        assert status["state"] == "running" and not status.get("stall_notice"), status

        for rank in (1, 3):
            going = do(rank, "c")
            assert going.returncode == 0 and going.stderr == f"rank {rank} runs on\n"
            if rank == 1:  # it was paused where the owner looks first: no more
                paused_in_status({3: [("local1", 10, "breakpoint")]})
                again = do(1, "p x")
                assert again.stderr.strip() == (
                    f"error: rank 1 of job {job_id} is not paused (paused: 3)"
                ), again.stderr
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_until_ended(record, 10) == "succeeded"
    said_by_the_run = said_on_stderr.read_text()  # no stall was said: none taken back
    assert "looks stuck" not in said_by_the_run and "moves again" not in said_by_the_run
    said = {key: [line.text for line in record.iter_log(key, "stdout")] for key in
            ("rank-1", "rank-3")}  # fmt: skip
    assert said["rank-1"][-1] == "rank 1 x 141" and said["rank-3"][-1] == "rank 3 x 343"
    told = [line.text for key in record.log_keys() for stream in ("stdout", "stderr")
            for line in record.iter_log(key, stream) if "distrun-debug" in line.text]  # fmt: skip
    assert told == []  # the debugger's word to the launcher is never output
    assert all(p["paused"] == [] for p in record.status()["processes"].values())
    ended = run_cli("debug", job_id, store=store)
    assert ended.returncode != 0
    assert ended.stderr.strip() == (
        f"error: job {job_id} has succeeded; only a running job's ranks pause"
    )
    for job_dir in job_dirs:
        assert not job_dir.exists() or not list(job_dir.glob("debug/*")), job_dir
    assert not list(record.path.glob("debug-*")), "a request or answer was left in the store"
    assert not_private(record.path) == []


def test_a_terminal_console_lists_attaches_casts_and_continues(tmp_path, store):
    """`jupyter distrun debug JOB` in a real terminal (a pty): the paused ranks listed,
    `cast` to a set of them (each answer under its rank), `attach` a pdb prompt (an empty
    line repeats pdb's last command, `detach` comes back), bad lines one line each, Ctrl-C
    leaves the ranks paused. `--do` with `--ranks`, as text and JSON. Then `continue` from
    a console fed by a pipe: every paused rank runs on and the job succeeds."""
    import pexpect

    spec, script = _local_job(tmp_path, nodes=2)
    proc, job_id = start_cli_run(spec, store)
    record = store.get(job_id)
    try:
        assert len(paused_ranks(store, job_id, 2)) == 2
        console = pexpect.spawn(
            sys.executable, ["-m", "jupyter_dist.cli", "debug", job_id, "--store",
                             str(store.root)], encoding="utf-8", timeout=60,
            env={**os.environ, "TERM": "dumb"},  # readline's line editing, no escapes
        )  # fmt: skip
        prompt = "(distrun debug) "

        def said(line: str, expect: str = prompt) -> list[str]:
            console.sendline(line)
            console.expect_exact(expect)
            lines = console.before.replace("\r\n", "\n").splitlines()
            assert lines[0] == line  # the terminal's echo
            return lines[1:]

        console.expect_exact(prompt)
        assert console.before.replace("\r\n", "\n").splitlines() == [
            f"debugger console for job {job_id} (help: the commands; quit leaves)",
            f"rank 1 (local0): {script}:7 in <module> (breakpoint)",
            f"rank 3 (local1): {script}:10 in <module> (breakpoint)",
        ]
        assert said("cast 1,3 p x, rank") == ["[rank 1] (41, 1)", "[rank 3] (43, 3)"]
        assert said("attach 1", "(Pdb rank 1) ") == [
            f"attached to rank 1 (local0): {script}:7 in <module> (breakpoint); `detach` comes back"
        ]
        assert said("p x", "(Pdb rank 1) ") == ["41"]
        assert said("n", "(Pdb rank 1) ") == [f"> {script}(8)<module>()", "-> if rank == 3:"]
        assert said("", "(Pdb rank 1) ") == [
            f"> {script}(11)<module>()",
            '-> print(f"rank {rank} x {x}", flush=True)',
        ]
        assert said("detach") == ["detached from rank 1"]
        assert said("cast all p x") == ["[rank 1] 141", "[rank 3] 43"]
        assert said("cast 0,1 p x") == [
            f"error: rank 0 of job {job_id} is not paused (paused: 1, 3)"
        ]
        assert said("cast 1") == ["error: cast takes ranks and a pdb command: cast 0,2-3 p x"]
        assert said("attach 2") == [f"error: rank 2 of job {job_id} is not paused (paused: 1, 3)"]
        assert said("frobnicate") == [
            "unknown command 'frobnicate': list, attach R, cast RANKS CMD, continue, quit "
            "(help: what each does)"
        ]
        console.sendintr()  # Ctrl-C
        console.expect(pexpect.EOF)
        assert "left the debugger console; every paused rank stays paused" in console.before
        console.close()
        assert console.exitstatus == 0

        # Still paused; one command to a set, from a script.
        cast = run_cli("debug", job_id, "--ranks", "all", "--do", "p rank", store=store)
        assert cast.returncode == 0 and cast.stdout == "[rank 1] 1\n[rank 3] 3\n", cast
        cast = run_cli("debug", job_id, "--ranks", "3", "--do", "p x", "--json", store=store)
        (answered,) = json.loads(cast.stdout)
        assert answered == {"rank": 3, "pid": answered["pid"], "answer": "43\n",
                            "paused": True, "state": "paused"}  # fmt: skip

        fed = run_cli("debug", job_id, input="list\ncontinue\nlist\n", store=store)
        assert fed.returncode == 0, fed.stderr
        assert "[rank 1] runs on\n" in fed.stdout and "[rank 3] runs on\n" in fed.stdout
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = {key: [line.text for line in record.iter_log(key, "stdout")][-1]
            for key in ("rank-1", "rank-3")}  # fmt: skip
    assert said == {"rank-1": "rank 1 x 141", "rank-3": "rank 3 x 343"}


def _started_lines(record) -> list[str]:
    return [
        line.text for key in record.log_keys()
        for line in record.iter_log(key, "stdout") if line.text.startswith("started ")
    ]  # fmt: skip


# What each launcher gives its ranks to say which one they are.
LAUNCHED = {
    "torchrun": "distribution: {type: pytorch, process_count_per_instance: 2, "
                "launcher: torchrun}\n",
    "mpirun": "distribution: {type: mpi, process_count_per_instance: 2}\n",
    "horovodrun": "distribution: {type: mpi, process_count_per_instance: 2, "
                  "launcher: horovodrun}\n",
}  # fmt: skip


@pytest.mark.parametrize(
    "launcher", ["torchrun", "mpirun", pytest.param("horovodrun", marks=pytest.mark.horovod)]
)
def test_a_breakpoint_in_a_rank_that_a_launcher_started_pauses_it(launcher, tmp_path, store):
    """Ranks that torchrun, mpirun or horovodrun start (children of one launcher process,
    not of our agent) inherit the startup hook: rank 1's breakpoint() pauses it, listed
    under its own rank and node; it is read and let go, and the job succeeds with what it
    changed."""
    script = tmp_path / "bp.py"
    script.write_text(
        "import os\n"
        "rank = int(os.environ.get('RANK') or os.environ['OMPI_COMM_WORLD_RANK'])\n"
        "x = 40 + rank\n"
        "if rank == 1:\n"
        "    breakpoint()\n"
        "    x += 100\n"
        "print(f'rank {rank} x {x}', flush=True)\n"
    )
    spec = tmp_path / "job.yml"
    spec.write_text(f"command: python {script}\n{LAUNCHED[launcher]}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--store", str(store.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not store.jobs():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        (record,) = store.jobs()
        found = paused_ranks(store, record.job_id, 1)
        assert [(p["rank"], p["node"], p["file"], p["line"], p["reason"]) for p in found] == [
            (1, "local0", str(script), 6, "breakpoint")
        ], found
        do = ["debug", record.job_id, "--rank", "1", "--do"]
        assert run_cli(*do, "p x", store=store).stdout == "41\n"
        assert run_cli(*do, "c", store=store).stderr == "rank 1 runs on\n"
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "[rank 1] rank 1 x 141" in out.splitlines(), out
    assert not_private(record.path) == []


SSH_SCRIPT = """\
import os
rank = int(os.environ["RANK"])
print("started", flush=True)
x = 40 + rank
done = rank != 0
while not done:
    x = 40 + rank
if rank == 1:
    breakpoint()
    x += 100
print(f"rank {rank} x {x}", flush=True)
"""


def _kept_helpers(cluster, node) -> list[int]:
    """The debugger helpers kept running on a node (`python -I -S -c SOURCE serve`)."""
    found = []
    for pid in cluster.pids(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[-2:] == [b"serve", b""] and b"-c" in argv:
            found.append(pid)
    return found


def test_a_paused_rank_on_an_ssh_node_is_listed_and_stepped_through_the_owner(
    ssh_cluster, tmp_path, store
):
    """The same over SSH (2 real sshd nodes, a rank each): the owner reaches the paused
    rank's pdb on its node through the connection it has. Rank 0, looping in Python, is
    paused there by `--interrupt` and let out of its loop; one command to both nodes'
    ranks with `--ranks all` (`p x`, then `c`); the job succeeds. Every command went through
    one helper the owner kept on each node, and those end with the job."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "bp.py").write_text(SSH_SCRIPT)
    spec = tmp_path / "job.yml"
    spec.write_text(
        f"code: {tmp_path / 'code'}\ncommand: python bp.py\n"
        "distribution: {type: pytorch}\nresources: {instance_count: 2}\n"
    )
    nodes_file = str(ssh_cluster.write_inventory(tmp_path / "nodes.yml"))
    proc, job_id = start_cli_run(spec, store, "--nodes-file", nodes_file, ranks=2)
    try:
        found = paused_ranks(store, job_id, 1)
        assert [(p["rank"], p["node"], p["line"]) for p in found] == [(1, "node1", 10)], found
        assert Path(found[0]["file"]).name == "bp.py"
        done = run_cli("debug", job_id, "--rank", "1", "--do", "p x + 1", store=store)
        assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr

        paused = run_cli("debug", job_id, "--interrupt", "--rank", "0", store=store)
        assert paused.returncode == 0, paused.stderr
        assert re.fullmatch(r"rank 0 \(node0\): \S*bp\.py:[67] in <module> \(interrupt\)\n",
                            paused.stdout), paused.stdout  # fmt: skip
        done = run_cli("debug", job_id, "--rank", "0", "--do", "!done = True", store=store)
        assert done.returncode == 0, done.stderr
        both = run_cli("debug", job_id, "--ranks", "all", "--do", "p x", store=store)
        assert both.stdout == "[rank 0] 40\n[rank 1] 41\n", both.stderr
        # Every command went through one helper kept on each node, not a Python each.
        kept = {n.name: len(_kept_helpers(ssh_cluster, n)) for n in ssh_cluster.nodes}
        assert kept == {"node0": 1, "node1": 1}
        both = run_cli("debug", job_id, "--ranks", "0-1", "--do", "c", store=store)
        assert both.stdout == "[rank 0] runs on\n[rank 1] runs on\n", both.stderr
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10  # the kept helpers end with the job
    while any(_kept_helpers(ssh_cluster, n) for n in ssh_cluster.nodes):
        assert time.monotonic() < deadline, "a debugger helper outlived its job"
        time.sleep(0.1)
    record = store.get(job_id)
    said = {key: [line.text for line in record.iter_log(key, "stdout")][-1]
            for key in ("rank-0", "rank-1")}  # fmt: skip
    assert said == {"rank-0": "rank 0 x 40", "rank-1": "rank 1 x 141"}


def test_a_breakpoint_in_a_distrun_cell_pauses_and_the_cell_ends_once_continued(kernel_env):
    """A `%%distrun` cell in a real kernel, each of its 2 ranks at breakpoint(): the cell's
    live view marks both paused, and where, and the cell waits; a terminal lists them,
    reads `x` on each, continues both; the cell succeeds with what ran after the pause.
    Then a --post-mortem cell, and a warm session's cell (its earlier cells' variables
    there; the session lives on)."""
    from helpers import await_text, running_kernel

    from jupyter_dist.store import JobStore

    store = JobStore(kernel_env)
    with running_kernel() as (_km, kc):
        kc.execute_interactive("%config DistrunMagics.view = 'widget'", timeout=30)
        msg_id = kc.execute(
            "%%distrun --nodes 2\nimport os\nx = 40 + int(os.environ['RANK'])\n"
            "breakpoint()\nx += 10\nprint('x is', x)\n"
        )
        # The cell's live view marks both ranks paused (its processes, as the page gets them).
        deadline, marked = time.monotonic() + 60, {}
        while len(marked) < 2 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                message = kc.get_iopub_msg(timeout=1)
                state = message["content"].get("data", {}).get("state", {})
                for row in state.get("processes", []) if message["msg_type"] == "comm_msg" else []:
                    if row.get("paused"):
                        marked[row["name"]] = row["paused"]
        assert marked == {
            f"rank-{rank}": ["paused at cell line 4 in <module> (breakpoint)"] for rank in (0, 1)
        }, marked
        (record,) = store.jobs()
        found = paused_ranks(store, record.job_id, 2)
        assert [(p["rank"], p["line"], p["function"]) for p in found] == [
            (0, 4, "<module>"),
            (1, 4, "<module>"),
        ]  # the cell's lines, as its tracebacks number them (the magic's line is not one)
        listed = run_cli("debug", record.job_id, "--list", store=store).stdout.splitlines()
        assert listed == [
            f"rank {rank} (local{rank}): cell line 4 in <module> (breakpoint): x += 10"
            for rank in (0, 1)
        ], listed
        for rank in (0, 1):
            done = run_cli("debug", record.job_id, "--rank", str(rank), "--do", "p x",
                           store=store)  # fmt: skip
            assert done.stdout == f"{40 + rank}\n", done.stderr
            run_cli("debug", record.job_id, "--rank", str(rank), "--do", "c", store=store)
        assert _reply(kc, msg_id)["status"] == "ok"
        kc.execute_interactive("%config DistrunMagics.view = 'auto'", timeout=30)  # text here

        # --post-mortem in a cell (its runner prints the error itself): paused in f, then
        # `q`, and the cell fails with the error.
        msg_id = kc.execute("%%distrun --post-mortem\ndef f(v):\n    raise KeyError(v)\nf(5)\n")
        assert await_text(kc, "paused after KeyError: 5", 1) == 1
        (failed,) = [r for r in store.jobs() if r.job_id != record.job_id]
        (found,) = paused_ranks(store, failed.job_id, 1)
        assert (found["function"], found["reason"]) == ("f", "post-mortem")
        looked = run_cli("debug", failed.job_id, "--rank", "0", "--do", "p v", store=store)
        assert looked.stdout == "5\n", looked.stderr
        run_cli("debug", failed.job_id, "--rank", "0", "--do", "q", store=store)
        assert _reply(kc, msg_id)["status"] == "error"
        assert failed.status()["state"] == "failed"

        # A warm session's cell: paused in it, its variables of earlier cells there, `c`,
        # and the session lives on for the next cell.
        kc.execute_interactive("%distrun session start --nodes 1 --procs-per-node 2", timeout=120)
        kc.execute_interactive("%%distrun\nkept = 5", timeout=60)
        msg_id = kc.execute("%%distrun\nimport os\nif os.environ['RANK'] == '1':\n"
                            "    breakpoint()\n    kept += 1\n")  # fmt: skip
        assert await_text(kc, "paused at", 1) == 1
        (session,) = [r for r in store.jobs() if r.job_id not in (record.job_id, failed.job_id)]
        looked = run_cli("debug", session.job_id, "--rank", "1", "--do", "p kept", store=store)
        assert looked.stdout == "5\n", looked.stderr

        # What would read the rank's stdin (the session's feed of cells) is refused at once,
        # in one line, and the rank stays reachable: interact, input() by ! and by p.
        def do(command: str) -> str:
            done = run_cli("debug", session.job_id, "--rank", "1", "--do", command,
                           "--timeout", "20", store=store)  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert do("interact").startswith("*** interact is not available in jupyter-dist's")
        no_input = "*** EOFError: no input to read in jupyter-dist's debugger"
        assert do("!input()").startswith(no_input) and do("p input()").startswith(no_input)
        assert do("p kept + 1") == "6\n"
        run_cli("debug", session.job_id, "--rank", "1", "--do", "c", store=store)
        assert _reply(kc, msg_id)["status"] == "ok"
        msg_id = kc.execute("%%distrun\nprint('kept', kept)")
        assert _reply(kc, msg_id)["status"] == "ok"

        # A session's failed cell needs no flag: `%distrun debug --rank 1` right after it
        # is a post-mortem there, with the cell's variables and the session's; leaving
        # it, the session lives on.
        failing = ("%%distrun\nimport os\ndef check(v):\n    if os.environ['RANK'] == '1':\n"
                   "        raise ValueError(f'bad {v}')\ncheck(kept * 2)\n")  # fmt: skip
        assert kc.execute_interactive(failing, timeout=60)["content"]["status"] == "error"
        said = []

        def printed(msg):
            if msg["msg_type"] in ("stream", "error"):
                said.append(msg["content"].get("text", msg["content"].get("evalue")))

        # By script, as the console does: --list names the failed rank, --do answers there.
        kc.execute_interactive("%distrun debug --list", timeout=60, output_hook=printed)
        assert "rank 1: its last cell failed (post-mortem)" in "".join(said), said
        said.clear()
        reply = kc.execute_interactive('%distrun debug --rank 1 --do "p v, kept"', timeout=60,
                                       output_hook=printed)  # fmt: skip
        assert reply["content"]["status"] == "ok" and "".join(said) == "(12, 6)\n", said
        typed, said = iter(["p v, kept", "where", "q", "quit"]), []

        def typing(msg):
            kc.input(next(typed))

        def shown(msg):
            if msg["msg_type"] in ("stream", "error"):
                said.append(msg["content"].get("text", msg["content"].get("evalue")))

        reply = kc.execute_interactive("%distrun debug", timeout=60, allow_stdin=True,
                                       stdin_hook=lambda m: kc.input("quit"),
                                       output_hook=shown)  # fmt: skip
        assert reply["content"]["status"] == "ok"
        assert said[0].splitlines()[0] == (
            "the last cell failed on rank 1: `%distrun debug --rank 1` looks where it raised"
        ), said
        said.clear()
        reply = kc.execute_interactive("%distrun debug --rank 1", timeout=60, allow_stdin=True,
                                       stdin_hook=typing, output_hook=shown)  # fmt: skip
        assert reply["content"]["status"] == "ok", said
        lines = "".join(said).splitlines()
        assert lines[1].startswith("attached to rank 1 (local0): <cell ") and lines[1].endswith(
            ":4 in check (post-mortem: ValueError: bad 12); `detach` comes back"
        ), lines
        assert lines[2] == "(12, 6)"
        assert "-> raise ValueError(f'bad {v}')" in lines[3:-1] and lines[-1] == "rank 1 runs on"
        reply = kc.execute_interactive("%distrun debug --rank 0", timeout=60, allow_stdin=True,
                                       stdin_hook=typing, output_hook=shown)  # fmt: skip
        assert reply["content"]["status"] == "error"
        assert said[-1] == f"rank 0 of job {session.job_id} is not paused (no rank is)"
        msg_id = kc.execute("%%distrun\nprint('still', kept)")
        assert _reply(kc, msg_id)["status"] == "ok"
        kc.execute_interactive("%distrun session stop", timeout=60)
        said = [line.text for line in session.iter_log("rank-1", "stdout")]
        assert "kept 6" in said and "still 6" in said, said
    said = sorted(
        line.text for key in ("rank-0", "rank-1")
        for line in record.iter_log(key, "stdout") if line.text.startswith("x is")
    )  # fmt: skip
    assert said == ["x is 50", "x is 51"]


def test_a_cancel_ends_a_paused_rank_and_leaves_nothing(tmp_path, store):
    """`cancel` while a rank waits in its debugger (and a terminal is connected to it):
    the job is cancelled, no process of it is left, nor any file of the pause."""
    from helpers import job_processes

    spec, _ = _local_job(tmp_path, nodes=1)
    proc, job_id = start_cli_run(spec, store, ranks=2)
    try:
        assert [p["rank"] for p in paused_ranks(store, job_id, 1)] == [1]
        job_dir = Path(next(iter(_started_lines(store.get(job_id)))).split()[1])
        # A command in flight as the job is cancelled: said so, not "runs on".
        busy = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dist.cli", "debug", job_id, "--rank", "1",
             "--do", "!import time; time.sleep(60)", "--store", str(store.root)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.5)  # the command runs on the rank
        assert run_cli("cancel", job_id, store=store).returncode == 0
        _, said = busy.communicate(timeout=60)
        assert busy.returncode == 1 and said.strip() == (
            "rank 1 was killed by SIGTERM during the command; the job was cancelled"
        ), said
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert store.get(job_id).status()["state"] == "cancelled"
    assert job_processes(job_id) == []
    assert not job_dir.exists() or not list(job_dir.glob("debug/*"))


FAILING = """\
import os, time
rank = int(os.environ["RANK"])


def step(batch):
    if rank == 1:
        raise ValueError(f"bad input {batch}")
    return batch


for batch in range(7, 9):
    step(batch)
time.sleep(300)  # rank 0 still runs when rank 1 fails, in every run: it is stopped alike
"""


def test_post_mortem_pauses_a_failed_rank_and_the_job_fails_as_it_would_have(tmp_path, store):
    """--post-mortem: rank 1 raises in step(); it waits where it raised, listed with the
    error; its local variables are read; `q` and the job fails with the very root cause of
    a run without the flag. The spec's debug: {post_mortem: true, wait: 2} with nobody
    looking: the rank exits with its error after 2 s, the same root cause again."""
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    body = (f"command: python {script}\n"
            "distribution: {type: pytorch, process_count_per_instance: 2}\n")  # fmt: skip
    plain, waiting = tmp_path / "plain.yml", tmp_path / "waiting.yml"
    plain.write_text(body)
    waiting.write_text(body + "debug: {post_mortem: true, wait: 2}\n")

    def root_cause(job_id: str) -> dict:
        status = store.get(job_id).status()
        assert status["state"] == "failed", status
        mine = ("time", "at", "log_path")  # when, and the job's own folder
        return {k: v for k, v in status["root_cause"].items() if k not in mine}

    done = run_cli("run", str(plain), store=store)
    assert done.returncode == 1
    (without,) = [r.job_id for r in store.jobs()]
    expected = root_cause(without)
    assert "ValueError: bad input 7" in json.dumps(expected)
    assert expected["stopped"] == ["rank 0"], expected  # the same in every run below

    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(plain), "--post-mortem",
         "--store", str(store.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(store.jobs()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        (job_id,) = [r.job_id for r in store.jobs() if r.job_id != without]
        (found,) = paused_ranks(store, job_id, 1)
        assert found == {"rank": 1, "node": "local0", "file": str(script), "line": 7,
                         "function": "step", "reason": "post-mortem",
                         "exception": "ValueError: bad input 7"}  # fmt: skip
        looked = run_cli("debug", job_id, "--rank", "1", "--do", "p batch, rank", store=store)
        assert looked.stdout == "(7, 1)\n", looked.stderr
        run_cli("debug", job_id, "--rank", "1", "--do", "q", store=store)
        assert proc.wait(60) == 1
        said = proc.stderr.read()
        assert "distrun: rank 1 paused after ValueError: bad input 7, at " in said, said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert root_cause(job_id) == expected

    # A rank that joined a process group: torch holds its stderr back until it exits, and
    # the announcement still reaches the job's output while the rank waits.
    grouped = tmp_path / "grouped.py"
    grouped.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                       + FAILING)  # fmt: skip
    (tmp_path / "grouped.yml").write_text(body.replace(str(script), str(grouped)))
    before = {r.job_id for r in store.jobs()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(tmp_path / "grouped.yml"),
         "--post-mortem", "--store", str(store.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (new := [r.job_id for r in store.jobs() if r.job_id not in before]):
            assert time.monotonic() < deadline, "no job started"
            time.sleep(0.1)
        (grouped_id,) = new
        paused_ranks(store, grouped_id, 1)
        record, deadline = store.get(grouped_id), time.monotonic() + 30
        while not any("paused after ValueError" in line.text
                      for line in record.iter_log("rank-1", "stderr")):  # fmt: skip
            assert time.monotonic() < deadline, "the pause was not announced while it lasts"
            time.sleep(0.1)
        # A command that ends the rank says so, and the job's root cause is the exit, not
        # the debugger's word that it paused.
        ended = run_cli("debug", grouped_id, "--rank", "1", "--do", "!import os; os._exit(3)",
                        store=store)  # fmt: skip
        assert ended.returncode == 1, ended
        assert ended.stderr.strip() == (
            "rank 1 exited with code 3 during the command; the job failed"
        ), ended.stderr
        assert proc.wait(60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cause = RootCause(**store.get(grouped_id).status()["root_cause"])
    assert cause.summary() == "rank 1 on local0 (127.0.0.1) exited with code 3", cause.summary()

    started = time.monotonic()
    done = run_cli("run", str(waiting), store=store)
    assert done.returncode == 1 and time.monotonic() - started >= 2
    assert "or in 2 s if nobody looks" in done.stdout + done.stderr
    (last,) = [r.job_id for r in store.jobs() if r.job_id not in (without, job_id, grouped_id)]
    assert root_cause(last) == expected


def test_the_magic_lists_and_steps_the_paused_ranks_of_a_detached_cell(kernel_env):
    """`%distrun debug` in the kernel that ran a detached cell (no JOB: its last job): the
    paused ranks as JSON, `p x` on one; the console in the notebook's input box, attached
    to a rank, then `cast` and `continue`; the job succeeds; once it ended, the magic says
    so in one line."""
    from helpers import running_kernel

    from jupyter_dist.run.requests import wait_until_ended
    from jupyter_dist.store import JobStore

    def run(kc, code: str, stdin_hook=None) -> tuple[str, dict]:
        said = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                said.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                said.append(msg["content"]["evalue"])

        reply = kc.execute_interactive(code, output_hook=hook, timeout=120,
                                       allow_stdin=stdin_hook is not None,
                                       stdin_hook=stdin_hook)  # fmt: skip
        return "".join(said), reply["content"]

    store = JobStore(kernel_env)
    with running_kernel() as (_km, kc):
        cell = ("%%distrun --detach --nodes 2\nimport os\nx = 7 * int(os.environ['RANK'])\n"
                "breakpoint()\nprint('after', x)\n")  # fmt: skip
        _, reply = run(kc, cell)
        assert reply["status"] == "ok", reply
        deadline = time.monotonic() + 60
        while True:
            said, reply = run(kc, "%distrun debug --json")
            assert reply["status"] == "ok", (said, reply)
            found = json.loads(said)
            if len(found) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(p["rank"], p["function"]) for p in found] == [(0, "<module>"), (1, "<module>")]
        said, _ = run(kc, "%distrun debug --rank 1 --do 'p x'")
        assert said == "7\n"
        # The console through the notebook's input box, as IPython's %debug: attached to
        # rank 1 first; `continue` lets both run on.
        typed = iter(["p x * 2", "detach", "cast 0-1 p x + 1", "continue", "quit"])
        prompts = []

        def answer(msg):
            prompts.append(msg["content"]["prompt"])
            kc.input(next(typed))

        said, reply = run(kc, "%distrun debug --rank 1", stdin_hook=answer)
        assert reply["status"] == "ok", (said, reply)
        assert prompts == ["(Pdb rank 1) ", "(Pdb rank 1) "] + ["(distrun debug) "] * 3
        assert said.splitlines()[2:] == [
            "14",
            "detached from rank 1",
            "[rank 0] 1",
            "[rank 1] 8",
            "[rank 0] runs on",
            "[rank 1] runs on",
        ], said
        (record,) = store.jobs()
        assert wait_until_ended(record, 60) == "succeeded"
        said, reply = run(kc, "%distrun debug")
        assert reply["status"] == "error"
        assert f"job {record.job_id} has succeeded; only a running job's ranks pause" in said


LOOPING = """\
import os, time
rank = int(os.environ["RANK"])
print("started", flush=True)
i, done = 0, False
if rank == 0:
    time.sleep(6)  # in native code when it is asked
while rank == 1 and not done:
    i += 1
print(f"rank {rank} looped {i > 0}", flush=True)
"""


def test_interrupt_pauses_a_running_rank_where_it_is(tmp_path, store):
    """`debug --interrupt --rank R`: rank 1, looping in Python, pauses at once where it
    is (listed with the reason `interrupt`), its variables read and changed, and it runs
    on with `c`; rank 0, asleep in native code, is asked, and the CLI says it pauses once
    back in Python: it is listed then. Wrong ranks and options are one line each; the job
    succeeds."""
    script = tmp_path / "loop.py"
    script.write_text(LOOPING)
    spec = tmp_path / "job.yml"
    spec.write_text(f"command: python {script}\n"
                    "distribution: {type: pytorch, process_count_per_instance: 2}\n")  # fmt: skip
    proc, job_id = start_cli_run(spec, store, ranks=2)
    try:
        asleep = run_cli("debug", job_id, "--interrupt", "--rank", "0", "--timeout", "1",
                         store=store)  # fmt: skip
        assert asleep.returncode == 0 and asleep.stdout == "", asleep
        assert asleep.stderr.startswith("rank 0 was asked to pause; it will once its main "
                                        "thread runs Python again"), asleep.stderr  # fmt: skip
        # --interrupt with --do: paused (once its sleep ends) and asked in one call; it
        # stays paused.
        both = run_cli("debug", job_id, "--interrupt", "--rank", "0", "--do", "p 6 * 7",
                       store=store)  # fmt: skip
        assert both.returncode == 0 and both.stdout == "42\n", both
        looping = run_cli("debug", job_id, "--interrupt", "--rank", "1", store=store)
        assert looping.returncode == 0, looping.stderr
        assert re.fullmatch(rf"rank 1 \(local0\): {re.escape(str(script))}:[78] in <module> "
                            r"\(interrupt\)\n", looping.stdout), looping.stdout  # fmt: skip

        def do(rank: int, command: str):
            return run_cli("debug", job_id, "--rank", str(rank), "--do", command, store=store)

        assert do(1, "p i > 0, done").stdout == "(True, False)\n"
        # Asked again while paused: told so, and its pdb is as it was (no pause inside ours).
        again = run_cli("debug", job_id, "--interrupt", "--rank", "1", store=store)
        assert again.returncode == 0 and again.stdout.startswith(
            f"rank 1 was paused already: rank 1 (local0): {script}:"
        ), again
        where = do(1, "w").stdout
        assert f"{script}(" in where and "sitecustomize" not in where, where
        assert do(1, "!done = True").returncode == 0
        found = paused_ranks(store, job_id, 2)  # rank 0 too, once its sleep ended
        assert [(p["rank"], p["reason"]) for p in found] == [(0, "interrupt"), (1, "interrupt")]
        assert found[0]["line"] == 7 and found[0]["file"] == str(script), found  # after its sleep

        refused = {
            "no such rank": run_cli("debug", job_id, "--interrupt", "--rank", "5", store=store),
            "no rank": run_cli("debug", job_id, "--interrupt", store=store),
        }
        for case, done in refused.items():
            assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, case
            assert "Traceback" not in done.stderr, case
        assert refused["no such rank"].stderr.strip() == (
            f"error: job {job_id} has ranks 0 to 1, not 5"
        )
        for rank in (0, 1):
            assert do(rank, "c").stderr == f"rank {rank} runs on\n"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = {r: [line.text for line in store.get(job_id).iter_log(f"rank-{r}", "stdout")]
            for r in (0, 1)}  # fmt: skip
    assert said[0][-1] == "rank 0 looped False" and said[1][-1] == "rank 1 looped True", said


def test_the_rank_and_the_helper_agree_on_the_signal_that_pauses():
    """The stack hook registers PAUSE_SIGNAL in every rank; the node helper sends its own
    copy (each is shipped alone, standard library only): the same signal, beside the
    stack dump's and apart from it."""
    from jupyter_dist.node_side import debugger, stack_hook

    assert debugger.PAUSE_SIGNAL == stack_hook.PAUSE_SIGNAL != stack_hook.STACK_SIGNAL


def test_a_pause_binds_even_when_an_ended_ranks_agent_takes_the_empty_folder(tmp_path, monkeypatch):
    """Two ranks on one node share the job's `debug/` folder; the agent of one that ends
    takes it away while empty (agent._clear_pauses). Seen in a whole run: rank 1 made the
    folder, rank 0's agent removed it, and rank 1's bind failed, killing the job. The pause
    makes the folder again and binds."""
    from jupyter_dist.node_side import debugger

    taken = []
    bind = debugger._Console._bind

    def bind_after_the_agent(console):
        if not taken:  # just between the folder's making and the bind
            taken.append(os.path.dirname(console.socket_path))
            os.rmdir(taken[0])
        return bind(console)

    monkeypatch.setattr(debugger._Console, "_bind", bind_after_the_agent)
    console = debugger._Console(str(tmp_path))
    try:
        assert taken and Path(console.socket_path).is_socket()
        assert not_private(tmp_path / "debug") == []
    finally:
        console.close()
    assert not Path(console.socket_path).exists()


def test_a_kept_helper_answers_each_request_by_its_id_and_ends_with_its_input(tmp_path):
    """`debugger.py serve` as the owner keeps it on an SSH node (a plain pipe here): a line
    that is not a request is passed over, each request is answered on a line with its ID
    as the command run alone would have ended, and end of input ends it."""
    from jupyter_dist.diagnose.debug import DEBUGGER_SOURCE

    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", DEBUGGER_SOURCE, "serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        requests = [[7, ["list", str(tmp_path)]], [8, ["what"]]]
        helper.stdin.write("not json\n" + "".join(json.dumps(r) + "\n" for r in requests))
        helper.stdin.flush()
        answers = {}
        for _ in range(2):
            ident, code, out, err = json.loads(helper.stdout.readline())
            answers[ident] = (code, out, err.split(":")[0])
        assert answers == {7: (0, "[]\n", ""), 8: (1, "", "usage")}
        helper.stdin.close()
        assert helper.wait(10) == 0
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


TURNS = """\
import multiprocessing, os, threading
print("started", flush=True)


def worker(tag):
    value = tag
    breakpoint()
    print("went on", tag, flush=True)


second = threading.Thread(target=worker, args=("thread",), name="second")
second.start()
worker("main")
second.join()
child = multiprocessing.get_context("fork").Process(target=worker, args=("child",))
child.start()
worker("parent")
child.join()
"""


def test_two_threads_pause_in_turn_and_a_forked_child_is_an_entry_of_its_own(tmp_path, store):
    """Two threads of a rank at breakpoint(): one pauses, the other waits its turn and says
    so, then pauses once the first goes on. A rank's forked child (multiprocessing, fork)
    and its parent both pause: two entries, each named by its pid, each reachable with
    --pid; a command without one says which there are; `--ranks all --do c` lets both go."""
    script = tmp_path / "turns.py"
    script.write_text(TURNS)
    spec = tmp_path / "job.yml"
    spec.write_text(f"command: python {script}\n")
    stderr_file = tmp_path / "stderr.txt"
    with stderr_file.open("w") as stderr:
        proc, job_id = start_cli_run(spec, store, ranks=1, stderr=stderr)
    try:

        def do(command: str, *extra: str):
            return run_cli("debug", job_id, "--rank", "0", "--do", command, *extra, store=store)

        def value_of_the_paused(other_than: str | None = None) -> str:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                done = do("p value")
                if done.returncode == 0 and done.stdout.strip() not in ("", other_than):
                    return done.stdout.strip()
                time.sleep(0.1)
            raise AssertionError(f"no other thread paused than {other_than}")

        first = value_of_the_paused()
        assert do("c").returncode == 0
        second = value_of_the_paused(other_than=first)
        assert {first, second} == {"'main'", "'thread'"}
        assert do("c").returncode == 0
        found = paused_ranks(store, job_id, 2)
        assert len(found) == 2 and {p["rank"] for p in found} == {0}, found
        listed = run_cli("debug", job_id, "--list", store=store).stdout.splitlines()
        pids = sorted(int(line.split()[3]) for line in listed)
        assert all(re.match(r"rank 0 pid \d+ \(local0\): ", line) for line in listed), listed
        several = do("p value")
        assert several.returncode == 2 and several.stderr.strip() == (
            f"error: rank 0 of job {job_id} has 2 paused processes (pids {pids[0]} and "
            f"{pids[1]}): give --pid PID"
        ), several.stderr
        values = {do("p value", "--pid", str(pid)).stdout.strip() for pid in pids}
        assert values == {"'parent'", "'child'"}, values
        going = run_cli("debug", job_id, "--ranks", "all", "--do", "c", store=store)
        assert going.returncode == 0 and going.stdout.count("runs on") == 2, going.stdout
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = [line.text for line in store.get(job_id).iter_log("rank-0", "stdout")]
    assert sorted(t for t in said if t.startswith("went on")) == [
        "went on child", "went on main", "went on parent", "went on thread",
    ]  # fmt: skip
    assert "thread 'second' waits to pause" in stderr_file.read_text() or (
        "thread 'MainThread' waits to pause" in stderr_file.read_text()
    )
