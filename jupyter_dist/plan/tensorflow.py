"""TensorFlow: one process per task, placed round-robin over nodes, each with TF_CONFIG."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from jupyter_dist.errors import SpecError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PlanContext, PortRequest
from jupyter_dist.plan.model import ProcessPlan
from jupyter_dist.spec import TensorFlowDistribution


@dataclass(frozen=True)
class Task:
    type: str  # chief, worker, ps, evaluator
    index: int
    node_rank: int
    slot: int  # how many tasks were placed on this node's host before this one

    @property
    def key(self) -> str:
        return f"tf-{self.type}-{self.index}"


def tasks(dist: TensorFlowDistribution, hosts: list[str]) -> list[Task]:
    """chief?, workers, ps, evaluator?, in that order, round-robin over the nodes (`hosts`,
    one per node). Slots count per host: local nodes share one machine and its ports."""
    num_nodes = len(hosts)
    placed: Counter[str] = Counter()
    out = []
    for k, (kind, index) in enumerate(dist.tasks(num_nodes)):
        node_rank = k % num_nodes
        out.append(Task(kind, index, node_rank, placed[hosts[node_rank]]))
        placed[hosts[node_rank]] += 1
    return out


def port_requests(dist: TensorFlowDistribution, nodes: list[Node]) -> list[PortRequest]:
    """A port per task: free ones, or with `base_port` that port plus the task's slot."""
    placed = tasks(dist, [n.host for n in nodes])
    if dist.base_port is not None:
        last = dist.base_port + max(t.slot for t in placed)
        if last > 65535:
            raise SpecError(
                f"base_port: {dist.base_port} leaves too few ports for the tasks on one "
                f"machine (up to {last}); choose at most {dist.base_port - (last - 65535)}"
            )
    return [
        PortRequest(
            t.key,
            t.node_rank,
            fixed=None if dist.base_port is None else dist.base_port + t.slot,
            setting="base_port",
        )
        for t in placed
    ]


def serving_roles(dist: TensorFlowDistribution) -> set[str]:
    """Task types that serve until stopped. Parameter servers never exit on their own; with
    a chief and parameter servers (ParameterServerStrategy) the chief is the coordinator and
    the workers serve too, so the job ends when the chief (and any evaluator) is done."""
    if not dist.parameter_server_count:
        return set()
    return {"ps", "worker"} if dist.chief_count else {"ps"}


def build(ctx: PlanContext, dist: TensorFlowDistribution) -> list[ProcessPlan]:
    all_tasks = tasks(dist, [n.host for n in ctx.nodes])
    serving = serving_roles(dist)
    address = {t: f"{ctx.nodes[t.node_rank].host}:{ctx.port(t.key)}" for t in all_tasks}
    cluster: dict[str, list[str]] = {}
    for t in all_tasks:
        if t.type != "evaluator":
            cluster.setdefault(t.type, []).append(address[t])
    world = sum(len(v) for v in cluster.values())
    procs = []
    for t in all_tasks:
        # An evaluator is not part of the training cluster: it sees only itself.
        task_cluster = {"evaluator": [address[t]]} if t.type == "evaluator" else cluster
        tf_config = {
            "cluster": task_cluster,
            "task": {"type": t.type, "index": t.index},
            "environment": "cloud",
        }
        label = t.type if t.type in ("chief", "evaluator") else f"{t.type} {t.index}"
        procs.append(
            ctx.process(
                t.node_rank,
                f"{t.type}-{t.index}",
                ctx.shell(ctx.command),
                {
                    **ctx.base_env(t.node_rank),
                    **dist.task_environment_variables.get(t.type, {}),
                    "TF_CONFIG": json.dumps(tf_config),
                },
                world,
                label=label,
                role=t.type,
                tf_config=tf_config,
                service=t.type in serving,
            )
        )
    return procs
