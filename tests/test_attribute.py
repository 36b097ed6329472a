"""Line attribution for launchers that start several ranks (a unit below test_mpi/test_torch)."""

from __future__ import annotations

from jupyter_dist.diagnose.attribute import attributor, failed_rank
from jupyter_dist.plan.model import ProcessPlan


def _proc(line_tags: str, ranks=(0, 1, 2, 3)) -> ProcessPlan:
    return ProcessPlan(
        name="launcher-0",
        label="node 0",
        role="launcher",
        node="n0",
        node_rank=0,
        host="h",
        argv=[],
        env={},
        cwd="/",
        world_size=4,
        ranks=tuple(ranks),
        line_tags=line_tags,
    )


def test_mpi_fragments_are_reassembled_per_rank():
    split = attributor(_proc("mpi"))
    assert split("[1,1]<stdout>:RESULT 1[1,2]<stdout>:hello") == [("rank-2", "rank 2", "hello")]
    assert split("[1,1]<stdout>:") == [("rank-1", "rank 1", "RESULT 1")]
    assert split("[1,0]<stderr>:boom") == [("rank-0", "rank 0", "boom")]
    assert split("mpirun: a message of its own") == [
        ("launcher-0", "node 0", "mpirun: a message of its own")
    ]


def test_torchrun_prefix_gives_the_global_rank():
    split = attributor(_proc("torchrun", ranks=(4, 5)))
    assert split("[default1]:hello") == [("rank-5", "rank 5", "hello")]
    assert split("torchrun says") == [("launcher-0", "node 0", "torchrun says")]


def test_torchrun_fragments_are_reassembled_per_rank():
    """torchrun tags each fragment a rank writes: a long line written before its newline
    came out as '[default1]:{...}[default1]:' (seen in CI: the RESULT line of rank 3 lost
    to a JSON error), another rank's fragment may stand between."""
    split = attributor(_proc("torchrun", ranks=(2, 3)))
    assert split('[default1]:{"rank": 3}[default1]:') == [("rank-3", "rank 3", '{"rank": 3}')]
    assert split("[default0]:half [default1]:other[default0]:") == [("rank-2", "rank 2", "half ")]
    assert split("[default1]: end") == [("rank-3", "rank 3", "other end")]


def test_failed_rank_prefers_the_launchers_root_cause_block():
    report = [
        "Failures:",
        "  rank      : 3 (local_rank: 1)",
        "Root Cause (first observed failure):",
        "  rank      : 2 (local_rank: 0)",
    ]
    assert failed_rank(_proc("torchrun"), report, {}) == 2
    mpi = ["Process name: [[4512,1],1]", "Exit code: 3"]
    assert failed_rank(_proc("mpi"), mpi, {}) == 1


def test_failed_rank_falls_back_to_the_first_traceback():
    first = {"rank-3": (1.0, False), "rank-1": (2.0, True), "rank-0": (3.0, True)}
    assert failed_rank(_proc("mpi"), [], first) == 1
    assert failed_rank(_proc("mpi"), [], {"rank-2": (5.0, False)}) == 2
    assert failed_rank(_proc("mpi"), [], {}) is None
