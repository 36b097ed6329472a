"""Output throughput: 8 ranks printing 200k lines each, through the runner with the
notebook's live view attached, vs the same processes writing straight to files.

    .venv/bin/python bench/output.py [--lines 200000] [--ranks 8]

Prints lines lost (must be 0: every line in the store and seen by the listener), the wall
time ratio against the baseline measured in the same run (goal <= 1.3), and how many
widget messages a second the view sent (at most about 10).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_dist.run.launch import prepare_job, start_and_wait
from jupyter_dist.spec import parse_spec
from jupyter_dist.store import JobStore
from jupyter_dist.widgets.live import LiveView

CHATTY = (
    "import os\nr = os.environ.get('RANK', '0')\nfor i in range({n}):\n"
    "    print(f'rank {{r}} line {{i}} some training output')\n"
)


class CountingView(LiveView):
    """The notebook's live view; outside a kernel its messages go to a dummy comm, so we
    count what it would have sent."""

    def send(self, content, buffers=None):
        self.payload_lines += len(content.get("lines", []))
        super().send(content, buffers)


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
    start = time.perf_counter()
    job = prepare_job(spec, store=store)
    view = CountingView(job)
    view.payload_lines = 0
    result = start_and_wait(job, on_tick=view.tick)
    view.tick(force=True)
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
    seen = view.lines_sent + view.lines_skipped
    print(
        f"lines lost: store {expected - stored}, view {expected - seen} (must be 0; "
        f"{view.lines_skipped} left to the store when a tick had more than the browser keeps)"
    )
    print(
        f"straight to files {base:.2f} s, through jupyter-dist {took:.2f} s, "
        f"ratio {took / base:.2f} (goal <= 1.3)"
    )
    print(
        f"widget messages: {view.messages_sent} in {took:.1f} s = "
        f"{view.messages_sent / took:.1f} per second (at most about 10)"
    )


if __name__ == "__main__":
    main()
