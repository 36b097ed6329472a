"""`jupyter distrun` as a user runs it: a real subprocess, real jobs, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import LONG_JOB, job_processes, run_cli, run_command_line, start_cli_run


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yml"
    path.write_text(textwrap.dedent(text))
    return path


def test_plan_json_lists_every_process(tmp_path: Path, store):
    spec = _write(
        tmp_path,
        """\
        command: python train.py
        resources: {instance_count: 2}
        distribution: {type: pytorch, process_count_per_instance: 2}
    """,
    )
    done = run_cli("plan", str(spec), "--json", store=store)
    assert done.returncode == 0, done.stderr
    procs = json.loads(done.stdout)
    assert [p["rank"] for p in procs] == [0, 1, 2, 3]
    assert [p["node"] for p in procs] == ["local0", "local0", "local1", "local1"]
    assert {p["host"] for p in procs} == {"127.0.0.1"}
    assert all(p["argv"] == ["/bin/sh", "-c", "python train.py"] for p in procs)
    assert [p["env"]["RANK"] for p in procs] == ["0", "1", "2", "3"]
    assert store.jobs() == []  # planning records nothing and runs nothing


@pytest.mark.slow
def test_the_dry_run_shows_the_exact_command_each_process_starts_with(tmp_path: Path, store):
    spec = _write(
        tmp_path,
        """\
        command: echo "hello from $RANK of $WORLD_SIZE"
        resources: {instance_count: 2}
    """,
    )
    table = run_cli("plan", str(spec), store=store)
    assert "Commands (what each process is started with" in table.stdout
    assert "rank 1 on local1:\n  env " in table.stdout
    procs = json.loads(run_cli("plan", str(spec), "--json", store=store).stdout)
    command = procs[1]["command"]
    assert command.startswith("env ") and "RANK=1 " in command and "agent.py" in command
    code, out = run_command_line(command)  # as pasted into a shell: the same process
    assert (code, out) == (0, "hello from 1 of 2\n")


@pytest.mark.slow
def test_plan_table_and_overrides(tmp_path: Path, store):
    spec = _write(
        tmp_path,
        """\
        command: python train.py
        distribution: {type: pytorch}
    """,
    )
    done = run_cli(
        "plan", str(spec), "--nodes", "3", "--procs-per-node", "2", "--json", store=store
    )
    assert len(json.loads(done.stdout)) == 6
    table = run_cli("plan", str(spec), store=store, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0
    assert "pytorch job plan" in table.stdout and "rank-5" not in table.stdout
    assert "127.0.0.1" in table.stdout


@pytest.mark.slow
def test_run_a_tensorflow_job_prefixes_lines_by_role(tmp_path: Path, store):
    (tmp_path / "show.py").write_text(
        "import json, os; c = json.loads(os.environ['TF_CONFIG']);"
        " print(c['task']['type'], c['task']['index'], len(c['cluster'].get('worker', [])))"
    )
    spec = _write(
        tmp_path,
        """\
        command: python show.py
        code: .
        resources: {instance_count: 2}
        distribution: {type: tensorflow, worker_count: 2, parameter_server_count: 1,
                       evaluator_count: 1}
    """,
    )  # (no chief: with a chief and a ps, the workers would be stopped once the chief ends)
    done = run_cli("run", str(spec), store=store)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert lines == [
        "[evaluator] evaluator 0 0",
        "[ps 0] ps 0 2",
        "[worker 0] worker 0 2",
        "[worker 1] worker 1 2",
    ]


@pytest.mark.slow
def test_jobs_and_logs_read_the_store(tmp_path: Path, store):
    spec = _write(
        tmp_path,
        """\
        command: echo "hello from $RANK"; echo "warning $RANK" >&2; exit $RANK
        resources: {instance_count: 1}
        distribution: {type: pytorch, process_count_per_instance: 2}
    """,
    )
    done = run_cli("run", str(spec), "--name", "exp3", store=store)  # as the magic has it
    assert done.returncode == 1  # rank 1 exits 1
    assert re.match(r"job \S+: 2 ranks on 1 node \(local\); logs in ", done.stderr)
    assert "Root cause: rank 1 on local0 (127.0.0.1) exited with code 1" in done.stderr
    jobs = run_cli("jobs", "--json", store=store)
    (status,) = json.loads(jobs.stdout)
    assert status["state"] == "failed" and status["root_cause"]["rank"] == 1
    assert status["name"] == "exp3"
    job_id = status["job_id"]
    inspected = run_cli("inspect", job_id, store=store).stdout  # why, where one looks first
    assert "Root cause: rank 1 on local0 (127.0.0.1) exited with code 1: warning 1" in inspected
    assert "Last stderr lines of rank 1:\n  warning 1\n" in inspected, inspected
    table = run_cli("jobs", store=store, env={**os.environ, "COLUMNS": "250"})
    assert job_id in table.stdout and "failed" in table.stdout
    assert "1 rank" not in table.stdout and "2 ranks" in table.stdout
    for columns in (80, 120):  # ids are never wrapped, and the table fits
        narrow = run_cli("jobs", store=store, env={**os.environ, "COLUMNS": str(columns)})
        assert re.search(rf"│ {job_id} │ \S+ +│ failed", narrow.stdout), narrow.stdout
        assert max(len(line) for line in narrow.stdout.splitlines()) <= columns
    one = run_cli("logs", job_id[:-2], "--rank", "1", store=store)  # a prefix is enough
    # stdout and stderr are separate pipes: their relative order is not kept, only each's own.
    assert sorted(one.stdout.splitlines()) == ["hello from 1", "warning 1"]
    err = run_cli("logs", job_id, "--rank", "0", "--stream", "stderr", store=store)
    assert err.stdout == "warning 0\n"
    both = run_cli("logs", job_id, "--timestamps", store=store)
    assert len(both.stdout.splitlines()) == 4 and "[rank-0] hello from 0" in both.stdout
    missing = run_cli("logs", job_id, "--rank", "7", store=store)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"error: job {job_id} has no log for 'rank-7' (logs: rank-0, rank-1)"
    )
    unknown = run_cli("logs", "nope", store=store)
    assert unknown.returncode == 2 and "no job 'nope'" in unknown.stderr


@pytest.mark.slow
def test_logs_tail_gives_the_last_lines_and_says_how_many_came_before(tmp_path: Path, store):
    spec = _write(tmp_path, "command: seq 1 20\n")
    assert run_cli("run", str(spec), store=store).returncode == 0
    (job,) = store.jobs()
    last = run_cli("logs", job.job_id, "--tail", "3", store=store)
    assert (last.returncode, last.stdout) == (0, "18\n19\n20\n")
    assert last.stderr == "(17 earlier lines left out; --tail 0 shows every one)\n"
    every = run_cli("logs", job.job_id, "--tail", "0", store=store)
    assert every.stdout.split() == [str(n) for n in range(1, 21)] and every.stderr == ""
    assert run_cli("logs", job.job_id, "--tail", "50", store=store).stderr == ""
    bad = run_cli("logs", job.job_id, "--tail", "-1", store=store)
    assert (bad.returncode, bad.stderr) == (
        2, "error: --tail: -1 is not valid; expected a line count >= 0 (0: every line)\n"
    )  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_stops_every_rank(tmp_path: Path, store):
    spec = _write(tmp_path, LONG_JOB)
    proc, job_id = start_cli_run(spec, store, stderr=subprocess.PIPE)
    assert len(job_processes(job_id)) >= 8
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "cancelled: every process was stopped" in err
    assert job_processes(job_id) == []
    assert store.get(job_id).status()["state"] == "cancelled"


@pytest.mark.slow
def test_killing_the_launcher_stops_every_rank(tmp_path: Path, store):
    """SIGKILL gives the launcher no chance to clean up: the node agents must notice."""
    spec = _write(tmp_path, LONG_JOB)
    proc, job_id = start_cli_run(spec, store)
    assert len(job_processes(job_id)) >= 8
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes(job_id) == []
    # Its status still says running, but nobody owns it: it is shown as lost, not cancellable.
    listed = json.loads(run_cli("jobs", "--json", store=store).stdout)
    assert [j["state"] for j in listed if j["job_id"] == job_id] == ["lost"]
    assert f"job {job_id} (pytorch, lost)" in run_cli("inspect", job_id, store=store).stdout
    refused = run_cli("cancel", job_id, store=store)
    assert refused.returncode == 2
    assert "has no owner any more" in refused.stderr


@pytest.mark.slow
def test_cancel_from_another_process_stops_every_rank(tmp_path: Path, store):
    spec = _write(tmp_path, LONG_JOB)
    proc, job_id = start_cli_run(spec, store, stderr=subprocess.PIPE)
    assert len(job_processes(job_id)) >= 8
    asked = run_cli("cancel", job_id[:-2], store=store)  # a unique prefix is enough
    assert asked.returncode == 0, asked.stderr
    assert f"job {job_id}: cancelled" in asked.stderr
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "cancelled from the command line" in err
    assert job_processes(job_id) == []
    status = store.get(job_id).status()
    assert status["state"] == "cancelled"
    assert {p["state"] for p in status["processes"].values()} == {"stopped"}
    again = run_cli("cancel", job_id, store=store)
    assert again.returncode == 0
    assert "already ended: cancelled" in again.stderr


@pytest.mark.slow
def test_inspect_shows_every_process_with_status_and_tf_config(tmp_path: Path, store):
    spec = _write(
        tmp_path,
        """\
        command: echo ok
        resources: {instance_count: 2}
        distribution: {type: tensorflow, worker_count: 2, parameter_server_count: 1}
    """,
    )
    assert run_cli("run", str(spec), store=store).returncode == 0
    job_id = store.jobs()[0].job_id
    shown = run_cli("inspect", job_id, store=store, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert f"job {job_id} (tensorflow, succeeded)" in shown.stdout
    for name in ("worker-0", "worker-1", "ps-0"):
        assert re.search(rf"{name}\s.*succeeded\s.*0", shown.stdout)
    assert shown.stdout.count("TF_CONFIG of") == 3
    assert '"type": "ps"' in shown.stdout


@pytest.mark.slow
def test_plan_and_inspect_say_what_would_make_ranks_collide(tmp_path: Path, store):
    """Environment parity before launch: unset OMP_NUM_THREADS under mpirun, ranks sharing
    the one visible GPU (a node's GPU count: test_plan); a plain pytorch job says nothing."""

    def checks(text: str, *args: str, env: dict | None = None) -> list[str]:
        spec = _write(tmp_path, text)
        done = run_cli("plan", str(spec), *args, store=store,
                       env={**os.environ, "COLUMNS": "250", **(env or {})})  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if line.startswith("Check: ")]

    mpi = "command: python t.py\nresources: {instance_count: 2}\n"
    mpi += "distribution: {type: mpi, process_count_per_instance: 2}\n"
    assert checks(mpi) == [
        "Check: OMP_NUM_THREADS is unset and local0, local1 each run 2 ranks: each one's "
        "math libraries would take every core (torchrun sets 1 here); set it, e.g. --env "
        "OMP_NUM_THREADS=1"
    ]
    assert checks(mpi + "environment_variables: {OMP_NUM_THREADS: '4'}\n") == []
    torch = "command: python t.py\ndistribution: {type: pytorch, process_count_per_instance: 2}\n"
    assert checks(torch) == []  # we set OMP_NUM_THREADS=1 as torchrun does
    (one_gpu,) = checks(torch + "environment_variables: {CUDA_VISIBLE_DEVICES: '0'}\n")
    assert one_gpu.startswith("Check: the 2 ranks on local0 all see CUDA_VISIBLE_DEVICES=0 (1 ")
    assert checks(torch + "environment_variables: {CUDA_VISIBLE_DEVICES: ''}\n") == []
    # inspect reads the stored plan: a real job's note comes back with it.
    done = run_cli("run", str(_write(tmp_path, mpi.replace("python t.py", "echo ok"))),
                   store=store)  # fmt: skip
    job_id = store.jobs()[-1].job_id
    shown = run_cli("inspect", job_id, store=store, env={**os.environ, "COLUMNS": "250"})
    assert "Check: OMP_NUM_THREADS is unset and local0, local1" in shown.stdout, (done, shown)


