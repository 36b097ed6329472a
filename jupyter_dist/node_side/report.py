"""`report(step=..., **values)`: a rank's training metrics, to the job's store and views.

Standard library only, Python 3.8+. Shipped into each job's folder beside the stack hook as
`$DISTRUN_JOB_DIR/pyhook/distrun.py` (first on every rank's PYTHONPATH), so that in every
rank, on any node, with or without jupyter-dist installed there:

    from distrun import report          # in a rank: always there
    from jupyter_dist import report     # the same function, where jupyter-dist is installed

    report(step=i, loss=loss.item(), lr=scheduler.get_last_lr()[0])

Outside a job (no DISTRUN_JOB_ID) it does nothing. A call only appends to a list (well under
5 µs); the values are written, as one line, at most every FLUSH_S seconds or every MAX_HELD
calls, and at exit, on the rank's stdout after a mark the launcher takes out of its output
(run/metrics.py): `MARK {"r": RANK, "d": [[time, step, {name: value}], ...]}`, as many
lines as keep each under MAX_LINE_BYTES (the launcher cuts longer lines). Values must be
numbers (a tensor's `.item()`, not the tensor; not a string, bytes or a bool), names at most
MAX_NAME characters; others are left out. A step is an int (a bool is none).
"""

import atexit
import json
import os
import threading
import time

MARK = "\x1edistrun-metrics "
FLUSH_S = 0.25
MAX_HELD = 512
MAX_LINE_BYTES = 256 * 1024  # well under the launcher's 1 MiB line (run/output.py)
MAX_NAME = 1000

_ON = "DISTRUN_JOB_ID" in os.environ
# The rank, as each launcher names it (torch's, MPI's, Slurm's); none for a TF task.
_RANK = next(
    (os.environ[n] for n in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") if n in os.environ), None
)
_held = []
_lock = threading.Lock()
_next_flush = [0.0]


def report(step=None, **values):
    """Record a rank's metrics: they reach the job's store and views within FLUSH_S.

    Args:
        step: The x-axis: an int (a bool is none), or None, for the time.
        **values: name=number: a float, an int, a numpy or torch scalar (`.item()` of a
            tensor); a string, bytes, a bool or an object is left out, as is a name over
            MAX_NAME characters.

    A call only appends to a list (well under 5 µs), never raises, and is thread-safe;
    outside a job (no DISTRUN_JOB_ID) it does nothing.
    """
    if not _ON:
        return
    now = time.time()
    _held.append((now, step, values))
    if len(_held) >= MAX_HELD or now >= _next_flush[0]:
        flush()


def flush():
    """Write what is held, as one line, or as many as keep each under MAX_LINE_BYTES (also
    at exit)."""
    global _held
    with _lock:
        batch, _held = _held, []
        _next_flush[0] = time.time() + FLUSH_S
    if not batch:
        return
    records = []
    for when, step, values in batch:
        numbers = _numbers(values)
        if numbers:
            step = step if isinstance(step, int) and not isinstance(step, bool) else None
            records.append([round(when, 3), step, numbers])
    if not records:
        return
    line = MARK + json.dumps({"r": _RANK, "d": records}, separators=(",", ":")) + "\n"
    if len(line) > MAX_LINE_BYTES:  # rare: many names, or a large batch of them
        line = _split(records)
    data = line.encode()
    try:
        while data:  # os.write, not print: a redirected sys.stdout must not swallow it
            data = data[os.write(1, data) :]
    except OSError:
        pass  # stdout is gone: so is whoever would read it


def _numbers(values):
    """A call's values that are numbers, as floats; names over MAX_NAME characters, and
    what is no number (a string, bytes, a bool, an object, an int too large), left out."""
    numbers = {}
    for name, value in values.items():
        if isinstance(value, (str, bytes, bytearray, bool)):
            continue
        name = str(name)
        if len(name) > MAX_NAME:
            continue
        try:
            numbers[name] = float(value)
        except Exception:
            continue
    return numbers


def _split(records):
    """The records as lines of at most MAX_LINE_BYTES each, a record of many names split
    into records of the same time and step."""
    head = MARK + '{"r":' + json.dumps(_RANK) + ',"d":['
    budget = MAX_LINE_BYTES - len(head) - 3
    lines, parts, size = [], [], len(head) + 3
    for when, step, numbers in records:
        for part in _records(when, step, numbers, budget):
            if parts and size + len(part) + 1 > MAX_LINE_BYTES:
                lines.append(head + ",".join(parts) + "]}\n")
                parts, size = [], len(head) + 3
            parts.append(part)
            size += len(part) + 1
    if parts:
        lines.append(head + ",".join(parts) + "]}\n")
    return "".join(lines)


def _records(when, step, numbers, budget):
    """One call's numbers as JSON records `[time, step, {name: value}]` of at most `budget`
    bytes each (a call of many names becomes several of the same time and step)."""
    found, part, size = [], {}, 0
    for name, number in numbers.items():
        cost = len(json.dumps(name)) + len(json.dumps(number)) + 2
        if part and size + cost > budget - 64:
            found.append(json.dumps([when, step, part], separators=(",", ":")))
            part, size = {}, 0
        part[name] = number
        size += cost
    if part:
        found.append(json.dumps([when, step, part], separators=(",", ":")))
    return found


atexit.register(flush)
