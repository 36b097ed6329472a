"""Nodes a job runs on. With no inventory, every node is this machine (a local "node")."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from jupyter_dist.errors import NodeError
from jupyter_dist.validation import (
    Port,
    StrictSection,
    YamlTooBig,
    count,
    load_yaml,
    one_line,
    read_yaml_file,
)

LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class SshAccess:
    """How the SSH backend reaches an inventory node: the inventory file's SSH settings."""

    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: str = "strict"  # or "accept-new"


@dataclass(frozen=True)
class Node:
    """One machine (or, for local nodes, one node rank on this machine): what every backend
    knows of a node, plus `access`, which only the node's own backend reads."""

    name: str
    host: str  # the address the other nodes reach it at (MASTER_ADDR when it is node 0)
    backend: str = "local"  # the backend whose node it is: local, ssh, slurm, ...
    python: str = "python3"
    workdir: str = ""  # scratch folder for job files; "~" is resolved on the node
    cwd: str | None = None  # where processes run when the spec has no `code`
    gpus: int | None = None
    cpus: int | None = None  # the cores its processes may use (local nodes: this machine's)
    # The node sees this machine's files at the same paths (local nodes; a cluster's shared
    # filesystem): code runs in place, nothing is shipped.
    shares_files: bool = False
    access: Any = None  # e.g. SshAccess for an inventory node
    # What the backend's preflight read on the node (python and torch versions, its NCCL_*
    # and GLOO_* variables), for the plan to compare between nodes; None: not read.
    software: dict[str, Any] | None = None


def local_nodes(count: int, workdir: Path | str, cwd: Path | str | None = None) -> list[Node]:
    """`count` local nodes: each is this machine with its own node rank (and all of its
    GPUs: the plan's checks count the ranks of every local node against them)."""
    return [
        Node(
            name=f"local{i}",
            host=LOCAL_HOST,
            python=sys.executable,
            workdir=str(workdir),
            cwd=str(cwd or os.getcwd()),
            gpus=this_machines_gpus(),
            cpus=len(os.sched_getaffinity(0)),
            shares_files=True,
        )
        for i in range(count)
    ]


@functools.cache
def this_machines_gpus() -> int | None:
    """The GPUs `nvidia-smi -L` lists here, read once per process; None without nvidia-smi
    or where it fails (no driver). The SSH preflight reads a node's the same way."""
    program = shutil.which("nvidia-smi")
    if not program:
        return None
    try:
        listed = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


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


DEFAULT_WORKDIR = "~/.distrun"


_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class NodeEntry(StrictSection):
    """One node of the inventory file, as the user writes it."""

    name: str
    host: str
    port: Port = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    python: str = "python3"
    workdir: str = DEFAULT_WORKDIR
    gpus: count(0) | None = None

    @field_validator("name", "host")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip() or any(c.isspace() for c in value):
            raise ValueError("expected a non-empty word without spaces")
        return value

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str) -> str:
        """A node's name names folders (its copied outputs in the store): a word of
        letters, digits, '.', '-' and '_', never '.' or '..' or a path."""
        if not _NODE_NAME.fullmatch(value) or value in (".", ".."):
            raise ValueError(
                "expected a name of letters, digits, '.', '-' and '_' (at most 64), not a path"
            )
        return value

    def to_node(self) -> Node:
        home = os.path.expanduser
        return Node(
            name=self.name,
            host=self.host,
            backend="ssh",
            python=self.python,
            workdir=self.workdir,
            gpus=self.gpus,
            access=SshAccess(
                port=self.port,
                user=self.user,
                key_file=home(self.key_file) if self.key_file else None,
                known_hosts=home(self.known_hosts) if self.known_hosts else None,
                host_key_policy=self.host_key_policy,
            ),
        )


class InventoryFile(StrictSection):
    nodes: list[NodeEntry] = Field(default_factory=list)


def default_inventory_path() -> Path:
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir()) / "distrun" / "nodes.yml"


def inventory_path(explicit: str | Path | None = None) -> Path | None:
    """`--nodes-file`, else $DISTRUN_NODES_FILE, else the default file if it exists.

    A file named explicitly (either way) must exist; None means local nodes."""
    named = explicit or os.environ.get("DISTRUN_NODES_FILE")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            how = "--nodes-file" if explicit else "DISTRUN_NODES_FILE"
            what = "is not a file" if path.exists() else "does not exist"
            raise NodeError(f"node inventory {path} (from {how}) {what}")
        return path
    default = default_inventory_path()
    return default if default.is_file() else None


def load_inventory(explicit: str | Path | None = None) -> Inventory:
    """The node inventory; with no file, local nodes."""
    path = inventory_path(explicit)
    if path is None:
        return Inventory()
    try:
        data = load_yaml(read_yaml_file(path))
    except YamlTooBig as exc:
        raise NodeError(f"{path}: {exc}") from None
    except UnicodeDecodeError:
        raise NodeError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise NodeError(f"{path}: not valid YAML{where}") from None
    except OSError as exc:
        raise NodeError(f"{path}: cannot read it ({exc.strerror})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise NodeError(f"{path}: expected a mapping with a 'nodes:' list")
    try:
        parsed = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise NodeError(f"{path}: {one_line(exc)}") from None
    names = [entry.name for entry in parsed.nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NodeError(f"{path}: node name {twice[0]!r} is used twice")
    return Inventory(nodes=tuple(entry.to_node() for entry in parsed.nodes), source=str(path))
