"""Backends by name: the ones shipped here, and any that a package adds through the
`jupyter_dist.backends` entry-point group, e.g. in its pyproject.toml:

    [project.entry-points."jupyter_dist.backends"]
    mycluster = "my_package.backend:MyClusterBackend"

The class implements `jupyter_dist.backends.base.Backend`; `--backend mycluster` picks it.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from jupyter_dist.backends.base import Backend, ProcessHandle
from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Node

ENTRY_POINT_GROUP = "jupyter_dist.backends"

# name -> "module:Class"; imported when chosen (paramiko only when SSH nodes need it).
BUILTIN = {
    "local": "jupyter_dist.backends.local:LocalBackend",
    "ssh": "jupyter_dist.backends.ssh:SshBackend",
}


def available() -> dict[str, str]:
    """Every backend name with where it comes from ("module:Class")."""
    found = dict(BUILTIN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, point.value)
    return found


def backend_class(name: str) -> type[Backend]:
    """The backend called `name`; DistrunError naming the valid ones if there is none."""
    where = available().get(name)
    if where is None:
        valid = ", ".join(sorted(available()))
        raise DistrunError(f"unknown backend {name!r}; valid backends: {valid}")
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def backend_for(nodes: list[Node]) -> Backend:
    """The backend the nodes were given for (the inventory's kind: local or ssh)."""
    kinds = {n.transport for n in nodes}
    if len(kinds) != 1:
        raise DistrunError(f"a job cannot mix nodes of kinds {', '.join(sorted(kinds))}")
    return backend_class(kinds.pop())()


__all__ = ["Backend", "ProcessHandle", "available", "backend_class", "backend_for"]
