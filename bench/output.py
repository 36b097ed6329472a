"""Output throughput: 8 ranks printing 200k lines each, through the runner with the
notebook view's listener attached, vs the same processes writing straight to files.

    .venv/bin/python bench/output.py [--lines 200000] [--ranks 8]

Prints lines lost (must be 0: every line in the store and seen by the listener), the wall
time ratio against the baseline measured in the same run (goal <= 1.3), and how many
batches per second the view drew (the cell prints at most about 10 a second).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_dist.magics import QueuedPrinter
from jupyter_dist.run.launch import prepare_job, start_and_wait
from jupyter_dist.spec import parse_spec
from jupyter_dist.store import JobStore

CHATTY = (
    "import os\nr = os.environ.get('RANK', '0')\nfor i in range({n}):\n"
    "    print(f'rank {{r}} line {{i}} some training output')\n"
)


class CountingView(QueuedPrinter):
    """The notebook printer, drawing into nothing, counting what it drew."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn = 0
        self.draws = 0

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
        if lines:
            self.draws += 1
            self.drawn += len(lines)
            "".join(f"[{line.label}] {line.text}\n" for line in lines)  # the work of drawing


def baseline(script: Path, ranks: int, out: Path) -> float:
    start = time.perf_counter()
    procs = []
    for rank in range(ranks):
        with open(out / f"{rank}.out", "w") as handle:
            env = {**os.environ, "RANK": str(rank), "PYTHONUNBUFFERED": "1"}
            procs.append(subprocess.Popen([sys.executable, str(script)], stdout=handle, env=env))
    for proc in procs:
        proc.wait()
    return time.perf_counter() - start


def ours(script: Path, ranks: int, root: Path) -> tuple[float, CountingView, JobStore, str]:
    spec = parse_spec(
        f"command: python {script}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: {ranks}}}"
    )
    store = JobStore(root)
    view = CountingView()
    start = time.perf_counter()
    job = prepare_job(spec, listeners=[view], store=store)
    result = start_and_wait(job, on_tick=view.flush)
    view.flush()
    took = time.perf_counter() - start
    assert result.ok, result.describe()
    return took, view, store, job.job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    expected = args.lines * args.ranks
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        script = tmp / "chatty.py"
        script.write_text(CHATTY.format(n=args.lines))
        (tmp / "base").mkdir()
        base = baseline(script, args.ranks, tmp / "base")
        took, view, store, job_id = ours(script, args.ranks, tmp / "jobs")
        record = store.get(job_id)
        stored = sum(sum(1 for _ in record.iter_log(k, "stdout")) for k in record.log_keys())
    print(f"{args.ranks} ranks x {args.lines} lines = {expected} lines")
    print(f"lines lost: store {expected - stored}, view {expected - view.drawn} (must be 0)")
    print(
        f"straight to files {base:.2f} s, through jupyter-dist {took:.2f} s, "
        f"ratio {took / base:.2f} (goal <= 1.3)"
    )
    print(f"view draws: {view.draws} in {took:.1f} s = {view.draws / took:.1f} per second")


if __name__ == "__main__":
    main()
