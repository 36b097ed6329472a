"""What every node runs, as one template: schedulers that start the same command on every
node (a JobSet's pods, a SkyPilot task's nodes, a PyTorchJob's replicas) tell each node
its index in a variable of their own, and nothing else. So the plan's process on each
node must differ from the others' only by that index (`--node-rank 1`, `NODE_RANK=1`, a
folder `torchrun-1`, TF_CONFIG's `"index": 1`): those values become the placeholder
`@@distrun:index@@`, and anything else that differs is an ExportError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jupyter_dist.export.symbolic import placeholder
from jupyter_dist.export.target import unsupported
from jupyter_dist.plan.model import LaunchPlan

INDEX = placeholder("index")


@dataclass(frozen=True)
class NodeTemplate:
    """The process every node runs (node 0's, with its index as `INDEX`)."""

    argv: list[str]
    env: dict[str, str]
    label: str


def node_template(planned: LaunchPlan, fmt: str, why: str) -> NodeTemplate:
    """One process per node, made one template; `why` says what `fmt` needs, for the error
    when the job is not one process per node."""
    procs = sorted(planned.processes, key=lambda p: p.node_rank)
    if [p.node_rank for p in procs] != list(range(len(planned.nodes))):
        raise unsupported(fmt, f"a {planned.job_type} job of {len(procs)} processes", why)
    if len({len(p.argv) for p in procs}) > 1 or len({tuple(p.env) for p in procs}) > 1:
        raise unsupported(fmt, "this job", "its nodes run different commands")
    argv = [_merged([p.argv[i] for p in procs], fmt) for i in range(len(procs[0].argv))]
    env = {name: _merged([p.env[name] for p in procs], fmt, name) for name in procs[0].env}
    return NodeTemplate(argv, env, procs[0].label)


def _merged(values: list[str], fmt: str, name: str = "the command") -> str:
    """One value for every node: the same, or the same around each node's own index."""
    if len(set(values)) == 1:
        return values[0]
    # Character by character, on purpose: these are any strings, not paths.
    head = os.path.commonprefix(values).rstrip("0123456789")  # noqa: RUF071
    tail = os.path.commonprefix([v[len(head) :][::-1] for v in values])[::-1]  # noqa: RUF071
    tail = tail.lstrip("0123456789")
    middles = [v[len(head) : len(v) - len(tail)] for v in values]
    if middles != [str(n) for n in range(len(values))]:
        raise unsupported(fmt, name, "it differs between nodes by more than the node's index")
    return head + INDEX + tail
