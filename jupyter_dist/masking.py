"""Secret-looking variables (tokens, keys, passwords) are shown masked in every view of a
job (dry run, `plan`, the REST API and so the sidebar); the processes still get them, and
the store (private to its owner) keeps them.

A name is secret when it matches one of the patterns (shell globs, any case): by default
*TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *PASSWD*, *CREDENTIAL*; `DISTRUN_SECRET_NAMES`
(comma-separated globs) replaces them.
"""

from __future__ import annotations

import copy
import fnmatch
import os
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_PATTERNS = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*")
MASK = "****"
_SHORTEST = 3  # a shorter value is masked where it is a variable's value, not in free text


def patterns() -> tuple[str, ...]:
    given = os.environ.get("DISTRUN_SECRET_NAMES")
    if given is None:
        return DEFAULT_PATTERNS
    return tuple(p.strip() for p in given.split(",") if p.strip())


def is_secret(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), p.upper()) for p in patterns())


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the values of secret names replaced by MASK."""
    return {name: MASK if is_secret(name) else value for name, value in env.items()}


def secret_values(envs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The values of secret names in these environments, longest first."""
    found = {str(v) for env in envs for k, v in env.items() if is_secret(k) and v}
    return sorted((v for v in found if len(v) >= _SHORTEST), key=len, reverse=True)


def mask_text(text: str, values: Iterable[str]) -> str:
    """`text` (a command line) with every secret value in it replaced by MASK."""
    for value in values:
        text = text.replace(value, MASK)
    return text


def masked_spec(data: Mapping[str, Any]) -> dict[str, Any]:
    """A spec mapping with its environment_variables masked."""
    out = dict(data)
    if isinstance(out.get("environment_variables"), Mapping):
        out["environment_variables"] = masked_env(out["environment_variables"])
    return out


def masked_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan mapping (plan.json) with each process's secret variables masked, in its env
    and wherever their values appear in its argv."""
    out = copy.deepcopy(dict(plan))
    procs = [p for p in out.get("processes", []) if isinstance(p, dict)]
    values = secret_values(p.get("env") or {} for p in procs)
    for proc in procs:
        if isinstance(proc.get("env"), Mapping):
            proc["env"] = masked_env(proc["env"])
        if isinstance(proc.get("argv"), list):
            proc["argv"] = [mask_text(str(arg), values) for arg in proc["argv"]]
    return out
