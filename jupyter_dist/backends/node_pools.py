"""The nodes' pools (node_side/pool_server.py): listed and stopped by running
node_side/pool_protocol.py on each node (as `python -c SOURCE list|stop`), for any backend
that can run a short command on a node. Local nodes are this machine: one look serves them
all. A Slurm allocation's nodes are looked at as job steps (`pools_in_allocation`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from jupyter_dist import node_side
from jupyter_dist.backends import Backend, inventory_backend
from jupyter_dist.backends.node_ports import on_every_node
from jupyter_dist.errors import NodeError
from jupyter_dist.nodes import Inventory, Node, local_nodes

POOL_SOURCE = node_side.source("pool_protocol.py")  # run as it is on the nodes
ACTIONS = ("list", "stop")


@dataclass(frozen=True)
class NodePools:
    """One node's answer: its pools (pool_protocol.py's `list_pools` rows), or why none came."""

    node: str
    pools: list[dict]
    problem: str | None = None


def pools_on_nodes(
    inventory: Inventory, action: str, names: list[str] | None = None
) -> list[NodePools]:
    """`action` ("list" or "stop") on every node of `inventory` (or those `names` picks; the
    local machine where it has none), all at once; never raises for a node that fails."""
    backend: Backend = inventory_backend(inventory)
    if inventory.is_local:
        if names:
            raise NodeError(
                "no node inventory: jobs run on local nodes, whose pools are this "
                "machine's (leave out the node names)"
            )
        nodes = local_nodes(1, workdir="")
    else:
        nodes = inventory.select(len(names or inventory.nodes), names, workdir="")
    return _on_nodes(backend, nodes, action, "this machine" if inventory.is_local else None)


def pools_for_jobs(
    inventory: Inventory, action: str, names: list[str] | None = None, environ=os.environ
) -> list[NodePools]:
    """`action` on the nodes a job runs on by default (backends.choose_backend): inside a
    Slurm allocation (SLURM_JOB_ID set), its nodes; else the inventory's, or this machine."""
    if environ.get("SLURM_JOB_ID"):
        return pools_in_allocation(environ["SLURM_JOB_ID"], action, names)
    return pools_on_nodes(inventory, action, names)


def pools_in_allocation(
    job_id: str, action: str, names: list[str] | None = None
) -> list[NodePools]:
    """`action` on every node of Slurm allocation `job_id` ("": SLURM_JOB_ID's), or those
    `names` picks: the pools a job that preloads modules holds there as steps of their own
    (backends/slurm.py). Outside an allocation, one answer with the problem."""
    from jupyter_dist.backends.slurm import SlurmBackend  # only where asked: Slurm's module

    backend = SlurmBackend(job_id)
    try:
        nodes = backend.allocation_nodes(names)
    except NodeError as exc:  # no allocation, or a node not in it: one answer says why
        return [NodePools("slurm", [], str(exc).removeprefix("slurm: "))]
    return _on_nodes(backend, nodes, action)


def _on_nodes(
    backend: Backend, nodes: list[Node], action: str, shown_as: str | None = None
) -> list[NodePools]:
    """pool_protocol.py's `action` on each node through `backend`, all at once."""
    if action not in ACTIONS:
        raise ValueError(f"no pool action {action!r}; they are {', '.join(ACTIONS)}")

    def on_node(node) -> NodePools:
        name = shown_as or node.name
        try:
            code, out, err = backend.run_on_node(node, [node.python, "-c", POOL_SOURCE, action], 30)
        except NodeError as exc:
            return NodePools(name, [], str(exc))
        if code != 0:
            return NodePools(name, [], (err.strip() or f"exit {code}").splitlines()[-1])
        try:
            return NodePools(name, json.loads(out))
        except ValueError:
            return NodePools(name, [], f"unreadable answer: {out[:200]!r}")

    return on_every_node(nodes, on_node)
