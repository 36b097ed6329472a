"""A job's metrics, as its ranks give them: `report()` calls (node_side/report.py, whose
lines the output pipeline takes out), and, with no code changed, what trainers print:
Hugging Face Trainer's log dicts (`{'loss': 0.41, 'learning_rate': 5e-05, 'epoch': 0.5}`),
tqdm's progress bars (`34%|███▍ | 340/1000 [00:12<00:23, 28.1it/s]`) with the numbers of
their postfix (Lightning's `..., 47.2it/s, v_num=0, train_loss=0.532]`), Keras' progress
lines (`8/8 ━━━━━━━━━━ 0s 3ms/step - accuracy: 0.2500 - loss: 2.3100`, the epoch its
`Epoch 2/5` line said before), and the lines the job names itself (`metrics.pattern`: a
regular expression's named groups, `step` the x-axis).

They go to `metrics.jsonl` in the job's folder, one JSON object a line:

    {"t": 1764100000.123, "k": "rank-0", "s": 12, "m": {"loss": 0.41}}      a metric record
    {"t": ..., "k": "rank-0", "p": [340, 1000], "r": 28.1}                   progress
    {"note": "rank-0: over 20000 records: from here every 2nd is kept"}      downsampled

`k` is the rank's log key; `s` the step (None: the time is the x-axis). A value that is not
finite (a loss gone to NaN) is the string "NaN", "Infinity" or "-Infinity": JSON has no such
numbers (Python would write bare `NaN`, which browsers, jq and the REST API's clients refuse),
and JavaScript's Number() and Python's float() read these back. Each key's records
are bounded: past `cap`, only every 2nd is kept, past 2·cap every 4th, and so on, said by a
note. `summarize_metrics` gives each metric's first, last, min and max, and the progress reached.
"""

from __future__ import annotations

import ast
import json
import math
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from jupyter_dist.errors import DamagedJob
from jupyter_dist.node_side.report import MARK
from jupyter_dist.store import JobRecord, NotAFile, append_private, open_regular, read_regular
from jupyter_dist.terminal_text import last_state, plain

SERIES_CAP = 20_000  # records of one key kept at full rate
MAX_NAMES = 1_000  # metric names kept per job (later ones are left out, said once)
NOT_FINITE = ("NaN", "Infinity", "-Infinity")  # how a stored value that is not finite reads
PROGRESS_EVERY_S = 1.0  # a bar being drawn: its progress stored this often
METRICS_FILE = "metrics.jsonl"

MAX_COUNT = 10**18  # a step or a progress count past this is no count (a damaged line)
# tqdm's bar: "n/total [elapsed<left, rate unit/s]" (or "s/unit", the slow way round); a
# count of more digits than MAX_COUNT has is no bar's.
_TQDM = re.compile(
    r"(?<!\d)(\d{1,18})/(\d{1,18}) \[[^\]<]*<[^\],]*,"
    r"\s*(?:([\d.]+)(?:[a-zA-Z]*)/s|([\d.]+)s/[a-zA-Z]*)(?:,([^\]]*))?\]"
)
_NUMBER = r"-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
# A tqdm bar's postfix (`set_postfix`, Lightning's metrics): `name=number` pairs.
_POSTFIX_VALUE = re.compile(rf"([A-Za-z_][\w./]*)=({_NUMBER})(?:,|$)")
_NOT_METRICS = frozenset({"v_num"})  # Lightning's logger version in its bar
# Keras' progress line (model.fit, verbose 1 or 2): "n/total" and its time per step, then
# " - name: value" pairs; its "Epoch e/E" line comes before an epoch's.
_KERAS_BAR = re.compile(r"^\s*(\d{1,18})/(\d{1,18}) .*?\d(?:\.\d+)?(?:s|ms|us|µs)/step\b")
_KERAS_VALUE = re.compile(rf" - ([A-Za-z_][\w./]*): ({_NUMBER})(?= - |\s*$)")
_KERAS_EPOCH = re.compile(r"^Epoch (\d{1,9})/(\d{1,9})\s*$")
# A Hugging Face Trainer's log line: a dict of names to numbers, with one of its keys.
_HF_KEYS = ("'loss'", "'eval_loss'", "'learning_rate'", "'train_loss'")


def may_be_metrics(text: str) -> bool:
    """Whether a line is worth a look for what is read with no help (cheap: most output is
    not); a job with patterns of its own has every line looked at (`MetricsSink.wants`)."""
    return (
        "\x1e" in text
        or "|" in text
        or text[:2] == "{'"
        or "/step" in text
        or (text[:6] == "Epoch ")
    )


