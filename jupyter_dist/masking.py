"""Secret-looking variables (tokens, keys, passwords) are shown masked in every view of a
job (dry run, `plan`, the REST API and so the sidebar); the processes still get them, and
the store (private to its owner) keeps them.

A name is secret when it matches one of the patterns (shell globs, any case): by default
*TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *PASSWD*, *CREDENTIAL*; `DISTRUN_SECRET_NAMES`
(comma-separated globs) replaces them.

A secret value is masked wherever it appears in a text: as written, as a shell quotes it
(`'aws'"'"'s'`), as JSON escapes it, and after `NAME=` for a secret NAME even where no
variable holds it (`command: HF_TOKEN=hf_x python train.py`). One `Masker` per plan or spec
masks every text of it in one pass each.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_PATTERNS = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*")
MASK = "****"
_SHORTEST = 3  # a shorter value is masked in free text only as a word of its own
# NAME=VALUE in free text: the value quoted as a shell writes it, or up to a blank.
_ASSIGNMENT = re.compile(r"""\b([A-Za-z_][A-Za-z0-9_]*)=('(?:[^']|'"'"')*'|"[^"]*"|[^\s'"]+)""")


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
    return sorted(found, key=len, reverse=True)


class Masker:
    """Masks secret values in texts: `Masker(values)(text)`. Made once (one pattern for
    every value and the forms quoting gives it), so masking each of N commands costs N
    passes, not N times every value."""

    def __init__(self, values: Iterable[str]):
        forms: set[str] = set()
        for value in values:
            if value:
                forms |= {
                    value,
                    shlex.quote(value),
                    value.replace("'", "'\"'\"'"),
                    json.dumps(value)[1:-1],
                }
        ordered = sorted(forms, key=len, reverse=True)  # the longest form wins
        parts = [
            re.escape(form) if len(form) >= _SHORTEST else rf"(?<!\w){re.escape(form)}(?!\w)"
            for form in ordered
        ]
        self._values = re.compile("|".join(parts)) if parts else None

    def __call__(self, text: str) -> str:
        if self._values is not None:
            text = self._values.sub(MASK, text)
        return _ASSIGNMENT.sub(_masked_assignment, text)


def _masked_assignment(found: re.Match[str]) -> str:
    return f"{found.group(1)}={MASK}" if is_secret(found.group(1)) else found.group(0)


def masked_spec(data: Mapping[str, Any]) -> dict[str, Any]:
    """A spec mapping with its environment_variables masked, and their secret values
    wherever else they appear (the command, inputs)."""
    env = data.get("environment_variables")
    env = env if isinstance(env, Mapping) else {}
    out = _mask_strings(data, Masker(secret_values([env])))  # a copy: new mappings, lists
    if env:
        out["environment_variables"] = masked_env(env)
    return out


def _mask_strings(value: Any, masker: Masker) -> Any:
    if isinstance(value, str):
        return masker(value)
    if isinstance(value, Mapping):
        return {key: _mask_strings(item, masker) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask_strings(item, masker) for item in value]
    return value


def masked_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan mapping (plan.json) with each process's secret variables masked, in its env
    and wherever their values appear in its argv."""
    out = copy.deepcopy(dict(plan))
    procs = [p for p in out.get("processes", []) if isinstance(p, dict)]
    envs = [p["env"] for p in procs if isinstance(p.get("env"), Mapping)]
    masker = Masker(secret_values(envs))
    for proc in procs:
        if isinstance(proc.get("env"), Mapping):
            proc["env"] = masked_env(proc["env"])
        if isinstance(proc.get("argv"), list):
            proc["argv"] = [masker(str(arg)) for arg in proc["argv"]]
    return out
