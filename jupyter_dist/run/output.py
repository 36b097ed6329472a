"""A process's output on its way to the user: bytes cut into lines, each line given to its
rank (torchrun and mpirun carry several), every batch stored on disk first, then handed to
the listeners; stderr lines also go to the root-cause evidence."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import IO

from jupyter_dist.backends.base import ProcessHandle
from jupyter_dist.diagnose.attribute import attributor
from jupyter_dist.diagnose.root_cause import StderrEvidence
from jupyter_dist.events import OutputLine
from jupyter_dist.node_side.report import MARK
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.run.metrics import MetricsSink
from jupyter_dist.store import JobRecord, timestamp

MAX_LINE = 1 << 20  # a "line" longer than this is cut into pieces
REPORT_MARK = MARK.encode()
# How every line of ours to the launcher begins (report(), the debugger, a session's worker):
# written with one write() from a thread of the rank, it can land inside a line another
# thread is printing piece by piece (unbuffered stdout). The text before it is then the
# start of a line that goes on after it.
OUR_LINE = b"\x1edistrun-"


class OutputPipeline:
    """One per job. `read` runs in one thread per stream of each process; `emit` (the
    listeners) gets each batch after it is on disk. Where the store cannot be written (a
    full disk, a log made read-only), `store_failed` is told once per stream and the lines
    still go to the listeners: a rank is never left blocked on a full pipe."""

    def __init__(
        self,
        record: JobRecord,
        evidence: StderrEvidence,
        emit: Callable[[list[OutputLine]], None],
        messages: Sequence[tuple[str, Callable[[ProcessPlan, str], None]]] = (),
        metrics: MetricsSink | None = None,
        store_failed: Callable[[OSError], None] = lambda _exc: None,
    ) -> None:
        self.record = record
        self.evidence = evidence
        self.emit = emit
        self.store_failed = store_failed
        # What the ranks report (report() lines, taken out of the output) and what trainers
        # print (kept as output too): run/metrics.py.
        self.metrics = metrics
        # (mark, handler) pairs: a line holding a `mark` is a message to the launcher (a
        # session's rank reporting a cell, a rank's debugger pausing), not output; the text
        # before it still is.
        self.messages = tuple(messages)
        # Each running process's stdout logs, open while its reader runs: a session's cell
        # marker (`note`) is written through them, not through a file opened a cell.
        self._stdout_logs: dict[str, _StreamLogs] = {}

    def read(self, proc: ProcessPlan, handle: ProcessHandle, stream: str) -> None:
        """Every line of `proc`'s `stream` until it ends (or breaks: the process watcher
        reports a dropped connection, not this)."""
        attribute = None if proc.line_tags == "plain" else attributor(proc)
        logs = _StreamLogs()
        if stream == "stdout":
            self._stdout_logs[proc.name] = logs
        partial = b""
        cut_report = False  # the rest of a report() line cut below, up to its newline
        try:
            for chunk in handle.chunks(stream):
                data = partial + chunk
                cut = data.rfind(b"\n")
                if cut_report and cut >= 0:  # its end: no fragment of it becomes output
                    data, cut_report = data[data.find(b"\n") + 1 :], False
                    cut = data.rfind(b"\n")
                if cut < 0:
                    partial = data
                    if len(partial) > MAX_LINE:  # no newline for a megabyte: cut it here
                        text = b""  # still inside a cut report() line: none of it
                        if not cut_report:  # a report() line this long is lost, not output
                            text, mark, _ = partial.partition(REPORT_MARK)
                            cut_report = bool(mark)
                        if text:
                            self._deliver(proc, stream, [_text(text)], attribute, logs)
                        partial = b""
                    elif self.metrics is not None and attribute is None and b"\r" in chunk:
                        # A progress bar redrawn with "\r" is one line until it ends: its
                        # progress is read as it is drawn.
                        self.metrics.drawn(proc.name, _text(partial[-512:]), time.time())
                    continue
                partial, whole = data[cut + 1 :], data[:cut]
                if attribute is None and OUR_LINE in whole:  # rare: cut and joined only then
                    lines, opened = _lines_around_ours(whole.split(b"\n"))
                    whole, partial = b"\n".join(lines), opened + partial
                # Whole lines only, so a character split across chunks is never cut.
                self._deliver(proc, stream, _text(whole).split("\n"), attribute, logs)
            if partial:
                self._deliver(proc, stream, [_text(partial)], attribute, logs)
        except OSError:
            pass  # the link broke: the process watcher says so
        finally:
            if self._stdout_logs.get(proc.name) is logs:
                del self._stdout_logs[proc.name]
            logs.close()

    def note(self, proc: ProcessPlan, text: str) -> None:
        """Store a line of ours in each of `proc`'s stdout logs, shown to no listener (a
        session's cell marker). Call only while `proc` prints nothing, so it lands between
        its lines, never inside one."""
        line = timestamp(time.time()) + " " + text + "\n"
        logs = self._stdout_logs.get(proc.name)
        for key in proc.log_keys:
            if logs is not None and not logs.failed:
                try:
                    log = logs.files.get(key)
                    if log is None:
                        log = logs.files[key] = self.record.open_log(key, "stdout")
                    log.write(line)
                    log.flush()
                    continue
                except ValueError:  # its reader closed it meanwhile: the process ended
                    pass
            with self.record.open_log(key, "stdout") as log:
                log.write(line)

    def _deliver(self, proc, stream, texts: list[str], attribute, logs) -> None:
        messages = []
        for mark, handler in self.messages:
            if any(mark in t for t in texts):
                kept = []
                for text in texts:
                    before, found, message = text.partition(mark)
                    if found:
                        messages.append((handler, mark + message))
                        if not before:
                            continue
                    kept.append(before)
                texts = kept
        if texts:
            self._store_and_emit(proc, stream, texts, attribute, logs)
        for handler, message in messages:  # after the lines before it are stored and shown
            handler(proc, message)

    def _store_and_emit(self, proc, stream, texts: list[str], attribute, logs) -> None:
        now = time.time()
        prefix = timestamp(now) + " "
        sink = self.metrics
        if attribute is None:  # every line is this process's own: the fast path
            key, label = proc.name, proc.label
            if sink is not None and any(map(sink.wants, texts)):
                texts = [
                    t for t in (sink.take(key, stream, t, now) for t in texts) if t is not None
                ]
            batch = [OutputLine(key, label, stream, text, now) for text in texts]
            by_key = {key: texts} if texts else {}
        else:
            batch = []
            by_key: dict[str, list[str]] = {}
            for raw in texts:
                for key, label, text in attribute(raw):
                    if sink is not None and sink.wants(text):
                        text = sink.take(key, stream, text, now)
                        if text is None:
                            continue
                    batch.append(OutputLine(key, label, stream, text, now))
                    by_key.setdefault(key, []).append(text)
        if not batch:
            return
        if stream == "stderr":
            for line in batch:
                self.evidence.note(proc, line.key, line.text, now)
        if not logs.failed:
            try:
                for key, lines in by_key.items():
                    log = logs.files.get(key)
                    if log is None:
                        log = logs.files[key] = self.record.open_log(key, stream)
                    log.write(prefix + ("\n" + prefix).join(lines) + "\n")
                    log.flush()  # on disk before anyone is shown it
            except OSError as exc:
                logs.failed = True  # this stream stores no more; its lines are still shown
                self.store_failed(exc)
        self.emit(batch)


class _StreamLogs:
    """The log files one stream of a process writes (by log key), open while it runs;
    `failed` once writing one failed."""

    def __init__(self) -> None:
        self.files: dict[str, IO[str]] = {}
        self.failed = False

    def close(self) -> None:
        for log in self.files.values():
            with contextlib.suppress(OSError):  # a failed write was said already
                log.close()


def _lines_around_ours(lines: list[bytes]) -> tuple[list[bytes], bytes]:
    """`lines` with each line of ours that landed inside an output line taken out of it: the
    output line's start joined to what follows the line of ours, as the rank printed it.
    Returns the lines and the start of an output line still open at the batch's end."""
    out: list[bytes] = []
    opened = b""
    for line in lines:
        line = opened + line
        at = line.find(OUR_LINE)
        if at > 0:
            out.append(line[at:])
            opened = line[:at]
        else:
            out.append(line)
            opened = b""
    return out, opened


def _text(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n") if "\r" in text else text
