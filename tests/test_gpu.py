"""The GPU paths on a real GPU: DDP over NCCL, the agents' meters read from the real
nvidia-smi, a warm session's GPU memory, stacks of a rank inside CUDA work, and the hints for
what CUDA and NCCL really print when ranks share a GPU, run out of its memory or use CUDA
after a fork (tests/test_runner.py checks the same hints on printed copies of these texts).

The test machines have no GPU: these tests are left out of scripts/test.sh and run where
one is, with `python -m pytest -m gpu tests/test_gpu.py`. Every test needs one GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import job_processes, run_cli

from jupyter_dist.run.launch import launch, run
from jupyter_dist.run.session import Session
from jupyter_dist.spec import parse_spec


def _gpus() -> int:
    """How many GPUs nvidia-smi lists here (0 without a driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


pytestmark = pytest.mark.skipif(_gpus() == 0, reason="needs a GPU (nvidia-smi lists none)")


def _printed(record) -> list[str]:
    """Every line the job's processes printed on stdout, as the store keeps them."""
    return [text for *_, text in record.read_logs(record.log_keys(), streams=("stdout",))]


def _spec(script: str, nodes: int = 1, per_node: int = 1, launcher: str = "per_process"):
    import yaml

    return parse_spec(yaml.safe_dump({
        "script": textwrap.dedent(script),
        "resources": {"instance_count": nodes},
        "distribution": {"type": "pytorch", "process_count_per_instance": per_node,
                         "launcher": launcher},
    }))  # fmt: skip


DDP = """
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(64, 64).cuda(), device_ids=[local])
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        loss = model(torch.randn(32, 64, device="cuda")).square().mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    total = torch.ones(1, device="cuda")
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {torch.cuda.get_device_name()}"
          f" backend {dist.get_backend()} sum {total.item():g}", flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("launcher", ["per_process", "torchrun"])
def test_ddp_over_nccl_on_the_gpu(launcher, store):
    result = run(_spec(DDP, launcher=launcher), store=store)
    assert result.ok, result.describe()
    lines = _printed(store.get(result.job_id))
    said = [line for line in lines if line.startswith("rank 0 of 1 on ")]
    assert len(said) == 1 and said[0].endswith(" backend nccl sum 1"), lines


# Rank R holds R + 1 GiB on the GPU and keeps it busy for 14 s (the agents read nvidia-smi
# every 5 s).
BUSY = """
    import os, time, torch
    rank = int(os.environ["RANK"])
    held = torch.empty((rank + 1) * 2**30, dtype=torch.uint8, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + 14
    while time.time() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    print("done", flush=True)
"""


def test_the_meters_read_each_ranks_gpu_memory_and_use_from_nvidia_smi(store):
    result = run(_spec(BUSY, per_node=2), store=store)
    assert result.ok, result.describe()
    shown = run_cli("inspect", result.job_id, store=store).stdout
    assert "What each rank used on GPUs" in shown, shown
    table = shown[shown.index("What each rank used on GPUs") :].splitlines()
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table if "│ rank " in line]
    rows = {row[0]: row for row in cells}  # rank, gpu avg, gpu peak, gpu memory peak
    mib = lambda text: int(text.removesuffix(" MiB").replace(",", ""))  # noqa: E731
    zero, one = mib(rows["rank 0"][3]), mib(rows["rank 1"][3])
    # each holds its tensor and CUDA's own context (a few hundred MiB)
    assert 1024 <= zero < 1024 + 1024 and 2048 <= one < 2048 + 1024, shown
    assert 900 <= one - zero <= 1200, shown  # one GiB more, on one device alike
    assert int(rows["rank 0"][2].rstrip("%")) > 0, shown  # the device was busy
    # what each agent's reading costs (it asks every 5 s while its tree holds GPU memory)
    took = []
    for _ in range(5):
        start = time.perf_counter()
        query = ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader"]
        subprocess.run(["nvidia-smi", *query], capture_output=True, check=True)
        took.append(time.perf_counter() - start)
    print(f"nvidia-smi --query-compute-apps: {sorted(took)[2] * 1000:.0f} ms", file=sys.stderr)


def test_a_sessions_ranks_report_their_gpu_memory(store):
    spec = parse_spec("command: unused\nresources: {instance_count: 1}\n"
                      "distribution: {type: pytorch, process_count_per_instance: 2}\n")  # fmt: skip
    session = Session.start(spec, store=store)
    try:
        cell = session.run_cell(
            "import os, torch\n"
            "x = torch.empty((int(os.environ['RANK']) + 1) * 2**30, dtype=torch.uint8, "
            "device='cuda')\n"
        )
        assert cell.ok, cell.describe()
        memory = session.memory_text()
        on_gpu = memory.split("; ")[-1]
        assert on_gpu == "rank 0 1024 MiB, rank 1 2048 MiB on GPU", memory
    finally:
        session.stop()
    assert job_processes(session.job.job_id) == []


def test_a_sessions_nccl_process_group_lives_across_cells(store):
    spec = parse_spec("command: unused\nresources: {instance_count: 1}\n")
    session = Session.start(spec, store=store)
    try:
        joined = session.run_cell(
            "import os, torch, torch.distributed as dist\n"
            "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
            "dist.init_process_group('nccl')\n"
        )
        assert joined.ok, joined.describe()
        for _ in range(2):  # the same group, its tensor kept between cells
            cell = session.run_cell(
                "t = globals().get('t', torch.zeros(1, device='cuda')) + 1\n"
                "dist.all_reduce(t)\nprint('sum', dist.get_backend(), t.item())\n"
            )
            assert cell.ok, cell.describe()
        lines = _printed(store.get(session.job.job_id))
        assert [line for line in lines if line.startswith("sum ")] == [
            "sum nccl 1.0",
            "sum nccl 2.0",
        ], lines
    finally:
        session.stop()
    assert job_processes(session.job.job_id) == []


SPIN = """
    import torch
    a = torch.randn(8192, 8192, device="cuda")
    print("READY", flush=True)
    def spin():
        global a
        while True:
            for _ in range(50):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    spin()
"""


def test_stacks_of_a_rank_inside_cuda_work(store):
    job = launch(_spec(SPIN), store=store, grace_period=2)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "READY" not in _printed(job.record):
            time.sleep(0.2)
        time.sleep(1)
        dump = job.watch.stacks("faulthandler")
        text = dump.format()
        assert " in spin" in text and "rank 0 (local0)" in text, text
    finally:
        job.cancel()
        job.wait(60)
    assert job_processes(job.job_id) == []


# What CUDA and NCCL really print, and how the hint under the root cause begins.
FAILURES = {
    "shared-gpu": (
        2,
        """
        import torch, torch.distributed as dist
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        dist.all_reduce(torch.ones(1, device="cuda:0"))
        """,
        "Hint: ranks share a GPU on local0",
    ),
    "cuda-oom": (
        1,
        """
        import torch
        torch.empty(2**50, dtype=torch.uint8, device="cuda")
        """,
        "Hint: rank 0 ran out of GPU memory on local0",
    ),
    "cuda-after-fork": (
        1,
        """
        import multiprocessing, sys, torch
        torch.zeros(1, device="cuda")
        def child():
            torch.zeros(1, device="cuda")
        worker = multiprocessing.get_context("fork").Process(target=child)
        worker.start()
        worker.join()
        sys.exit(worker.exitcode)
        """,
        "Hint: rank 0 used CUDA in a forked process",
    ),
}


@pytest.mark.parametrize("kind", list(FAILURES))
def test_what_cuda_and_nccl_print_gets_its_hint(kind, store):
    per_node, script, begins = FAILURES[kind]
    result = run(_spec(script, per_node=per_node), store=store)
    cause = result.root_cause
    assert cause is not None and cause.exit_code not in (0, None), result.describe()
    hint = cause.format().splitlines()[-1]
    assert hint.startswith(begins), cause.format()
    print(cause.format(), file=sys.stderr)  # the real text, for whoever reads the log


def test_local_nodes_have_this_machines_gpus_and_the_plan_says_when_ranks_share_one(store):
    from jupyter_dist.nodes import this_machines_gpus
    from jupyter_dist.plan.parity import parity_notes
    from jupyter_dist.run.launch import make_plan

    this_machines_gpus.cache_clear()
    start = time.perf_counter()
    gpus = this_machines_gpus()
    print(f"nvidia-smi -L: {gpus} GPUs in {time.perf_counter() - start:.3f} s", file=sys.stderr)
    assert gpus == _gpus() >= 1
    launch_plan, _, chosen = make_plan(_spec("pass", per_node=gpus + 1), store=store)
    chosen.release()
    assert launch_plan.nodes[0]["gpus"] == gpus
    assert any(note.startswith(f"local0 has {gpus} GPU") for note in parity_notes(launch_plan)), (
        parity_notes(launch_plan)
    )
