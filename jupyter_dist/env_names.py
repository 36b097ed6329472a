"""The variables a job may give its processes: what a name must look like, and the names
jupyter-dist sets itself (a spec may not). Shared by the spec (spec.py) and the proposal's
dialect (spec_dialect.py)."""

from __future__ import annotations

import re
from typing import Any

from jupyter_dist.validation import fail

# Names jupyter-dist sets for every process; a spec may not set them itself.
RESERVED_ENV: dict[str, str] = {
    name: "set by jupyter-dist for every rank"
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "TF_CONFIG",
        "AZ_BATCH_MASTER_NODE",
        "AZUREML_MPI_HOSTFILE",
        "DASK_SCHEDULER_ADDRESS",
        "PYTHONUNBUFFERED",
        "TORCHELASTIC_RESTART_COUNT",
    )
}
RESERVED_ENV["MASTER_PORT"] = "use distribution.master_port to choose it"
RESERVED_ENV_PREFIXES = ("DISTRUN_", "OMPI_COMM_WORLD_")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def environment_variables(value: Any) -> dict[str, str]:
    """A mapping of variable names to values, as a process gets it (each value a string);
    a name that is not one, or that jupyter-dist sets itself, is a one-line error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail("mapping", "expected a mapping of variable names to strings")
    clean: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise fail(
                "env_name",
                "{name!r} is not a valid variable name (letters, digits, _; not first a digit)",
                name=name,
            )
        reason = RESERVED_ENV.get(name) or (
            "set by jupyter-dist" if name.startswith(RESERVED_ENV_PREFIXES) else None
        )
        if reason:
            raise fail("env_reserved", "{name} cannot be set here: {why}", name=name, why=reason)
        if isinstance(item, bool):
            raise fail(
                "env_value",
                "{name}={item!r}: expected a string value (YAML reads unquoted "
                "true/yes/on as a boolean: quote it)",
                name=name,
                item=item,
            )
        if not isinstance(item, str | int | float):
            raise fail(
                "env_value", "{name}={item!r}: expected a string value", name=name, item=item
            )
        clean[name] = str(item)
    return clean
