"""skypilot: a SkyPilot task (`sky launch TASK.yaml`): `num_nodes`, `resources`, the code
as its `workdir`, the spec's variables as its `envs`, and a `run` script that every node
runs. The script reads the node's index and the nodes' addresses from what SkyPilot sets
(SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS) and starts what jupyter-dist's plan starts there:
one torchrun per node for PyTorch (so every rank gets the same variables as under
jupyter-dist), one TensorFlow task per node, mpirun on node 0 for MPI.
"""

from __future__ import annotations

from jupyter_dist.code_folder import CodeFolder
from jupyter_dist.export.pernode import node_template
from jupyter_dist.export.symbolic import shell_word, symbolic_plan
from jupyter_dist.export.target import MARKER, ExportTarget, path_from, unsupported
from jupyter_dist.plan.model import LaunchPlan
from jupyter_dist.spec import JobSpec, dump_yaml

FORMAT = "skypilot"
# Where the job's scratch folders go on a node, and its id.
VARIABLES = {"here": "HOME", "job": "SKYPILOT_TASK_ID", "index": "SKYPILOT_NODE_RANK"}


def render(
    spec: JobSpec, target: ExportTarget, cell: str | None = None, code: CodeFolder | None = None
) -> str:
    """The manifest (a cell's code is the file beside it: `cell` is not needed)."""
    if spec.job_type == "dask":
        raise unsupported(
            FORMAT,
            "distribution.type: dask",
            "a Dask cluster is several processes per node, and SkyPilot runs one command "
            "per node; use sbatch",
        )
    if spec.job_type == "pytorch":  # one torchrun per node: the same variables per rank
        spec = spec.with_overrides(launcher="torchrun")
    planned = symbolic_plan(spec, target.python)
    variables = dict(VARIABLES)
    for n in range(spec.instance_count):
        variables[f"addr{n}"] = f"addr_{n}"
    lines = [
        "set -e",
        "# Every node's address, in node order (SkyPilot's SKYPILOT_NODE_IPS).",
        "addrs=($SKYPILOT_NODE_IPS)",
        *(f"addr_{n}=${{addrs[{n}]}}" for n in range(spec.instance_count)),
        f'[ "${{#addrs[@]}}" -ge {spec.instance_count} ] || '
        f'{{ echo "jupyter-dist: needs {spec.instance_count} nodes" >&2; exit 1; }}',
    ]
    lines += _script(spec, planned, variables)
    task: dict = {"name": target.job_name(spec), "num_nodes": spec.instance_count}
    resources = _resources(spec, target)
    if resources:
        task["resources"] = resources
    # The folder synced to every node and run in: the code, else the export's own folder
    # (which holds a cell's code); relative, as SkyPilot reads it from the YAML's folder.
    code = spec.code_dir()
    task["workdir"] = path_from(target.folder, code) if code else "."
    if spec.environment_variables:
        task["envs"] = dict(spec.environment_variables)
    task["run"] = "\n".join(lines) + "\n"
    header = f"# {MARKER}{' from ' + target.source if target.source else ''}.\n"
    return header + dump_yaml(task)


def _script(spec: JobSpec, planned: LaunchPlan, variables: dict[str, str]) -> list[str]:
    """The part of `run` that starts the node's process: with its variables exported, and
    for an MPI job, its hostfile first, on node 0 only."""

    def word(text: str) -> str:
        return shell_word(text, variables)

    if len(planned.processes) == 1 and len(planned.nodes) > 1:  # mpirun on node 0
        proc = planned.processes[0]
        lines = ['if [ "$SKYPILOT_NODE_RANK" != 0 ]; then exit 0; fi  # mpirun reaches it']
        for planned_file in planned.files:
            lines.append(f'mkdir -p "$(dirname {word(planned_file.path)})"')
            lines.append(f"printf %s {word(planned_file.content)} > {word(planned_file.path)}")
        return lines + _exec(proc.argv, proc.env, spec, word)
    template = node_template(
        planned, FORMAT, "SkyPilot runs one command per node (TensorFlow: one task per node)"
    )
    return _exec(template.argv, template.env, spec, word)


def _exec(argv: list[str], env: dict[str, str], spec: JobSpec, word) -> list[str]:
    own = {k: v for k, v in env.items() if spec.environment_variables.get(k) != v}
    return [
        *(f"export {name}={word(value)}" for name, value in own.items()),
        "exec " + " ".join(word(arg) for arg in argv),
    ]


def _resources(spec: JobSpec, target: ExportTarget) -> dict:
    resources: dict = {}
    gpus = spec.gpus_per_node()
    if gpus:
        if not target.accelerator:
            raise unsupported(
                FORMAT,
                f"gpus_per_node: {gpus}",
                "SkyPilot needs the GPU's name too: give --accelerator NAME (e.g. A100)",
            )
        resources["accelerators"] = f"{target.accelerator}:{gpus}"
    elif target.accelerator:  # SkyPilot's own meaning: one of them per node
        resources["accelerators"] = target.accelerator
    if target.image:
        resources["image_id"] = f"docker:{target.image}"
    return resources
