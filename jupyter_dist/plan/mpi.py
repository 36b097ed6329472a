"""MPI: a hostfile and one mpirun (or horovodrun) on node 0 that starts every rank; the
backend says how mpirun reaches the other nodes (Backend.mpi_launch).

A command that is itself a launcher (`horovodrun -np 16 --hostfile $AZUREML_MPI_HOSTFILE
python train.py`, the seed's Horovod job; or the user's own `mpirun ...`) runs once, on
node 0, with the same hostfile and variables: it starts the ranks itself."""

from __future__ import annotations

import posixpath

from jupyter_dist.command_words import own_launcher, own_world
from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import PlannedFile, ProcessPlan
from jupyter_dist.spec import MpiDistribution

# Names MPI itself must not be told to forward (they are per-rank, set by mpirun).
_NOT_FORWARDED = ("OMPI_",)


def runs_ssh(ctx: PlanContext) -> bool:
    """Whether the job's launcher calls `ssh` itself (horovodrun, or the command's own
    launcher): the backend then plans an `ssh` for it (MpiLaunch.ssh_env)."""
    launcher = getattr(ctx.spec.distribution, "launcher", None)
    return launcher == "horovodrun" or own_launcher(ctx.command) is not None


def port_requests(dist: MpiDistribution, nodes: list[Node]) -> list[PortRequest]:
    return [PortRequest("master", 0)]


def hostfile(ctx: PlanContext, slots_per_node: int) -> str:
    """`host slots=P` per host; local nodes share one host, so their slots add up."""
    slots: dict[str, int] = {}
    for node in ctx.nodes:
        slots[node.host] = slots.get(node.host, 0) + slots_per_node
    return "".join(f"{host} slots={count}\n" for host, count in slots.items())


def crowded_hosts(ctx: PlanContext, slots_per_node: int) -> list[str]:
    """The hosts given more ranks than they have cores, where the cores are known (local
    nodes: this machine, whose slots add up)."""
    ranks: dict[str, int] = {}
    cpus: dict[str, int | None] = {}
    for node in ctx.nodes:
        ranks[node.host] = ranks.get(node.host, 0) + slots_per_node
        cpus[node.host] = node.cpus
    return [host for host, count in ranks.items() if cpus[host] and count > cpus[host]]


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
    own = own_launcher(ctx.command)
    launcher = own or dist.launcher
    if own is not None:  # it starts the ranks itself: run it once, with the hostfile
        argv = []
        world = own_world(ctx.command, world)
        env.update(reach.ssh_env)
    elif launcher == "horovodrun":
        # horovodrun reads the same hostfile; it forwards the whole environment itself (its
        # MPI mode with -x for every variable, its Gloo mode on the ssh command line).
        hosts = ["--hostfile", hosts_path] if reach.hostfile else ["-H", reach.hosts]
        argv = ["horovodrun", "-np", str(world), *hosts, *dist.mpi_args]
        env.update(reach.ssh_env)
    else:
        hosts = ["--hostfile", hosts_path] if reach.hostfile else []
        argv = ["mpirun", "-np", str(world), *hosts, "--tag-output", *reach.args]
        for name in forward:  # remote ranks get our variables only when told to forward them
            argv += ["-x", name]
        argv += dist.mpi_args
    # mpirun refuses root unless told (horovodrun's mpirun too); harmless for everyone else.
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # An Open MPI rank that waits for a message polls for it on a whole core. With more
    # ranks than cores (local nodes on a laptop), the waiting ranks starve those still
    # working or importing torch: a Horovod job here took about 30 % more CPU. Open MPI yields
    # by itself where it knows a host is oversubscribed, but the hostfile gives a slot per
    # rank, so it is told. A value the spec sets stands.
    if crowded_hosts(ctx, per_node):
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    argv += ctx.shell(ctx.command)
    # Both tag every rank's lines: mpirun --tag-output "[1,R]<stdout>:", horovodrun's Gloo
    # mode "[R]<stdout>:" (its MPI mode runs mpirun --tag-output).
    proc = ctx.process(0, launcher, argv, env, world, ranks=tuple(range(world)), line_tags="mpi")
    return [proc], files
