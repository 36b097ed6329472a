"""The example notebooks run as they are, on local nodes."""

from __future__ import annotations

import nbformat
import pytest
from helpers import EXAMPLES, job_processes
from nbclient import NotebookClient

from jupyter_dist.store import JobStore


@pytest.mark.parametrize(
    "name",
    ["pytorch_ddp.ipynb", "mpi_allreduce.ipynb", "tensorflow_mwms.ipynb", "dask_cluster.ipynb"],
)
def test_example_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path))
    monkeypatch.delenv("DISTRUN_NODES_FILE", raising=False)
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()  # fmt: skip
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    if name == "pytorch_ddp.ipynb":
        assert "4 ranks, identical weights:" in text and "[rank 0] epoch 2: loss" in text
    elif name == "tensorflow_mwms.ipynb":
        assert '"task": {"type": "worker", "index": 1}' in text  # the dry run's TF_CONFIG
        assert "2 workers, identical weights:" in text and "[worker 1] step 40: loss" in text
    elif name == "dask_cluster.ipynb":
        shown = "".join(  # the cluster's summary is a display, not a stream
            out.get("data", {}).get("text/plain", "") for cell in nb.cells
            for out in cell.get("outputs", [])
        )  # fmt: skip
        assert "4 worker(s) on 2 node(s)" in shown
        holders = int(text.split(" workers hold the 8 partitions")[0].split()[-1])
        assert holders >= 2  # the partitions are spread over the workers
        assert "totals match pandas: True" in text and "stopped: 5 process(es)" in text
        (job,) = JobStore(tmp_path / "jobs").jobs()
        assert job.status()["state"] == "succeeded" and job_processes(job.job_id) == []
    else:
        assert text.count("allreduce gives 10") == 4 and "127.0.0.1 slots=4" in text
