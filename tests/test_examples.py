"""The example notebooks run as they are, on local nodes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import nbformat
import pytest
from helpers import EXAMPLES, ROOT, job_processes, run_notebook

from jupyter_dist.store import JobStore


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "pytorch_ddp.ipynb",
        "mpi_allreduce.ipynb",
        "tensorflow_mwms.ipynb",
        "dask_cluster.ipynb",
        "session.ipynb",
    ],
)
def test_example_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path))
    monkeypatch.delenv("DISTRUN_NODES_FILE", raising=False)
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    run_notebook(nb, timeout=300, resources={"metadata": {"path": str(EXAMPLES)}})
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    if name == "pytorch_ddp.ipynb":
        assert "4 ranks, identical weights:" in text and "[rank 0] epoch 2: loss" in text
        logs = "".join(out.get("text", "") for out in nb.cells[-1].outputs)
        assert logs.startswith("epoch 0: loss ") and logs.count("\n") == 3  # rank 3's, alone
    elif name == "tensorflow_mwms.ipynb":
        assert '"task": {"type": "worker", "index": 1}' in text  # the dry run's TF_CONFIG
        assert "2 workers, identical weights:" in text and "[worker 1] step 40: loss" in text
    elif name == "dask_cluster.ipynb":
        shown = "".join(  # the cluster's summary is a display, not a stream
            out.get("data", {}).get("text/plain", "") for cell in nb.cells
            for out in cell.get("outputs", [])
        )  # fmt: skip
        assert "4 workers on 2 nodes" in shown
        holders = int(text.split(" workers hold the 8 partitions")[0].split()[-1])
        assert holders >= 2  # the partitions are spread over the workers
        assert "totals match pandas: True" in text
        assert "stopped: 1 scheduler and 4 workers on 2 nodes ended" in text
        (job,) = JobStore(tmp_path / "jobs").jobs()
        assert job.status()["state"] == "succeeded" and job_processes(job.job_id) == []
    elif name == "session.ipynb":
        losses = [float(x) for x in re.findall(r"\[rank 0\] loss (\S+)", text)]
        assert len(losses) == 2 and losses[1] < losses[0]  # the same model kept learning
        assert text.count("identical weights on every rank: True") == 4
        weights = eval(nb.cells[-2].outputs[0].text)  # rank 0's, brought back
        assert len(weights) == 8 and weights[7] > weights[0]  # learning true_w = 0..7
        (job,) = JobStore(tmp_path / "jobs").jobs()
        assert job.status()["state"] == "succeeded" and job_processes(job.job_id) == []
    else:
        assert text.count("allreduce gives 10") == 4 and "127.0.0.1 slots=4" in text


@pytest.mark.slow
def test_the_demo_runs_the_notebook_and_prints_no_warning(tmp_path):
    """The README's main command runs scripts/demo.py after the set-up: every rank's lines,
    the job's outcome, and nothing the user did not cause (no warning, no traceback)."""
    env = {**os.environ, "DISTRUN_HOME": str(tmp_path)}
    env.pop("DISTRUN_NODES_FILE", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"job \S+: 4 ranks on 2 nodes \(local\)\n", out)
    assert all(f"[rank {r}] epoch 2: loss" in out for r in range(4))
    assert re.search(r"Job \S+ succeeded in [\d.]+ s\.", out)
    assert "4 ranks, identical weights:" in out and "every cell succeeded" in out
    assert "warn" not in out.lower() and "traceback" not in out.lower(), out
    (job,) = JobStore(tmp_path / "jobs").jobs()
    assert job.status()["state"] == "succeeded" and job_processes(job.job_id) == []


@pytest.mark.slow
def test_the_readmes_cell_runs_as_written(kernel_env):
    """The README's `%%distrun` cell, copied from it: four ranks greet from two nodes."""
    from helpers import execute_notebook, stream_text

    readme = (ROOT / "README.md").read_text()
    (cell,) = re.findall(r"```python\n(%%distrun .*?)```", readme, re.S)
    printed = stream_text(execute_notebook(cell).cells[1])
    for rank in range(4):
        assert f"hello from rank {rank} of 4 on {rank // 2}" in printed
    assert re.search(r"Job \S+ succeeded", printed)
