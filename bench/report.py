"""The cost of `report()` on a rank (node_side/report.py), against the cheapest thing a
rank could do instead: appending the same values to a list.

    .venv/bin/python bench/report.py [--calls 200000]

Runs in a child with DISTRUN_JOB_ID set (inside a job, where report() is not a no-op), its
stdout (the batched metric lines) going to /dev/null as a launcher would read it. Prints
each one's time per call and the ratio. Goal: report() <= 5 µs a call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys, time
sys.path.insert(0, {folder!r})
from report import report, flush
calls = {calls}
held = []
start = time.perf_counter()
for i in range(calls):
    held.append((time.time(), i, {{"loss": 0.5, "lr": 0.1}}))
baseline = (time.perf_counter() - start) / calls
start = time.perf_counter()
for i in range(calls):
    report(step=i, loss=0.5, lr=0.1)
flush()
ours = (time.perf_counter() - start) / calls
print(baseline, ours, file=sys.stderr)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    folder = str(Path(__file__).resolve().parents[1] / "jupyter_dist" / "node_side")
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(folder=folder, calls=args.calls)],
        env={**os.environ, "DISTRUN_JOB_ID": "bench"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, check=True,
    )  # fmt: skip
    baseline, ours = (float(v) for v in done.stderr.split())
    print(
        f"report(): {ours * 1e6:.2f} µs a call, flushes included (goal <= 5 µs); a list "
        f"append of the same values {baseline * 1e6:.2f} µs; ratio {ours / baseline:.1f}"
    )


if __name__ == "__main__":
    main()
