"""PyTorch: one process per rank (per_process) or one torchrun per node (torchrun)."""

from __future__ import annotations

import posixpath

from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import ProcessPlan, rank_key
from jupyter_dist.spec import PyTorchDistribution


def port_requests(dist: PyTorchDistribution, nodes: list[Node]) -> list[PortRequest]:
    return [PortRequest("master", 0, fixed=dist.master_port, setting="master_port")]


def _master_env(ctx: PlanContext, port: int, node_rank: int) -> dict[str, str]:
    return {"MASTER_ADDR": ctx.master_addr, "MASTER_PORT": str(port), "NODE_RANK": str(node_rank)}


def build(ctx: PlanContext, dist: PyTorchDistribution) -> list[ProcessPlan]:
    per_node = dist.process_count_per_instance
    world = ctx.num_nodes * per_node
    port = ctx.port("master")
    procs: list[ProcessPlan] = []
    for n, node in enumerate(ctx.nodes):
        if dist.launcher == "torchrun":
            procs.append(_torchrun(ctx, node, n, per_node, port))
            continue
        for local in range(per_node):
            rank = n * per_node + local
            env = {
                **ctx.base_env(n),
                **_master_env(ctx, port, n),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(per_node),
                "GROUP_RANK": str(n),
            }
            if per_node > 1:  # as torchrun does: several ranks must not each take every core
                env.setdefault("OMP_NUM_THREADS", "1")
            procs.append(
                ctx.process(
                    n,
                    rank_key(rank)[0],
                    ctx.shell(ctx.command),
                    env,
                    world,
                    label=rank_key(rank)[1],
                    role="rank",
                    rank=rank,
                    local_rank=local,
                    ranks=(rank,),
                )
            )
    return procs


def _torchrun(ctx: PlanContext, node, n: int, per_node: int, port: int) -> ProcessPlan:
    argv = [
        node.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(ctx.num_nodes),
        "--nproc-per-node",
        str(per_node),
        "--node-rank",
        str(n),
        "--master-addr",
        ctx.master_addr,
        "--master-port",
        str(port),
        # --tee prefixes each worker line with "[default<local rank>]:" so lines reach
        # the right rank's log; the copies it writes stay in the job's scratch folder.
        "--tee",
        "3",
        "--log-dir",
        posixpath.join(ctx.job_dir(node), f"torchrun-{n}"),
        "--no-python",
        *ctx.shell(ctx.command),
    ]
    first = n * per_node
    return ctx.process(
        n,
        f"torchrun-{n}",
        argv,
        {**ctx.base_env(n), **_master_env(ctx, port, n)},
        ctx.num_nodes * per_node,
        label=f"node {n}",
        role="torchrun",
        ranks=tuple(range(first, first + per_node)),
        line_tags="torchrun",
    )
