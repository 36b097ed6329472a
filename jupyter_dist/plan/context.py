"""What every job type's planner shares: the nodes, the ports, the base environment."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import MpiLaunch, ProcessPlan
from jupyter_dist.spec import JobSpec

SHELL = "/bin/sh"


@dataclass(frozen=True)
class PortRequest:
    """A port the job needs on one node: a free one the runner finds before planning, or
    the spec's own (`fixed`, from the spec key `setting`), checked free so that a taken
    port fails at once with a clear error instead of a hang."""

    key: str
    node_rank: int
    fixed: int | None = None
    setting: str = ""

    def taken_message(self, node: Node, reason: str) -> str:
        return (
            f"{self.setting}: port {self.fixed} on node {node.name} ({node.host}) is {reason}; "
            f"choose another port, or leave {self.setting} out for a free one"
        )


def _shell_path(path: str) -> str:
    """A path for the shell: quoted, with a leading ${DISTRUN_JOB_DIR} left to expand."""
    variable = "${DISTRUN_JOB_DIR}"
    if path.startswith(variable):
        return f'"{variable}"{shlex.quote(path[len(variable) :]) if path != variable else ""}'
    return shlex.quote(path)


def plain_mpi_launch(ctx: PlanContext) -> MpiLaunch:
    """mpirun with the hostfile and nothing more: every node is this machine."""
    return MpiLaunch()


@dataclass(frozen=True)
class PlanContext:
    spec: JobSpec
    nodes: list[Node]
    job_id: str
    ports: Mapping[str, int]
    # The backend's part of an MPI launch (Backend.mpi_launch): how mpirun reaches the nodes.
    mpi_launch: Callable[[PlanContext], MpiLaunch] = plain_mpi_launch
    restart_count: int = 0  # how many times the job started again after a failure

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def master_addr(self) -> str:
        return self.nodes[0].host

    @property
    def command(self) -> str | None:
        return self.spec.resolved_command()

    def port(self, key: str) -> int:
        return self.ports[key]

    def job_dir(self, node: Node) -> str:
        """The job's scratch folder on a node (generated files, launcher logs)."""
        return posixpath.join(node.workdir, self.job_id)

    def cwd(self, node: Node) -> str:
        code = self.spec.code_dir()
        if code is not None:
            return str(code) if node.shares_files else posixpath.join(self.job_dir(node), "code")
        return node.cwd or self.job_dir(node)

    def base_env(self, node_rank: int) -> dict[str, str]:
        """What every process gets, before its type-specific variables."""
        wait = self.spec.post_mortem_wait()
        return {
            "DISTRUN_JOB_ID": self.job_id,
            "DISTRUN_JOB_DIR": self.job_dir(self.nodes[node_rank]),
            "DISTRUN_NODE_RANK": str(node_rank),
            "DISTRUN_NUM_NODES": str(self.num_nodes),
            # Both, so that a script written for torchrun's restarts reads ours unchanged.
            "DISTRUN_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "PYTHONUNBUFFERED": "1",
            # A rank that raises pauses for the debugger this long (node_side/debugger.py).
            **({"DISTRUN_POST_MORTEM": str(wait)} if wait else {}),
            # Python ranks fork from each node's pool of these (node_side/pool_server.py).
            **self.spec.preload_env(),
            **self.spec.environment_variables,
        }

    def shell(self, command: str) -> list[str]:
        """The command as a shell runs it; first, where the job has outputs, their folders
        made (private: the job's folder is; a path the spec gives is made too)."""
        folders = [out.folder(name) for name, out in self.spec.outputs.items()]
        if folders:
            made = " ".join(_shell_path(folder) for folder in dict.fromkeys(folders))
            command = f"(umask 077 && mkdir -p -- {made}) || exit 1\n{command}"
        return [SHELL, "-c", command]

    def process(
        self,
        node_rank: int,
        name: str,
        argv: list[str],
        env: dict[str, str],
        world_size: int,
        label: str | None = None,
        role: str | None = None,
        **details: Any,
    ) -> ProcessPlan:
        """One process on the node of rank `node_rank`: where it runs (node, host, working
        folder) comes from that node; `label` and `role` default to `name`; `details` are
        the rest of ProcessPlan's fields (rank, local_rank, ranks, line_tags, service, ...)."""
        node = self.nodes[node_rank]
        return ProcessPlan(
            name=name,
            label=label or name,
            role=role or name,
            node=node.name,
            node_rank=node_rank,
            host=node.host,
            argv=argv,
            env=env,
            cwd=self.cwd(node),
            world_size=world_size,
            **details,
        )
