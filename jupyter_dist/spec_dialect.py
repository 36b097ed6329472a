"""The design proposal's shape of a job (the seed documents' `distributed:` dialect), read
into the canonical spec (spec.py) before it is validated.

The proposal writes a job as

    distributed:
      mpi | pytorch | tensorflow:
        worker: {count, slots_per, resources: {limits: {gpu, cpu, memory}} | resource_limits,
                 environment, environment_variables}
        parameter_server | chief | evaluator: {count, ...}     (tensorflow)
        launcher: {resources}                                  (mpi)
        resources | resource_limits                            (for every role)
    compute: {infrastructure | type: managed | k8s, target, instance_type, instance_count}
    environment: {docker: {image: ...}}

and `translate` turns it into `distribution:`, `resources:` and `environment: {image}`,
saying each translation once ("read distributed.mpi.worker.count: 4 as
resources.instance_count: 4"): the notes travel with the spec (`JobSpec.read_as`) into
the plan, where `plan`, the dry run, `inspect` and the live view show them. Processes per
node, which the proposal leaves open, come from the command where it says so (`-np 16`
over 4 workers, `--nproc_per_node 4`), else the workers' GPU limits, else 1. A mapping
without `distributed:` is returned as it is.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError, field_validator

from jupyter_dist.command_words import own_launcher, own_world, torch_processes_per_node
from jupyter_dist.env_names import environment_variables
from jupyter_dist.errors import SpecError
from jupyter_dist.validation import MAX_PROCS_PER_NODE, StrictSection, count, one_line

DIALECT_KEY = "distributed"
# The roles each framework has in the proposal, and the canonical count each becomes.
ROLES = {
    "mpi": ("worker", "launcher"),
    "pytorch": ("worker",),
    "tensorflow": ("worker", "parameter_server", "chief", "evaluator"),
}
_TF_COUNTS = {
    "parameter_server": "parameter_server_count",
    "chief": "chief_count",
    "evaluator": "evaluator_count",
}
_TF_TASK = {
    "worker": "worker",
    "parameter_server": "ps",
    "chief": "chief",
    "evaluator": "evaluator",
}


# Whole numbers (the canonical spec checks their upper bounds again once translated).
_Number = count(0)
_Slots = count(1)


class _Limits(StrictSection):
    gpu: _Number | None = None
    cpu: str | int | float | None = None
    memory: str | int | None = None


class _Resources(StrictSection):
    limits: _Limits | None = None
    requests: _Limits | None = None


class _Role(StrictSection):
    count: _Number | None = None
    slots_per: _Slots | None = None
    resources: _Resources | None = None
    resource_limits: _Limits | None = None
    environment: Any = None
    environment_variables: dict[str, str] | None = None

    @field_validator("environment_variables", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return environment_variables(value)


class _Framework(StrictSection):
    worker: _Role | None = None
    launcher: _Role | None = None
    parameter_server: _Role | None = None
    chief: _Role | None = None
    evaluator: _Role | None = None
    resources: _Resources | None = None
    resource_limits: _Limits | None = None


class _Distributed(StrictSection):
    mpi: _Framework | None = None
    pytorch: _Framework | None = None
    tensorflow: _Framework | None = None


def translate(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` in the canonical shape, and what was read as what (one line each); SpecError
    in one line for a key the proposal does not have, or both shapes in one file."""
    if DIALECT_KEY not in data:
        return data, []
    if "distribution" in data:
        raise SpecError(
            "distributed: and distribution: are two shapes of the same setting "
            "(the design proposal's and Azure ML's); keep one"
        )
    given = data[DIALECT_KEY]
    if not isinstance(given, dict) or len(given) != 1:
        raise SpecError(
            "distributed: expected one of mpi, pytorch, tensorflow, as "
            "distributed: {pytorch: {worker: {count: 2}}}"
        )
    try:
        parsed = _Distributed.model_validate(given)
    except ValidationError as exc:
        said = one_line(exc)
        nested = exc.errors(include_url=False)[0]["loc"]  # else it is about the kinds
        raise SpecError(f"{DIALECT_KEY}.{said}" if nested else f"{DIALECT_KEY}: {said}") from None
    (kind,) = given
    framework: _Framework = getattr(parsed, kind)
    if framework is None:
        raise SpecError(
            f"distributed.{kind}: expected a mapping of its roles ({', '.join(ROLES[kind])})"
        )
    for role in ("worker", "launcher", "parameter_server", "chief", "evaluator"):
        if getattr(framework, role) is not None and role not in ROLES[kind]:
            raise SpecError(
                f"distributed.{kind}.{role}: a {kind} job has no such role; its "
                f"roles: {', '.join(ROLES[kind])}"
            )
    return _Reader(data, kind, framework).canonical()


