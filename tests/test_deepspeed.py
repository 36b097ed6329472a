"""DeepSpeed, as the seed documents promise it: ZeRO data-parallel training under the
PyTorch distribution (a rank per process, jupyter-dist's environment) and under MPI
(mpirun starts the ranks; DeepSpeed reads them from MPI), on CPU with gloo here."""

from __future__ import annotations

import pytest
from helpers import EXAMPLES, result_reports

from jupyter_dist.run.launch import run
from jupyter_dist.spec import load_spec

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# The first weights of the model before training (torch.manual_seed(0)): training moved them.
INITIAL = [-0.002647, 0.189661, -0.29099, -0.260194]


@pytest.mark.parametrize(
    ("example", "stage"),
    [("deepspeed_zero.yml", 2), pytest.param("deepspeed_mpi.yml", 1, marks=pytest.mark.mpi)],
)
def test_deepspeed_zero_trains_data_parallel(example, stage, store):
    result = run(load_spec(EXAMPLES / example), store=store)
    assert result.ok, result.describe()
    reports = result_reports(store, result.job_id)
    assert sorted(reports) == [0, 1]
    assert {(r["world"], r["stage"]) for r in reports.values()} == {(2, stage)}
    # Each rank trained on its own batches (their losses differ), yet the weights are one:
    # the gradients were averaged across the ranks, and they moved from where they began.
    assert reports[0]["loss"] != reports[1]["loss"]
    assert reports[0]["weights"] == reports[1]["weights"] != INITIAL
