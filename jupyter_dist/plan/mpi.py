"""MPI: a hostfile and one mpirun (or horovodrun) on node 0 that starts every rank; the
backend says how mpirun reaches the other nodes (Backend.mpi_launch)."""

from __future__ import annotations

import posixpath

from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import PlannedFile, ProcessPlan
from jupyter_dist.spec import MpiDistribution

# Names MPI itself must not be told to forward (they are per-rank, set by mpirun).
_NOT_FORWARDED = ("OMPI_",)


def port_requests(dist: MpiDistribution, nodes: list[Node]) -> list[PortRequest]:
    return [PortRequest("master", 0)]


def hostfile(ctx: PlanContext, slots_per_node: int) -> str:
    """`host slots=P` per host; local nodes share one host, so their slots add up."""
    slots: dict[str, int] = {}
    for node in ctx.nodes:
        slots[node.host] = slots.get(node.host, 0) + slots_per_node
    return "".join(f"{host} slots={count}\n" for host, count in slots.items())


def build(ctx: PlanContext, dist: MpiDistribution) -> tuple[list[ProcessPlan], list[PlannedFile]]:
    per_node = dist.process_count_per_instance
    world = ctx.num_nodes * per_node
    node0 = ctx.nodes[0]
    hosts_path = posixpath.join(ctx.job_dir(node0), "hostfile")
    port = ctx.port("master")
    env = {
        **ctx.base_env(0),
        "MASTER_ADDR": ctx.master_addr,
        "MASTER_PORT": str(port),
        "AZ_BATCH_MASTER_NODE": f"{ctx.master_addr}:{port}",
        "DISTRUN_MPI_HOSTFILE": hosts_path,
        "AZUREML_MPI_HOSTFILE": hosts_path,
    }
    reach = ctx.mpi_launch(ctx)  # the backend's way to the other nodes
    forward = [name for name in env if not name.startswith(_NOT_FORWARDED)]
    forward += reach.forward
    files = [PlannedFile(0, hosts_path, hostfile(ctx, per_node)), *reach.files]
    hosts = ["--hostfile", hosts_path] if reach.hostfile else []
    if dist.launcher == "horovodrun":
        argv = ["horovodrun", "-np", str(world), *hosts, *dist.mpi_args]
        output = "plain"
    else:
        argv = ["mpirun", "-np", str(world), *hosts, "--tag-output", *reach.args]
        for name in forward:  # remote ranks get our variables only when told to forward them
            argv += ["-x", name]
        argv += dist.mpi_args
        output = "mpi"
        # mpirun refuses root unless told; harmless for everyone else.
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    argv += ctx.shell(ctx.command)
    proc = ctx.process(0, "mpirun", argv, env, world, ranks=tuple(range(world)), output=output)
    return [proc], files
