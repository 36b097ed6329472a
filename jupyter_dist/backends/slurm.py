"""The Slurm backend: a job's processes run as job steps on the nodes of a Slurm allocation.
Inside one (JupyterLab or `jupyter distrun run` started under `salloc`/`sbatch`, where
SLURM_JOB_ID is set), its nodes; outside, an allocation asked for here (`salloc`, sized
from the spec, with the spec's `backend:` options: partition, time, gpus_per_node, account,
qos, constraint), shown while it is pending, given back when the job ends, fails or is
cancelled (an interrupt while pending gives it back too), and when the process that holds
it dies, even by SIGKILL (`HOLDER`).

No SSH: every process is one `srun --jobid JOB --nodelist NODE -N1 -n1 --overlap ...
agent.py ...`, run from here, whose pipes carry the agent's protocol like a local process's.

A job that preloads modules gets each node's pool (node_side/pool_server.py) as a job step of its
own (`hold`), started here before its processes: Slurm ends whatever a step started when
the step ends, so a pool one rank's agent started would end with that rank, and take the
node's other ranks, forked from it, with it. The pool's step outlives the job's (its srun
runs on here, in a session of its own, not this process's child) and ends with the pool:
idle for its idle time, `jupyter distrun pool stop --backend slurm`, or the allocation's end.

The nodes must see this machine's files at the same paths (a cluster's shared filesystem):
the notebook's Python, the job store and the code folder are used in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import queue
import re
import selectors
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from jupyter_dist.backends.agent_client import AGENT_SOURCE, agent_argv, agents_say
from jupyter_dist.backends.local import LocalBackend, LocalProcess
from jupyter_dist.backends.node_ports import on_every_node, ports_on_nodes
from jupyter_dist.errors import DistrunError, NodeError
from jupyter_dist.node_side import shipped_path
from jupyter_dist.node_side.agent import PATH_FIRST_VAR
from jupyter_dist.node_side.pool_protocol import HELD_VAR, PRELOAD_VAR
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.options import Option
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import LaunchPlan, MpiLaunch, PlannedFile, ProcessPlan
from jupyter_dist.plan.mpi import runs_ssh
from jupyter_dist.plan.summary import counted
from jupyter_dist.spec import MAX_PROCS_PER_NODE, SALLOC_KEYS, JobSpec

COMMAND_TIMEOUT_S = 60
HOLDER_EXIT_S = 10.0  # how long a holding salloc has to end before it is stopped
POOL_STEP_S = 30.0  # how long a node's pool step has to say it listens
PENDING_POLL_S = 5.0  # how often a pending request's reason is asked again
# Pending reasons that no wait cures (the request exceeds what the partition is or allows):
# such a request is withdrawn at once, with what the partitions offer.
NEVER_GRANTED = {
    "PartitionConfig": "more than the partition has",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "more time than the partition allows",
    "BadConstraints": "what no node of the partition offers",
}
# What srun says of a task's exit: the agent already reports it, so these are not output.
_SRUN_EXIT_NOTE = re.compile(
    rb"srun: (error: \S+: task \d+: (Exited with exit code \d+|Killed|Terminated)"
    rb"|launch/slurm: _step_signal: Terminating StepId=\S+)\s*"
)


class SlurmProcess(LocalProcess):
    """A process started by srun: the agent's protocol over srun's pipes, srun's own notes
    of the task's exit left out of the output."""

    def chunks(self, stream: str) -> Iterator[bytes]:
        if stream == "stdout":
            yield from super().chunks(stream)
            return
        held = b""
        for data in super().chunks(stream):
            held += data
            *lines, held = held.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not _SRUN_EXIT_NOTE.fullmatch(line))
            if kept:
                yield kept
        if held and not _SRUN_EXIT_NOTE.fullmatch(held):
            yield held


def _require(tool: str) -> None:
    if not shutil.which(tool):
        raise NodeError(f"slurm: {tool} not found on PATH (is Slurm's client installed?)")