class MetricsSink:
    """One per job: `take` handles a line of output (after the launcher's tags are taken
    off), returning what of it is output; what it recognises is appended to the store and
    kept as each key's latest values (`latest`, `progress`) for the views."""

    def __init__(
        self,
        record: JobRecord,
        cap: int = SERIES_CAP,
        store_failed: Callable[[OSError], None] = lambda _exc: None,
        patterns: Iterable[str] = (),
    ) -> None:
        self.record, self.cap = record, cap
        # The job's own (spec.metrics.pattern, compiled there once already: valid here).
        self.patterns = [re.compile(pattern) for pattern in patterns]
        self._epochs: dict[str, int] = {}  # key -> the epoch Keras said last
        self.store_failed = store_failed  # told when metrics.jsonl cannot be written
        self.latest: dict[str, dict[str, float]] = {}  # key -> name -> last value
        self.progress: dict[str, tuple[int, int, float | None]] = {}  # key -> n, total, rate
        self._counts: dict[str, int] = {}
        self._names: set[str] = set()  # the metric names kept, at most MAX_NAMES
        self._names_noted = False
        self._progress_written: dict[str, float] = {}  # key -> when its progress was stored
        self._lock = threading.Lock()

    def wants(self, text: str) -> bool:
        """Whether `take` should see the line (every line, where the job has patterns)."""
        return bool(self.patterns) or may_be_metrics(text)

    def take(self, key: str, stream: str, text: str, now: float) -> str | None:
        """The line's text as output (None when it was a report() line, all of it ours).
        Never raises: what cannot be read as metrics is output, or dropped if it was ours."""
        if MARK in text:
            before, _, payload = text.partition(MARK)
            with _skipped():
                self._reported(key, payload)
            return before or None
        with _skipped():
            if stream == "stdout" and text.startswith("{'") and text.endswith("}"):
                self._trainer_dict(key, text, now)
            elif "|" in text and ("/s" in text or "s/" in text):
                self._progress_bar(key, text, now, whole=True)
            elif "/step" in text or text[:6] == "Epoch ":
                self._keras(key, text, now)
        for pattern in self.patterns:
            with _skipped():
                self._named_line(key, pattern, text, now)
        return text

    def drawn(self, key: str, text: str, now: float) -> None:
        """A line still being drawn (a progress bar's `\r` updates): its progress, kept at
        most every PROGRESS_EVERY_S seconds per key. Never raises."""
        if now - self._progress_written.get(key, 0.0) >= PROGRESS_EVERY_S:
            with _skipped():
                if "/step" in text[-512:]:
                    self._keras(key, text, now, whole=False)
                else:
                    self._progress_bar(key, text, now)

    def _named_line(self, key: str, pattern: re.Pattern, text: str, now: float) -> None:
        found = pattern.search(text)
        if found is None:
            return
        groups = found.groupdict()
        numbers = {
            name: json_number(number)
            for name, value in groups.items()
            if name != "step" and (number := _number(value)) is not None
        }
        if numbers:
            self._store(
                key, [{"t": now, "k": key, "s": _step_text(groups.get("step")), "m": numbers}]
            )

    def _keras(self, key: str, text: str, now: float, whole: bool = True) -> None:
        """Keras' lines: an epoch's number (kept for its end's record), and a progress line:
        its progress, and where it is the epoch's last (n == total, whole) its values."""
        text = plain(last_state(text))  # bold, redrawn with "\r" and "\b"
        epoch = _KERAS_EPOCH.match(text)
        if epoch:
            self._epochs[key] = int(epoch.group(1))
            return
        bar = _KERAS_BAR.match(text)
        if bar is None:
            return
        n, total = int(bar.group(1)), int(bar.group(2))
        with self._lock:
            self.progress[key] = (n, total, None)
            self._progress_written[key] = now
        self._write([{"t": now, "k": key, "p": [n, total], "r": None}])
        if not whole or n != total:
            return
        numbers = {
            name: json_number(number)
            for name, value in _KERAS_VALUE.findall(text)
            if (number := _number(value)) is not None
        }
        if numbers:
            self._store(key, [{"t": now, "k": key, "s": self._epochs.get(key), "m": numbers}])

    def _reported(self, key: str, payload: str) -> None:
        try:
            message = json.loads(payload)
            rank, records = message.get("r"), message["d"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # a cut line: its records are lost, the output is not
        key = f"rank-{rank}" if isinstance(rank, str) and rank.isdigit() else key
        found = []
        for entry in records if isinstance(records, list) else []:
            with _skipped():
                when, step, values = entry
                numbers = {
                    str(n): json_number(number)
                    for n, v in values.items()
                    if (number := _stored_number(v)) is not None
                }
                if numbers:
                    found.append({"t": float(when), "k": key, "s": _step(step), "m": numbers})
        self._store(key, found)

    def _trainer_dict(self, key: str, text: str, now: float) -> None:
        if not any(name in text for name in _HF_KEYS):
            return
        with _skipped():
            values = ast.literal_eval(text)
            numbers = {
                str(name): json_number(number)
                for name, value in values.items()
                if (number := _number(value)) is not None
            }
            if numbers:
                self._store(
                    key, [{"t": now, "k": key, "s": _step(values.get("step")), "m": numbers}]
                )

    def _progress_bar(self, key: str, text: str, now: float, whole: bool = False) -> None:
        """A tqdm bar's progress, and the numbers of its postfix (as drawn: at most every
        PROGRESS_EVERY_S; `whole`, its last state: always)."""
        found = _TQDM.findall(text.rsplit("\r", 1)[-1] or text)  # a bar's last state
        if not found:
            return
        done, total, per_second, seconds_each, postfix = found[-1]
        numbers = {
            name: json_number(number)
            for name, value in _POSTFIX_VALUE.findall(postfix.strip())
            if name not in _NOT_METRICS and (number := _number(value)) is not None
        }
        if numbers:
            self._store(key, [{"t": now, "k": key, "s": None, "m": numbers}])
        each = float(seconds_each or 0)
        rate = float(per_second) if per_second else (1 / each if each > 0 else 0.0)
        n, total_n = int(done), int(total)
        with self._lock:
            self.progress[key] = (n, total_n, rate)
            self._progress_written[key] = now
        self._write([{"t": now, "k": key, "p": [n, total_n], "r": rate}])

    def _store(self, key: str, records: list[dict[str, Any]]) -> None:
        """Keep the latest values; append the records this key's rate lets through."""
        kept, notes = [], []
        with self._lock:
            for record in records:
                record = self._named(record, notes)
                if record is None:
                    continue
                self.latest.setdefault(key, {}).update(record["m"])
                count = self._counts[key] = self._counts.get(key, 0) + 1
                stride = _stride(count, self.cap)
                if stride != _stride(count - 1, self.cap):
                    notes.append(
                        {
                            "note": f"{key}: over {count - 1} records: from here "
                            f"every {_ordinal(stride)} is kept"
                        }
                    )
                if (count - 1) % stride == 0:
                    kept.append(record)
        self._write(notes + kept)

    def _named(self, record: dict[str, Any], notes: list[dict]) -> dict[str, Any] | None:
        """The record with the values of names past the job's first MAX_NAMES left out
        (None: none left), said once by a note (under the lock). A metric per sample or
        per parameter would otherwise make every reader list hundreds of thousands."""
        values = record["m"]
        if self._names.issuperset(values):  # the common case, at C speed
            return record
        for name in values:
            if name not in self._names and len(self._names) < MAX_NAMES:
                self._names.add(name)
        kept = {name: value for name, value in values.items() if name in self._names}
        if len(kept) < len(values) and not self._names_noted:
            self._names_noted = True
            left_out = next(name for name in values if name not in self._names)
            notes.append(
                {
                    "note": f"over {MAX_NAMES} metric names: later ones are left out "
                    f"(the first: {left_out[:80]!r})"
                }
            )
        return {**record, "m": kept} if kept else None

    def _write(self, lines: list[dict[str, Any]]) -> None:
        if lines:
            text = "".join(
                json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n" for line in lines
            )
            try:
                with self._lock:
                    append_private(self.record.path / METRICS_FILE, text)
            except OSError as exc:  # said to the job, not skipped as a bad record is
                self.store_failed(exc)


def json_number(value: float) -> float | str:
    """`value` as JSON can hold it: itself if finite, else its name in NOT_FINITE."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _stored_number(value: Any) -> float | None:
    """A stored value as a float (NaN and the infinities included); None if it is none
    (an int too large for a float is none)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) or value in NOT_FINITE:
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _count(value: Any) -> int | None:
    """A progress count: an int from 0 to MAX_COUNT, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _step(value: Any) -> int | None:
    """A step: an int within MAX_COUNT either way (a bool is none), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_COUNT:
        return value
    return None


