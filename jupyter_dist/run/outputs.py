"""A job's outputs (the spec's `outputs:`, `${{outputs.NAME}}` in its command): where each
one is, and, when the job ends, a copy from every node that does not see this machine's
store into the store's job folder.

    where = output_places(plan, record_path)           # NAME -> where it is, in words
    notes = output_notes(plan, record_path)            # "outputs.NAME: where", each
    said = collect_outputs(plan, nodes, backend, record_path)   # at the job's end

An output without a `path` is written on each node into the job's folder there
(`outputs/NAME`, a folder; for uri_file a file `outputs/NAME`). On local nodes that folder
is the store's job folder itself, as on a Slurm cluster's shared filesystem: nothing to
copy. From nodes that do not see this machine's files (SSH, Ray) the
files are copied into `<store job>/outputs/<node>/NAME` (the files directly in the folder;
a subfolder stays on the node). An output with a `path` is where the spec says, on every
node, and is not copied. Everything copied is private (0600 in 0700).
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterable
from pathlib import Path

from jupyter_dist.backends.base import Backend
from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import LaunchPlan
from jupyter_dist.spec import OUTPUTS_FOLDER
from jupyter_dist.store import private_dir, write_atomic


def _sees_store(node: Node, plan: LaunchPlan, record_path: Path) -> bool:
    """Whether the node's job folder is the store's (local nodes)."""
    if not node.shares_files:
        return False
    return Path(node.workdir, plan.job_id).resolve() == record_path.resolve()


def output_places(plan: LaunchPlan, record_path: Path) -> dict[str, str]:
    """Each output's place, in words: its own path on every node; the store's job folder
    where the nodes see this machine's files (local nodes, a Slurm cluster's shared
    filesystem: the job's folder is the store's); else the job's folder on each node,
    copied into the store."""
    places = {}
    local = all(n.get("shares_files") for n in plan.nodes)
    for name, output in plan.outputs.items():
        if output.get("path"):
            places[name] = f"{output['path']} on each node (the spec's path)"
        elif local:
            places[name] = str(record_path / OUTPUTS_FOLDER / name)
        else:
            copies = record_path / OUTPUTS_FOLDER
            places[name] = (f"{OUTPUTS_FOLDER}/{name} in the job's folder on each node; "
                            f"copied into {copies}/<node>/{name} when the job ends")  # fmt: skip
    return places


def output_notes(plan: LaunchPlan, record_path: Path) -> list[str]:
    """`outputs.NAME: where` for each output, as the inspectors show them."""
    return [f"outputs.{name}: {place}" for name, place in output_places(plan, record_path).items()]


def collect_outputs(
    plan: LaunchPlan, nodes: Iterable[Node], backend: Backend, record_path: Path
) -> list[str]:
    """Copy each output without a path from every node that does not see the store into
    `<record_path>/outputs/<node>/NAME`; what was copied or could not be, one line each.
    Never raises: a node that cannot be reached is said so."""
    said: list[str] = []
    wanted = {n: o for n, o in plan.outputs.items() if not o.get("path")}
    for node in nodes if wanted else ():
        if _sees_store(node, plan, record_path):
            continue
        job_outputs = posixpath.join(node.workdir, plan.job_id, OUTPUTS_FOLDER)
        top: dict[str, bytes] | None = None  # the files directly in outputs/: read once
        for name, output in wanted.items():
            is_file = output.get("type") == "uri_file"
            try:
                if is_file:
                    top = backend.collect(node, job_outputs) if top is None else top
                    files = {name: top[name]} if name in top else {}
                else:
                    files = backend.collect(node, posixpath.join(job_outputs, name))
            except (DistrunError, OSError) as exc:
                said.append(f"outputs.{name}: not copied from {node.name}: {exc}")
                continue
            if not files:
                continue
            target = private_dir(private_dir(record_path / OUTPUTS_FOLDER) / node.name)
            if not is_file:
                target = private_dir(target / name)
            for file_name, data in files.items():
                with contextlib.suppress(OSError):
                    write_atomic(target / file_name, data)
            where = target / name if is_file else target
            said.append(f"outputs.{name}: {len(files)} file(s) from {node.name} in {where}")
    return said