def _ended(salloc: subprocess.Popen) -> None:
    """Wait for a holding salloc to end once its command's input closed (about a second),
    and stop it where it does not: one was found still running, orphaned and spinning a
    core, long after its allocation was given back and its command had ended. SIGTERM
    first (salloc then gives back what it holds), SIGKILL last."""
    for stop in (None, salloc.terminate, salloc.kill):
        if stop is not None:
            with contextlib.suppress(OSError):
                stop()
        try:
            salloc.wait(timeout=HOLDER_EXIT_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _cancel(job_id: str) -> None:
    """scancel, quietly: used where the job is being given back anyway."""
    subprocess.run(["scancel", job_id], capture_output=True, timeout=COMMAND_TIMEOUT_S)


def _slurm(*argv: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """A Slurm client command's output; NodeError with its last line when it fails."""
    _require(argv[0])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NodeError(f"slurm: {argv[0]} did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise NodeError(f"slurm: {shlex.join(argv[:3])} failed: {last}")
    return done.stdout


# Its launch options: the allocation to run in, or the one it asks for (salloc's options,
# the spec's `backend:` keys).
_ALLOCATION_HELP = {
    "partition": ("NAME", "the partition to allocate in"),
    "time": ("LIMIT", "the allocation's time limit, e.g. 01:00:00"),
    "gpus_per_node": ("N", "GPUs per node"),
    "account": ("NAME", "the account to charge"),
    "qos": ("NAME", "quality of service"),
    "constraint": ("FEATURES", "node features, e.g. a100"),
}
# Slurm's time formats (sbatch --time): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or
# no limit; checked when planned, not when salloc (or an exported script) refuses it.
_TIME = r"(?i:unlimited|infinite)|\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}"
_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
SLURM_OPTIONS = (
    Option(
        "slurm_job",
        "run in this allocation (its job id; default: SLURM_JOB_ID's, else a new one)",
        metavar="ID",
        backend="slurm",
        spec_key="job",
    ),
    *(
        Option(
            key,
            text,
            kind="int" if key == "gpus_per_node" else "str",
            metavar=metavar,
            backend="slurm",
            bounds=(0, MAX_PROCS_PER_NODE) if key == "gpus_per_node" else None,
            pattern=_TIME if key == "time" else None,
            expects=_TIME_FORMATS if key == "time" else "",
        )
        for key, (metavar, text) in _ALLOCATION_HELP.items()
    ),
)


class SlurmBackend(LocalBackend):
    """Job steps on the nodes of a Slurm allocation: local srun processes, each carrying one
    agent to its node (so starting, the dry run, files and collecting are the local
    backend's, with srun in front)."""

    name = "slurm"
    feeds_directly = False  # its agents run on the nodes, beyond srun: they relay
    options = SLURM_OPTIONS

    def __init__(self, job_id: str | None = None, report=None) -> None:
        self.job_id = job_id or os.environ.get("SLURM_JOB_ID", "")
        self.allocated = False  # whether this backend asked for the allocation (and frees it)
        self._holder: subprocess.Popen | None = None  # the salloc that holds it (HOLDER)
        self._report = report or (lambda text: print(text, file=sys.stderr, flush=True))

    def acquire(self, spec: JobSpec, inventory: Inventory, workdir: str, cwd: str) -> list[Node]:
        """The allocation's nodes (the first `instance_count`, or those `spec.nodes`
        names), each with the address Slurm knows it by; outside an allocation, one is
        asked for first (blocks while it is pending)."""
        if spec.backend and spec.backend.job:  # --slurm-job: the one named, over SLURM_JOB_ID
            self.job_id = spec.backend.job
        if not self.job_id:
            self.job_id = self._allocate(spec)
            self.allocated = True
        names = self._allocation_names()
        if spec.nodes:
            unknown = [n for n in spec.nodes if n not in names]
            if unknown:
                raise NodeError(
                    f"node {unknown[0]!r} is not in Slurm job {self.job_id} "
                    f"(its nodes: {', '.join(names)})"
                )
            names = list(spec.nodes)
        elif spec.instance_count > len(names):
            raise NodeError(
                f"the job asks for {spec.instance_count} nodes but Slurm job {self.job_id} "
                f"has {len(names)} ({', '.join(names)})"
            )
        return [_node(name, workdir, cwd) for name in names[: spec.instance_count]]

    def allocation_nodes(self, names: list[str] | None = None) -> list[Node]:
        """The allocation's nodes (or those of them `names` picks), for a look at them
        outside any job (`jupyter distrun pool --backend slurm`). NodeError outside an
        allocation, or for a name not in it."""
        if not self.job_id:
            raise NodeError(
                "slurm: not inside an allocation (no SLURM_JOB_ID): name one with --slurm-job ID"
            )
        found = self._allocation_names()
        unknown = [name for name in names or [] if name not in found]
        if unknown:
            raise NodeError(
                f"node {unknown[0]!r} is not in Slurm job {self.job_id} "
                f"(its nodes: {', '.join(found)})"
            )
        return [_node(name, "", "") for name in names or found]

    def _allocation_names(self) -> list[str]:
        """The names of the running allocation's nodes; NodeError in Slurm's words."""
        try:
            found = _slurm("squeue", "-h", "-j", self.job_id, "-o", "%T %N")
        except NodeError as exc:  # an unknown id, or no controller: Slurm's own words
            raise NodeError(f"slurm: job {self.job_id}: {exc.args[0].split(': ', 2)[-1]}") from None
        state, _, nodelist = found.partition(" ")
        if state.strip() != "RUNNING":
            raise NodeError(
                f"slurm: job {self.job_id} is {state.strip().lower() or 'gone'}, not running"
            )
        return _slurm("scontrol", "show", "hostnames", nodelist.strip()).split()

    def preflight(self, nodes: list[Node]) -> list[Node]:
        return nodes  # acquire asked Slurm; a step that cannot start says why in confirm

    def spares(self, inventory: Inventory) -> list[Node]:
        """None: the allocation's nodes are the job's, and a restart runs in it again."""
        return []

    def release(self) -> None:
        """Give back the allocation this backend asked for (none it found). Idempotent."""
        if self.allocated:
            self.allocated = False
            _cancel(self.job_id)
        holder, self._holder = self._holder, None
        if holder is not None:  # its end is salloc's: the allocation is given back
            with contextlib.suppress(OSError):
                holder.stdin.close()
            _ended(holder)

    def _allocate(self, spec: JobSpec) -> str:
        """salloc sized from the spec, running HOLDER: its job id once granted. While it is
        pending, says why (squeue's reason) whenever the reason changes, and when it is
        granted; a request Slurm can never grant is withdrawn; an interrupt gives it back."""
        _require("salloc")
        proc = subprocess.Popen(
            salloc_argv(spec),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()  # salloc's stderr; None once it ends
        threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
        job_id, said, reason = "", [], ""
        asked_at = next_poll = time.monotonic()
        try:
            while True:
                try:  # short waits: an interrupt is never held up
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                said += [line] if line else []
                found = re.search(r"(Pending|Granted) job allocation (\d+)", line)
                if found:
                    job_id = found.group(2)
                    if found.group(1) == "Granted":
                        if reason:
                            waited = time.monotonic() - asked_at
                            self._report(f"slurm: job {job_id} granted after {waited:.0f} s")
                        self._holder = proc  # its stdin, our pipe, holds the allocation
                        return job_id
                    next_poll = 0.0  # ask why at once
                if job_id and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + PENDING_POLL_S
                    now = _reason(job_id)
                    if now in NEVER_GRANTED:  # Slurm would keep it pending for ever
                        raise _never_granted(now, spec)
                    if now == "None":  # the scheduler has not looked at it yet
                        next_poll = time.monotonic() + 0.5
                    elif now != reason:
                        reason = now
                        self._report(f"slurm: job {job_id} is pending ({reason})")
            proc.wait()
            raise _allocation_error(said, spec)
        except BaseException:
            proc.terminate()  # salloc gives a pending request back when it is stopped
            if job_id:
                _cancel(job_id)
            raise
        finally:
            if proc is not self._holder and proc.poll() is None:
                proc.wait(timeout=COMMAND_TIMEOUT_S)

    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        return ports_on_nodes(requests, nodes, self.run_on_node, on_every_node)

    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        """The local backend's (the nodes see these files), then each node's pool where the
        job preloads modules (see the module's docstring)."""
        super().prepare(plan, nodes)
        firsts: dict[str, ProcessPlan] = {}  # node -> its first process that would fork
        for proc in plan.processes:
            if proc.env.get(PRELOAD_VAR):
                firsts.setdefault(proc.node, proc)
        by_name = {node.name: node for node in nodes}
        on_every_node(
            [by_name[name] for name in firsts],
            lambda node: self._hold_pool(node, firsts[node.name]),
        )

    def _hold_pool(self, node: Node, proc: ProcessPlan) -> str:
        """Start `node`'s pool for `proc`'s preload as a step of its own unless one runs
        (pool_agent.py `hold`, with the environment `proc` will have); what it said (`running`,
        `started`), or "" when it said nothing in time: the agents then say that their
        ranks start cold."""
        pool = posixpath.join(proc.env["DISTRUN_JOB_DIR"], shipped_path("pool_agent.py"))
        # Not bound to one CPU (the step's): the ranks it forks take their fronts' CPUs.
        argv = [
            *self._step(node),
            "--job-name=distrun-pool",
            "--cpu-bind=none",
            node.python,
            pool,
            "hold",
        ]
        # Started through a process that ends at once: the srun is no child of this one
        # (a kernel, a `run`), and outlives it, as the pool does.
        starter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)",
                *argv,
            ],
            env={**os.environ, **proc.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        starter.wait()
        with starter.stdout, selectors.DefaultSelector() as waiting:
            waiting.register(starter.stdout, selectors.EVENT_READ)
            if not waiting.select(POOL_STEP_S):
                return ""
            return starter.stdout.readline().decode(errors="replace").strip()

    def start(self, proc: ProcessPlan, node: Node, grace: float) -> LocalProcess:
        return super().start(_uses_held_pool(proc), node, grace)

    def command_line(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        return super().command_line(_uses_held_pool(proc), node, grace)

    def sweep(self, job_id: str, node_names: set[str]) -> list[int]:
        """The agent's sweep on every node where one did not report a clean exit."""
        return self._agents_say("--sweep", job_id, node_names)

    def terminate_ranks(self, job_id: str, node_names: set[str]) -> list[int]:
        return self._agents_say("--term", job_id, node_names)

    def _agents_say(self, flag: str, job_id: str, node_names: set[str]) -> list[int]:
        """As job steps on the named nodes (they see this machine's files: the agent's own)."""
        nodes = [Node(name, name, "slurm", sys.executable) for name in sorted(node_names)]
        return agents_say(flag, job_id, nodes, self.run_on_node, lambda _: str(AGENT_SOURCE))

    def mpi_launch(self, ctx: PlanContext) -> MpiLaunch:
        return mpi_launch(ctx)

    def _step(self, node: Node) -> list[str]:
        """An srun that runs one task on `node` within the allocation, beside other steps."""
        return [
            "srun",
            f"--jobid={self.job_id}",
            f"--nodelist={node.name}",
            "--nodes=1",
            "--ntasks=1",
            "--overlap",
            "--kill-on-bad-exit=1",
            "--quiet",
        ]

    def _argv(
        self, proc: ProcessPlan, node: Node, grace: float, stdin_fd: int | None = None
    ) -> list[str]:
        agent = agent_argv(node.python, str(AGENT_SOURCE), proc.cwd, proc.argv, grace, proc.stdin)
        return [*self._step(node), *agent]

    def _handle(
        self, popen: subprocess.Popen, proc: ProcessPlan, node: Node, feed: int | None = None
    ) -> SlurmProcess:
        return SlurmProcess(popen, f"{proc.label} on {node.name}")

    def run_on_node(
        self, node: Node, argv: list[str], timeout: float = COMMAND_TIMEOUT_S
    ) -> tuple[int, str, str]:
        """`argv` as a step of the allocation on `node`, beside the job's own steps."""
        try:
            done = subprocess.run(
                [*self._step(node), *argv],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 1, "", f"srun: {exc}"
        return done.returncode, done.stdout, done.stderr


def mpi_launch(ctx: PlanContext) -> MpiLaunch:
    """mpirun (itself a step on node 0) starts its daemons on the job's nodes as job steps
    of the same allocation, through Open MPI's Slurm launcher: no SSH, no hostfile. The
    hosts are the job's nodes by Slurm name, not the whole allocation.

    horovodrun gets the same settings as Open MPI variables (for the mpirun it starts),
    and an `ssh` of the job's that is srun (for what it starts itself: its checks, its
    Gloo ranks)."""
    per_node = ctx.spec.distribution.process_count_per_instance
    hosts = ",".join(f"{node.name}:{per_node}" for node in ctx.nodes)
    # its srun shares the allocation with the other steps, as ours do
    mca = {"plm": "slurm", "ras": "^slurm", "plm_slurm_args": "--overlap"}
    args = (
        "--host",
        hosts,
        *(arg for name, value in mca.items() for arg in ("--mca", name, value)),
    )
    if not runs_ssh(ctx):
        return MpiLaunch(args=args, hostfile=False, hosts=hosts)
    folder = posixpath.join(ctx.job_dir(ctx.nodes[0]), "bin")
    return MpiLaunch(
        args=args,
        files=(PlannedFile(0, posixpath.join(folder, "ssh"), SRUN_AS_SSH, executable=True),),
        hostfile=False,
        hosts=hosts,
        ssh_env={
            PATH_FIRST_VAR: folder,
            **{f"OMPI_MCA_{name}": value for name, value in mca.items()},
        },
    )


# horovodrun's `ssh [OPTIONS] HOST [OPTIONS] COMMAND` as a step of the allocation on HOST,
# beside the job's other steps; COMMAND runs with the shell, as sshd would run it.
SRUN_AS_SSH = r"""#!/bin/sh
# jupyter-dist: `ssh HOST COMMAND` as a step of this Slurm allocation on HOST.
host=
while [ $# -gt 0 ]; do
    case $1 in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # an option and its value
        -*) shift ;;
        *) [ -n "$host" ] && break; host=$1; shift ;;
    esac
done
[ -n "$host" ] || { echo "jupyter-dist ssh: no host given" >&2; exit 255; }
exec srun --jobid="$SLURM_JOB_ID" --nodelist="$host" --nodes=1 --ntasks=1 --overlap \
    --kill-on-bad-exit=1 --quiet /bin/sh -c "$*"
"""


def allocation_options(spec: JobSpec, name: str = "jupyter-dist") -> list[str]:
    """The options that ask Slurm for the job's nodes (salloc's and sbatch's): nodes, tasks
    per node, a job name, and the spec's backend options."""
    options = spec.backend
    argv = [
        f"--nodes={spec.instance_count}",
        f"--ntasks-per-node={spec.processes_per_node()}",
        f"--job-name={name}",
    ]
    for flag in SALLOC_KEYS:
        value = getattr(options, flag, None) if options else None
        if flag == "gpus_per_node":  # the backend's, else the job's resources'
            value = spec.gpus_per_node()
        if value is not None:
            argv.append(f"--{flag.replace('_', '-')}={value}")
    return argv


# What salloc runs on this machine while the backend holds its allocation: it reads its
# stdin, our pipe, to the end. When the backend releases the allocation, or its owner dies
# (a kernel or a supervisor, even by SIGKILL), the pipe closes, it ends, and salloc gives
# the allocation back: none outlives its owner.
HOLDER = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]


def salloc_argv(spec: JobSpec) -> list[str]:
    """The salloc that asks for the job's nodes, with the spec's backend options, and holds
    them while HOLDER runs."""
    return ["salloc", *allocation_options(spec), *HOLDER]


def _pump(stream, lines: queue.Queue) -> None:
    """Each line of `stream`, stripped, into `lines`; then None."""
    with stream:
        for line in stream:
            lines.put(line.strip())
    lines.put(None)


def _reason(job_id: str) -> str:
    """Why a job waits, as squeue says it ("Resources", "Priority", ...)."""
    try:
        return _slurm("squeue", "-h", "-j", job_id, "-o", "%r", timeout=10).strip() or "queued"
    except NodeError:
        return "queued"


def _allocation_error(said: list[str], spec: JobSpec) -> DistrunError:
    """salloc's refusal in one line; for a partition, the valid ones."""
    errors = [line.split("error:", 1)[1].strip() for line in said if "error:" in line]
    message = errors[-1] if errors else (said[-1] if said else "salloc ended without a job")
    if "partition" in message.lower():
        asked = spec.backend.partition if spec.backend else None
        if asked and asked not in message:  # Slurm's words name no partition
            message += f" ({asked!r})"
        try:
            valid = sorted(set(_slurm("sinfo", "-h", "-o", "%R", timeout=10).split()))
        except NodeError:
            valid = []
        if valid:
            message += f"; valid partitions: {', '.join(valid)}"
    return DistrunError(
        f"slurm: no allocation for {counted(spec.instance_count, 'node')}: {message}"
    )


def _never_granted(reason: str, spec: JobSpec) -> DistrunError:
    """A request Slurm would keep pending for ever, in one line with what each partition
    offers (nodes, and CPUs per node)."""
    tasks = counted(spec.processes_per_node(), "task")
    asked = f"{counted(spec.instance_count, 'node')} of {tasks}"
    try:
        rows = _slurm("sinfo", "-h", "-o", "%R %D %c", timeout=10).split("\n")
        offers = [
            f"{p} ({counted(int(n), 'node')}, {c} CPUs each)"
            for p, n, c in (row.split() for row in rows if row.strip())
        ]
    except (NodeError, ValueError):
        offers = []
    where = f"; partitions: {', '.join(offers)}" if offers else ""
    return DistrunError(
        f"slurm: no allocation for {asked}: it asks for {NEVER_GRANTED[reason]} "
        f"(Slurm: {reason}){where}"
    )


def _uses_held_pool(proc: ProcessPlan) -> ProcessPlan:
    """`proc`, whose agent uses the node's pool that `prepare` held where its ranks fork,
    and never starts one (a pool it started would end with its step)."""
    if not proc.env.get(PRELOAD_VAR):
        return proc
    return dataclasses.replace(proc, env={**proc.env, HELD_VAR: "1"})


def _node(name: str, workdir: str, cwd: str) -> Node:
    """An allocation's node, at the address Slurm knows it by; it sees this machine's files."""
    return Node(
        name=name,
        host=_address(name),
        backend="slurm",
        python=sys.executable,
        workdir=workdir,
        cwd=cwd,
        shares_files=True,
    )


def _address(name: str) -> str:
    """The address Slurm reaches a node at (its NodeAddr), which the others reach it at."""
    fields = dict(
        word.split("=", 1)
        for word in _slurm("scontrol", "show", "node", "-o", name).split()
        if "=" in word
    )
    return fields.get("NodeAddr") or name
