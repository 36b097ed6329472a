"""Helpers for tests: the real process table, and the CLI in a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jupyter_dist.store import JobStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# A rank that says what it found as it started (torch imported, parent, argv, ...) and
# joins a gloo all_reduce: the pool tests' subject (tests/scripts/pool_probe.py).
POOL_PROBE = ROOT / "tests" / "scripts" / "pool_probe.py"

# A Dask job on two nodes whose client says where its workers run and sums on them
# ("workers 4 on ['<host>', '<host>']", "total 328350").
DASK_JOB = """\
command: >-
  python -c "import os, socket; from distributed import Client;
  c = Client(os.environ['DASK_SCHEDULER_ADDRESS']);
  hosts = c.run(socket.gethostname);
  print('workers', len(hosts), 'on', sorted(set(hosts.values())));
  print('total', sum(c.gather(c.map(lambda x: x * x, range(100)))))"
resources: {instance_count: 2}
distribution: {type: dask, process_count_per_instance: 2, threads_per_process: 1}
"""

# Azure ML's own example of a distributed PyTorch command job, as its docs write it.
AZURE_JOB = """\
$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json
code: src
command: >-
  python train.py --epochs ${{inputs.epochs}} --lr ${{inputs.learning_rate}}
inputs:
  epochs: 10
  learning_rate: 0.01
environment: azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest
compute: azureml:gpu-cluster
distribution:
  type: PyTorch
  process_count_per_instance: 2
resources:
  instance_count: 2
