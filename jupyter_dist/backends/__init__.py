"""Backends by name: the ones shipped here, and any that a package adds through the
`jupyter_dist.backends` entry-point group, e.g. in its pyproject.toml:

    [project.entry-points."jupyter_dist.backends"]
    mycluster = "my_package.backend:MyClusterBackend"

The class implements `jupyter_dist.backends.base.Backend`; `--backend mycluster` picks it,
and the launch options it declares (`Backend.options`) are offered by every front.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import re
from collections.abc import Mapping
from importlib.metadata import entry_points

from jupyter_dist.backends.base import Backend, NodeHealth, ProcessHandle
from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.nodes import Inventory
from jupyter_dist.options import OPTIONS, Option
from jupyter_dist.spec import BackendSection

ENTRY_POINT_GROUP = "jupyter_dist.backends"

# name -> "module:Class"; imported when chosen (paramiko only when SSH nodes need it).
BUILTIN = {
    "local": "jupyter_dist.backends.local:LocalBackend",
    "ssh": "jupyter_dist.backends.ssh:SshBackend",
    "slurm": "jupyter_dist.backends.slurm:SlurmBackend",
    "ray": "jupyter_dist.backends.ray:RayBackend",
}


@functools.cache  # each call read every installed package's entry points: 25 ms a call
def available() -> dict[str, str]:
    """Every backend name with where it comes from ("module:Class"): the built-in ones,
    then the installed packages' (read once a process, as their options are)."""
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


def check_section(section: BackendSection) -> None:
    """The spec's `backend:` keys against the options its backend declares (their
    `spec_key`s): a key it does not declare, or a value of the wrong kind, is SpecError in
    one line naming what is valid."""
    declared = {
        option.spec_key or option.name: option for option in backend_class(section.type).options
    }
    typed = {k for k in section.model_fields_set if k in type(section).model_fields}
    written = {key: getattr(section, key) for key in typed - {"type"}}
    written.update(section.model_extra or {})
    for key, value in written.items():
        option = declared.get(key)
        if option is None:
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            valid = ", ".join(declared) or "none"
            raise SpecError(
                f"backend: {key!r} is not an option of the {section.type} "
                f"backend{hint}; its options: {valid}"
            )
        low, high = option.bounds or (None, None)
        if option.kind == "int" and not (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (low is None or low <= value <= high)
        ):
            within = f" from {low} to {high}" if low is not None else ""
            raise SpecError(f"backend: {key}: expected a whole number{within} ({option.flag})")
        if option.kind == "str" and not isinstance(value, str):
            raise SpecError(f"backend: {key}: expected a string ({option.flag})")
        if option.pattern and not re.fullmatch(option.pattern, value):
            raise SpecError(
                f"backend: {key}: {value!r} is not valid; expected {option.expects} ({option.flag})"
            )
        if option.kind == "flag" and not isinstance(value, bool):
            raise SpecError(f"backend: {key}: expected true or false ({option.flag})")


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
    "Backend",
    "NodeHealth",
    "ProcessHandle",
    "available",
    "backend_class",
    "check_section",
    "choose_backend",
    "declared_options",
    "inventory_backend",
]