class _Reader:
    """One translation: the canonical mapping built up, and its notes."""

    def __init__(self, data: dict[str, Any], kind: str, framework: _Framework) -> None:
        self.data = {k: v for k, v in data.items() if k != DIALECT_KEY}
        self.kind, self.framework = kind, framework
        self.notes: list[str] = []
        self.dist: dict[str, Any] = {"type": kind}

    def said(self, source: str, value: Any, target: str, why: str = "") -> None:
        shown = (
            "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
            if isinstance(value, dict)
            else value
        )
        self.notes.append(f"read {source}: {shown} as {target}: {shown}{why}")

    def canonical(self) -> tuple[dict[str, Any], list[str]]:
        nodes = self._nodes()
        gpus = self._gpus()
        if self.kind == "tensorflow":
            self._tensorflow()
        else:
            self._per_node(nodes, gpus)
        self._left_as_they_are()
        self._image()
        self.data["distribution"] = self.dist
        return self.data, self.notes

    def _nodes(self) -> int:
        """The job's node count: the workers' count, or compute.instance_count (which
        must agree); for TensorFlow, compute's else one node per worker."""
        worker = self.framework.worker
        workers = worker.count if worker is not None else None
        compute = self.data.get("compute") if isinstance(self.data.get("compute"), dict) else {}
        raw = self.data.get("resources")
        if raw is not None and not isinstance(raw, dict):
            raise SpecError("resources: expected a mapping of keys to values")
        resources = dict(raw or {})
        if (
            "instance_count" in compute
            and "instance_count" in resources
            and compute["instance_count"] != resources["instance_count"]
        ):
            raise SpecError(
                f"compute.instance_count is {compute['instance_count']!r} but "
                f"resources.instance_count is {resources['instance_count']!r}; make them "
                "agree, or write one (both count the job's nodes)"
            )
        written = compute.get("instance_count", resources.get("instance_count"))
        where = (
            "compute.instance_count" if "instance_count" in compute else "resources.instance_count"
        )
        if written is not None and (
            isinstance(written, bool) or not isinstance(written, int) or written < 1
        ):
            raise SpecError(f"{where}: {written!r} is not valid; expected a whole number >= 1")
        source = f"distributed.{self.kind}.worker.count"
        if self.kind == "tensorflow":
            if workers is not None:
                self.dist["worker_count"] = workers
                self.said(source, workers, "distribution.worker_count")
            nodes = written if written is not None else (workers or 1)
            if written is None:
                self.said(
                    source,
                    workers or 1,
                    "resources.instance_count",
                    " (a node for each worker; the other tasks share them)",
                )
        else:
            if workers == 0:
                raise SpecError(
                    f"{source}: 0 is not valid; expected a whole number >= 1 (the job's nodes)"
                )
            if workers is not None and written is not None and workers != written:
                raise SpecError(
                    f"{source} is {workers} but {where} is {written}; make them "
                    "agree (both count the job's nodes)"
                )
            nodes = workers if workers is not None else (written or 1)
            if workers is not None:
                self.said(source, workers, "resources.instance_count")
        if "instance_count" in compute and "instance_count" not in resources:
            self.said(
                "compute.instance_count", compute["instance_count"], "resources.instance_count"
            )
        if "instance_type" in compute and "instance_type" not in resources:
            resources["instance_type"] = compute["instance_type"]
        resources["instance_count"] = nodes
        self.data["resources"] = resources
        return nodes

    def _gpus(self) -> int | None:
        """The workers' GPU limit (else the framework's) as resources.gpus_per_node."""
        for where, holder in (
            (f"distributed.{self.kind}.worker", self.framework.worker),
            (f"distributed.{self.kind}", self.framework),
        ):
            found = _limits_of(holder) if holder is not None else None
            if found is not None and found[1].gpu is not None:
                path, limits = found
                self.data["resources"]["gpus_per_node"] = limits.gpu
                self.said(f"{where}.{path}.gpu", limits.gpu, "resources.gpus_per_node")
                return limits.gpu
        return None

    def _per_node(self, nodes: int, gpus: int | None) -> None:
        """Processes per node (pytorch, mpi): the workers' slots_per; else what the command
        says (mpirun's -np over the workers; torch's launcher starting its own); else one
        per GPU; else 1."""
        command = self.data.get("command") if isinstance(self.data.get("command"), str) else ""
        worker = self.framework.worker
        slots = worker.slots_per if worker is not None else None
        world = own_world(command, 0) if self.kind == "mpi" and own_launcher(command) else 0
        started = torch_processes_per_node(command) if self.kind == "pytorch" else None
        if slots is not None:
            per_node = slots
            self.said(
                f"distributed.{self.kind}.worker.slots_per",
                slots,
                "distribution.process_count_per_instance",
            )
            if world > slots * nodes:
                raise SpecError(
                    f"command: -np {world} is more ranks than {nodes} workers with "
                    f"slots_per: {slots} hold ({slots * nodes}); raise one or lower -np"
                )
        else:
            if world:
                per_node = -(-world // nodes)
                why = f"the command's -np {world} over {nodes} workers: the hostfile's slots"
            elif started:
                if started > MAX_PROCS_PER_NODE:
                    raise SpecError(
                        f"command: --nproc_per_node {started} is more processes than a node "
                        f"runs (at most {MAX_PROCS_PER_NODE})"
                    )
                per_node = 1
                why = (
                    f"the command starts {started} processes on each node itself: "
                    f"--nproc_per_node {started}, {nodes * started} ranks in all"
                )
            elif gpus:
                per_node, why = gpus, "one process per GPU"
            else:
                per_node = 1
                why = "the proposal leaves it open; neither the command nor a GPU limit says"
            self.notes.append(f"read processes per node as {per_node} ({why})")
        self.dist["process_count_per_instance"] = per_node

    def _tensorflow(self) -> None:
        """Parameter servers, chief, evaluator; each task type's own variables."""
        for role, key in _TF_COUNTS.items():
            holder: _Role | None = getattr(self.framework, role)
            if holder is not None and holder.count is not None:
                self.dist[key] = holder.count
                self.said(
                    f"distributed.tensorflow.{role}.count", holder.count, f"distribution.{key}"
                )
        own: dict[str, Any] = {}
        for role, task in _TF_TASK.items():
            holder = getattr(self.framework, role)
            if holder is not None and holder.environment_variables:
                own[task] = holder.environment_variables
                self.said(
                    f"distributed.tensorflow.{role}.environment_variables",
                    holder.environment_variables,
                    f"distribution.task_environment_variables.{task}",
                )
        if own:
            self.dist["task_environment_variables"] = own

    def _left_as_they_are(self) -> None:
        """What the proposal says that jupyter-dist does not act on: said, not dropped
        silently."""
        roles = [(f"distributed.{self.kind}", self.framework)] + [
            (f"distributed.{self.kind}.{r}", getattr(self.framework, r)) for r in ROLES[self.kind]
        ]
        for where, holder in roles:
            if holder is None:
                continue
            found = _limits_of(holder)
            if found is not None:
                path, limits = found
                for name in ("cpu", "memory"):
                    value = getattr(limits, name)
                    if value is None:
                        continue
                    if where.endswith(".launcher"):  # what an MPIJob export's Launcher gets
                        self.dist.setdefault("launcher_limits", {})[name] = value
                        self.said(
                            f"{where}.{path}.{name}",
                            value,
                            f"distribution.launcher_limits.{name}",
                            " (an exported MPIJob's Launcher pod)",
                        )
                    else:
                        self.notes.append(
                            f"kept {where}.{path}.{name}: {value} as written "
                            "(not acted on: jupyter-dist does not cap a "
                            "node's CPUs or memory)"
                        )
                if limits.gpu is not None and not where.endswith((".worker", self.kind)):
                    self.notes.append(
                        f"kept {where}.{path}.gpu: {limits.gpu} as written "
                        "(not acted on: the workers' GPU limit sizes the nodes)"
                    )
            image = _docker_image(getattr(holder, "environment", None))
            if image:
                self.notes.append(
                    f"kept {where}.environment.docker.image: {image} as written "
                    "(not acted on: a job runs in one image)"
                )
            if where.endswith((".worker", ".launcher")) and self.kind != "tensorflow":
                env = getattr(holder, "environment_variables", None)
                if env:
                    raise SpecError(
                        f"{where}.environment_variables: a {self.kind} job's "
                        "ranks share one environment; use the job's "
                        "environment_variables"
                    )

    def _image(self) -> None:
        """environment: {docker: {image}} as environment: {image} (what exports read)."""
        environment = self.data.get("environment")
        image = _docker_image(environment)
        if image:
            rest = {k: v for k, v in environment.items() if k != "docker"}
            self.data["environment"] = {**rest, "image": image}
            self.said("environment.docker.image", image, "environment.image")


def _limits_of(holder: _Role | _Framework) -> tuple[str, _Limits] | None:
    if holder.resource_limits is not None:
        return "resource_limits", holder.resource_limits
    if holder.resources is not None and holder.resources.limits is not None:
        return "resources.limits", holder.resources.limits
    return None


def _docker_image(environment: Any) -> str | None:
    if isinstance(environment, dict) and isinstance(environment.get("docker"), dict):
        image = environment["docker"].get("image")
        return image if isinstance(image, str) and image else None
    return None