# Texts that rich would read as markup: gloo's own error line, a tag, a closing tag alone.
GLOO_ERROR = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:29500"
)
HOSTILE_NAME = "[bold red]train[/]"


@pytest.mark.slow
def test_hostile_texts_print_as_they_are_in_every_table(tmp_path: Path, store):
    """A root cause in gloo's words, a job named like markup and a node's host `h[/x]`:
    `jobs`, `inspect`, `nodes` and `%distrun jobs` print them literally, exit as usual,
    and never show a traceback (rich's MarkupError broke the whole listing)."""
    spec = _write(
        tmp_path,
        f"""\
        name: {json.dumps(HOSTILE_NAME)}
        command: {json.dumps(f"echo '{GLOO_ERROR}' >&2; exit 1")}
        resources: {{instance_count: 1}}
        distribution: {{type: pytorch, process_count_per_instance: 1}}
    """,
    )
    done = run_cli("run", str(spec), store=store)
    assert done.returncode == 1 and GLOO_ERROR in done.stderr
    wide = {**os.environ, "COLUMNS": "400"}
    table = run_cli("jobs", store=store, env=wide)
    assert table.returncode == 0, table.stderr
    assert GLOO_ERROR in table.stdout and HOSTILE_NAME in table.stdout
    (job_id,) = [s["job_id"] for s in json.loads(run_cli("jobs", "--json", store=store).stdout)]
    inspect = run_cli("inspect", job_id, store=store, env=wide)
    assert inspect.returncode == 0 and "Traceback" not in inspect.stderr, inspect.stderr
    nodes_file = tmp_path / "nodes.yml"
    nodes_file.write_text("nodes:\n  - {name: n1, host: 'h[/x]', port: 1}\n")
    nodes = run_cli("nodes", "--nodes-file", str(nodes_file), env=wide)
    assert nodes.returncode == 1 and "Traceback" not in nodes.stderr, nodes.stderr
    assert "h[/x]" in nodes.stdout and "unreachable" in nodes.stdout
    # A node's name names a folder: one like `n[/x]` is refused, in one line.
    nodes_file.write_text("nodes:\n  - {name: 'n[/x]', host: 127.0.0.1, port: 1}\n")
    refused = run_cli("nodes", "--nodes-file", str(nodes_file), env=wide)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "expected a name of letters, digits" in refused.stderr
    from helpers import execute_notebook

    # In a kernel, rich shows the table as a display (115 columns: the root cause is cut).
    cell = execute_notebook(f"%distrun jobs --store {store.root}").cells[1]
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs)
    assert HOSTILE_NAME in shown and "rank 0 on local0" in shown, cell.outputs
    assert [o.output_type for o in cell.outputs] == ["display_data"]


