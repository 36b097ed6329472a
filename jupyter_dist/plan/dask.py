"""Dask: a scheduler on node 0, P worker processes per node, and the command as a client."""

from __future__ import annotations

import posixpath
import shlex
from collections import Counter

from jupyter_dist import node_side
from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import PlannedFile, ProcessPlan
from jupyter_dist.spec import DaskDistribution

# Run on node 0 before the command: it waits until every worker has registered. Read once
# at import, as the cell runner is (plan/__init__), so that planning stays free of I/O.
WAIT_FILE = "dask_wait.py"
_WAIT_SOURCE = node_side.source(WAIT_FILE)
READY_TIMEOUT_S = 60
# Dask's INFO chatter (every connection, every worker) would drown the user's own lines;
# warnings and errors still come. So would the nanny's "leaked semaphore" warning at every
# stop. `environment_variables` can set either back.
QUIET = {
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "PYTHONWARNINGS": "ignore:resource_tracker:UserWarning",
}


def port_requests(dist: DaskDistribution, nodes: list[Node]) -> list[PortRequest]:
    wanted = [
        ("dask-scheduler", "scheduler_port", dist.scheduler_port),
        ("dask-dashboard", "dashboard_port", dist.dashboard_port),
    ]
    return [PortRequest(key, 0, fixed=fixed, setting=setting) for key, setting, fixed in wanted]


def scheduler_address(ctx: PlanContext) -> str:
    return f"tcp://{ctx.master_addr}:{ctx.port('dask-scheduler')}"


def worker_name(node_name: str, local: int) -> str:
    """The name a worker registers under: its node and its index there."""
    return f"{node_name}-{local}"


def build(ctx: PlanContext, dist: DaskDistribution) -> tuple[list[ProcessPlan], list[PlannedFile]]:
    address = scheduler_address(ctx)
    per_node = dist.process_count_per_instance
    workers = ctx.num_nodes * per_node
    node0 = ctx.nodes[0]
    extra = {"DASK_SCHEDULER_ADDRESS": address, "DISTRUN_DASK_WORKERS": str(workers)}

    def env(node_rank: int) -> dict[str, str]:
        return {**QUIET, **ctx.base_env(node_rank), **extra}

    procs = [
        ctx.process(
            0,
            "scheduler",
            [
                node0.python,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                node0.host,
                "--port",
                str(ctx.port("dask-scheduler")),
                "--dashboard-address",
                f"{node0.host}:{ctx.port('dask-dashboard')}",
            ],
            env(0),
            workers,
            service=True,
        )
    ]
    # Worker processes per machine (local nodes share one): each gets its share of memory.
    sharing = Counter(node.host for node in ctx.nodes)
    names = []
    for n, node in enumerate(ctx.nodes):
        for local in range(per_node):
            name = worker_name(node.name, local)
            names.append(name)
            argv = [
                node.python,
                "-m",
                "distributed.cli.dask_worker",
                address,
                "--host",
                node.host,
                "--name",
                name,
                "--nworkers",
                "1",
            ]
            if dist.threads_per_process:
                argv += ["--nthreads", str(dist.threads_per_process)]
            on_host = per_node * sharing[node.host]
            if on_host > 1:  # each process would otherwise claim all of the machine's memory
                argv += ["--memory-limit", f"{1 / on_host:.4f}"]
            index = n * per_node + local
            procs.append(
                ctx.process(
                    n,
                    f"dask-worker-{index}",
                    argv,
                    env(n),
                    workers,
                    label=f"dask worker {index}",
                    role="dask-worker",
                    local_rank=local,
                    service=True,
                )
            )
    files = []
    if ctx.command:
        wait = posixpath.join(ctx.job_dir(node0), WAIT_FILE)
        files.append(PlannedFile(0, wait, _WAIT_SOURCE))
        ready = f"{shlex.quote(node0.python)} {shlex.quote(wait)}"
        procs.append(
            ctx.process(
                0,
                "client",
                ctx.shell(f"{ready} && {ctx.command}"),
                {
                    **env(0),
                    "DISTRUN_DASK_WORKER_NAMES": ",".join(names),
                    "DISTRUN_DASK_READY_TIMEOUT": str(READY_TIMEOUT_S),
                },
                workers,
            )
        )
    return procs, files
