"""Free ports found on remote nodes by running node_side/ports.py there (as `python -c SOURCE`),
for any backend that can run a short command on a node (SSH, Slurm)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from jupyter_dist import node_side
from jupyter_dist.errors import DistrunError, NodeError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.context import PortRequest

PORTS_SOURCE = node_side.source("ports.py")  # run as it is on the nodes

# Runs argv on a node: (exit code, stdout, stderr).
RunOnNode = Callable[[Node, list[str]], tuple[int, str, str]]
# Calls work(node) for every node at once; the results in the nodes' order.
OnEveryNode = Callable[[list[Node], Callable[[Node], object]], list]


def ports_on_nodes(
    requests: list[PortRequest], nodes: list[Node], run: RunOnNode, on_every_node: OnEveryNode
) -> dict[str, int]:
    """A free port on its node for each request without a fixed one (key -> port); fixed
    ports checked free there (DistrunError naming the setting if not). Only the nodes that
    need ports are asked, all at once."""
    wanted: dict[str, list[PortRequest]] = {}  # node name -> its requests
    for request in requests:
        wanted.setdefault(nodes[request.node_rank].name, []).append(request)

    def on_node(node: Node) -> dict[str, int]:
        mine = wanted[node.name]
        free = [r for r in mine if r.fixed is None]
        fixed = {r.fixed: r for r in mine if r.fixed is not None}
        argv = [node.python, "-c", PORTS_SOURCE, str(len(free)), *map(str, fixed)]
        code, out, err = run(node, argv)
        if code != 0:
            raise NodeError(f"node {node.name}: could not find free ports: {err.strip()}")
        found, *taken = out.splitlines() or [""]
        for line in taken:
            port, _, reason = line.partition(" ")
            raise DistrunError(fixed[int(port)].taken_message(node, reason))
        return dict(zip((r.key for r in free), map(int, found.split()), strict=True))

    asked = [node for node in nodes if node.name in wanted]
    return {key: port for ports in on_every_node(asked, on_node) for key, port in ports.items()}


def on_every_node(nodes: list[Node], work: Callable[[Node], object]) -> list:
    """`work(node)` for every node at once; the results in the nodes' order (the first
    failure raised)."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        futures = [pool.submit(work, node) for node in nodes]
        return [f.result() for f in futures]
