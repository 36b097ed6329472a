"""A job's outputs (the spec's `outputs:`, `${{outputs.NAME}}` in its command): where each
one is, and, when the job ends, a copy from every node that does not see this machine's
store into the store's job folder.

    where = output_places(plan, record_path)           # NAME -> where it is, in words
    notes = output_notes(plan, record_path)            # "outputs.NAME: where", each
    said = collect_outputs(plan, nodes, backend, record_path)   # at the job's end
    files = collect_folder(backend, nodes, job_id, "out")      # a folder's small files

An output without a `path` is written on each node into the job's folder there
(`outputs/NAME`, a folder; for uri_file a file `outputs/NAME`). On local nodes that folder
is the store's job folder itself, as on a Slurm cluster's shared filesystem: nothing to
copy. From nodes that do not see this machine's files (SSH, Ray) the
files are copied into `<store job>/outputs/<node>/NAME` (the files directly in the folder;
a subfolder stays on the node). An output with a `path` is where the spec says, on every
node, and is not copied. Everything copied is private (0600 in 0700).

The copy reads each file in pieces (none has to fit in memory), as large as it was when
listed (a file that keeps growing is not followed), at most DISTRUN_OUTPUTS_LIMIT_MB (1024)
from each node: what is past it stays on the node and is named with its path. The job's
cancel stops it (`stop`), and a long copy says how far it is (`progress`).
"""

from __future__ import annotations

import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_dist.backends.base import Backend
from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import LaunchPlan
from jupyter_dist.spec import OUTPUTS_FOLDER
from jupyter_dist.store import private_dir, write_pieces

# What one job copies from each node at most; files past it stay there, and are named.
COPY_LIMIT_MB = 1024
COPY_LIMIT_VARIABLE = "DISTRUN_OUTPUTS_LIMIT_MB"
PIECE_BYTES = 4 << 20  # read and written at a time: a file never has to fit in memory
PROGRESS_EVERY_S = 5.0


def _sees_store(node: Node, plan: LaunchPlan, record_path: Path) -> bool:
    """Whether the node's job folder is the store's (local nodes)."""
    if not node.shares_files:
        return False
    return Path(node.workdir, plan.job_id).resolve() == record_path.resolve()


def output_places(plan: LaunchPlan, record_path: Path) -> dict[str, str]:
    """Each output's place, in words: its own path on every node; the store's job folder
    where the nodes see this machine's files (local nodes, a Slurm cluster's shared
    filesystem: the job's folder is the store's); else the job's folder on each node,
    copied into the store."""
    places = {}
    local = all(n.get("shares_files") for n in plan.nodes)
    for name, output in plan.outputs.items():
        if output.get("path"):
            places[name] = f"{output['path']} on each node (the spec's path)"
        elif local:
            places[name] = str(record_path / OUTPUTS_FOLDER / name)
        else:
            copies = record_path / OUTPUTS_FOLDER
            places[name] = (
                f"{OUTPUTS_FOLDER}/{name} in the job's folder on each node; "
                f"copied into {copies}/<node>/{name} when the job ends"
            )
    return places


def output_notes(plan: LaunchPlan, record_path: Path) -> list[str]:
    """`outputs.NAME: where` for each output, as the inspectors show them."""
    return [f"outputs.{name}: {place}" for name, place in output_places(plan, record_path).items()]


class CopyCancelled(Exception):
    """The copy was told to stop (the job was cancelled while it copied)."""


def copy_limit() -> tuple[int, str | None]:
    """(bytes a job may copy from each node, a note when the variable was not a number)."""
    said = os.environ.get(COPY_LIMIT_VARIABLE, "").strip()
    if not said:
        return COPY_LIMIT_MB << 20, None
    if said.isdecimal():
        return int(said) << 20, None
    return COPY_LIMIT_MB << 20, (
        f"{COPY_LIMIT_VARIABLE}={said!r} is not a whole number of MiB: "
        f"{COPY_LIMIT_MB} MiB were allowed"
    )


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


@dataclass
class _Copy:
    """One node's copy: what it may still take, and how it tells its progress."""

    node: Node
    backend: Backend
    room: int
    limit: int
    stop: threading.Event | None
    progress: Callable[[str], None] | None
    copied: int = 0
    total: int = 0
    last_said: float = field(default_factory=time.monotonic)

    def pieces(self, path: str, size: int) -> Iterator[bytes]:
        """The file's first `size` bytes (its size when listed: one that keeps growing is
        not followed), a piece at a time."""
        offset = 0
        while offset < size:
            if self.stop is not None and self.stop.is_set():
                raise CopyCancelled
            piece = self.backend.read_piece(
                self.node, path, offset, min(PIECE_BYTES, size - offset)
            )
            if not piece:
                return  # it shrank meanwhile
            offset += len(piece)
            self.copied += len(piece)
            self._say()
            yield piece

    def _say(self) -> None:
        now = time.monotonic()
        if self.progress is not None and now - self.last_said >= PROGRESS_EVERY_S:
            self.last_said = now
            self.progress(
                f"copying outputs from {self.node.name}: {_mib(self.copied)} of {_mib(self.total)}"
            )


