"""Warm sessions through a real kernel: ranks started once keep their namespaces (a
variable, a model, an initialised gloo process group) across cells; a rank's exception
fails the cell, not the session; stopping leaves nothing."""

from __future__ import annotations

import re

from helpers import execute_notebook, job_processes, stream_text

CELL_1 = (
    "%%distrun\n"
    "import os, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "rank = dist.get_rank()\n"
    "model = torch.nn.Linear(2, 1)\n"
    "print('ready', rank, os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'])\n"
)
CELL_2 = (
    "%%distrun\ncalls = rank * 10\nprint('model', sum(p.numel() for p in model.parameters()))\n"
)
CELL_3 = (
    "%%distrun\n"
    "total = torch.tensor([float(calls)])\n"
    "dist.all_reduce(total)\n"  # the group of cell 1, still formed
    "print('sum', total.item())\n"
)


def test_state_persists_across_cells_and_a_failing_rank_fails_only_its_cell(kernel_env):
    nb = execute_notebook(
        "%distrun session start --nodes 2 --procs-per-node 2",
        CELL_1,
        CELL_2,
        CELL_3,
        "%%distrun\nif rank == 1:\n    raise ValueError(f'rank {rank} has a bad shard')\n",
        "%%distrun\nprint('after', rank)",
        "%%distrun --nodes 1\nprint('cold')",
        "%distrun session",
        "%distrun session stop",
        "%distrun session stop nope",
        allow_errors=True,
    )
    out = [stream_text(cell) for cell in nb.cells[1:]]
    started = re.search(
        r"Session session ready in [\d.]+ s \(job (\S+)\): 4 ranks on 2 nodes", out[0]
    )
    assert started, out[0]
    job_id = started.group(1)
    for rank in range(4):
        assert f"[rank {rank}] ready {rank} 4 {rank % 2}" in out[1]
        assert f"[rank {rank}] model 3" in out[2]
        assert f"[rank {rank}] sum 60.0" in out[3]  # 0 + 10 + 20 + 30: one group since cell 1
        assert f"[rank {rank}] after {rank}" in out[5]
    error = nb.cells[5].outputs[-1]
    assert error.output_type == "error" and error.ename == "CellFailed"
    assert error.evalue.startswith("rank 1: ValueError: rank 1 has a bad shard\n")
    assert "[rank 1] ValueError: rank 1 has a bad shard" in out[4]
    refused = nb.cells[7].outputs[-1]
    assert refused.ename == "DistrunError" and "--new" in refused.evalue
    assert "\n" not in refused.evalue
    assert re.match(r"session: 4 ranks on 2 nodes \(local\), job \S+, up \d+ s\n", out[7]), out[7]
    assert out[8].startswith(f"Session session stopped (job {job_id}): 4 ranks on 2 nodes")
    assert job_processes(job_id) == []
    unknown = nb.cells[10].outputs[-1]
    assert unknown.evalue == (
        "%distrun session stop: no open session named 'nope' (open: none is open)"
    )
