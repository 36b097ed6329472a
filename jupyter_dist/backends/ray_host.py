"""What runs inside the Ray actor that the ray backend (backends/ray.py) places on each of a
job's Ray nodes: it starts node agents (node_side/agent.py) as its own subprocesses and
moves their bytes, writes the job's files, and runs short helpers. Ray only places it; the
agents do everything else, as they do over SSH.

Standard library only, and sent to the cluster by value (the ray backend registers this
module with Ray's pickler): a Ray node needs nothing of jupyter-dist installed. A process's
output stays in its pipe on the Ray node until the launcher reads it (the agent waits when
the pipe is full), so a slow reader loses no line.

Every method may be called from several threads at once (the actor's max_concurrency):
one reader per stream and a waiter per process, a writer, the launcher's helpers.
"""

from __future__ import annotations

import contextlib
import os
import platform
import select
import socket
import subprocess
import sys
import tempfile
import threading

_CHUNK = 65536


def make_group(bundles: list, wait: float) -> tuple:
    """A STRICT_SPREAD placement group of `bundles`, made in the cluster, and whether it was
    placed within `wait` seconds. Run as one task (no CPU) where the launcher is a Ray
    Client: there each call of Ray's placement API is a task of its own (the group, then
    its `ready()`), this one call in their place."""
    from ray.util.placement_group import placement_group

    group = placement_group(bundles, strategy="STRICT_SPREAD")
    return group, group.wait(wait)


class RayNodeHost:
    """One per job and Ray node. `key` names one of its processes (the launcher's choice)."""

    def __init__(self) -> None:
        import ray  # the actor's own Ray: here only to ask which node this is

        # Per user and Ray node: nodes that share a filesystem (a machine's) keep apart.
        node_id = ray.get_runtime_context().get_node_id()
        self.workdir = os.path.join(
            tempfile.gettempdir(), f"distrun-ray-{os.getuid()}-{node_id[:12]}"
        )
        os.makedirs(self.workdir, mode=0o700, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        self.processes: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()

    def info(self) -> dict:
        """What the launcher plans with: where this node is and what it runs."""
        import ray

        return {
            "hostname": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "python": sys.executable,
            "version": platform.python_version(),
            "workdir": self.workdir,
            "pid": os.getpid(),
        }

    def put_files(self, entries: list) -> None:
        """(path, piece, mode, offset, size) each: the piece of the file at `offset`; a file
        appears at `path` (private folders made on the way) once its last piece is written,
        never half. A large file comes in pieces over several calls, in order."""
        for path, piece, mode, offset, size in entries:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            temporary = f"{path}.{os.getpid()}.part"
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
            with open(os.open(temporary, flags, mode), "r+b" if offset else "wb") as handle:
                handle.seek(offset)
                handle.write(piece)
            if offset + len(piece) >= size:
                os.chmod(temporary, mode)
                os.replace(temporary, path)

    def make_folders(self, folders: list) -> None:
        for folder in folders:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)

    def start(self, key: str, argv: list, env: dict, cwd: str | None) -> int:
        """Start `argv` (an agent) with these variables added, through a shell that waits
        for it and exits with its code; the shell's pid. Why the shell: when an actor dies
        (its driver gone: a killed kernel), Ray SIGKILLs the actor's own children. The
        shell dies so; the agent, its child, lives on, sees its input close as the actor's
        end of the pipe goes, and stops its process tree, as it does when SSH drops."""
        popen = subprocess.Popen(
            ["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv],
            env={**os.environ, **env},
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self.lock:
            self.processes[key] = popen
        return popen.pid

    def read(self, key: str, stream: str, timeout: float) -> bytes | None:
        """Some bytes of the stream; b"" at its end; None when none came within `timeout`."""
        popen = self.processes[key]
        pipe = popen.stdout if stream == "stdout" else popen.stderr
        try:
            ready, _, _ = select.select([pipe], [], [], timeout)
            return os.read(pipe.fileno(), _CHUNK) if ready else None
        except (OSError, ValueError):
            return b""

    def write(self, key: str, data: bytes) -> None:
        pipe = self.processes[key].stdin
        pipe.write(data)
        pipe.flush()

    def close_stdin(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self.processes[key].stdin.close()

    def wait(self, key: str, timeout: float) -> int | None:
        """The exit code, or None while it runs after `timeout` seconds."""
        try:
            return self.processes[key].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def run(self, argv: list, timeout: float) -> tuple:
        """A short command: (exit code, stdout, stderr)."""
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return 1, "", f"{argv[0]} did not finish within {timeout:g} s"
        except OSError as exc:
            return 127, "", str(exc)
        return done.returncode, done.stdout, done.stderr

    def list_files(self, folder: str) -> dict:
        return list_folder(folder)

    def read_piece(self, path: str, offset: int, size: int) -> bytes:
        return read_piece(path, offset, size)

    def collect(self, folder: str) -> dict:
        """Every file directly in `folder`: name -> content."""
        if not os.path.isdir(folder):
            return {}
        found = {}
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[name] = handle.read()
        return found

    def stop_all(self, timeout: float) -> None:
        """End every agent still running: their input closed (an agent then stops its tree),
        then, after `timeout`, SIGKILL to whatever is left of them."""
        with self.lock:
            running = [p for p in self.processes.values() if p.poll() is None]
        for popen in running:
            with contextlib.suppress(OSError):
                popen.stdin.close()
        for popen in running:
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                popen.kill()

    def remove_group(self, group) -> None:
        """Remove the job's placement group, from here: over Ray Client the launcher's own
        call runs as a task of its own (a worker started for it: 1.3 s on the test
        cluster), this one in the actor's process. It ends the job's actors, this one too:
        its caller does not wait for the answer."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)


# Module-level, standard library: the local backend reads its nodes' outputs with them too.
def list_folder(folder: str) -> dict[str, int]:
    """Every regular file directly in `folder` (name -> size); none if it does not exist.
    A link is not followed, and a FIFO or a device is not a file to copy."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return {}
    found = {}
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                found[entry.name] = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # gone meanwhile
    return found


def read_piece(path: str, offset: int, size: int) -> bytes:
    """Up to `size` bytes of the file at `path` from `offset` (fewer at its end)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)
