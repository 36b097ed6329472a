"""Live resource meters (issue 15, part 4): each node agent samples its ranks' CPU time and
memory once a second; the live view gets each rank's share and memory, the store keeps a
sample every few seconds, and `inspect` prints averages and peaks. Real jobs: rank 0 busy,
rank 1 idle with 500 MiB held.

GPUs: no GPU machine runs these tests, so the agents read a stand-in `nvidia-smi` (first on
PATH) that answers the two queries the agent asks, in nvidia-smi's CSV, for the ranks that
registered their PID as holding GPU memory (rank 0 on GPU-0 at 90%, rank 1 on GPU-1 whose
utilisation reads "[N/A]"). The real nvidia-smi's side is in tests/test_gpu.py, on a GPU."""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers import execute_notebook, run_cli

from jupyter_dist.diagnose.meters import node_series
from jupyter_dist.node_side.agent import GpuUsage
from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec

FAKE_NVIDIA_SMI = """#!{python}
import os, sys
folder = os.environ["FAKE_GPU_DIR"]
with open(os.path.join(folder, "calls"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if os.path.exists(os.path.join(folder, "broken")):
    sys.exit("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
query = sys.argv[1] if len(sys.argv) > 1 else ""
if query == "--query-compute-apps=pid,gpu_uuid,used_memory":
    for name in sorted(os.listdir(folder)):
        if name.isdigit():
            uuid, mib = open(os.path.join(folder, name)).read().split()
            print(f"{{name}}, {{uuid}}, {{mib}}")
elif query == "--query-gpu=uuid,utilization.gpu":
    print("GPU-0, 90")
    print("GPU-1, [N/A]")
else:
    sys.exit(f"unexpected query {{sys.argv[1:]}}")
"""


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """A stand-in nvidia-smi first on PATH; the folder where ranks register their PIDs."""
    folder, programs = tmp_path / "gpus", tmp_path / "bin"
    folder.mkdir()
    programs.mkdir()
    smi = programs / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{programs}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GPU_DIR", str(folder))
    return folder


WORK = (
    "import os, time\n"
    "rank = int(os.environ['RANK'])\n"
    "if 'FAKE_GPU_DIR' in os.environ:  # this process holds 1000 MiB (rank 1: 2000) on a GPU\n"
    "    with open(os.path.join(os.environ['FAKE_GPU_DIR'], str(os.getpid())), 'w') as f:\n"
    "        f.write(f'GPU-{rank} {1000 * (rank + 1)}')\n"
    "held = bytearray(500 * 2**20) if os.environ['RANK'] == '1' else b''\n"
    "end = time.time() + 12\n"
    "while time.time() < end:\n"
    "    if os.environ['RANK'] == '0':\n"
    "        sum(range(10000))\n"
    "    else:\n"
    "        time.sleep(0.5)\n"
)


@pytest.mark.slow
def test_inspect_prints_what_each_rank_used(store, tmp_path, fake_gpus):
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
    gpu_table = shown.index("What each rank used on GPUs")
    table = shown[shown.index("What each rank used (") : gpu_table].splitlines()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table if "│ rank " in line]
    rows = {row[0]: row for row in cells}  # rank, cpu avg, cpu peak, memory avg, memory peak
    busy, idle = rows["rank 0"], rows["rank 1"]
    percent = lambda text: int(text.rstrip("%"))  # noqa: E731
    mib = lambda text: int(text.removesuffix(" MiB").replace(",", ""))  # noqa: E731
    assert percent(busy[2]) >= 40 and percent(idle[1]) <= 15, table  # ~100% and ~0% alone
    assert mib(idle[4]) >= 500 > mib(busy[4]), table
    on_gpus = shown[gpu_table:].splitlines()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in on_gpus if "│ rank " in line]
    # rank, gpu avg, gpu peak, gpu memory peak; rank 1's utilisation read "[N/A]"
    assert cells == [["rank 0", "90%", "90%", "1000 MiB"], ["rank 1", "", "", "2000 MiB"]], shown
    # the sidebar's node line sums the GPU memory held on the node
    plan = store.get(result.job_id).plan()
    node_of = {proc["name"]: proc["node"] for proc in plan["processes"]}
    nodes = node_series([(samples, node_of)], now=max(s["t"] for s in samples))
    assert max(v for v in nodes["local0"]["gpu"] if v is not None) == 3000 * 2**20, nodes
    calls = (fake_gpus / "calls").read_text().splitlines()
    apps = [c for c in calls if c.startswith("--query-compute-apps")]
    # read every 5 s, not with every report: a 12 s job's agents ask a few times each
    assert 2 <= len(apps) <= 16 and len(calls) - len(apps) <= len(apps), calls


def test_a_failing_nvidia_smi_is_asked_once_and_reports_nothing(fake_gpus):
    (fake_gpus / "broken").touch()
    (fake_gpus / str(os.getpid())).write_text("GPU-0 1000")
    gpus = GpuUsage()
    assert gpus.program is not None
    for _ in range(3):
        gpus.next_read = 0.0  # due again
        assert gpus.sample([os.getpid()]) == {}
    assert len((fake_gpus / "calls").read_text().splitlines()) == 1
    assert gpus.program is None  # given up for this agent


@pytest.mark.slow
def test_the_live_view_sends_each_ranks_cpu_and_memory(kernel_env, fake_gpus):
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
        # rank 0 spins, with the share of a core the scheduler gives it (tests run beside
        # other workers' jobs), rank 1 sleeps
        r["rank-0"][0] >= 25 and r["rank-1"][0] <= 15 and r["rank-1"][1] >= 500 * 2**20
        for r in both
    ), both
    with_gpu = [r for r in both if len(r["rank-0"]) == 4 and len(r["rank-1"]) == 4]
    assert with_gpu and with_gpu[-1]["rank-0"][2:] == [90.0, 1000 * 2**20], both
    assert with_gpu[-1]["rank-1"][2:] == [None, 2000 * 2**20], both


def test_a_process_counts_once_in_a_bucket_however_its_samples_fall():
    """Stored samples are 5 s apart, rounded to 10 ms: two of one process 5.00 s apart can
    fall in one bucket (the last one holds everything up to `now`), and its memory was
    counted twice (CI: 6000 MiB of GPU memory for 3000). Two processes still add up."""
    gib = 1 << 30
    samples = [
        {"t": t, "p": p, "cpu": t / 5, "rss": gib, "gpu": [None, 2 * gib]}
        for t in (100.0, 105.0, 110.0)
        for p in ("rank-0", "rank-1")
    ]
    nodes = node_series([(samples, {"rank-0": "n0", "rank-1": "n0"})], now=110.0)
    line = nodes["n0"]
    shown = [i for i, value in enumerate(line["rss"]) if value is not None]
    assert shown and all(line["rss"][i] == 2 * gib for i in shown), line["rss"]
    assert all(line["gpu"][i] == 4 * gib for i in shown), line["gpu"]
    assert all(line["cpu"][i] == 40.0 for i in shown), line["cpu"]  # 20% each: 1 s per 5 s
