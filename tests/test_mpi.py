"""Real Open MPI with mpi4py on local nodes: the hostfile, the Azure ML variables, per-rank
output, and a failing rank."""

from __future__ import annotations

import json

import pytest
from helpers import EXAMPLES, job_processes, run_cli

from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec

pytestmark = pytest.mark.mpi


@pytest.mark.slow
def test_mpi_allreduce_with_azure_variables(store):
    done = run_cli("run", str(EXAMPLES / "mpi_allreduce.yml"), store=store, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    record = store.jobs()[0]
    assert record.log_keys() == ["rank-0", "rank-1", "rank-2", "rank-3"]
    for rank in range(4):
        (line,) = [entry.text for entry in record.iter_log(f"rank-{rank}", "stdout")]
        report = json.loads(line.removeprefix("RESULT "))
        assert report["rank"] == report["mpi_rank"] == rank
        assert report["size"] == 4 and report["allreduce"] == 10
        assert report["master"][0] == "127.0.0.1"
        assert report["hostfile"] == ["127.0.0.1 slots=4"]  # two local nodes, one host
        assert f"[rank {rank}] RESULT " in done.stdout
    assert job_processes(record.job_id) == []


@pytest.mark.slow
def test_a_failing_mpi_rank_is_the_root_cause(store):
    script = (
        "import os, sys, time\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
        "    raise SystemExit('rank 1 cannot open its shard')\n"
        "time.sleep(60)\n"
    )
    (store.root.parent / "fail.py").write_text(script)
    spec = parse_spec(
        f"command: python {store.root.parent / 'fail.py'}\nresources: {{instance_count: 2}}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    result = run(spec, store=store, grace_period=3)
    assert result.state == "failed"
    assert result.root_cause.rank == 1, result.root_cause.format()
    assert "rank 1 cannot open its shard" in result.root_cause.stderr_tail
    assert job_processes(result.job_id) == []


def test_unbuffered_output_of_every_rank_is_reassembled(store, tmp_path):
    """mpirun tags fragments, not lines; unbuffered Python writes text and newline apart."""
    (tmp_path / "chatty.py").write_text(
        "import os\n"
        "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "for i in range(300):\n"
        "    print(f'rank {rank} line {i} ' + 'x' * (i % 50))\n"
    )
    spec = parse_spec(
        f"command: python -u {tmp_path / 'chatty.py'}\nresources: {{instance_count: 2}}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    result = run(spec, store=store)
    assert result.ok, result.describe()
    record = store.get(result.job_id)
    assert record.log_keys() == ["rank-0", "rank-1", "rank-2", "rank-3"]
    for rank in range(4):
        lines = [entry.text for entry in record.iter_log(f"rank-{rank}", "stdout")]
        assert lines == [f"rank {rank} line {i} " + "x" * (i % 50) for i in range(300)]
