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
(run/metrics.py): `MARK {"r": RANK, "d": [[time, step, {name: value}], ...]}`. Values must
be numbers (a tensor's `.item()`, not the tensor); others are left out.
"""

import atexit
import json
import os
import threading
import time

MARK = "\x1edistrun-metrics "
FLUSH_S = 0.25
MAX_HELD = 512

_ON = "DISTRUN_JOB_ID" in os.environ
# The rank, as each launcher names it (torch's, MPI's, Slurm's); none for a TF task.
_RANK = next(
    (os.environ[n] for n in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") if n in os.environ),
    None,
)
_held = []
_lock = threading.Lock()
_next_flush = [0.0]


def report(step=None, **values):
    """Record `values` (name=number) at `step` (an int, or None: the time is the x-axis)."""
    if not _ON:
        return
    now = time.time()
    _held.append((now, step, values))
    if len(_held) >= MAX_HELD or now >= _next_flush[0]:
        flush()


def flush():
    """Write what is held, as one line (also at exit)."""
    global _held
    with _lock:
        batch, _held = _held, []
        _next_flush[0] = time.time() + FLUSH_S
    if not batch:
        return
    records = []
    for when, step, values in batch:
        numbers = {}
        for name, value in values.items():
            try:
                numbers[str(name)] = float(value)
            except Exception:  # not a number (a string, an int too large): left out
                continue
        if numbers:
            records.append([round(when, 3), step if isinstance(step, int) else None, numbers])
    if not records:
        return
    line = MARK + json.dumps({"r": _RANK, "d": records}, separators=(",", ":")) + "\n"
    data = line.encode()
    try:
        while data:  # os.write, not print: a redirected sys.stdout must not swallow it
            data = data[os.write(1, data) :]
    except OSError:
        pass  # stdout is gone: so is whoever would read it


atexit.register(flush)
