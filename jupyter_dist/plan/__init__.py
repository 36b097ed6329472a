"""spec + nodes -> plan. Pure: no I/O, the same inputs always give the same plan."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_dist import node_side
from jupyter_dist.errors import SpecError
from jupyter_dist.nodes import Node
from jupyter_dist.plan import dask, mpi, pytorch, tensorflow
from jupyter_dist.plan.context import PlanContext, PortRequest, plain_mpi_launch
from jupyter_dist.plan.model import LaunchPlan, MpiLaunch, PlannedFile, ProcessPlan
from jupyter_dist.spec import SCRIPT_NAME, SCRIPT_RUNNER_NAME, JobSpec

__all__ = [
    "LaunchPlan",
    "MpiLaunch",
    "PlanContext",
    "PlannedFile",
    "PortRequest",
    "ProcessPlan",
    "plan",
    "port_requests",
]

# Read once at import, so that planning stays free of I/O.
_SCRIPT_RUNNER_SOURCE = node_side.source(SCRIPT_RUNNER_NAME)
_PLANNERS = {"pytorch": pytorch, "tensorflow": tensorflow, "mpi": mpi, "dask": dask}


def port_requests(spec: JobSpec, nodes: list[Node]) -> list[PortRequest]:
    """The ports a job needs: free ones to find, and the spec's own to check, before it is
    planned."""
    return _PLANNERS[spec.job_type].port_requests(spec.distribution, nodes)


def plan(
    spec: JobSpec,
    nodes: list[Node],
    job_id: str,
    ports: Mapping[str, int],
    extra_files: Mapping[str, str] | None = None,
    mpi_launch: Callable[[PlanContext], MpiLaunch] = plain_mpi_launch,
    restart_count: int = 0,
) -> LaunchPlan:
    """Every process of the job: node, argv, env, cwd, role and ranks. `extra_files`
    (name -> text) are written into the job's folder on every node; `mpi_launch` is the
    backend's part of an MPI job's mpirun (Backend.mpi_launch); `restart_count` is the
    attempt's number, counted from 0 (DISTRUN_RESTART_COUNT)."""
    if len(nodes) != spec.instance_count:
        raise SpecError(
            f"resources.instance_count is {spec.instance_count} but {len(nodes)} node(s) were given"
        )
    requests = port_requests(spec, nodes)
    ports = {**ports, **{r.key: r.fixed for r in requests if r.fixed is not None}}
    missing = [r.key for r in requests if r.key not in ports]
    if missing:
        raise ValueError(f"ports not chosen for: {', '.join(missing)}")
    ctx = PlanContext(spec, list(nodes), job_id, ports, mpi_launch, restart_count)
    built = _PLANNERS[spec.job_type].build(ctx, spec.distribution)
    processes, files = built if isinstance(built, tuple) else (built, [])
    per_node = dict(extra_files or {})
    if spec.script is not None:  # the notebook cell (or inline script), on every node
        per_node[SCRIPT_NAME] = spec.script
        per_node[SCRIPT_RUNNER_NAME] = _SCRIPT_RUNNER_SOURCE
    files = [
        *files,
        *(
            PlannedFile(n, posixpath.join(ctx.job_dir(node), name), text)
            for n, node in enumerate(nodes)
            for name, text in per_node.items()
        ),
    ]
    master_port = processes[0].env.get("MASTER_PORT")
    return LaunchPlan(
        job_id=job_id,
        job_type=spec.job_type,
        nodes=[_node_entry(n) for n in nodes],
        master_addr=ctx.master_addr,
        master_port=int(master_port) if master_port else None,
        world_size=processes[0].world_size,
        processes=processes,
        files=files,
        code_dir=str(spec.code_dir()) if spec.code_dir() else None,
        read_as=spec.read_as,
        outputs={n: {"type": o.type, "path": o.node_path} for n, o in spec.outputs.items()},
    )


def _node_entry(node: Node) -> dict[str, Any]:
    """A node as the plan keeps it: where it is, its GPUs, whether it sees this machine's
    files, what its preflight read."""
    entry = {"name": node.name, "host": node.host, "backend": node.backend, "gpus": node.gpus}
    if node.shares_files:
        entry["shares_files"] = True
    if node.software is not None:
        entry["software"] = node.software
    return entry