def _record(entry: Any) -> dict[str, Any] | None:
    """A stored line as every reader takes it, or None where it is not one: a note
    ({"note"}), progress ({"t", "k", "p": [n, total], "r"}) or a metric record ({"t", "k",
    "s", "m"}) whose values are numbers or NOT_FINITE names (others are left out). Lines
    written by hand or damaged on disk (a value of 400 digits, 1e400, `"m": [1, 2]`, no
    "k") are never more than one lost line to a reader, whatever it does with the rest."""
    if not isinstance(entry, dict):
        return None
    values, when, step = entry.get("m"), entry.get("t"), entry.get("s")
    if (  # as this module writes a record: taken as it is (most lines, read fast)
        type(values) is dict
        and type(entry.get("k")) is str
        and type(when) is float
        and (step is None or (type(step) is int and abs(step) <= MAX_COUNT))
        and len(entry) == 4
        and values
        and all(type(v) is float and v - v == 0 for v in values.values())  # finite
        and all(type(n) is str for n in values)
    ):
        return entry
    if isinstance(entry.get("note"), str) and "k" not in entry:
        return {"note": entry["note"]}
    key, when = entry.get("k"), _stored_number(entry.get("t"))
    if not isinstance(key, str):
        return None
    when = when if when is not None and math.isfinite(when) else None
    if "p" in entry:
        progress = entry["p"]
        if not isinstance(progress, list) or len(progress) != 2:
            return None
        n, total = _count(progress[0]), _count(progress[1])
        rate = _stored_number(entry.get("r"))
        if n is None or total is None:
            return None
        return {
            "t": when,
            "k": key,
            "p": [n, total],
            "r": rate if rate is not None and math.isfinite(rate) else None,
        }
    values = entry.get("m")
    if not isinstance(values, dict):
        return None
    numbers = {
        name: json_number(number)
        for name, value in values.items()
        if (number := _stored_number(value)) is not None
    }
    if not numbers:
        return None
    return {"t": when, "k": key, "s": _step(entry.get("s")), "m": numbers}


