"""Live resource meters (issue 15, part 4): each node agent samples its ranks' CPU time and
memory once a second; the live view gets each rank's share and memory, the store keeps a
sample every few seconds, and `inspect` prints averages and peaks. Real jobs: rank 0 busy,
rank 1 idle with 500 MiB held."""

from __future__ import annotations

import json

from helpers import execute_notebook, run_cli

from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec

WORK = (
    "import os, time\n"
    "held = bytearray(500 * 2**20) if os.environ['RANK'] == '1' else b''\n"
    "end = time.time() + 12\n"
    "while time.time() < end:\n"
    "    if os.environ['RANK'] == '0':\n"
    "        sum(range(10000))\n"
    "    else:\n"
    "        time.sleep(0.5)\n"
)


def test_inspect_prints_what_each_rank_used(store, tmp_path):
    (tmp_path / "work.py").write_text(WORK)
    spec = parse_spec(
        f"code: {tmp_path}\ncommand: python work.py\nresources: {{instance_count: 1}}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    result = run(spec, store=store)
    assert result.ok, result.describe()
    samples = store.get(result.job_id).usage()
    assert len(samples) >= 4  # a sample every 5 s per process, for 12 s
    shown = run_cli("inspect", result.job_id, store=store).stdout
    table = shown[shown.index("What each rank used") :].splitlines()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table if "│ rank " in line]
    rows = {row[0]: row for row in cells}  # rank, cpu avg, cpu peak, memory avg, memory peak
    busy, idle = rows["rank 0"], rows["rank 1"]
    percent = lambda text: int(text.rstrip("%"))  # noqa: E731
    mib = lambda text: int(text.removesuffix(" MiB").replace(",", ""))  # noqa: E731
    assert percent(busy[2]) >= 40 and percent(idle[1]) <= 15, table  # ~100% and ~0% alone
    assert mib(idle[4]) >= 500 > mib(busy[4]), table


def test_the_live_view_sends_each_ranks_cpu_and_memory(kernel_env):
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --nodes 1 --procs-per-node 2\n" + WORK,
        "import json\nfrom jupyter_dist.widgets.live import LiveView\n"
        "print(json.dumps(list(LiveView.last.meters_sent)))",
    )
    sent = json.loads(nb.cells[3].outputs[0].text)
    assert len(sent) >= 5  # about one a second
    both = [r for r in sent if "rank-0" in r and "rank-1" in r]
    assert any(
        r["rank-0"][0] >= 40 and r["rank-1"][0] <= 15 and r["rank-1"][1] >= 500 * 2**20
        for r in both
    ), both