def collect_folder(
    backend: Backend, nodes: Iterable[Node], job_id: str, folder: str
) -> dict[str, bytes]:
    """The files in `folder` of the job's folder on every node (name -> content), read
    whole (a session's `--out` values: small); local nodes, which share one folder, once."""
    found: dict[str, bytes] = {}
    seen: set[tuple[str, str]] = set()
    for node in nodes:
        path = posixpath.join(node.workdir, job_id, folder)  # a node's own paths
        if (node.host, path) not in seen:
            seen.add((node.host, path))
            found.update(backend.collect(node, path))
    return found


def collect_outputs(
    plan: LaunchPlan,
    nodes: Iterable[Node],
    backend: Backend,
    record_path: Path,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Copy each output without a path from every node that does not see the store into
    `<record_path>/outputs/<node>/NAME`, a piece at a time, at most the copy limit from each
    node (`DISTRUN_OUTPUTS_LIMIT_MB`, 1024 by default): a file past it stays on the node,
    named with where it is. `stop` set ends the copy (what was not copied is named);
    `progress(text)` every few seconds of a long copy. What was copied or left, one line
    each. Never raises: a node that cannot be reached is said so."""
    said: list[str] = []
    wanted = {n: o for n, o in plan.outputs.items() if not o.get("path")}
    limit, note = copy_limit()
    if note and wanted:
        said.append(note)
    for node in nodes if wanted else ():
        if _sees_store(node, plan, record_path):
            continue
        copy = _Copy(node, backend, limit, limit, stop, progress)
        try:
            said += _copy_node(copy, plan, wanted, record_path)
        except CopyCancelled:
            rest = posixpath.join(node.workdir, plan.job_id, OUTPUTS_FOLDER)
            said.append(
                f"outputs: the copy was cancelled; what it had not copied is on the "
                f"nodes, {rest} on {node.name}"
            )
            break
    return said


def _copy_node(copy: _Copy, plan: LaunchPlan, wanted: dict, record_path: Path) -> list[str]:
    said: list[str] = []
    node = copy.node
    job_outputs = posixpath.join(node.workdir, plan.job_id, OUTPUTS_FOLDER)
    listed: dict[str, tuple[str, dict[str, int]]] = {}  # name -> (its folder, its files)
    top: dict[str, int] | None = None  # the files directly in outputs/: listed once
    for name, output in wanted.items():
        try:
            if output.get("type") == "uri_file":
                top = copy.backend.list_files(node, job_outputs) if top is None else top
                files = {name: top[name]} if name in top else {}
                listed[name] = (job_outputs, files)
            else:
                folder = posixpath.join(job_outputs, name)
                listed[name] = (folder, copy.backend.list_files(node, folder))
        except (DistrunError, OSError) as exc:
            said.append(f"outputs.{name}: not copied from {node.name}: {exc}")
    copy.total = sum(sum(files.values()) for _, files in listed.values())
    for name, (folder, files) in listed.items():
        if not files:
            continue
        is_file = wanted[name].get("type") == "uri_file"
        target = private_dir(private_dir(record_path / OUTPUTS_FOLDER) / node.name)
        if not is_file:
            target = private_dir(target / name)
        count, over, unread = 0, [], []
        for file_name, size in files.items():
            source = posixpath.join(folder, file_name)
            if size > copy.room:
                over.append(f"{source} ({_mib(size)})")
                continue
            try:
                copy.room -= write_pieces(target / file_name, copy.pieces(source, size))
                count += 1
            except (DistrunError, OSError) as exc:
                unread.append(f"{source} ({exc})")
        where = target / name if is_file else target
        if count:
            said.append(f"outputs.{name}: {count} file(s) from {node.name} in {where}")
        if over:
            said.append(
                f"outputs.{name}: left on {node.name}, past the {_mib(copy.limit)} a job "
                f"copies from each node ({COPY_LIMIT_VARIABLE}): {', '.join(over)}"
            )
        if unread:
            said.append(f"outputs.{name}: not copied from {node.name}: {', '.join(unread)}")
    return said
