"""The job store on disk: the truth every view reads (widget, CLI, lab sidebar).

One folder per job under the store root::

    <root>/<job id>/spec.yml      the job spec as run
    <root>/<job id>/plan.json     every process: node, argv, env, ranks
    <root>/<job id>/status.json   job and per-process state, root cause, times
    <root>/<job id>/logs/<key>.stdout.log, <key>.stderr.log
                                  one line per printed line: "<UTC timestamp> <text>"

A log key is a rank ("rank-3") where the line is known to come from one, else the process
name ("worker-1", "torchrun-0", "mpirun"). A warm session's rank logs hold every cell it ran,
each after a marker line `── cell N ──` on stdout (`cell_marker`), written before the cell
was sent, so `read_logs(..., cell=N)` can pick one cell's lines out. A job that started
again after a failure (limits.max_restarts) has a marker `── attempt N ──` in the stdout of
every key of attempt N ≥ 2 (`attempt_marker`), so `read_logs(..., attempt=N)` picks one
attempt's lines out (attempt 1's come before the first marker).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import io
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

from jupyter_dist.errors import DamagedJob, DistrunError
from jupyter_dist.events import RootCause

STREAMS = ("stdout", "stderr")
MAX_JOB_ID = 128  # ours are 26 characters
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]+")
_CELL_MARKER = re.compile(r"\u2500\u2500 cell (\d+) \u2500\u2500")
_ATTEMPT_MARKER = re.compile(r"\u2500\u2500 attempt (\d+) \u2500\u2500")


def cell_marker(cell: int) -> str:
    """The stored line that opens a session cell's output in a rank's log."""
    return f"\u2500\u2500 cell {cell} \u2500\u2500"


def attempt_marker(attempt: int) -> str:
    """The stored line that opens a later attempt's output in each of its logs."""
    return f"\u2500\u2500 attempt {attempt} \u2500\u2500"


def is_marker(text: str) -> bool:
    """Whether a stored stdout line is one of ours (a cell's or an attempt's marker), not
    a process's."""
    return (_ATTEMPT_MARKER.fullmatch(text) or _CELL_MARKER.fullmatch(text)) is not None


class UnknownJob(DistrunError):
    """No job has that id (or no unique job starts with it)."""


# What the views read of a status, and the types they need.
_STATUS_TYPES = {
    "state": str,
    "name": str,
    "type": str,
    "processes": dict,
    "nodes": list,
    "root_cause": dict,
    "started": (int, float),
    "ended": (int, float),
    "owner_host": str,
    "world_size": int,
    "message": str,
}


_MAX_PID = 1 << 22  # Linux's pid_max can be no higher
_LATEST = 1e11  # seconds since 1970: the year 5138


def _status_problem(status: Any) -> str | None:
    """Why a status.json's content cannot be shown, or None: every value a view reads is
    checked, so that a damaged job never breaks a listing (valid JSON can be damaged)."""
    if not isinstance(status, dict):
        return f"status.json holds a {type(status).__name__}, not a mapping"
    for key, kinds in _STATUS_TYPES.items():
        value = status.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            return f"status.json's {key} is a {type(value).__name__}"
    for key in ("started", "ended"):
        value = status.get(key)
        if value is not None and not (0 <= value <= _LATEST):  # NaN fails this too
            return f"status.json's {key} is not a time"
    pid = status.get("owner_pid")
    if pid is not None and not (isinstance(pid, int) and 0 < pid <= _MAX_PID):
        return "status.json's owner_pid is not a process id"
    processes = status.get("processes") or {}
    if not all(isinstance(entry, dict) for entry in processes.values()):
        return "status.json's processes are not all mappings"
    cause = status.get("root_cause")
    if cause is not None and not _is_root_cause(cause):
        return "status.json's root_cause is not one"
    return None


# A stored root cause has every field RootCause requires, and none it does not know.
_CAUSE_FIELDS = {f.name for f in fields(RootCause)}
_CAUSE_REQUIRED = {
    f.name for f in fields(RootCause) if f.default is MISSING and f.default_factory is MISSING
}