@pytest.mark.slow
def test_with_colour_never_no_escape_sequence_reaches_the_terminal(tmp_path: Path, store):
    """A rank's escape sequences (a window title, colours, a reset, a cursor move) and
    control bytes pass to the terminal only where colours are on; with --color never (or
    output that is not a terminal) the text alone, a progress bar's last state."""
    printed = r"print('\x1b]0;pwned\x07\x1b[31mred\x1b[0m\tok\x1bc\x1b[2J\x07!\n10%\r50%')"
    spec = _write(
        tmp_path,
        f"""\
        command: {json.dumps(f'{sys.executable} -c "{printed}"')}
        distribution: {{type: pytorch, process_count_per_instance: 1}}
    """,
    )
    never = run_cli("run", str(spec), "--color", "never", store=store)
    assert never.returncode == 0, never.stderr
    assert "[rank 0] red\tok!\n[rank 0] 50%\n" in never.stdout and "\x1b" not in never.stdout
    always = run_cli("run", str(spec), "--color", "always", store=store)
    assert "\x1b[31mred" in always.stdout  # asked for: the rank's own colours too


def test_a_job_on_local_nodes_never_imports_ssh(tmp_path: Path, store):
    """paramiko and cryptography (130 ms of a start) are imported where SSH is used, not
    by every CLI call, kernel and server that names the SSH backend's options: `run` on
    local nodes and `jobs` go without them."""
    spec = tmp_path / "job.yml"
    spec.write_text("command: echo hi\nresources: {instance_count: 2}\n")
    code = (
        "import sys\nfrom jupyter_dist.cli import main\n"
        f"for argv in (['run', {str(spec)!r}], ['jobs']):\n"
        f"    assert main([*argv, '--store', {str(store.root)!r}]) == 0\n"
        "print(sorted(m for m in ('paramiko', 'cryptography') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def test_pool_on_slurm_outside_an_allocation_is_one_line(tmp_path: Path):
    """`pool list --backend slurm` with no allocation to look in says so and what to name;
    another backend is refused by the parser with the one it takes."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    listed = run_cli("pool", "list", "--backend", "slurm", env=env)
    assert listed.returncode == 1 and listed.stdout == ""
    assert listed.stderr == (
        "slurm: not inside an allocation (no SLURM_JOB_ID): name one with --slurm-job ID\n"
    )
    refused = run_cli("pool", "list", "--backend", "ray", env=env)
    assert refused.returncode == 2 and "invalid choice: 'ray' (choose from 'slurm')" in (
        refused.stderr
    )
