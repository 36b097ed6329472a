"""The local transport: processes on this machine, each in its own process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PortRequest
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan

_CHUNK = 65536
# Ports handed out recently by this process, so two jobs started together never share one.
_recent_ports: dict[int, float] = {}
_ports_lock = threading.Lock()
_PORT_MEMORY_S = 120.0


def free_port(host: str = "") -> int:
    """A port nothing listens on now and that this process has not handed out lately."""
    with _ports_lock:
        now = time.monotonic()
        for port, when in list(_recent_ports.items()):
            if now - when > _PORT_MEMORY_S:
                del _recent_ports[port]
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _recent_ports:
                _recent_ports[port] = now
                return port
    raise DistrunError("could not find a free TCP port on this machine")


def process_environment(node: Node, env: dict[str, str]) -> dict[str, str]:
    """This machine's environment, the plan's variables, and the node's python first on PATH."""
    merged = {**os.environ, **env}
    if os.path.isabs(node.python):
        merged["PATH"] = os.path.dirname(node.python) + os.pathsep + merged.get("PATH", "")
    return merged


class LocalProcess:
    """A started process: its output streams, its exit, and stopping its whole tree."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid  # also its process-group id (it leads a new session)
        self._family: dict[int, psutil.Process] = {}

    def chunks(self, stream: str) -> Iterator[bytes]:
        pipe = self.popen.stdout if stream == "stdout" else self.popen.stderr
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, _CHUNK)
                if not data:
                    return
                yield data
        finally:
            pipe.close()

    def wait(self) -> int:
        return self.popen.wait()

    def _remember_family(self) -> None:
        # torchrun moves each worker into its own session: a signal to our process group
        # misses them, so remember every descendant while the tree is still connected.
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            for proc in [root, *root.children(recursive=True)]:
                self._family.setdefault(proc.pid, proc)

    def terminate(self) -> None:
        """SIGTERM to the process group and every descendant seen."""
        self._remember_family()
        self._signal_all(signal.SIGTERM)

    def kill(self) -> None:
        self._remember_family()
        self._signal_all(signal.SIGKILL)

    def _signal_all(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        for proc in self._family.values():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)  # psutil checks the pid was not reused


class LocalTransport:
    """Starts a plan's processes on this machine."""

    name = "local"

    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        return {request.key: free_port() for request in requests}

    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        """Write the plan's generated files (an MPI hostfile) before anything starts."""
        for node in nodes:
            Path(node.workdir, plan.job_id).mkdir(parents=True, exist_ok=True)
        for planned in plan.files:
            path = Path(planned.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(planned.content)

    def start(self, proc: ProcessPlan, node: Node) -> LocalProcess:
        try:
            popen = subprocess.Popen(
                proc.argv,
                cwd=proc.cwd,
                env=process_environment(node, proc.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            missing = exc.filename or proc.argv[0]
            if missing == proc.cwd:
                raise DistrunError(f"cannot start {proc.label}: no folder {proc.cwd}") from None
            raise DistrunError(
                f"cannot start {proc.label}: {missing!r} not found on PATH"
            ) from None
        except PermissionError as exc:
            raise DistrunError(f"cannot start {proc.label}: {exc}") from None
        return LocalProcess(popen)

    def sweep(self, job_id: str) -> list[int]:
        """Kill any process still carrying this job's id (a rank that daemonized, an orphan)."""
        marker = f"DISTRUN_JOB_ID={job_id}".encode()
        killed = []
        me = os.getpid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))
        return killed
