"""The launcher's side of the node agent (agent.py): handshake, output, usage reports, stop,
exit code.

A backend supplies the byte pipes (a local subprocess, an SSH channel); this class speaks
the protocol over them (backends.base.ProcessHandle), so every backend stops processes the
same way.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jupyter_dist import node_side
from jupyter_dist.backends.node_ports import on_every_node
from jupyter_dist.errors import DistrunError
from jupyter_dist.node_side.agent import HANDSHAKE
from jupyter_dist.nodes import Node

AGENT_SOURCE = node_side.path("agent.py")
_HANDSHAKE = HANDSHAKE.encode()
# The agent's reports on stderr: "exited CODE", "usage JSON", "oom JSON".
_REPORT = _HANDSHAKE + b" "
_MAX_HANDSHAKE = 64 * 1024
USAGE_EVERY_S = 1.0  # how often an agent reports what its process tree uses
# A running agent reports every USAGE_EVERY_S (its usage, or while it stops its tree, that it
# is alive). Silent this long, it is gone: killed, frozen, or its link dead while something
# it left holds the pipes open (then its process would never be seen to end).
AGENT_SILENCE_S = 15.0


def _partial_marker(data: bytes) -> int:
    """How many trailing bytes of `data` could begin a report (or be an unfinished one)."""
    report = data.rfind(_REPORT[:1])
    if report < 0:
        return 0
    tail = data[report:]
    if _REPORT.startswith(tail) or (tail.startswith(_REPORT) and b"\n" not in tail):
        return len(tail)
    return 0


@functools.cache  # once per process: every start, prepare and sweep names the agent
def agent_file_name() -> str:
    """The agent's file name on a node that does not see this machine's files: by its
    content, so that jobs of different versions never replace each other's."""
    digest = hashlib.sha256(AGENT_SOURCE.read_bytes()).hexdigest()[:12]
    return f"agent-{digest}.py"


def agents_say(
    flag: str,
    job_id: str,
    nodes: list[Node],
    run: Callable[[Node, list[str], float], tuple[int, str, str]],
    agent_path: Callable[[Node], str] | None = None,
) -> list[int]:
    """The agent's one-shot `flag` for the job on every node at once (--sweep: kill what
    still carries the job's id; --term: SIGTERM the job's MPI ranks), each run by `run`
    (a backend's run_on_node) from `agent_path(node)` (by default the agent shipped into
    the node's workdir); the pids the agents printed. Never raises: a node that cannot be
    reached has nothing to say."""
    agent_path = agent_path or (lambda node: posixpath.join(node.workdir, agent_file_name()))

    def on_node(node: Node) -> list[int]:
        with contextlib.suppress(Exception):
            code, out, _ = run(node, [node.python, agent_path(node), flag, job_id], 30)
            return [int(p) for p in out.split()] if code == 0 else []
        return []

    return [pid for pids in on_every_node(nodes, on_node) for pid in pids]


def agent_argv(
    python: str,
    agent_path: str,
    cwd: str,
    argv: list[str],
    grace: float,
    stdin: bool = False,
    stdin_fd: int | None = None,
) -> list[str]:
    """The agent running `argv`, reporting its usage every USAGE_EVERY_S; with `stdin`, the
    process reads what `feed` sends it: relayed by the agent, or with `stdin_fd` (a pipe's
    reading end the agent inherits) straight from that pipe."""
    wants = ["--stdin"] if stdin else []
    if stdin and stdin_fd is not None:
        wants = ["--stdin-fd", str(stdin_fd)]
    timing = ["--grace", f"{grace:g}", "--usage", f"{USAGE_EVERY_S:g}"]
    # -E: the job's PYTHON* variables are its processes', not the agent's (PYTHONVERBOSE or
    # PYTHONPROFILEIMPORTTIME would write ahead of its handshake); its children get them.
    return [python, "-E", agent_path, "--cwd", cwd, *timing, *wants, "--", *argv]


class AgentProcess:
    """One process started through the agent. Subclasses provide the raw pipes."""

    label = "process"
    # What it means when the agent never reported its exit (see `exit_note`).
    silent_exit = "lost its node agent"

    def __init__(self) -> None:
        self._stderr_head = b""
        self._stdin_lock = threading.Lock()
        self._stdin_open = True
        self.pid: int | None = None
        self.agent_exit: int | None = None  # the code the agent reported as it exited
        self.oom: dict[str, Any] | None = None  # the agent's evidence of an OOM kill
        self.on_usage: Callable[[dict[str, Any]], None] | None = None
        self.on_preload_failed: Callable[[str], None] | None = None
        self.last_heard: float | None = None  # monotonic time of its last report
        self.silent_for: float | None = None  # set when `wait` gave up on a silent agent

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
        self.last_heard = time.monotonic()

    def chunks(self, stream: str) -> Iterator[bytes]:
        if stream == "stdout":
            while data := self._read(stream):
                yield data
            return
        # The agent's reports (usage, and last its exit) come on stderr, wherever the
        # process's own bytes stand: take them out of the output.
        held = self._stderr_head
        while True:
            data = self._read(stream)
            held = self._take_reports(held + data, whole=not data)
            # Keep back a tail that could be the start of a report, until it is whole.
            keep = _partial_marker(held) if data else 0
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep :]
            if not data:
                return

    def _take_reports(self, held: bytes, whole: bool) -> bytes:
        """`held` less every complete report in it, each acted on (with `whole`, the
        stream ended: a report without its newline is complete too)."""
        start = held.find(_REPORT)
        while start >= 0:
            line_end = held.find(b"\n", start)
            if line_end < 0 and not whole:
                break
            end = len(held) if line_end < 0 else line_end + 1
            word, _, detail = held[start + len(_REPORT) : end].strip().partition(b" ")
            self.last_heard = time.monotonic()
            if word == b"exited":
                with contextlib.suppress(ValueError):
                    self.agent_exit = int(detail)
            elif word == b"oom":
                with contextlib.suppress(ValueError):
                    self.oom = json.loads(detail)
            elif word == b"usage" and self.on_usage is not None:
                with contextlib.suppress(ValueError, TypeError):
                    self.on_usage(json.loads(detail))
            elif word == b"preload-failed" and self.on_preload_failed is not None:
                with contextlib.suppress(ValueError, TypeError):
                    self.on_preload_failed(str(json.loads(detail)))
            held = held[:start] + held[end:]
            start = held.find(_REPORT, start)
        return held

    @property
    def exit_note(self) -> str | None:
        """Why the exit code is not the process's own; read once the output is drained."""
        if self.silent_for is not None:
            return f"lost its node agent (no word from it for {self.silent_for:.0f} s)"
        return self.silent_exit if self.agent_exit is None else None

    def wait(self) -> int:
        """The exit code once the process ended; 255 once its agent said nothing for
        AGENT_SILENCE_S (see `exit_note`): what the dead agent left may hold the pipes and
        keep the process from ever being seen to end."""
        code = self._wait_hearing()
        self._send(None)
        return code

    def _wait_hearing(self) -> int:
        if self.last_heard is None:  # never started: nothing to listen for
            return self._wait()
        ended: list[int] = []
        waiter = threading.Thread(
            target=lambda: ended.append(self._wait()), daemon=True, name=f"wait-{self.label}"
        )
        waiter.start()
        while True:
            waiter.join(0.5)
            if ended:
                return ended[0]
            quiet = time.monotonic() - self.last_heard
            if quiet > AGENT_SILENCE_S:
                self.silent_for = quiet
                return 255

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
