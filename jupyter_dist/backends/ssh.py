"""The SSH backend (paramiko): nodes from the inventory, reached over kept connections.

Every value that reaches a remote shell goes through `shlex.quote`. Host keys are checked
against known_hosts; an unknown host is refused unless the node says `accept-new`.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import os
import posixpath
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_dist.backends.agent_client import (
    AGENT_SOURCE,
    AgentProcess,
    agent_argv,
    agent_file_name,
    agents_say,
)
from jupyter_dist.backends.base import Backend, NodeHealth
from jupyter_dist.backends.node_ports import ports_on_nodes
from jupyter_dist.code_folder import read_code_folder
from jupyter_dist.errors import DistrunError, NodeError
from jupyter_dist.node_side.agent import PATH_FIRST_VAR
from jupyter_dist.nodes import Inventory, Node, SshAccess
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import LaunchPlan, MpiLaunch, PlannedFile, ProcessPlan
from jupyter_dist.plan.mpi import runs_ssh
from jupyter_dist.spec import JobSpec
from jupyter_dist.store import PRIVATE_DIR, PRIVATE_FILE


class _ImportedAtFirstUse:
    """paramiko, imported when one of its names is first used: paramiko and cryptography
    took 130 ms of every front's start (the CLI, a kernel's magic, the server), which
    import this module for its backend's options alone. An import statement, not
    importlib's LazyLoader: nodes are connected from several threads at once, and the
    import lock keeps a first use from two of them safe (LazyLoader's is not, before 3.13)."""

    def __getattr__(self, name: str) -> Any:
        import paramiko as module

        return getattr(module, name)


paramiko = _ImportedAtFirstUse()

CONNECT_TIMEOUT = 10.0
# paramiko logs what it also raises (a connection's failure, with its traceback) and what we
# handle (sshd refusing a session: another connection takes it). With no handler of the
# user's, Python would print those records to stderr, into a notebook cell or past our one
# line; a logging setup of the user's still gets them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
SESSIONS_PER_CONNECTION = 10  # OpenSSH's default MaxSessions
_CHUNK = 65536

# What a node tells about itself: python version, home, workdir (made), hostname, GPUs, the
# torch installed (read from its metadata: importing torch takes seconds), and the NCCL_*
# and GLOO_* variables its processes start with.
_PROBE = r"""
import json, os, platform, shutil, subprocess, sys
work = os.path.abspath(os.path.expanduser(sys.argv[1]))
try:  # what is made is private (0700), parents too; a folder that exists is left as it is
    missing, folder = [], work
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
except OSError as exc:
    sys.exit(f"workdir {work}: {exc.strerror or exc}")
gpus = None
if shutil.which("nvidia-smi"):
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        gpus = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except Exception:
        pass
try:
    from importlib.metadata import version
    torch = version("torch")
except Exception:
    torch = None
comm = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))}
print(json.dumps({"python": platform.python_version(), "workdir": work,
                  "hostname": platform.node(), "gpus": gpus, "executable": sys.executable,
                  "torch": torch, "comm_env": comm}))
"""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    host: str
    python: str
    workdir: str
    hostname: str
    gpus: int | None
    latency_ms: float
    torch: str | None = None
    comm_env: dict[str, str] = field(default_factory=dict)  # its NCCL_* and GLOO_* variables

    @property
    def software(self) -> dict[str, Any]:
        """What the plan compares between nodes (Node.software)."""
        return {"python": self.python, "torch": self.torch, "comm_env": self.comm_env}


class AcceptNewPolicy:
    """Like OpenSSH's `StrictHostKeyChecking accept-new`: record an unknown host's key;
    a changed key is still refused (paramiko raises BadHostKeyException for that). A
    paramiko MissingHostKeyPolicy by its method (paramiko calls only that), not by its
    base class, which would import paramiko with this module."""

    _file_lock = threading.Lock()  # nodes are connected in parallel; one writer at a time

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        with self._file_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as handle:  # append: never rewrite what others recorded
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def access(node: Node) -> SshAccess:
    """The node's SSH settings (the defaults for a node the inventory did not describe)."""
    return node.access if isinstance(node.access, SshAccess) else SshAccess()


def address(node: Node) -> str:
    """host:port, as messages name a node."""
    return f"{node.host}:{access(node).port}"


def known_hosts_path(node: Node) -> str:
    return os.path.expanduser(access(node).known_hosts or "~/.ssh/known_hosts")


def connect(node: Node, policy: str | None = None) -> paramiko.SSHClient:
    """An authenticated connection, or a NodeError naming the node and the reason."""
    ssh = access(node)
    policy = policy or ssh.host_key_policy
    known = known_hosts_path(node)
    where = address(node)
    client = paramiko.SSHClient()
    if os.path.exists(known):
        try:
            client.load_host_keys(known)
        except OSError as exc:
            raise NodeError(
                f"node {node.name} ({where}): known_hosts {known}: {exc.strerror or exc}"
            ) from None
    client.set_missing_host_key_policy(
        AcceptNewPolicy(known) if policy == "accept-new" else paramiko.RejectPolicy()
    )
    user = ssh.user or getpass.getuser()
    try:
        client.connect(
            node.host,
            port=ssh.port,
            username=user,
            key_filename=ssh.key_file,
            look_for_keys=ssh.key_file is None,
            allow_agent=True,
            timeout=CONNECT_TIMEOUT,
            banner_timeout=CONNECT_TIMEOUT,
            auth_timeout=CONNECT_TIMEOUT,
        )
    except paramiko.BadHostKeyException:
        client.close()
        raise NodeError(
            f"node {node.name} ({where}): its host key CHANGED since it was recorded in "
            f"{known}; if the node was reinstalled, remove its line there, else do not connect"
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        key = f" with key {ssh.key_file}" if ssh.key_file else " with the agent/default keys"
        raise NodeError(
            f"node {node.name} ({where}): authentication failed for {user}{key}"
        ) from None
    except paramiko.SSHException as exc:
        client.close()
        if ssh.key_file and "private key" in str(exc):  # paramiko could not read the key
            raise NodeError(f"node {node.name} ({where}): key file {ssh.key_file}: {exc}") from None
        if "not found in known_hosts" in str(exc):
            raise NodeError(
                f"node {node.name} ({where}): unknown host key (not in {known}); if you trust "
                f"it, run `jupyter distrun nodes --trust {node.name}` or set "
                f"host_key_policy: accept-new for it"
            ) from None
        # A service that is not sshd, or nothing that greets in time: paramiko's banner read
        # fails, or its handshake wait ends first and the host key is found missing.
        if any(sign in str(exc) for sign in ("protocol banner", "No existing session")):
            raise NodeError(
                f"node {node.name} ({where}): did not answer as an SSH server (no SSH "
                f"handshake within {CONNECT_TIMEOUT:g} s); is port {ssh.port} the node's sshd?"
            ) from None
        raise NodeError(f"node {node.name} ({where}): SSH failed: {exc}") from None
    except TimeoutError:
        client.close()
        raise NodeError(f"node {node.name} ({where}): timed out connecting") from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        client.close()
        raise NodeError(
            f"node {node.name} ({where}): connection refused (is sshd running?)"
        ) from None
    except OSError as exc:
        client.close()
        reason = exc.strerror or str(exc)
        if exc.filename is not None and exc.filename == ssh.key_file:
            reason = f"key file {exc.filename}: {reason}"
        raise NodeError(f"node {node.name} ({where}): {reason}") from None
    transport = client.get_transport()
    transport.set_keepalive(5)  # notice a dead link within seconds
    return client


def trust(node: Node) -> str:
    """Record a node's host key in its known_hosts (`nodes --trust`); returns the fingerprint."""
    client = connect(node, policy="accept-new")
    try:
        key = client.get_transport().get_remote_server_key()
        return f"{key.get_name()} SHA256:{key.fingerprint.split(':', 1)[-1]}"
    finally:
        client.close()


def run_command(
    channel: paramiko.Channel, argv: list[str], timeout: float = 60
) -> tuple[int, str, str]:
    """Run argv on a fresh session `channel` (every word quoted); returns exit code, stdout,
    stderr."""
    channel.settimeout(timeout)
    channel.exec_command(shlex.join(argv))
    out, err = bytearray(), bytearray()
    while True:
        if channel.recv_ready():
            out += channel.recv(_CHUNK)
        elif channel.recv_stderr_ready():
            err += channel.recv_stderr(_CHUNK)
        elif (
            channel.exit_status_ready()
            and not channel.recv_ready()
            and not channel.recv_stderr_ready()
        ):
            break
        else:
            time.sleep(0.005)
    code = channel.recv_exit_status()
    channel.close()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


@dataclass(eq=False)
class _Connection:
    """One kept connection and the sessions it has open (sshd counts them)."""

    client: paramiko.SSHClient
    sessions: list[paramiko.Channel]

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return bool(transport and transport.is_active())

    def has_room(self) -> bool:
        self.sessions = [c for c in self.sessions if not c.closed]
        return len(self.sessions) < SESSIONS_PER_CONNECTION

    def open_session(self, timeout: float) -> paramiko.Channel:
        channel = self.client.get_transport().open_session(timeout=timeout)
        self.sessions.append(channel)
        return channel


class Connections:
    """Kept connections per node, reused across jobs. sshd caps the sessions one connection
    may have open (MaxSessions, 10 by default; every process, command and SFTP client holds
    one), so a node with more at once gets more connections: a new one when the kept ones
    have that many open, or when sshd refuses a session (a lower cap)."""

    def __init__(self) -> None:
        self._pools: dict[tuple, list[_Connection]] = {}
        self._opening: dict[tuple, threading.Lock] = {}
        self._infos: dict[tuple, tuple[int, NodeInfo]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(node: Node) -> tuple:
        ssh = access(node)
        return (node.host, ssh.port, ssh.user, ssh.key_file)

    def _live(self, node: Node) -> list[_Connection]:
        key = self._key(node)
        with self._lock:
            pool = self._pools.get(key, [])
            live = [c for c in pool if c.alive()]
            for dead in (c for c in pool if c not in live):
                dead.client.close()
            self._pools[key] = live
        return live

    def _add(self, node: Node) -> _Connection:
        connection = _Connection(connect(node), [])
        with self._lock:
            self._pools.setdefault(self._key(node), []).append(connection)
        return connection

    def get(self, node: Node) -> paramiko.SSHClient:
        """The node's first kept connection (opened if there is none)."""
        live = self._live(node)
        return (live[0] if live else self._add(node)).client

    def open_session(self, node: Node, timeout: float = CONNECT_TIMEOUT) -> paramiko.Channel:
        """A new session on the first kept connection with room for it, or on a new one.
        One at a time per node: the count stays right, and paramiko keeps a failed open's
        reason in one place per connection, so concurrent opens could swap theirs."""
        with self._opening_lock(node):
            for connection in (c for c in self._live(node) if c.has_room()):
                try:
                    return connection.open_session(timeout)
                except paramiko.SSHException:
                    # Refused: sshd allows fewer sessions than we assumed, or still counts
                    # ones that were just closed. Another connection takes it.
                    continue
            return self._add(node).open_session(timeout)

    def _opening_lock(self, node: Node) -> threading.Lock:
        with self._lock:
            return self._opening.setdefault(self._key(node), threading.Lock())

    def open_sftp(self, node: Node) -> paramiko.SFTPClient:
        channel = self.open_session(node)
        channel.invoke_subsystem("sftp")
        return paramiko.SFTPClient(channel)

    def run(self, node: Node, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        """`run_command` on the node."""
        return run_command(self.open_session(node, timeout), argv, timeout)

    def info(self, node: Node) -> NodeInfo:
        """The node's probe, done once per kept connection (a new connection probes again)."""
        client = self.get(node)
        key = (*self._key(node), node.python, node.workdir)
        with self._lock:
            cached = self._infos.get(key)
        if cached and cached[0] == id(client):
            return cached[1]
        info = probe(node, self)
        with self._lock:
            self._infos[key] = (id(client), info)
        return info

    def close_all(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for connection in (c for pool in pools for c in pool):
            connection.client.close()


def parallel(nodes: list[Node], work: Callable[[Node], object]) -> list:
    """`work` on every node at once. The first failure (in node order) is raised as one
    NodeError line naming its node."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        futures = [pool.submit(_on_node, work, node) for node in nodes]
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def _on_node(work: Callable[[Node], object], node: Node) -> object:
    try:
        return work(node)
    except DistrunError:
        raise
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise NodeError(
            f"node {node.name} ({address(node)}): {exc or type(exc).__name__}"
        ) from None


CONNECTIONS = Connections()


def probe(node: Node, connections: Connections | None = None) -> NodeInfo:
    """Check a node: reachable, authenticated, python found; resolve its workdir."""
    start = time.perf_counter()
    connections = connections or CONNECTIONS
    code, out, err = connections.run(
        node, [node.python, "-c", _PROBE, node.workdir or "~/.distrun"]
    )
    latency = (time.perf_counter() - start) * 1000
    if code == 127:
        raise NodeError(
            f"node {node.name}: python {node.python!r} not found (set python: in the inventory)"
        )
    if code != 0:
        last = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        if last.startswith("workdir "):  # the probe's own word: python ran, the folder failed
            raise NodeError(f"node {node.name}: cannot make its {last}")
        raise NodeError(f"node {node.name}: checking python {node.python!r} failed: {last}")
    info = json.loads(out.strip().splitlines()[-1])
    return NodeInfo(
        name=node.name,
        host=node.host,
        python=info["python"],
        workdir=info["workdir"],
        hostname=info["hostname"],
        gpus=info["gpus"],
        latency_ms=latency,
        torch=info.get("torch"),
        comm_env=info.get("comm_env") or {},
    )


class SshProcess(AgentProcess):
    """A process on a node: the agent runs it; its stdin is our SSH channel's."""

    silent_exit = "lost its SSH connection"

    def __init__(self, channel: paramiko.Channel, label: str):
        super().__init__()
        self.channel = channel
        self.label = label

    def _read(self, stream: str) -> bytes:
        try:
            if stream == "stdout":
                return self.channel.recv(_CHUNK)
            return self.channel.recv_stderr(_CHUNK)
        except (OSError, EOFError, paramiko.SSHException):
            return b""

    # Nothing is sent on a session once sshd has said it ended (its exit status, or its
    # close): sshd closes the channel by itself then, and what paramiko sends outside the
    # channel's lock (an EOF, data) can reach sshd after our side's CLOSE; sshd answers a
    # message for a channel it has freed by dropping the whole connection ("ieof packet
    # referred to nonexistent channel"), and every other session on it loses its process's
    # exit report (paramiko issue 1705). The EOF that followed every exit status did so now
    # and then: the kept connections that closed under load.
    def _ended(self) -> bool:
        return self.channel.exit_status_ready() or self.channel.eof_received

    def _write_stdin(self, data: bytes) -> None:
        if not self._ended():
            self.channel.sendall(data)

    def _close_stdin(self) -> None:
        if not self._ended():
            self.channel.shutdown_write()

    def _wait(self) -> int:
        code = self.channel.recv_exit_status()
        return 255 if code == -1 else code  # -1: no status at all, the link died

    @property
    def exit_note(self) -> str | None:
        """As the agent's, with what became of the connection: what ended it, or that it
        is still up and only this session ended without the agent's last word."""
        note = super().exit_note
        if note != self.silent_exit:
            return note
        transport = self.channel.get_transport()
        problem = transport.get_exception() if transport is not None else None
        if problem is not None:  # EOFError: the far end went away
            return f"{note} ({type(problem).__name__}: {problem})".replace(": )", ")")
        if transport is not None and transport.is_active():
            return f"{note} (its session closed without the agent's exit report)"
        return f"{note} (the connection closed)"


class SshKept:
    """A helper kept running on a node over one session of a kept connection
    (Backend.keep_on_node). As for SshProcess, nothing is sent once sshd said the session
    ended."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel
        self._stdout = channel.makefile("rb")

    def _ended(self) -> bool:
        return self.channel.exit_status_ready() or self.channel.eof_received

    def send(self, data: bytes) -> None:
        if self._ended():
            raise OSError("the helper's session ended")
        try:
            self.channel.sendall(data)
        except (EOFError, paramiko.SSHException) as exc:
            raise OSError(f"the helper's session ended: {exc}") from None

    def lines(self) -> Iterator[bytes]:
        try:
            yield from iter(self._stdout.readline, b"")
        except (OSError, EOFError, paramiko.SSHException):
            return

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if not self._ended():
                self.channel.shutdown_write()  # its end of input: the helper ends
            self.channel.close()


def ssh_config(nodes: list[Node]) -> str:
    """An OpenSSH client config that reaches `nodes` as the inventory says, host by host."""
    lines = []
    for node in nodes:
        ssh = access(node)
        policy = "accept-new" if ssh.host_key_policy == "accept-new" else "yes"
        lines += [f"Host {node.host}", f"  Port {ssh.port}", "  BatchMode yes"]
        lines.append(f"  StrictHostKeyChecking {policy}")
        if ssh.user:
            lines.append(f"  User {ssh.user}")
        if ssh.key_file:
            lines.append(f"  IdentityFile {ssh.key_file}")
        if ssh.known_hosts:
            lines.append(f"  UserKnownHostsFile {ssh.known_hosts}")
    return "\n".join(lines) + "\n"


def horovodrun_ssh(config_path: str, folder: str) -> str:
    """The `ssh` horovodrun finds first on PATH (in `folder`): OpenSSH with the job's
    ssh_config. horovodrun passes `-o StrictHostKeyChecking=no`, which would beat the
    config's host-key policy (ssh keeps the first value it is given): it is dropped, so an
    unknown host key is refused unless the inventory trusts it, as with mpirun."""
    return f"""#!/bin/sh
# jupyter-dist: horovodrun's ssh, with this job's ssh_config and host-key policy.
n=$#
while [ "$n" -gt 0 ]; do
    arg=$1; shift; n=$((n - 1))
    if [ "$arg" = -o ] && [ "$n" -gt 0 ] && [ "$1" = StrictHostKeyChecking=no ]; then
        shift; n=$((n - 1)); continue
    fi
    set -- "$@" "$arg"
done
# the system's ssh, not this one
PATH=$(printf '%s\\n' "$PATH" | tr ':' '\\n' | grep -vxF {shlex.quote(folder)} | paste -sd: -)
exec ssh -F {shlex.quote(config_path)} "$@"
"""


class SshBackend(Backend):
    """Starts a plan's processes on inventory nodes over SSH."""

    name = "ssh"

    def __init__(self, connections: Connections = CONNECTIONS) -> None:
        self.connections = connections
        self._nodes: dict[str, Node] = {}

    def acquire(self, spec: JobSpec, inventory: Inventory, workdir: str, cwd: str) -> list[Node]:
        if inventory.is_local:
            raise NodeError(
                "the ssh backend needs a node inventory (--nodes-file FILE, $DISTRUN_NODES_FILE "
                "or the Jupyter config dir's distrun/nodes.yml)"
            )
        return super().acquire(spec, inventory, workdir, cwd)

    def preflight(self, nodes: list[Node]) -> list[Node]:
        """Preflight: connect to every node in parallel, check python, resolve workdirs.
        Nothing is started anywhere if a node fails."""
        infos = parallel(nodes, self.connections.info)
        resolved = [
            replace(n, workdir=info.workdir, software=info.software)
            for n, info in zip(nodes, infos, strict=True)
        ]
        self._nodes = {n.name: n for n in resolved}
        return resolved

    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        return ports_on_nodes(requests, nodes, self.connections.run, parallel)

    def health(self, nodes: list[Node]) -> list[NodeHealth]:
        """Every node probed at once: reachable, latency, python, hostname, GPUs."""

        def check(node: Node) -> NodeHealth:
            port = access(node).port
            try:
                info = probe(node, self.connections)
            except NodeError as exc:
                problem = str(exc).split(": ", 1)[-1]
                return NodeHealth(node.name, node.host, port, "unreachable", problem=problem)
            return NodeHealth(
                node.name,
                node.host,
                port,
                "ok",
                latency_ms=round(info.latency_ms, 1),
                python=info.python,
                hostname=info.hostname,
                gpus=info.gpus,
            )

        return parallel(nodes, check)

    def trust(self, node: Node) -> str:
        return trust(node)

    def mpi_launch(self, ctx: PlanContext) -> MpiLaunch:
        """mpirun on node 0 starts the other nodes' daemons with OpenSSH, configured from
        the inventory (port, user, key, host-key policy) in an ssh_config of the job's;
        horovodrun (or the user's own mpirun) calls an `ssh` of the job's that uses it."""
        job_dir = ctx.job_dir(ctx.nodes[0])
        config_path = posixpath.join(job_dir, "ssh_config")
        files = [PlannedFile(0, config_path, ssh_config(ctx.nodes[1:]))]
        ssh_env = {}
        if runs_ssh(ctx):
            folder = posixpath.join(job_dir, "bin")
            program = horovodrun_ssh(config_path, folder)
            files.append(PlannedFile(0, posixpath.join(folder, "ssh"), program, executable=True))
            ssh_env[PATH_FIRST_VAR] = folder
        return MpiLaunch(
            args=("--mca", "plm_rsh_agent", f"ssh -F {config_path}"),
            files=tuple(files),
            forward=("PATH",),  # the other nodes' ranks find the same python
            ssh_env=ssh_env,
        )

    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        """Ship the agent (once per version), the code folder (only what changed) and the
        plan's generated files to every node that needs them."""
        code = Path(plan.code_dir) if plan.code_dir else None

        def ship(node: Node) -> None:
            job_dir = posixpath.join(node.workdir, plan.job_id)
            with self.connections.open_sftp(node) as sftp:
                _makedirs(sftp, job_dir)
                sftp.chmod(job_dir, PRIVATE_DIR)  # it gets the code and the pushed variables
                agent = posixpath.join(node.workdir, agent_file_name())
                if not _exists(sftp, agent):
                    _put_atomic(sftp, AGENT_SOURCE, agent)
                elif stat.S_IMODE(sftp.stat(agent).st_mode or 0) & 0o077:
                    sftp.chmod(agent, PRIVATE_FILE)  # shipped readable by an earlier version
                if code is not None:
                    cache = posixpath.join(node.workdir, "code", _code_key(code))
                    sync_folder(sftp, code, cache)
                    sftp.chmod(posixpath.dirname(cache), PRIVATE_DIR)
                for planned in plan.files:  # private, in private folders
                    if nodes[planned.node_rank].name == node.name:
                        folder = posixpath.dirname(planned.path)
                        if folder != job_dir:
                            _makedirs(sftp, folder)
                            sftp.chmod(folder, PRIVATE_DIR)
                        with sftp.open(planned.path, "w") as handle:
                            handle.chmod(0o700 if planned.executable else PRIVATE_FILE)
                            handle.write(planned.content)
            if code is not None:  # a snapshot per job: later syncs replace files, not edit them
                snapshot = posixpath.join(job_dir, "code")
                # A later attempt's snapshot replaces the last (cp would nest it inside).
                replace = 'rm -rf -- "$1" && exec cp -al "$2" "$1"'
                self._run_checked(node, ["sh", "-c", replace, "sh", snapshot, cache])

        parallel(nodes, ship)

    def collect(self, node: Node, folder: str) -> dict[str, bytes]:
        """Every file directly in `folder` on the node (name -> content), by SFTP."""

        def fetch(node: Node) -> dict[str, bytes]:
            found: dict[str, bytes] = {}
            with self.connections.open_sftp(node) as sftp:
                try:
                    entries = sftp.listdir_attr(folder)
                except OSError:
                    return found
                for entry in entries:
                    if stat.S_ISREG(entry.st_mode or 0):
                        with sftp.open(posixpath.join(folder, entry.filename), "rb") as handle:
                            found[entry.filename] = handle.read()
            return found

        return _on_node(fetch, node)

    def list_files(self, node: Node, folder: str) -> dict[str, int]:
        """Every regular file directly in `folder` on the node and its size, by SFTP (its
        listing gives each entry's own attributes: a link is not followed)."""

        def listing(node: Node) -> dict[str, int]:
            with self.connections.open_sftp(node) as sftp:
                try:
                    entries = sftp.listdir_attr(folder)
                except OSError:
                    return {}
            return {
                e.filename: e.st_size or 0
                for e in sorted(entries, key=lambda e: e.filename)
                if stat.S_ISREG(e.st_mode or 0)
            }

        return _on_node(listing, node)

    def read_piece(self, node: Node, path: str, offset: int, size: int) -> bytes:
        """One piece of a file on the node, by SFTP, its requests sent ahead (readv)."""

        def read(node: Node) -> bytes:
            with self.connections.open_sftp(node) as sftp, sftp.open(path, "rb") as handle:
                length = max(0, min(size, handle.stat().st_size - offset))
                return b"".join(handle.readv([(offset, length)])) if length else b""

        return _on_node(read, node)

    def start(self, proc: ProcessPlan, node: Node, grace: float) -> SshProcess:
        node = self._nodes.get(node.name, node)

        def open_channel(node: Node) -> SshProcess:
            channel = self.connections.open_session(node)
            channel.exec_command(self._remote_command(proc, node, grace))
            return SshProcess(channel, f"{proc.label} on {node.name}")

        return _on_node(open_channel, node)

    def _remote_command(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        """What the node's shell runs. `env NAME=VALUE ...`: sshd rarely accepts variables
        (AcceptEnv), so they go in the command line, each word quoted."""
        agent = posixpath.join(node.workdir, agent_file_name())
        env_words = [f"{name}={value}" for name, value in proc.env.items()]
        command = agent_argv(node.python, agent, proc.cwd, proc.argv, grace, proc.stdin)
        return shlex.join(["exec", "env", *env_words, *command])

    def command_line(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        """The same as OpenSSH's `ssh` would run it (paramiko holds the connection, with the
        inventory's user, port, key and host-key policy: so does this line)."""
        node = self._nodes.get(node.name, node)
        ssh = access(node)
        target = f"{ssh.user}@{node.host}" if ssh.user else node.host
        checking = "accept-new" if ssh.host_key_policy == "accept-new" else "yes"
        options = [
            "-p",
            str(ssh.port),
            "-o",
            "BatchMode=yes",
            "-o",
            f"StrictHostKeyChecking={checking}",
            "-o",
            f"UserKnownHostsFile={known_hosts_path(node)}",
            *(["-i", os.path.expanduser(ssh.key_file)] if ssh.key_file else []),
        ]
        remote = self._remote_command(proc, node, grace)
        return shlex.join(["ssh", *options, target, remote])

    def _run_checked(self, node: Node, argv: list[str]) -> str:
        code, out, err = self.connections.run(node, argv)
        if code != 0:
            raise NodeError(f"node {node.name}: {argv[0]} failed: {err.strip() or code}")
        return out

    def run_on_node(self, node: Node, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        return self.connections.run(self._nodes.get(node.name, node), argv, timeout)

    def keep_on_node(self, node: Node, argv: list[str]) -> SshKept:
        channel = self.connections.open_session(self._nodes.get(node.name, node))
        channel.exec_command(shlex.join(argv))
        return SshKept(channel)

    def sweep(self, job_id: str, node_names: set[str]) -> list[int]:
        """Kill anything of the job still running on the named nodes: those where an agent
        did not report a clean exit (elsewhere the agent already took its tree down)."""
        return self._agents_say("--sweep", job_id, node_names)

    def terminate_ranks(self, job_id: str, node_names: set[str]) -> list[int]:
        return self._agents_say("--term", job_id, node_names)

    def _agents_say(self, flag: str, job_id: str, node_names: set[str]) -> list[int]:
        nodes = [n for n in self._nodes.values() if n.name in node_names]
        return agents_say(flag, job_id, nodes, self.run_on_node)


def _code_key(folder: Path) -> str:
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.stat(path)
        return True
    except OSError:
        return False


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`path` and its missing parents, each made private (0700): the workdir, the code
    cache and the job folders hold the user's code and variables."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts:
        current += "/" + part
        if not _exists(sftp, current):
            with contextlib.suppress(OSError):  # another job made it meanwhile
                sftp.mkdir(current, PRIVATE_DIR)


def _put_atomic(sftp: paramiko.SFTPClient, local: Path, remote: str) -> None:
    """Upload under a temporary name, then rename: a new file, never an edited one (a job's
    hard-linked snapshot of the code keeps the old content)."""
    tmp = f"{remote}.distrun-{os.getpid()}-{threading.get_ident()}.tmp"
    st = local.stat()  # before the upload: a file gone meanwhile leaves no temporary file
    sftp.put(str(local), tmp)
    sftp.utime(tmp, (st.st_atime, st.st_mtime))
    sftp.chmod(tmp, _private_mode(st.st_mode))
    sftp.posix_rename(tmp, remote)


def _private_mode(mode: int) -> int:
    """A file's mode with its owner's bits only: 0644 becomes 0600, 0755 (a script) 0700."""
    return stat.S_IMODE(mode) & 0o700


def sync_folder(sftp: paramiko.SFTPClient, local: Path, remote: str) -> tuple[int, int]:
    """Make `remote` a copy of `local`'s regular files (`read_code_folder`), sending only
    files whose size or mtime differ; a file gone from `local` since it was listed is gone
    from `remote` too. Returns (files sent, files unchanged)."""
    remote_files: dict[str, tuple[int, int]] = {}
    remote_dirs: set[str] = set()
    shared: list[str] = []  # what an earlier version left readable by others

    def scan(folder: str) -> None:
        try:
            entries = sftp.listdir_attr(folder)
        except OSError:
            return
        for entry in entries:
            path = posixpath.join(folder, entry.filename)
            if stat.S_IMODE(entry.st_mode or 0) & 0o077:
                shared.append(path)
            if stat.S_ISDIR(entry.st_mode or 0):
                remote_dirs.add(path)
                scan(path)
            else:
                remote_files[path] = (entry.st_size, int(entry.st_mtime or 0))

    scan(remote)
    _makedirs(sftp, remote)
    sftp.chmod(remote, PRIVATE_DIR)
    for path in shared:
        with contextlib.suppress(OSError):  # removed below if it is no longer wanted
            mode = sftp.lstat(path).st_mode or 0
            sftp.chmod(path, PRIVATE_DIR if stat.S_ISDIR(mode) else _private_mode(mode))
    shipped = read_code_folder(local, ignore_files=False)
    for folder in shipped.folders:  # parents first
        target_dir = posixpath.join(remote, folder)
        if target_dir not in remote_dirs:
            _makedirs(sftp, target_dir)
    sent = kept = 0
    wanted = set()
    for rel in shipped.files:
        path, target = local / rel, posixpath.join(remote, rel)
        try:
            st = path.stat()
            if remote_files.get(target) == (st.st_size, int(st.st_mtime)):
                kept += 1
            else:
                _put_atomic(sftp, path, target)
                sent += 1
        except FileNotFoundError:
            if os.path.lexists(path):
                raise  # the node's side (paramiko's errors are OSErrors too)
            continue  # gone since the folder was listed (it changes as it ships): so there
        wanted.add(target)
    for path in remote_files:
        if path not in wanted:
            with contextlib.suppress(OSError):
                sftp.remove(path)
    return sent, kept