display_name: pytorch-cifar-distributed-example
experiment_name: pytorch-cifar-distributed-example
description: Train a basic convolutional neural network with PyTorch on CIFAR-10.
"""

# A rank that needs 2 s after SIGTERM to save, and notes each time its handler runs.
SAVER = """\
import os, signal, sys, time
folder = sys.argv[1]
rank = os.environ.get("RANK") or os.environ["OMPI_COMM_WORLD_RANK"]  # torch's, or MPI's
note = os.path.join(folder, "rank-" + rank + ".txt")
def save(*_):
    with open(note, "a") as f:
        f.write("term\\n")
    time.sleep(2)
    with open(note, "a") as f:
        f.write("saved\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(os.path.join(folder, "ready-" + rank), "w").close()
print("READY", flush=True)
time.sleep(300)
"""

# 2 nodes x 2 ranks that each say "started", then wait to be stopped.
LONG_JOB = (
    "command: echo started; sleep 300\nresources: {instance_count: 2}\n"
    "distribution: {type: pytorch, process_count_per_instance: 2}\n"
)


# Rank 2 waits for data in load_batch for ever while the others wait for it in all_reduce:
# a hung job (the stacks and stall tests). Each rank prints READY once its group is up.
HANG_SCRIPT = """\
import time
import torch
import torch.distributed as dist

def load_batch():
    time.sleep(3600)  # this rank's data never comes

dist.init_process_group("gloo")
print("READY", flush=True)
if dist.get_rank() == 2:
    load_batch()
dist.all_reduce(torch.ones(1))
"""


def job_processes(job_id: str, among: list[int] | None = None) -> list[int]:
    """Live PIDs (zombies are dead) whose environment carries the job's id, read from
    /proc: every process on this machine, or those `among`."""
    marker = f"DISTRUN_JOB_ID={job_id}".encode()
    pids = among if among is not None else [int(e) for e in os.listdir("/proc") if e.isdigit()]
    found = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(pid)
        except OSError:
            continue  # gone while we looked
    return found


def result_reports(store: JobStore, job_id: str) -> dict[int | str, dict]:
    """What each rank of a job printed as its `RESULT {json}` line, by rank (or by role,
    for a report that has no rank: a TensorFlow chief)."""
    record = store.get(job_id)
    found = {}
    for key in record.log_keys():
        for line in record.iter_log(key, "stdout"):
            if line.text.startswith("RESULT "):
                report = json.loads(line.text.removeprefix("RESULT "))
                found[report.get("rank", report.get("role"))] = report
    return found


def strict_json(text: str | bytes):
    """`text` read as a browser's JSON.parse or jq reads it: a bare NaN or Infinity, which
    Python's json writes and reads, is an AssertionError naming it."""

    def refuse(name: str):
        raise AssertionError(f"{name} was sent, which is not JSON (browsers and jq refuse it)")

    return json.loads(text, parse_constant=refuse)


def run_cli(*args: str, store: JobStore | None = None, timeout: float = 120, **kwargs):
    """`jupyter distrun ARGS` in a real subprocess; returns the CompletedProcess. Its
    stdin is empty unless given (a console it opens reads end of input, never the terminal
    the tests were started from)."""
    argv = [sys.executable, "-m", "jupyter_dist.cli", *args]
    if store is not None:
        argv += ["--store", str(store.root)]
    if "input" not in kwargs:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def start_cli_run(spec: Path, store: JobStore, *extra: str, ranks: int = 4, stderr=None):
    """`jupyter distrun run SPEC` in the background; returns once `ranks` lines saying
    "started" came out (the command must print that), with the process and its job id."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--store", str(store.root),
         *extra],
        stdout=subprocess.PIPE, stderr=stderr if stderr is not None else subprocess.DEVNULL,
        text=True,
        # Ctrl-C reaches it as it would from a terminal, even when the tests themselves were
        # started in the background (where a shell starts them ignoring SIGINT).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    seen = 0
    deadline = time.monotonic() + 60
    while seen < ranks and time.monotonic() < deadline:
        if "started" in proc.stdout.readline():
            seen += 1
    assert seen == ranks, f"only {seen} of {ranks} ranks started"
    return proc, store.jobs()[0].job_id


def paused_ranks(store: JobStore, job_id: str, count: int, timeout: float = 60) -> list[dict]:
    """The job's ranks paused in their debugger (`jupyter distrun debug JOB --json`), once
    `count` of them are listed (or `timeout` passed: what is listed then)."""
    import json
    import time

    deadline = time.monotonic() + timeout
    while True:
        done = run_cli("debug", job_id, "--json", store=store)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@contextlib.contextmanager
def ipc_kernel_manager(prefix: Sequence[str] = ()):
    """A KernelManager whose kernel talks to this process over files (ZeroMQ's ipc, in a
    folder of its own), not TCP ports: the ports jupyter_client picks as free can be taken
    by another process before the kernel binds them (a kernel that died before replying
    to kernel_info, with two workers' jobs opening ports beside it), and files cross
    network namespaces. With `prefix`, the kernel starts under those words (`ip netns exec
    NS`)."""
    from jupyter_client import KernelManager

    class Prefixed(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            return [*prefix, *super().format_kernel_cmd(extra_arguments)]

    with tempfile.TemporaryDirectory() as sockets:
        yield Prefixed(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "kernel"))


def execute_notebook(
    *sources: str, allow_errors: bool = False, timeout: int = 180, kernel_prefix: list[str] = ()
):
    """A notebook of `%load_ext jupyter_dist` and these cells, run in a real kernel (over
    ipc: `ipc_kernel_manager`). With `kernel_prefix` the kernel starts under those words
    (`ip netns exec NS`: a test node's network)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in ("%load_ext jupyter_dist", *sources)]
    run_notebook(nb, timeout=timeout, allow_errors=allow_errors, kernel_prefix=kernel_prefix)
    return nb


def run_notebook(nb, kernel_prefix: Sequence[str] = (), **options) -> None:
    """Run `nb` in place, in a real kernel over ipc (`ipc_kernel_manager`); `options` go
    to nbclient's NotebookClient (timeout, allow_errors, resources)."""
    from nbclient import NotebookClient

    with ipc_kernel_manager(kernel_prefix) as km:
        NotebookClient(nb, km=km, **options).execute()


@contextlib.contextmanager
def started_kernel(startup_timeout: float = 60):
    """A real kernel over ipc (`ipc_kernel_manager`): (manager, ready client). The caller
    shuts it down (some tests do so politely, as JupyterLab asks)."""
    with ipc_kernel_manager() as km:
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=startup_timeout)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        yield km, kc


def stream_text(cell) -> str:
    """What a cell printed (stdout and stderr)."""
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def run_command_line(command: str, timeout: float = 60) -> tuple[int, str]:
    """A dry run's command line, run by a shell as a user would paste it: (exit code,
    stdout). Its stdin stays open until it ends (the node agent stops its process when its
    stdin closes, as when the launcher dies)."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        out = proc.stdout.read()
        return proc.wait(timeout=timeout), out
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()


def await_text(kc, text: str, count: int, timeout: float = 60) -> int:
    """Read the kernel's iopub messages until `text` was printed `count` times (or the
    timeout passed); how many times it was."""
    import queue
    import time

    seen, deadline = 0, time.monotonic() + timeout
    while seen < count and time.monotonic() < deadline:
        try:
            seen += kc.get_iopub_msg(timeout=1)["content"].get("text", "").count(text)
        except queue.Empty:
            continue
    return seen


def interrupt_and_reply(km, kc, msg_id: str) -> dict:
    """Interrupt the kernel; the reply to the execute request `msg_id`, once the kernel is
    idle again: after an error, ipykernel aborts any request that reaches it while it
    clears its queue, so a test's next request must not be sent before (its iopub
    messages up to then are read)."""
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):  # fmt: skip
            return reply


@contextlib.contextmanager
def running_kernel():
    """A real kernel with jupyter_dist loaded: (manager, client); shut down afterwards."""
    with started_kernel() as (km, kc):
        try:
            kc.execute_interactive("%load_ext jupyter_dist", timeout=60)
            yield km, kc
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def not_private(root: Path) -> list[str]:
    """Every folder or file under `root` (itself included) that its group or others may
    read, write or enter: "PATH 0755". The README's promise: files 0600 (a program 0700)
    in 0700 folders, for every file of every feature."""
    import stat

    found = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path} {mode:04o}")
    return found


def pool_programs():
    """The pool's programs of node_side (protocol, server, front, agent's part), imported
    here: they import their protocol by the name it is shipped under, which is, in this
    process, the package's module."""
    import importlib

    from jupyter_dist.node_side import pool_protocol

    sys.modules.setdefault("distrun_pool_protocol", pool_protocol)
    return pool_protocol, *(
        importlib.import_module(f"jupyter_dist.node_side.pool_{name}")
        for name in ("server", "front", "agent")
    )


def ship_pool_programs(folder: Path) -> Path:
    """The pool's programs written into `folder`/pyhook under their shipped names, as a job
    that preloads modules has them (run/launch.py); the folder."""
    from jupyter_dist import node_side

    hook = folder / node_side.HOOK_FOLDER
    hook.mkdir(parents=True, exist_ok=True)
    for name in node_side.POOL_FILES:
        (folder / node_side.shipped_path(name)).write_text(node_side.source(name))
    return hook
