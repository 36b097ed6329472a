"""The local backend: processes on this machine, each under a node agent (node_side/agent.py)."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from jupyter_dist.backends.agent_client import AGENT_SOURCE, AgentProcess, agent_argv
from jupyter_dist.backends.base import Backend
from jupyter_dist.backends.ray_host import list_folder, read_piece
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import describe_exit
from jupyter_dist.node_side import agent
from jupyter_dist.node_side.ports import free_ports, why_taken
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.plan.context import PortRequest
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan
from jupyter_dist.spec import JobSpec
from jupyter_dist.store import private_dir, write_atomic

_CHUNK = 65536
# Ports handed out recently by this process, so two jobs started together never share one.
_recent_ports: dict[int, float] = {}
_ports_lock = threading.Lock()
_PORT_MEMORY_S = 120.0


def free_port() -> int:
    """A port nothing listens on now and that this process has not handed out lately."""
    with _ports_lock:
        now = time.monotonic()
        for port, when in list(_recent_ports.items()):
            if now - when > _PORT_MEMORY_S:
                del _recent_ports[port]
        for _ in range(100):
            (port,) = free_ports(1)
            if port not in _recent_ports:
                _recent_ports[port] = now
                return port
    raise DistrunError("could not find a free TCP port on this machine")


class LocalProcess(AgentProcess):
    """A process on this machine, started through the node agent."""

    def __init__(self, popen: subprocess.Popen, label: str, feed: int | None = None):
        super().__init__()
        self.popen = popen
        self.label = label
        self._feed = feed  # the process's own stdin, where the agent does not relay it

    def feed(self, data: bytes) -> None:
        if self._feed is None:
            return super().feed(data)
        # OSError: it closed its input or ended, which its exit tells.
        with self._stdin_lock, contextlib.suppress(OSError):
            view = memoryview(data)
            while view and self._feed is not None:
                view = view[os.write(self._feed, view) :]

    def _read(self, stream: str) -> bytes:
        pipe = self.popen.stdout if stream == "stdout" else self.popen.stderr
        try:
            return os.read(pipe.fileno(), _CHUNK)
        except (OSError, ValueError):
            return b""

    def _write_stdin(self, data: bytes) -> None:
        self.popen.stdin.write(data)
        self.popen.stdin.flush()

    def _close_stdin(self) -> None:
        self.popen.stdin.close()
        if self._feed is not None:  # under _stdin_lock (AgentProcess._send)
            os.close(self._feed)
            self._feed = None

    def _wait(self) -> int:
        return self.popen.wait()

    @property
    def exit_note(self) -> str | None:
        """As every agent's; here how the agent itself ended is known too: "lost its node
        agent (killed by SIGKILL)"."""
        note = super().exit_note
        died_of = describe_exit(self.popen.returncode)[1] if self.popen.returncode else None
        return f"{note} (killed by {died_of})" if note and died_of else note


class LocalBackend(Backend):
    """Starts a plan's processes on this machine: every local "node" is this machine with a
    node rank of its own. A backend whose processes are local subprocesses too (Slurm's
    srun) subclasses it and changes `_argv` and `_handle`."""

    name = "local"
    # A process that reads stdin (a warm session's rank) gets a pipe of its own from here,
    # which the agent passes on: a cell reaches the rank without waking the agent (a
    # relay per rank per cell, on the path every warm cell waits on). Not through srun.
    feeds_directly = True

    def acquire(self, spec: JobSpec, inventory: Inventory, workdir: str, cwd: str) -> list[Node]:
        """Local nodes, whatever the inventory holds (`--backend local` forces them)."""
        return Inventory().select(spec.instance_count, spec.nodes, workdir=workdir, cwd=cwd)

    def preflight(self, nodes: list[Node]) -> list[Node]:
        return nodes  # this machine: nothing to check or resolve

    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        """Free ports for the requests that need one; the spec's own ports checked free
        (the planner takes those from the requests)."""
        for request in (r for r in requests if r.fixed is not None):
            reason = why_taken(request.fixed)
            if reason:
                raise DistrunError(request.taken_message(nodes[request.node_rank], reason))
        return {r.key: free_port() for r in requests if r.fixed is None}

    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        write_plan_files(plan, nodes)

    def start(self, proc: ProcessPlan, node: Node, grace: float) -> LocalProcess:
        feed = None
        if proc.stdin and self.feeds_directly:  # its input straight from here, not relayed
            reading, feed = os.pipe()
            argv = self._argv(proc, node, grace, stdin_fd=reading)
        else:
            argv = self._argv(proc, node, grace)
        try:
            popen = subprocess.Popen(
                argv,
                env={**os.environ, **proc.env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the ranks
                pass_fds=() if feed is None else (reading,),
            )
        except BaseException:
            if feed is not None:
                os.close(feed)
            raise
        finally:
            if feed is not None:
                os.close(reading)
        return self._handle(popen, proc, node, feed)

    def command_line(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        env_words = [f"{name}={value}" for name, value in proc.env.items()]
        return shlex.join(["env", *env_words, *self._argv(proc, node, grace)])

    def _argv(
        self, proc: ProcessPlan, node: Node, grace: float, stdin_fd: int | None = None
    ) -> list[str]:
        """What this machine runs to start `proc`: its agent, here (`stdin_fd`: the pipe
        its process reads as stdin, inherited)."""
        return agent_argv(
            sys.executable, str(AGENT_SOURCE), proc.cwd, proc.argv, grace, proc.stdin, stdin_fd
        )

    def _handle(
        self, popen: subprocess.Popen, proc: ProcessPlan, node: Node, feed: int | None = None
    ) -> LocalProcess:
        return LocalProcess(popen, proc.label, feed)

    def collect(self, node: Node, folder: str) -> dict[str, bytes]:
        return read_folder(folder)

    def list_files(self, node: Node, folder: str) -> dict[str, int]:
        return list_folder(folder)

    def read_piece(self, node: Node, path: str, offset: int, size: int) -> bytes:
        return read_piece(path, offset, size)

    def run_on_node(self, node: Node, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return 1, "", f"{argv[0]} did not finish within {timeout:g} s"
        return done.returncode, done.stdout, done.stderr

    def sweep(self, job_id: str, node_names: set[str]) -> list[int]:
        """Kill any process still carrying this job's id (a rank that daemonized, an orphan).
        Cheap here, so always done, whatever `node_names` says."""
        return agent.sweep(job_id)


def write_plan_files(plan: LaunchPlan, nodes: list[Node]) -> None:
    """The job's folder on each node and the plan's generated files (an MPI hostfile), for
    nodes that see this machine's files."""
    for node in nodes:  # private: it gets the cell's code and the pushed variables
        private_dir(Path(node.workdir, plan.job_id))
    for planned in plan.files:  # private too, and so are the folders they are in
        path = Path(planned.path)
        private_dir(path.parent)
        write_atomic(path, planned.content, mode=0o700 if planned.executable else None)


def read_folder(folder: str) -> dict[str, bytes]:
    """Every file directly in `folder` (name -> content); none if it does not exist."""
    path = Path(folder)
    if not path.is_dir():
        return {}
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.is_file()}
