"""Dask: a scheduler on node 0, P worker processes per node, and the command as a client."""

from __future__ import annotations

from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.spec import DaskDistribution


def port_requests(dist: DaskDistribution, num_nodes: int) -> list[PortRequest]:
    wanted = [("dask-scheduler", dist.scheduler_port), ("dask-dashboard", dist.dashboard_port)]
    return [PortRequest(key, 0) for key, fixed in wanted if fixed is None]


def scheduler_address(ctx: PlanContext, dist: DaskDistribution) -> str:
    return f"tcp://{ctx.master_addr}:{ctx.port('dask-scheduler', dist.scheduler_port)}"


def build(ctx: PlanContext, dist: DaskDistribution) -> list[ProcessPlan]:
    address = scheduler_address(ctx, dist)
    per_node = dist.process_count_per_instance
    workers = ctx.num_nodes * per_node
    node0 = ctx.nodes[0]
    sched_port = ctx.port("dask-scheduler", dist.scheduler_port)
    dash_port = ctx.port("dask-dashboard", dist.dashboard_port)
    extra = {"DASK_SCHEDULER_ADDRESS": address, "DISTRUN_DASK_WORKERS": str(workers)}
    procs = [
        ProcessPlan(
            name="scheduler",
            label="scheduler",
            role="scheduler",
            node=node0.name,
            node_rank=0,
            host=node0.host,
            argv=[
                node0.python,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                node0.host,
                "--port",
                str(sched_port),
                "--dashboard-address",
                f"{node0.host}:{dash_port}",
            ],
            env={**ctx.base_env(0), **extra},
            cwd=ctx.cwd(node0),
            world_size=workers,
            service=True,
        )
    ]
    for n, node in enumerate(ctx.nodes):
        for local in range(per_node):
            argv = [
                node.python,
                "-m",
                "distributed.cli.dask_worker",
                address,
                "--host",
                node.host,
                "--name",
                f"{node.name}-{local}",
                "--nworkers",
                "1",
            ]
            if dist.threads_per_process:
                argv += ["--nthreads", str(dist.threads_per_process)]
            index = n * per_node + local
            procs.append(
                ProcessPlan(
                    name=f"dask-worker-{index}",
                    label=f"dask worker {index}",
                    role="dask-worker",
                    node=node.name,
                    node_rank=n,
                    host=node.host,
                    argv=argv,
                    env={**ctx.base_env(n), **extra},
                    cwd=ctx.cwd(node),
                    world_size=workers,
                    local_rank=local,
                    service=True,
                )
            )
    if ctx.command:
        procs.append(
            ProcessPlan(
                name="client",
                label="client",
                role="client",
                node=node0.name,
                node_rank=0,
                host=node0.host,
                argv=ctx.shell(ctx.command),
                env={**ctx.base_env(0), **extra},
                cwd=ctx.cwd(node0),
                world_size=workers,
            )
        )
    return procs