def _records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The stored lines that are records (or notes), each as `_record` reads it."""
    found = []
    for line in lines:
        try:
            entry = _record(_loads(line))
        except Exception:  # not JSON, too deep: that line only
            continue
        if entry is not None:
            found.append(entry)
    return found


def _share(progress: tuple[int, int]) -> float:
    """How far a progress is, 0 to 1 (past its total counts as done)."""
    n, total = progress
    return 1.0 if n >= total else n / total


def _loads(line: str) -> Any:
    """A stored line; a bare NaN or Infinity (written before they were strings) is read as
    its string, so that nothing read is sent on as JSON no one else can read."""
    return json.loads(line, parse_constant=str)


def _number(value: Any) -> float | None:
    """A logged value as a number: an int or float, or a string holding one (Trainer has
    prints them formatted, `'loss': '5.378'`, in its progress bar's log lines)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and len(value) < 40:
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _step_text(text: str | None) -> int | None:
    """A step as a line writes it ("10"), or None."""
    return _step(int(text)) if text and text.isdigit() else None


def _stride(count: int, cap: int) -> int:
    """Every how many of a key's records is kept once it has `count`: 1 up to cap, then
    2 up to 2·cap, 4 up to 4·cap..."""
    stride = 1
    while count > cap * stride:
        stride *= 2
    return stride


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 32nd, 1024th."""
    if n % 100 in (11, 12, 13):
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


class _skipped:
    """A record that is not one (a user's odd dict, a cut line, a number too large for a
    float) is skipped: reading metrics never costs a line of output."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, traceback) -> bool:
        return kind is not None and issubclass(kind, Exception)


# -- reading them back ------------------------------------------------------------------------


class MetricsReader:
    """A job's records as they are appended (a live view's feed): each `new()` reads what
    was written since the last, whole lines only."""

    def __init__(self, record: JobRecord) -> None:
        self.path = record.path / METRICS_FILE
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with open_regular(self.path) as handle:
                handle.seek(self.offset)
                data = handle.read()
        except (FileNotFoundError, NotAFile):  # none yet; damaged: nothing to draw
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        lines = whole.decode("utf-8", errors="replace").splitlines()
        return [entry for entry in _records(lines) if "k" in entry]


def latest(record: JobRecord, tail_bytes: int = 1 << 16) -> dict[str, Any]:
    """What a job list shows of a running job's metrics, from the end of its file only:
    {"metrics": {name: the mean of each rank's latest value}, "progress": "340/1000"
    (the slowest rank's)}; {} when it reported none."""
    path = record.path / METRICS_FILE
    try:
        with open_regular(path) as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - tail_bytes))
            data = handle.read()
    except (FileNotFoundError, NotAFile):  # none; damaged: the job lists without them
        return {}
    if size > tail_bytes:
        data = data[data.find(b"\n") + 1 :]  # the first line may be cut
    values: dict[str, dict[str, float]] = {}  # name -> key -> latest
    progress: dict[str, tuple[int, int]] = {}
    for entry in _records(data.decode("utf-8", errors="replace").splitlines()):
        if "p" in entry:
            progress[entry["k"]] = (entry["p"][0], entry["p"][1])
        for name, value in (entry.get("m") or {}).items():
            values.setdefault(name, {})[entry["k"]] = float(value)
    found: dict[str, Any] = {}
    if values:
        found["metrics"] = {n: json_number(_mean(v.values())) for n, v in values.items()}
    if progress:
        n, total = min(progress.values(), key=_share)
        found["progress"] = f"{n}/{total}"
    return found


