"""azureml: an Azure ML command job (CLI v2 YAML) with its `distribution:`, which our own
loader reads back into the same job.

Azure ML starts the ranks itself and picks their ports, so what only says how jupyter-dist
would launch them (the torchrun launcher, a master port, TensorFlow's base port, the
horovodrun launcher: Horovod runs under Azure's MPI) and where (`backend`, `nodes`), or how
it watches them (`limits.stall_timeout`, `limits.on_stall`) is left out, listed in the
file's header. A setting that would change what runs (a Dask job, a TensorFlow chief or
evaluator, mpirun options) is an ExportError.
"""

from __future__ import annotations

from typing import Any

from jupyter_dist.code_folder import CodeFolder
from jupyter_dist.export.target import MARKER, ExportTarget, path_from, unsupported
from jupyter_dist.spec import JobSpec, dump_yaml

FORMAT = "azureml"
SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
# Distribution keys Azure ML has, per job type (the rest are ours).
AZURE_DISTRIBUTION = {
    "pytorch": ("type", "process_count_per_instance"),
    "tensorflow": ("type", "worker_count", "parameter_server_count"),
    "mpi": ("type", "process_count_per_instance"),
}
# Ours, and only about how jupyter-dist launches or watches the job: left out, and said so.
LAUNCH_ONLY = {"launcher", "launcher_limits", "master_port", "base_port"}
# Ours, and part of what the job runs: cannot be left out.
CHANGES_THE_JOB = {
    "chief_count": "Azure ML's TensorFlow jobs have workers and parameter servers only",
    "evaluator_count": "Azure ML's TensorFlow jobs have workers and parameter servers only",
    "mpi_args": "Azure ML starts mpirun itself and takes no options for it",
    "task_environment_variables": "Azure ML gives every task the job's variables",
}


def render(
    spec: JobSpec, target: ExportTarget, cell: str | None = None, code: CodeFolder | None = None
) -> str:
    """The manifest (a cell's code is the file beside it: `cell` is not needed)."""
    data = spec.to_dict()
    left_out: list[str] = []
    if spec.job_type not in AZURE_DISTRIBUTION:
        raise unsupported(
            FORMAT, f"distribution.type: {spec.job_type}", "Azure ML has no such distribution"
        )
    dist = dict(data.get("distribution") or {"type": spec.job_type})
    for key in list(dist):
        if key in AZURE_DISTRIBUTION[spec.job_type]:
            continue
        value = dist.pop(key)
        if key in CHANGES_THE_JOB and value:
            raise unsupported(FORMAT, f"distribution.{key}", CHANGES_THE_JOB[key])
        if key in LAUNCH_ONLY and value not in (None, "per_process", "mpirun"):
            left_out.append(f"distribution.{key}: {value}")
    data["distribution"] = dist
    for key in ("backend", "nodes", "name", "network_check"):
        value = data.pop(key, None)
        if key == "name" and value:  # Azure's `name` is the job's unique id: a display name
            data.setdefault("display_name", value)
        elif value:
            left_out.append(key)
    for name, output in (data.get("outputs") or {}).items():
        if spec.outputs[name].node_path is not None:  # ours: a folder on the nodes, not Azure's
            output.pop("path")
            left_out.append(f"outputs.{name}.path")
    resources = data.get("resources") or {}
    if resources.pop("gpus_per_node", None) is not None:  # Azure: the instance type's GPUs
        left_out.append("resources.gpus_per_node")
    limits = data.pop("limits", None) or {}
    for key in ("stall_timeout", "on_stall", "grace_period", "max_restarts", "restart_delay"):
        if limits.pop(key, None) is not None:
            left_out.append(f"limits.{key}")
    if limits:
        data["limits"] = limits
    if "environment" not in data:
        if not target.image:
            raise unsupported(
                FORMAT,
                "a job without an environment",
                "Azure ML runs every job in one; give --image IMAGE, or set environment: "
                "in the spec",
            )
        data["environment"] = {"image": target.image}
    if spec.code is not None:  # as a path from the manifest's folder, where Azure reads it
        data["code"] = path_from(target.folder, spec.code_dir())
    ordered: dict[str, Any] = {"$schema": data.pop("$schema", SCHEMA), "type": "command"}
    data.pop("type", None)
    ordered.update(data)
    header = [f"# {MARKER}{' from ' + target.source if target.source else ''}."]
    if left_out:
        header += [
            "# Left out, as jupyter-dist's own (Azure ML launches and places the ranks itself):",
            f"# {', '.join(left_out)}.",
        ]
    body = dump_yaml(ordered)
    return "\n".join(header) + "\n" + body
