"""The plan of a job whose nodes are not known yet: the planner runs as for any job, on
nodes whose names, addresses and folders are placeholders (`@@distrun:addr0@@`), which a
format then turns into what its scheduler provides at run time (a shell variable in an
sbatch script). So an export's ranks, environment and argv are the planner's own.

Ports cannot be found free ahead of time: the spec's own are used, else the usual ones
(29500 for PyTorch and MPI, 2222 upwards for TensorFlow tasks, 8786/8787 for Dask).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace

from jupyter_dist.nodes import Node
from jupyter_dist.plan import LaunchPlan, PlanContext, plan, port_requests
from jupyter_dist.plan.context import plain_mpi_launch
from jupyter_dist.plan.model import MpiLaunch
from jupyter_dist.spec import JobSpec

DEFAULT_PORTS = {"master": 29500, "dask-scheduler": 8786, "dask-dashboard": 8787}
TF_BASE_PORT = 2222
JOBS_FOLDER = "distrun-jobs"  # the jobs' scratch folders, under `here`
_PLACEHOLDER = re.compile(r"@@distrun:([a-z0-9_]+)@@")


def placeholder(name: str) -> str:
    """A value known only at run time: `node0`, `addr0` (node 0's name and address),
    `job` (the job's id), `here` (the folder the export was written to)."""
    return f"@@distrun:{name}@@"


def symbolic_plan(
    spec: JobSpec,
    python: str,
    code_from: str | None = None,
    mpi_launch: Callable[[PlanContext], MpiLaunch] = plain_mpi_launch,
) -> LaunchPlan:
    """The plan of `spec` on placeholder nodes. `python` runs the per-node launchers;
    `code_from` is the folder the spec's `code` is reached from at run time (relative to
    `here`), else the code runs from `here` itself."""
    here = placeholder("here")
    if spec.job_type == "tensorflow" and spec.distribution.base_port is None:
        spec = spec.with_overrides(base_port=TF_BASE_PORT)
    workdir = posixpath.join(here, JOBS_FOLDER)
    nodes = [
        Node(placeholder(f"node{n}"), placeholder(f"addr{n}"), "export", python, workdir, here)
        for n in range(spec.instance_count)
    ]
    ports = {r.key: r.fixed or DEFAULT_PORTS[r.key] for r in port_requests(spec, nodes)}
    planned = plan(spec, nodes, placeholder("job"), ports, mpi_launch=mpi_launch)
    if spec.code_dir() is None:
        return planned
    cwd = posixpath.join(here, code_from) if code_from and code_from != "." else here
    # (an absolute `code_from` stays itself: join keeps the second path)
    return replace(planned, processes=[replace(p, cwd=cwd) for p in planned.processes])


def placeholders_in(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def shell_word(text: str, variables: Mapping[str, str]) -> str:
    """`text` as one shell word: its literal parts quoted, each placeholder as the shell
    variable `variables` names for it ("${addr_0}"), so nothing else is ever expanded."""
    parts, last = [], 0
    for found in _PLACEHOLDER.finditer(text):
        if found.start() > last:
            parts.append(shlex.quote(text[last : found.start()]))
        parts.append('"${' + variables[found.group(1)] + '}"')
        last = found.end()
    if last < len(text) or not parts:
        parts.append(shlex.quote(text[last:]))
    return "".join(parts)
