"""The contract every backend keeps: how a job's nodes are checked and prepared, how each of
its processes is started, watched and stopped, and what is left to clean up.

A backend is where processes run: `local` (this machine), `ssh` (inventory nodes over SSH),
`slurm` (an allocation's nodes). The job (run/job.py) drives it in this order,
and a backend may rely on that order:

    nodes = backend.acquire(spec, inventory, workdir, cwd)   # the job's nodes
    nodes = backend.preflight(nodes)            # every node usable, or NodeError; nothing runs
    ports = backend.choose_ports(requests, nodes)
    plan = ...                                  # pure, from the spec, nodes and ports
                                                # (an MPI job's mpirun: backend.mpi_launch)
    backend.prepare(plan, nodes)                # files on the nodes; still nothing runs
    handles = [backend.start(proc, node, grace) for each process]   # in parallel
    handle.confirm() for each                   # every process started, or the job stops
    ... handle.chunks(stream), handle.wait() ... handle.terminate() / handle.kill()
    backend.sweep(job_id, node_names)           # nothing of the job survives
    backend.collect(node, folder)               # small files the ranks left (--out values)
    backend.list_files(node, folder)            # the job's outputs, copied piece by piece:
    backend.read_piece(node, path, offset, n)   #   run/outputs.py
    backend.release()                           # give back what acquire took

A job that starts again after a failure (run/job.Restarts) keeps its nodes and goes back to
`health` and `preflight` before the next attempt: where a node cannot be reached, a backend
that places nodes itself places them anew (`place_again`: Ray), any other replaces it by
one of `spares` where the job asked for nodes by count; then on from `choose_ports`.

Outside a job, `health(nodes)` checks nodes for `jupyter distrun nodes` and the sidebar,
`trust(node)` records a node's identity (an SSH host key) for `nodes --trust`, and a
backend that reaches a cluster by itself lists its nodes (`cluster_nodes`, for `nodes
--backend NAME`).

A backend's own launch options (`options`) are declared on its class and offered by every
front: a new backend, and its flags, is one module plus its line in the registry.

`run_on_node(node, argv)` runs a short helper beside a running job (its stacks);
`keep_on_node(node, argv)` keeps one running for many requests, where a backend can (the
debugger's helper over one SSH session: diagnose/debug.NodeHelpers).

`command_line(proc, node, grace)` is the dry run: the exact command that `start` would run
for that process, as one line a user could paste (shown by `--dry-run` and `jupyter distrun
plan`).

Every process runs under the node agent (node_side/agent.py), so stopping is the same everywhere:
the backend only moves bytes (see run/agent_client.AgentProcess, which implements
ProcessHandle over a backend's pipes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

from jupyter_dist.errors import DistrunError, NodeError
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.options import Option
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import LaunchPlan, MpiLaunch, ProcessPlan
from jupyter_dist.spec import JobSpec


class KeptCommand(Protocol):
    """A helper kept running on a node (Backend.keep_on_node): bytes to its stdin, its
    stdout line by line. Closing it ends its input (the helper then ends); so does its
    owner's death, or its link's."""

    def send(self, data: bytes) -> None:
        """Write `data` to its stdin; OSError where it or its link has gone."""

    def lines(self) -> Iterator[bytes]:
        """Its stdout's lines as they come (each with its newline), until it ends."""

    def close(self) -> None:
        """End its input and let go of it. Never raises."""


class ProcessHandle(Protocol):
    """One started process of a job, as the job sees it. Methods may be called from several
    threads (one reader per stream, one waiter, a canceller)."""

    def confirm(self) -> None:
        """Block until the process is known to run; `DistrunError` with a one-line reason
        (no such folder, command not found, node unreachable) if it never started."""

    def chunks(self, stream: str) -> Iterator[bytes]:
        """The bytes the process writes to `stream` ("stdout" or "stderr"), as they come,
        until the stream ends. Control messages of the agent are never part of them."""

    def wait(self) -> int:
        """Block until the process ended; its exit code (128+N for a signal N)."""

    def terminate(self) -> None:
        """Ask the process tree to stop: SIGTERM, then SIGKILL after the grace period the
        process was started with. Idempotent; does nothing once the process ended."""

    def kill(self) -> None:
        """SIGKILL the process tree now. Idempotent."""

    def interrupt(self) -> None:
        """SIGINT to the process itself (KeyboardInterrupt in a session's rank)."""

    def feed(self, data: bytes) -> None:
        """Bytes for the process's stdin; only a process planned with `stdin` reads them
        (a session's rank). Ignored once the process ended."""

    @property
    def exit_note(self) -> str | None:
        """Why the exit code is not the process's own (its agent or link died), or None.
        Read once the output is drained."""

    #: What the process's agent saw of the kernel's OOM killer under a memory limit over its
    #: tree ({"cgroup", "kills", "limit", "peak"}), or None; read once the output is drained.
    oom: dict[str, Any] | None

    #: Called with each usage report of the process's agent (about once a second, from the
    #: stderr reader): {"cpu": seconds, "rss": bytes, "ranks": {rank: [seconds, bytes]}},
    #: and where nvidia-smi read GPU memory held, "gpu": [percent, bytes] and
    #: "gpus": {rank: [percent, bytes]} (percent None where the device does not say).
    #: Set before the streams are read.
    on_usage: Callable[[dict[str, Any]], None] | None

    #: Called, from the stderr reader, with the line its agent said where the job's preload
    #: could not be imported on the node (node_side/pool_server.py): its ranks start cold there.
    on_preload_failed: Callable[[str], None] | None