def _is_root_cause(cause: dict) -> bool:
    return _CAUSE_REQUIRED <= set(cause) <= _CAUSE_FIELDS


def _is_usage(sample: Any) -> bool:
    """Whether a usage.jsonl line is an agent's report as append_usage stored it."""
    return (
        isinstance(sample, dict)
        and isinstance(sample.get("t"), (int, float))
        and isinstance(sample.get("p"), str)
    )


def default_root() -> Path:
    """`$DISTRUN_HOME/jobs`, else `<jupyter data dir>/distrun/jobs`."""
    home = os.environ.get("DISTRUN_HOME")
    if home:
        return Path(home).expanduser() / "jobs"
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "distrun" / "jobs"


def timestamp(seconds: float) -> str:
    """UTC, to the microsecond: what prefixes every stored log line."""
    whole = int(seconds)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        + f".{int((seconds - whole) * 1e6):06d}Z"
    )


# The store holds what jobs were given (environment values, a notebook's pushed variables,
# the cells' code): readable by its owner alone, whatever the umask.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a folder (made, with its parents) that only its owner can enter."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def _private_opener(path: str, flags: int) -> int:
    """open()'s opener: a file created readable by its owner alone."""
    fd = os.open(path, flags, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return fd


def append_private(path: Path, text: str) -> None:
    """Append `text` to a file readable by its owner alone (made so if new)."""
    with open(path, "a", encoding="utf-8", opener=_private_opener) as handle:
        handle.write(text)


def write_atomic(path: Path, text: str | bytes, mode: int | None = None) -> None:
    """`text` (or bytes) as the whole of `path`, which no reader ever sees half written;
    private (PRIVATE_FILE, or `mode`: 0o700 for a program)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb" if isinstance(text, bytes) else "w", opener=_private_opener) as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:  # a full disk: nothing is left but what `path` was
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """`data` as the whole of the regular file `path`, written over the blocks it already
    holds: the last resort where a new file cannot be made (a full disk), so not atomic (a
    reader may see it half written). False, with nothing written, when `data` would need
    more blocks than `path` holds."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or len(data) > held.st_blocks * 512:
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return True


def write_pieces(path: Path, pieces: Iterable[bytes]) -> int:
    """The bytes of `pieces` as the whole of `path`, written as they come (a file larger
    than memory) and seen by no reader half written: private, as `write_atomic`. If the
    pieces raise, nothing is left but what `path` was. The bytes written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    written = 0
    try:
        with open(tmp, "wb", opener=_private_opener) as handle:
            for piece in pieces:
                handle.write(piece)
                written += len(piece)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return written


@dataclass(frozen=True)
class LogLine:
    ts: str
    text: str


class JobRecord:
    """One job's folder."""

    def __init__(self, path: Path):
        self.path = path
        self.job_id = path.name

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    def log_path(self, key: str, stream: str) -> Path:
        return self.logs_dir / f"{key}.{stream}.log"

    def open_log(self, key: str, stream: str):
        """An append-mode text file for one key and stream (the runner's writer)."""
        return open(
            self.log_path(key, stream), "a", encoding="utf-8", newline="\n", opener=_private_opener
        )

    def write_plan(self, plan: dict[str, Any]) -> None:
        """Replace plan.json with the plan now running (a later attempt's)."""
        write_atomic(self.path / "plan.json", json.dumps(plan, indent=1))

    def write_status(self, status: dict[str, Any]) -> None:
        """status.json, atomically; on a full disk over the old one's blocks instead (as
        readable, or as compact JSON if that fits), so that a job stopped because its store
        filled up can still say so (else it read "lost" once its owner was gone)."""
        text = json.dumps(status, indent=1)
        try:
            write_atomic(self.path / "status.json", text)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            compact = json.dumps(status, separators=(",", ":"))
            for data in (text.encode(), compact.encode()):
                with contextlib.suppress(OSError):
                    if overwrite_in_place(self.path / "status.json", data):
                        return
            raise

    def status(self) -> dict[str, Any]:
        """The job's status.json; "unknown" before the job wrote one, "damaged" (with a
        message saying why) when it cannot be read as one, so that listings go on."""
        try:
            status = json.loads(read_regular(self.path / "status.json"))
        except FileNotFoundError:
            return {"job_id": self.job_id, "state": "unknown"}
        except (OSError, ValueError, RecursionError) as exc:  # bytes, JSON, nesting, access
            return self._damaged(f"status.json cannot be read ({type(exc).__name__})")
        problem = _status_problem(status)
        return self._damaged(problem) if problem else status

    def _damaged(self, why: str) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": "damaged", "message": f"damaged: {why}"}

    def spec_yaml(self) -> str:
        """The job's spec.yml; DamagedJob where it is not a regular file."""
        try:
            return read_regular(self.path / "spec.yml").decode()
        except NotAFile as exc:
            raise DamagedJob(f"job {self.job_id}: its {exc}") from None

    def append_usage(self, sample: dict[str, Any]) -> None:
        """One usage report of a process's agent ({"t", "p", "cpu", "rss", "ranks"}, and
        "gpu", "gpus" where GPUs were read), kept
        as a line of usage.jsonl (diagnose/meters.py reads them back)."""
        append_private(self.path / "usage.jsonl", json.dumps(sample, separators=(",", ":")) + "\n")

    def usage(self, since: float | None = None) -> list[dict[str, Any]]:
        """The usage reports kept so far, oldest first; with `since` (a time.time()), only
        those taken from then on, read from the end of the file back (a long job's file
        is not read whole every few seconds by the sidebar)."""
        try:
            with open_regular(self.path / "usage.jsonl") as handle:
                text = handle.read() if since is None else _tail_since(handle, since)
        except FileNotFoundError:
            return []
        except NotAFile:  # damaged: no usage to show, and the rest of the job still shows
            return []
        found = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError, RecursionError):  # a line cut by a crash
                sample = json.loads(line)
                if not _is_usage(sample):
                    continue  # damaged: not one of the agents' reports
                if since is None or sample["t"] >= since:
                    found.append(sample)
        return found

    def save_stacks(self, dump: dict[str, Any]) -> None:
        """Keep the latest stack dump (run/stacks.StackDump.to_dict), replacing the last."""
        write_atomic(self.path / "stacks.json", json.dumps(dump))

    def last_stacks(self) -> dict[str, Any] | None:
        """The latest stack dump taken of the job, if any was; DamagedJob where stacks.json
        is not one (StackDump.from_dict checks the rest)."""
        try:
            dump = json.loads(read_regular(self.path / "stacks.json"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):
            dump = None
        if not isinstance(dump, dict):
            raise DamagedJob(f"job {self.job_id}: its stacks.json is damaged")
        return dump

    def plan(self) -> dict[str, Any]:
        """The job's plan.json; DistrunError in one line if it is damaged."""
        try:
            plan = json.loads(read_regular(self.path / "plan.json"))
        except (OSError, ValueError) as exc:
            raise DamagedJob(
                f"job {self.job_id}: its plan.json cannot be read ({type(exc).__name__}); "
                f"the job's folder is {self.path}"
            ) from None
        if not isinstance(plan, dict) or not isinstance(plan.get("processes"), list):
            raise DamagedJob(
                f"job {self.job_id}: its plan.json is not a plan; the job's folder is {self.path}"
            )
        return plan

    def log_keys(self) -> list[str]:
        keys = {p.name.rsplit(".", 2)[0] for p in self.logs_dir.glob("*.log") if p.is_file()}
        return sorted(keys, key=natural_order)

    def read_log(self, key: str, streams: tuple[str, ...] = STREAMS) -> list[tuple[str, LogLine]]:
        """Every stored line of `key`, stdout and stderr merged by timestamp."""
        lines: list[tuple[str, LogLine]] = []
        for stream in streams:
            for line in self.iter_log(key, stream):
                lines.append((stream, line))
        lines.sort(key=lambda item: item[1].ts)  # stable: order within a stream is kept
        return lines

    def read_logs(
        self,
        keys: list[str],
        streams: tuple[str, ...] = STREAMS,
        tail: int | None = None,
        cell: int | None = None,
        attempt: int | None = None,
    ) -> list[tuple[str, str, str, str]]:
        """Lines of several keys merged by timestamp, as (ts, key, stream, text): every
        stored line, or with `tail` the last `tail` of each key; with `cell`, only the
        lines of that session cell (between its marker and the next); with `attempt`, only
        that attempt's."""
        per_key = []
        for key in keys:
            if cell is not None or attempt is not None:
                marker, number, first = (
                    (_CELL_MARKER, cell, None)
                    if cell is not None
                    else (_ATTEMPT_MARKER, attempt, 1)
                )
                lines = _lines_between_markers(
                    [(line.ts, key, stream, line.text) for stream, line in self.read_log(key)],
                    marker,
                    number,
                    streams,
                    first,
                )
                lines = lines[-tail:] if tail else lines
            elif tail is None:
                lines = [
                    (line.ts, key, stream, line.text)
                    for stream, line in self.read_log(key, streams)
                ]
            else:
                lines = [
                    (line["ts"], key, line["stream"], line["text"])
                    for line in self.read_range(key, tail=tail)[0]
                    if line["stream"] in streams
                ]
            per_key.append(lines)
        return list(heapq.merge(*per_key, key=lambda line: line[0]))

    def cells(self, key: str) -> list[int]:
        """The session cells whose markers are in `key`'s log (none for a job's)."""
        found = (_CELL_MARKER.fullmatch(line.text) for line in self.iter_log(key, "stdout"))
        return [int(m.group(1)) for m in found if m]

    def iter_log(self, key: str, stream: str) -> Iterator[LogLine]:
        raw_handle = _open_log(self.log_path(key, stream))
        if raw_handle is None:
            return
        # Lines end at "\n" only: a "\r" (a progress bar) is part of its line.
        with io.TextIOWrapper(
            raw_handle, encoding="utf-8", errors="replace", newline="\n"
        ) as handle:
            for raw in handle:
                ts, _, text = raw.rstrip("\n").partition(" ")
                yield LogLine(ts, text)

    def read_range(
        self, key: str, cursor: str = "0.0", limit: int = 5000, tail: int | None = None
    ) -> tuple[list[dict[str, str]], str]:
        """Up to `limit` lines of `key` after `cursor`, stdout and stderr merged by time, and
        the cursor of what follows. A cursor is "<stdout bytes>.<stderr bytes>" read so far:
        exact however the two files grow. With `tail`, the last `tail` lines instead."""
        paths = [self.log_path(key, stream) for stream in STREAMS]
        if tail is None:
            starts = _parse_cursor(cursor)
        else:
            starts, limit = [_tail_start(path, tail) for path in paths], tail
        per_stream = [
            _complete_lines(path, start, index, limit)
            for index, (path, start) in enumerate(zip(paths, starts, strict=True))
        ]
        merged = list(heapq.merge(*per_stream, key=lambda line: line[0]))
        # A tail reads both files to their end; a page ends after its last line.
        taken, consumed = (merged[-tail:], merged) if tail else (merged[:limit], merged[:limit])
        ends = list(starts)
        for _ts, index, _text, end in consumed:
            ends[index] = max(ends[index], end)
        out = [{"ts": ts, "stream": STREAMS[index], "text": text} for ts, index, text, _ in taken]
        return out, f"{ends[0]}.{ends[1]}"


def _lines_between_markers(
    lines: list[tuple[str, str, str, str]],
    marker: re.Pattern[str],
    number: int,
    streams: tuple[str, ...],
    first: int | None,
) -> list[tuple[str, str, str, str]]:
    """The lines (one key's, merged by time) after marker `number` and before the next;
    those before any marker count as `first`'s."""
    kept, current = [], first
    for line in lines:
        found = marker.fullmatch(line[3]) if line[2] == "stdout" else None
        if found:
            current = int(found.group(1))
        elif current == number and line[2] in streams:
            kept.append(line)
    return kept


def _parse_cursor(cursor: str) -> list[int]:
    words = (cursor or "0.0").split(".")
    # ASCII digits a file offset can be (int() takes "٣" and thousands of digits; seek() no)
    fits = all(w.isascii() and w.isdigit() and len(w) <= 18 for w in words)
    parts = [int(w) for w in words] if fits else []
    if len(parts) != 2:
        raise DistrunError(
            f"log cursor {cursor!r} is not valid; use 0.0 or the 'next' of the previous read"
        )
    return parts


def _complete_lines(path: Path, start: int, index: int, limit: int) -> list[tuple]:
    """(timestamp, stream index, text, end offset) of whole lines from `start`; a line still
    being written (no newline yet) waits for the next read."""
    lines: list[tuple] = []
    handle = _open_log(path)
    if handle is None:
        return lines
    with handle:
        position = start
        if start > 0:  # a cursor inside a line (not one of ours): from the next whole line
            handle.seek(start - 1)
            if handle.read(1) != b"\n":
                rest = handle.readline()
                if not rest.endswith(b"\n"):
                    return lines
                position += len(rest)
        handle.seek(position)
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            position += len(raw)
            ts, _, text = raw[:-1].decode("utf-8", errors="replace").partition(" ")
            lines.append((ts, index, text, position))
            if len(lines) >= limit:
                break
    return lines


def _open_log(path: Path) -> BinaryIO | None:
    """A log file opened to read, or None where there is none. Never blocks: a FIFO or a
    folder named like a log (a damaged job) is DamagedJob, not a reader stuck for ever."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        return None
    except NotAFile as exc:
        raise DamagedJob(str(exc)) from None


class NotAFile(OSError):
    """A file of the store that is not a regular file (a FIFO, a folder, a device)."""


def open_regular(path: Path | str) -> BinaryIO:
    """`path` opened to read, without ever blocking: every file of a job folder is read
    through this (or read_regular), since a FIFO put in a file's place would hold its
    reader, a listing and the REST API's handlers, for ever. FileNotFoundError where there
    is none; NotAFile, an OSError, where it is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(f"{Path(path).name} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: Path | str) -> bytes:
    """A regular file's bytes (open_regular's errors where it is none)."""
    with open_regular(path) as handle:
        return handle.read()


def _tail_start(path: Path, count: int, block: int = 1 << 16) -> int:
    """The offset where the last `count` lines of a file begin (read backwards by blocks)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if count <= 0:
        return size
    handle = _open_log(path)
    if handle is None:
        return 0
    with handle:
        handle.seek(max(0, size - 1))
        position = size - 1 if size and handle.read(1) == b"\n" else size  # the last line's own
        seen = 0
        while position > 0:
            step = min(block, position)
            position -= step
            handle.seek(position)
            data = handle.read(step)
            cut = len(data)
            while (newline := data.rfind(b"\n", 0, cut)) >= 0:
                seen += 1
                if seen == count:
                    return position + newline + 1
                cut = newline
    return 0


def natural_order(key: str) -> tuple:
    """A log key's place: "rank-2" before "rank-10"."""
    head, _, tail = key.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (key, -1)


class JobStore:
    """All jobs under one root folder: each a folder of its own (`JobRecord`), private
    (0700 folders, 0600 files), written by the job's owner and read by any view. Readers
    need no lock: every file is written whole (`write_atomic`) or appended line by line.

    Args:
        root: The folder (default: `default_root()`); made on the first job, not before.
    """

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root else default_root()

    @staticmethod
    def new_job_id() -> str:
        """`YYYYmmdd-HHMMSS-mmm-xxxxxx`: sorts by start time to the millisecond (jobs list
        newest first by name), and the random tail keeps ids of one millisecond apart."""
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        return f"{stamp}-{int(now % 1 * 1000):03d}-{secrets.token_hex(3)}"

    def create(self, job_id: str, spec_yaml: str, plan: dict[str, Any]) -> JobRecord:
        """A new job's folder, with its spec and plan.

        Args:
            job_id: From `new_job_id` (never reused).
            spec_yaml: The spec as it runs (JobSpec.to_yaml).
            plan: The plan (LaunchPlan.to_dict).

        Returns:
            Its record.

        Raises:
            DistrunError: The store's folder cannot be made (a file in its place, no room,
                no permission), naming another to choose.
            FileExistsError: A job of that id exists.
        """
        try:
            private_dir(self.root)
        except OSError as exc:  # a file there, or a folder that cannot be made
            why = (
                "is a file, not a folder"
                if isinstance(exc, FileExistsError)
                else f"cannot be made ({exc.strerror or exc})"
            )
            raise DistrunError(
                f"the job store {self.root} {why}; choose another with --store, or DISTRUN_HOME"
            ) from None
        path = self.root / job_id
        path.mkdir(mode=PRIVATE_DIR)  # a job id is never reused
        private_dir(path)
        private_dir(path / "logs")
        write_atomic(path / "spec.yml", spec_yaml)
        write_atomic(path / "plan.json", json.dumps(plan, indent=1))
        return JobRecord(path)

    def jobs(self) -> list[JobRecord]:
        """Every job, newest first (by id); [] where the store has none yet. A job whose
        files are damaged is listed too: its record says so when read."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if (p / "plan.json").is_file()]
        return [JobRecord(p) for p in sorted(found, key=lambda p: p.name, reverse=True)]

    def get(self, job_id: str) -> JobRecord:
        """A job by id, or by a unique prefix of one.

        Args:
            job_id: The id, or a prefix of it.

        Returns:
            Its record.

        Raises:
            UnknownJob: No job has it, several start with it (it names them), or it is
                not an id (letters, digits, '-' and '_').
        """
        if (
            len(job_id) > MAX_JOB_ID
            or job_id.startswith(".")
            or not _JOB_ID.fullmatch(job_id or "x")
        ):
            shown = job_id if len(job_id) <= 40 else job_id[:40] + "..."
            raise UnknownJob(f"no job {shown!r}: a job id is letters, digits, '-' and '_'")
        exact = self.root / job_id
        if job_id and (exact / "plan.json").is_file():
            return JobRecord(exact)
        matches = [r for r in self.jobs() if r.job_id.startswith(job_id)] if job_id else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UnknownJob(f"no job {job_id!r} in {self.root} (see: jupyter distrun jobs)")
        names = ", ".join(r.job_id for r in matches[:5])
        raise UnknownJob(f"job id {job_id!r} is ambiguous: it starts {names}")


_TAIL_CHUNK = 64 * 1024


def _tail_since(handle, since: float) -> bytes:
    """The end of a usage.jsonl from a line taken before `since` on (or the whole file):
    chunks read backwards until a whole line in them is older. Lines come in about time
    order (each process appends its own); the caller drops the older ones."""
    end = handle.seek(0, os.SEEK_END)
    start, data = end, b""
    while start > 0:
        start = max(0, start - _TAIL_CHUNK)
        handle.seek(start)
        data = handle.read(end - start)
        lines = data.split(b"\n")
        whole = lines[1:] if start > 0 else lines  # the first may be cut
        first = next((line for line in whole if line.strip()), None)
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            if first is not None and float(json.loads(first).get("t", 0)) < since:
                break
    cut = data.find(b"\n") if start > 0 else -1
    return data[cut + 1 :]  # without a first line cut in two
