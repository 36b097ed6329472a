"""Nodes a job runs on. With no inventory, every node is this machine (a local "node")."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_dist.errors import NodeError

LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class Node:
    """One machine (or, for local nodes, one node rank on this machine)."""

    name: str
    host: str
    transport: str = "local"  # "local" or "ssh"
    python: str = "python3"
    workdir: str = ""  # scratch folder for a job's generated files
    cwd: str | None = None  # where processes run when the spec has no `code`
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: str = "strict"
    gpus: int | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_local(self) -> bool:
        return self.transport == "local"


def local_nodes(count: int, workdir: Path | str, cwd: Path | str | None = None) -> list[Node]:
    """`count` local nodes: each is this machine with its own node rank."""
    return [
        Node(
            name=f"local{i}",
            host=LOCAL_HOST,
            python=sys.executable,
            workdir=str(workdir),
            cwd=str(cwd or os.getcwd()),
        )
        for i in range(count)
    ]


@dataclass(frozen=True)
class Inventory:
    """The nodes attached to the notebook; `nodes` empty means local nodes on demand."""

    nodes: tuple[Node, ...] = ()
    source: str | None = None

    @property
    def is_local(self) -> bool:
        return not self.nodes

    def select(
        self,
        count: int,
        names: list[str] | None,
        workdir: Path | str,
        cwd: Path | str | None = None,
    ) -> list[Node]:
        """The nodes for a job: the named ones, else the first `count`."""
        if self.is_local:
            if names:
                known = [n.name for n in local_nodes(count, workdir, cwd)]
                unknown = [n for n in names if n not in known]
                if unknown:
                    raise NodeError(
                        f"node {unknown[0]!r} is not attached (no node inventory; local nodes "
                        f"are {', '.join(known)})"
                    )
            return local_nodes(count, workdir, cwd)
        by_name = {n.name: n for n in self.nodes}
        if names:
            missing = [n for n in names if n not in by_name]
            if missing:
                raise NodeError(
                    f"node {missing[0]!r} is not in {self.source or 'the node inventory'} "
                    f"(nodes: {', '.join(by_name)})"
                )
            return [by_name[n] for n in names]
        if count > len(self.nodes):
            raise NodeError(
                f"the job asks for {count} nodes but {self.source or 'the node inventory'} "
                f"has {len(self.nodes)} ({', '.join(by_name)})"
            )
        return list(self.nodes[:count])
