"""Starting a job's processes, outside the state machine: every process of a plan at once
(each backend's start is a round trip to its node: SSH's overlap), all attempted before the
first failure is raised, so that whoever started them knows each one to stop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from jupyter_dist.backends.base import Backend, ProcessHandle
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import ProcessPlan

MAX_AT_ONCE = 16


def start_all(
    backend: Backend,
    procs: list[ProcessPlan],
    nodes: dict[str, Node],
    grace: float,
    started: list[tuple[ProcessPlan, ProcessHandle]],
) -> None:
    """`backend.start` for every process of `procs` on its node (`nodes`, by name) at once,
    at most MAX_AT_ONCE at a time. Each one that started is added to `started`, in plan
    order; once all were tried, the first failure is raised."""
    with ThreadPoolExecutor(max_workers=min(MAX_AT_ONCE, len(procs))) as pool:
        futures = [pool.submit(backend.start, p, nodes[p.node], grace) for p in procs]
    failures = []
    for proc, future in zip(procs, futures, strict=True):
        error = future.exception()
        if error is None:
            started.append((proc, future.result()))
        else:
            failures.append(error)
    if failures:
        raise failures[0]