def _mean(values: Iterable[float]) -> float:
    """Their mean, rounded to 6 places (NaN where one is NaN, infinite where it is)."""
    values = list(values)
    total = math.fsum(values) if all(math.isfinite(v) for v in values) else sum(values)
    return round(total / len(values), 6) if math.isfinite(total) else total


def thinned(records: list[dict[str, Any]], most: int) -> list[dict[str, Any]]:
    """At most about `most` metric records per key (evenly spaced, the last kept), and
    every key's last progress: what a page that lost its charts is sent again."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    progress: dict[str, dict[str, Any]] = {}
    for record in records:
        if "p" in record:
            progress[record["k"]] = record
        else:
            by_key.setdefault(record["k"], []).append(record)
    kept = []
    for series in by_key.values():
        stride = max(1, -(-len(series) // most))
        kept += series[::stride] + ([series[-1]] if (len(series) - 1) % stride else [])
    return kept + list(progress.values())


def read_metrics(record: JobRecord) -> tuple[list[dict[str, Any]], list[str]]:
    """A job's metric and progress records, oldest first, and its notes (downsampling)."""
    try:
        text = read_regular(record.path / METRICS_FILE).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    except NotAFile as exc:
        raise DamagedJob(f"job {record.job_id}: its {exc}") from None
    entries = _records(text.splitlines())
    notes = [entry["note"] for entry in entries if "note" in entry]
    return [entry for entry in entries if "k" in entry], notes


def readable(record: dict[str, Any]) -> dict[str, Any]:
    """A record as `metrics --json` prints it, in words: {"time", "rank" (or "process", for
    a key that is no rank's: a TensorFlow task), "step", "values": {name: value}}, or for
    progress {"time", "rank", "progress", "total", "rate"}."""
    key = record["k"]
    number = key.removeprefix("rank-")
    who = (
        {"rank": int(number)} if key.startswith("rank-") and number.isdigit() else {"process": key}
    )
    if "p" in record:
        n, total = record["p"]
        return {"time": record["t"], **who, "progress": n, "total": total, "rate": record.get("r")}
    return {"time": record["t"], **who, "step": record.get("s"), "values": record["m"]}


def summarize_metrics(records: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Each metric's first, last, min and max (over every rank, in time order), and the
    progress reached ("100/100", the slowest rank's; "" when none was reported)."""
    series: dict[str, list[float]] = {}
    ranks: dict[str, set[str]] = {}
    progress: dict[str, tuple[int, int]] = {}
    for record in records:
        if "p" in record:
            progress[record["k"]] = (record["p"][0], record["p"][1])
            continue
        for name, value in (record.get("m") or {}).items():
            series.setdefault(name, []).append(float(value))
            ranks.setdefault(name, set()).add(record["k"])
    rows = []
    for name, values in series.items():
        numbers = [v for v in values if not math.isnan(v)] or [math.nan]  # a NaN is no bound
        rows.append(
            {
                "metric": name,
                "ranks": len(ranks[name]),
                "first": _short(values[0]),
                "last": _short(values[-1]),
                "min": _short(min(numbers)),
                "max": _short(max(numbers)),
                "points": len(values),
            }
        )
    reached = ""
    if progress:
        n, total = min(progress.values(), key=_share)
        reached = f"{n}/{total}"
    return rows, reached


def _short(value: float) -> str:
    return f"{value:.4g}"
