"""The launcher's side of the node agent (agent.py): handshake, output, stop, exit code.

A backend supplies the byte pipes (a local subprocess, an SSH channel); this class speaks
the protocol over them (backends.base.ProcessHandle), so every backend stops processes the
same way.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator

from jupyter_dist import node_side
from jupyter_dist.errors import DistrunError
from jupyter_dist.node_side.agent import HANDSHAKE

AGENT_SOURCE = node_side.path("agent.py")
_HANDSHAKE = HANDSHAKE.encode()
_EXITED = _HANDSHAKE + b" exited "
_MAX_HANDSHAKE = 64 * 1024


def _partial_marker(data: bytes) -> int:
    """How many trailing bytes of `data` could begin an exit report (or be an unfinished one)."""
    report = data.rfind(_EXITED[:1])
    if report < 0:
        return 0
    tail = data[report:]
    if _EXITED.startswith(tail) or (tail.startswith(_EXITED) and b"\n" not in tail):
        return len(tail)
    return 0


def agent_argv(
    python: str, agent_path: str, cwd: str, argv: list[str], grace: float, stdin: bool = False
) -> list[str]:
    """The agent running `argv`; with `stdin`, the process reads what `feed` sends it."""
    wants = ["--stdin"] if stdin else []
    return [python, agent_path, "--cwd", cwd, "--grace", f"{grace:g}", *wants, "--", *argv]


class AgentProcess:
    """One process started through the agent. Subclasses provide the raw pipes."""

    label = "process"
    # What it means when the agent never reported its exit (see `exit_note`).
    silent_exit = "its node agent was killed"

    def __init__(self) -> None:
        self._stderr_head = b""
        self._stdin_lock = threading.Lock()
        self._stdin_open = True
        self.pid: int | None = None
        self.agent_exit: int | None = None  # the code the agent reported as it exited

    # -- raw pipes, provided by the backend ----------------------------------------------

    def _read(self, stream: str) -> bytes:
        """Some bytes of `stream`, b"" at its end."""
        raise NotImplementedError

    def _write_stdin(self, data: bytes) -> None:
        raise NotImplementedError

    def _close_stdin(self) -> None:
        raise NotImplementedError

    def _wait(self) -> int:
        raise NotImplementedError

    # -- protocol ------------------------------------------------------------------------

    def confirm(self) -> None:
        """Read the handshake: the process started, or a one-line reason why not."""
        data = b""
        while b"\n" not in data and len(data) < _MAX_HANDSHAKE:
            chunk = self._read("stderr")
            if not chunk:
                break
            data += chunk
        line, _, rest = data.partition(b"\n")
        self._stderr_head = rest
        marker = line.find(_HANDSHAKE)
        if marker < 0:
            text = data.decode(errors="replace").strip() or f"exit code {self._wait()}"
            raise DistrunError(f"cannot start {self.label}: {text.splitlines()[-1]}")
        word, _, detail = (
            line[marker + len(_HANDSHAKE) :].decode(errors="replace").strip().partition(" ")
        )
        if word != "started":
            raise DistrunError(f"cannot start {self.label}: {detail}")
        self.pid = int(detail)

    def chunks(self, stream: str) -> Iterator[bytes]:
        if stream == "stdout":
            while data := self._read(stream):
                yield data
            return
        # stderr ends with the agent's exit report: take it out of the output.
        held = self._stderr_head
        while True:
            data = self._read(stream)
            held += data
            report = held.find(_EXITED)
            if report >= 0:
                line_end = held.find(b"\n", report)
                if line_end >= 0 or not data:
                    end = len(held) if line_end < 0 else line_end + 1
                    with contextlib.suppress(ValueError):
                        self.agent_exit = int(held[report + len(_EXITED) : end].strip())
                    held = held[:report] + held[end:]
            # Keep back a tail that could be the start of the report, until it is whole.
            keep = _partial_marker(held) if data else 0
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep :]
            if not data:
                return

    @property
    def exit_note(self) -> str | None:
        """Why the exit code is not the process's own; read once the output is drained."""
        return self.silent_exit if self.agent_exit is None else None

    def wait(self) -> int:
        code = self._wait()
        self._send(None)
        return code

    def terminate(self) -> None:
        """SIGTERM to the process tree; the agent kills it after its grace period."""
        self._send(b"term\n")

    def kill(self) -> None:
        self._send(b"kill\n")

    def interrupt(self) -> None:
        """SIGINT to the process itself (KeyboardInterrupt in Python)."""
        self._send(b"int\n")

    def feed(self, data: bytes) -> None:
        """Bytes for the process's standard input (one started with stdin)."""
        self._send(b"feed " + base64.b64encode(data) + b"\n")

    def _send(self, data: bytes | None) -> None:
        with self._stdin_lock:
            if not self._stdin_open:
                return
            with contextlib.suppress(OSError, EOFError):
                if data is None:
                    self._stdin_open = False
                    self._close_stdin()
                else:
                    self._write_stdin(data)
