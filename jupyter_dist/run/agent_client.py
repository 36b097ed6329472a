"""The launcher's side of the node agent (agent.py): handshake, output, stop, exit code.

A transport supplies the byte pipes (a local subprocess, an SSH channel); this class speaks
the protocol over them, so every transport stops processes the same way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from jupyter_dist.errors import DistrunError
from jupyter_dist.run.agent import HANDSHAKE

AGENT_SOURCE = Path(__file__).with_name("agent.py")
_HANDSHAKE = HANDSHAKE.encode()
_MAX_HANDSHAKE = 64 * 1024


def agent_argv(python: str, agent_path: str, cwd: str, argv: list[str], grace: float) -> list[str]:
    return [python, agent_path, "--cwd", cwd, "--grace", f"{grace:g}", "--", *argv]


class AgentProcess:
    """One process started through the agent. Subclasses provide the raw pipes."""

    label = "process"

    def __init__(self) -> None:
        self._stderr_head = b""
        self._stdin_lock = threading.Lock()
        self._stdin_open = True
        self.pid: int | None = None

    # -- raw pipes, provided by the transport --------------------------------------------

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
        if stream == "stderr" and self._stderr_head:
            yield self._stderr_head
        while True:
            data = self._read(stream)
            if not data:
                return
            yield data

    def wait(self) -> int:
        code = self._wait()
        self._send(None)
        return code

    def terminate(self) -> None:
        """SIGTERM to the process tree; the agent kills it after its grace period."""
        self._send(b"term\n")

    def kill(self) -> None:
        self._send(b"kill\n")

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