@dataclass(frozen=True)
class NodeHealth:
    """One node as a health check found it (`jupyter distrun nodes`, the sidebar)."""

    name: str
    host: str
    port: int | None  # where the backend reaches it, if by a port of its own (SSH)
    status: str  # "ok" or "unreachable"
    latency_ms: float | None = None
    python: str | None = None  # the python version the node runs jobs with
    hostname: str | None = None
    gpus: int | None = None
    problem: str | None = None  # why it is not ok, in one line
    cpus: float | None = None  # where the backend knows them (a Ray node's resources)
    memory: int | None = None  # bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(ABC):
    """Where and how a job's processes run. One instance serves one job."""

    #: The name users choose it by (`--backend NAME`), and the registry's key.
    name: str = ""
    #: Its own launch options, declared as every option is (options.Option, with
    #: `backend` set to its name): the magic, the CLI and the form offer them, and their
    #: values go into the spec's `backend:` section (`spec_key`). Slurm's --partition is one.
    options: ClassVar[tuple[Option, ...]] = ()

    def acquire(self, spec: JobSpec, inventory: Inventory, workdir: str, cwd: str) -> list[Node]:
        """The job's nodes. A backend that allocates nodes does it here and frees them in
        `release`.

        Args:
            spec: The job: `spec.nodes` names nodes, else `instance_count` counts them.
            inventory: The nodes attached to the notebook (local nodes when it has none).
            workdir: The folder on each node that holds the job's folders.
            cwd: The working folder on this machine (local nodes run there).

        Returns:
            The nodes, node rank 0 first.

        Raises:
            NodeError: There are not enough, or a named one is unknown.
        """
        return inventory.select(spec.instance_count, spec.nodes, workdir=workdir, cwd=cwd)

    @abstractmethod
    def preflight(self, nodes: list[Node]) -> list[Node]:
        """Check every node before anything starts; starts nothing, leaves nothing behind.

        Args:
            nodes: From `acquire`.

        Returns:
            The same nodes with what only each node knows filled in (its resolved workdir,
            its GPUs).

        Raises:
            NodeError: Naming the first node that cannot be used (unreachable, no python).
        """

    @abstractmethod
    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        """The ports the job's processes will listen on.

        Args:
            requests: What the plan needs (plan.port_requests): a node, and a fixed port or
                none.
            nodes: The job's nodes.

        Returns:
            request key -> port: a free port on its node for each request without a fixed
            one, the fixed port where it is free.

        Raises:
            DistrunError: A fixed port is taken there (request.taken_message says by what).
        """

    def mpi_launch(self, ctx: PlanContext) -> MpiLaunch:
        """How an MPI job's mpirun, started on node 0, reaches the job's other nodes: its
        extra options, the files they name, the variables to forward. Pure (called while
        planning; nothing is reached). The default is the hostfile alone."""
        return MpiLaunch()

    @abstractmethod
    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        """Put everything a node needs there before its processes start: the job's folder,
        the agent, the code folder, the plan's generated files (an MPI hostfile). Safe to
        repeat (a restart calls it again).

        Args:
            plan: The job's plan (its `files`, `code_dir`).
            nodes: The job's nodes.

        Raises:
            NodeError: A node cannot be reached or written to.
        """

    @abstractmethod
    def start(self, proc: ProcessPlan, node: Node, grace: float) -> ProcessHandle:
        """Start one process under the node agent. Returns at once; thread-safe (the job
        starts every process at once).

        Args:
            proc: What to run: `proc.argv`, `proc.env`, `proc.cwd`.
            node: Where.
            grace: Seconds between SIGTERM and SIGKILL when it is stopped.

        Returns:
            Its handle; `confirm()` says whether it really started.

        Raises:
            NodeError: The node cannot be reached.
        """

    @abstractmethod
    def command_line(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        """The exact command `start` runs for `proc`, as one shell line (the dry run)."""

    @abstractmethod
    def collect(self, node: Node, folder: str) -> dict[str, bytes]:
        """The small files a job's ranks left (a rank's --out values); outputs use
        `list_files` and `read_piece`.

        Args:
            node: Where.
            folder: A path on the node.

        Returns:
            Every file directly in `folder`, name -> content; {} if there is no folder.
        """

    @abstractmethod
    def list_files(self, node: Node, folder: str) -> dict[str, int]:
        """The files of a folder on the node, for a copy piece by piece (run/outputs.py).

        Args:
            node: Where.
            folder: A path on the node.

        Returns:
            Every regular file directly in `folder`, name -> size in bytes, as they are
            now; {} if there is no folder.

        Raises:
            NodeError: The node cannot be reached.
        """

    @abstractmethod
    def read_piece(self, node: Node, path: str, offset: int, size: int) -> bytes:
        """A piece of a file on the node.

        Args:
            node: Where.
            path: The file's path there.
            offset: Where the piece starts, in bytes.
            size: At most this many bytes.

        Returns:
            Up to `size` bytes from `offset` (fewer at the file's end).

        Raises:
            NodeError: The node cannot be reached.
            OSError: The file cannot be read.
        """

    @abstractmethod
    def sweep(self, job_id: str, node_names: set[str]) -> list[int]:
        """Kill whatever still carries the job's id on the named nodes: the last safety net
        after every agent stopped its tree. Never raises; idempotent.

        Args:
            job_id: The job.
            node_names: The nodes to look on (those where an agent may not have stopped
                its tree: it died, or its link).

        Returns:
            The pids killed.
        """

    def terminate_ranks(self, job_id: str, node_names: set[str]) -> list[int]:
        """SIGTERM the job's MPI ranks that no agent of the job holds on the named nodes
        (an MPI launcher's daemons started them there: the agent's `--term`), at the start
        of a stop; the pids signalled. Never raises. Nothing to do where every process
        runs under an agent of the job (the default)."""
        return []

    @abstractmethod
    def run_on_node(self, node: Node, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        """Run a short command on the node (a node-side helper such as node_side/stacks.py,
        beside the job's processes) and wait for it. Blocking; thread-safe.

        Args:
            node: Where.
            argv: The command, each word as it is (nothing is read by a shell unquoted).
            timeout: Seconds; a command that outlives it is stopped and reported with a
                non-zero code.

        Returns:
            (exit code, stdout, stderr).

        Raises:
            NodeError: The node cannot be reached.
        """

    def keep_on_node(self, node: Node, argv: list[str]) -> KeptCommand | None:
        """Start `argv` on the node and keep it, for a helper that answers one request a
        line (node_side/debugger.py `serve`): where starting a command costs more than a
        request (a session to open, a Python to start). None where this backend keeps
        none (the default: the caller runs one `run_on_node` a request). A node that
        cannot be reached raises NodeError."""
        return None

    def health(self, nodes: list[Node]) -> list[NodeHealth]:
        """Check each node (in parallel where that costs something) and say what was found,
        in the order given; a node that fails is `unreachable` with its problem, never an
        exception. The default asks `preflight`, one node at a time."""
        found = []
        for node in nodes:
            try:
                checked = self.preflight([node])[0]
                found.append(NodeHealth(node.name, node.host, None, "ok", gpus=checked.gpus))
            except NodeError as exc:
                found.append(
                    NodeHealth(node.name, node.host, None, "unreachable", problem=str(exc))
                )
        return found

    def cluster_nodes(self, options: dict[str, Any]) -> list[NodeHealth] | None:
        """The nodes of the cluster a backend reaches by itself (Ray's), with what each
        has, for `jupyter distrun nodes --backend NAME`; `options` are its own options as
        the spec's backend: section would hold them. None for a backend whose nodes are
        the inventory's (ssh, local) or an allocation's (slurm)."""
        return None

    def place_again(self, spec: JobSpec, nodes: list[Node]) -> list[Node] | None:
        """For a backend that places a job's nodes itself (Ray): before a restart in which
        some of `nodes` cannot be reached, what it holds is given back and the job's nodes
        are placed anew (those still alive keep their node rank where placed there again).
        None, the default: a lost node is replaced by one of `spares`."""
        return None

    def spares(self, inventory: Inventory) -> list[Node]:
        """Nodes that may replace a job's node that cannot be reached when the job starts
        again after a failure (one it asked for by count only): by default the inventory's
        (where `acquire` takes them from); none for local nodes, which are never lost, and
        none for a backend whose nodes are allocated to the job."""
        return [] if inventory.is_local else list(inventory.nodes)

    def trust(self, node: Node) -> str:
        """Record the node's identity so that later connections accept it (an SSH host key
        into known_hosts); returns what was recorded, e.g. the key's fingerprint.
        DistrunError for backends whose nodes have nothing to trust."""
        raise DistrunError(f"{self.name} nodes have no host key to trust; ssh nodes do")

    def release(self) -> None:  # noqa: B027 (a hook: most backends acquire nothing)
        """Give back what the backend acquired for the job (an allocation). Idempotent;
        nothing to do for backends that acquire nothing."""
