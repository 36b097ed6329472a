"""A plan in words: what a job starts ("4 ranks on 2 nodes"), as the job's first line and
an export's comment say it."""

from __future__ import annotations

from jupyter_dist.plan.model import LaunchPlan


def counted(number: int, noun: str) -> str:
    """`counted(1, "rank")` is "1 rank", `counted(4, "rank")` "4 ranks"."""
    plural = noun + ("es" if noun.endswith(("s", "sh", "ch")) else "s")
    return f"{number} {noun if number == 1 else plural}"


# Processes that start the ranks themselves: one of them carries several ranks.
_LAUNCHER_ROLES = ("torchrun", "mpirun", "horovodrun")
_DASK_ROLES = (("scheduler", "scheduler"), ("dask-worker", "worker"), ("client", "client"))


def header_summary(plan: LaunchPlan, backend: str) -> str:
    """A job's header line: what it starts, where, on which backend, and the network
    interface chosen for it where one was: "4 ranks on 2 nodes (ssh), gloo over eth0 on
    node0, node1 (their hostnames resolve to 127.0.1.1)"."""
    choice = f", {plan.network_choice}" if plan.network_choice else ""
    return f"{launch_summary(plan)} ({backend}){choice}"


def launch_summary(plan: LaunchPlan) -> str:
    """What a job starts, in words: "4 ranks on 2 nodes", "4 ranks in 2 torchrun processes
    on 2 nodes", "4 tasks (1 chief, 2 workers, 1 ps) on 2 nodes", "1 scheduler and 4
    workers on 2 nodes"."""
    procs = plan.processes
    where = "on " + counted(len(plan.nodes), "node")
    roles = [p.role for p in procs]
    if plan.job_type == "tensorflow":
        kinds = ", ".join(counted(roles.count(r), r) for r in dict.fromkeys(roles))
        return f"{counted(len(procs), 'task')} ({kinds}) {where}"
    if plan.job_type == "dask":
        parts = [counted(roles.count(r), noun) for r, noun in _DASK_ROLES if r in roles]
        listed = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        return f"{listed} {where}"
    ranks = counted(plan.world_size, "rank")
    launchers = [r for r in roles if r in _LAUNCHER_ROLES]
    if not launchers:
        return f"{ranks} {where}"
    return f"{ranks} in {counted(len(launchers), launchers[0] + ' process')} {where}"
