"""Backends by name: the ones shipped here, and any that a package adds through the
`jupyter_dist.backends` entry-point group, e.g. in its pyproject.toml:

    [project.entry-points."jupyter_dist.backends"]
    mycluster = "my_package.backend:MyClusterBackend"

The class implements `jupyter_dist.backends.base.Backend`; `--backend mycluster` picks it,
and the launch options it declares (`Backend.options`) are offered by every front.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping
from importlib.metadata import entry_points

from jupyter_dist.backends.base import Backend, NodeHealth, ProcessHandle
from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Inventory
from jupyter_dist.options import OPTIONS, Option

ENTRY_POINT_GROUP = "jupyter_dist.backends"

# name -> "module:Class"; imported when chosen (paramiko only when SSH nodes need it).
BUILTIN = {
    "local": "jupyter_dist.backends.local:LocalBackend",
    "ssh": "jupyter_dist.backends.ssh:SshBackend",
    "slurm": "jupyter_dist.backends.slurm:SlurmBackend",
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


@functools.cache
def declared_options() -> tuple[Option, ...]:
    """Every launch option: those every job has (options.OPTIONS), then each backend's own
    (`Backend.options`), in the registry's order. What the magic, the CLI and the form
    offer. A backend that cannot be imported offers none (choosing it says why)."""
    found = list(OPTIONS)
    for name in available():
        try:
            own = backend_class(name).options
        except Exception:  # a broken entry point must not take every front down with it
            continue
        found += [option for option in own if option.backend == name]
    return tuple(found)


def choose_backend(
    inventory: Inventory, name: str | None = None, environ: Mapping[str, str] = os.environ
) -> Backend:
    """The backend a job runs on: the one named (`--backend`); else, inside a Slurm
    allocation (SLURM_JOB_ID set), its nodes; else the inventory's SSH nodes, or local nodes
    when there is no inventory."""
    if name:
        return backend_class(name)()
    if environ.get("SLURM_JOB_ID"):
        return backend_class("slurm")()
    return backend_class("local" if inventory.is_local else "ssh")()


def inventory_backend(inventory: Inventory) -> Backend:
    """The backend the inventory's nodes belong to (ssh; local with no inventory): the one
    that checks them and trusts them (`jupyter distrun nodes`, the sidebar)."""
    return backend_class(inventory.nodes[0].backend if inventory.nodes else "local")()


__all__ = [
    "Backend", "NodeHealth", "ProcessHandle", "available", "backend_class", "choose_backend",
    "declared_options", "inventory_backend",
]  # fmt: skip
