"""kubeflow and jobset: the job as Kubernetes resources (`kubectl apply -f FILE`).

kubeflow writes Kubeflow Training's v1 kinds: a PyTorchJob (one torchrun per pod, Master
and Workers), a TFJob (a replica type per TensorFlow role), an MPIJob (a Launcher that runs
mpirun, and Workers). jobset writes a JobSet (`jobset.x-k8s.io/v1alpha2`) for PyTorch: one
indexed Job of a pod per node, each running torchrun.

Each pod runs what jupyter-dist's plan runs on a node, and what the operator gives a pod is
used instead of ours, never set twice (the table is `PROVIDED`, and the README's):

- PyTorchJob: the operator sets MASTER_ADDR and MASTER_PORT (its master Service, at the
  port the container names `pytorchjob-port`: the job's master port) and RANK (the pod's
  index), from which each pod's torchrun takes its node rank; torchrun then gives every
  rank RANK, LOCAL_RANK, WORLD_SIZE, ... as jupyter-dist does.
- JobSet: the pod's index is JOB_COMPLETION_INDEX; node 0 is reached at its DNS name
  (`NAME-node-0-0.NAME`, JobSet's headless Service).
- TFJob: the operator writes TF_CONFIG for every task (from its Services, at the port named
  `tfjob-port`). Tasks are pods, not placed on nodes: DISTRUN_NODE_RANK is not set.
- MPIJob: the operator writes the hostfile (/etc/mpi/hostfile, which DISTRUN_MPI_HOSTFILE
  and AZUREML_MPI_HOSTFILE name) and starts mpirun's daemons; MASTER_ADDR, MASTER_PORT and
  AZ_BATCH_MASTER_NODE are not set (the ranks meet through MPI).

Pods need an image (`--image`, or the spec's `environment: {image: ...}`). The code
reaches them in a ConfigMap mounted at /distrun/code, where the command runs: a notebook
cell's file, and the `code` folder's files (what its .amlignore or .gitignore leave out
stays behind, named in the manifest's header; a ConfigMap holds about 1 MiB). With
`--code-in-image PATH` the command runs in the image's own copy at PATH instead, and a
cell's file is mounted into that folder.
"""

from __future__ import annotations

import base64
import contextlib
import posixpath
import re
from typing import Any

from jupyter_dist.code_folder import CodeFolder
from jupyter_dist.export.pernode import node_template
from jupyter_dist.export.symbolic import placeholder, placeholders_in, shell_word, symbolic_plan
from jupyter_dist.export.target import MARKER, ExportTarget, unsupported
from jupyter_dist.plan.model import MpiLaunch, ProcessPlan
from jupyter_dist.spec import JobSpec, dump_yaml

CODE_MOUNT = "/distrun/code"
CODE_VOLUME = "distrun-code"
# What a ConfigMap may hold (etcd's object limit), less room for its name and keys' framing.
CONFIGMAP_BYTES = 1024 * 1024
_CONFIGMAP_ROOM = 16 * 1024
_KEY = re.compile(r"[-._a-zA-Z0-9]+\Z")
SCRATCH = "/tmp"  # the jobs' scratch folders (torchrun's logs) in a pod
KUBEFLOW = "kubeflow.org/v1"
JOBSET = "jobset.x-k8s.io/v1alpha2"
# What each kind's operator sets in a pod (or what has no meaning there): our environment
# leaves these out.
PROVIDED = {
    "PyTorchJob": {"MASTER_ADDR", "MASTER_PORT"},
    "TFJob": {"TF_CONFIG", "DISTRUN_NODE_RANK"},
    "MPIJob": {"MASTER_ADDR", "MASTER_PORT", "AZ_BATCH_MASTER_NODE"},
}
MPI_HOSTFILE = "/etc/mpi/hostfile"
TF_REPLICAS = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


class _Pods:
    """What every pod of one export shares: the image, the job's name, the GPUs, and the
    code (a ConfigMap's files: the cell's, the code folder's)."""

    def __init__(
        self,
        spec: JobSpec,
        target: ExportTarget,
        fmt: str,
        cell: str | None,
        code: CodeFolder | None = None,
    ):
        self.spec, self.target, self.fmt, self.cell = spec, target, fmt, cell
        self.code = code  # what of the code folder travels: export() read it
        self.workdir = target.code_in_image or CODE_MOUNT
        self.code_files = _code_files(fmt, code, cell, target.stem + ".py")
        environment = spec.environment
        self.image = target.image or (
            environment.get("image") if isinstance(environment, dict) else None
        )
        if not self.image:
            raise unsupported(
                fmt,
                "a job without an image",
                "its pods run in a container: give --image IMAGE (or environment: {image: ...})",
            )
        self.name = target.job_name(spec)
        # Placeholders with one value for every pod: the scratch folder, the job's id.
        self.literal = {placeholder("here"): SCRATCH, placeholder("job"): self.name}

    def container(
        self,
        name: str,
        argv: list[str] | None,
        env: dict[str, str],
        shell_vars: dict[str, str] | None = None,
        port: tuple[str, int] | None = None,
        gpus: bool = True,
    ) -> dict:
        """A container; values that still hold a placeholder after the literal ones (a
        pod's index, node 0's address) come from `shell_vars` (placeholder name -> the
        variable the operator sets), set by a shell before the command."""

        def fill(text: str) -> str:
            for token, value in self.literal.items():
                text = text.replace(token, value)
            return text

        argv = [fill(arg) for arg in argv] if argv is not None else None
        env = {k: fill(v) for k, v in env.items()}
        late = {k: v for k, v in env.items() if placeholders_in(v)}
        container: dict[str, Any] = {"name": name, "image": self.image}
        if argv is not None and (late or any(placeholders_in(a) for a in argv)):
            words = shell_vars or {}
            script = [f"export {k}={shell_word(v, words)}" for k, v in late.items()]
            script.append("exec " + " ".join(shell_word(a, words) for a in argv))
            container["command"] = ["/bin/sh", "-c", "\n".join(script)]
        elif argv is not None:
            container["command"] = argv
        fixed = [{"name": k, "value": v} for k, v in env.items() if k not in late]
        if fixed:
            container["env"] = fixed
        if port is not None:
            container["ports"] = [{"name": port[0], "containerPort": port[1]}]
        gpu_count = self.spec.gpus_per_node()
        if gpus and gpu_count:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpu_count)}}
        if self.code_files or self.target.code_in_image:
            container["workingDir"] = self.workdir
        if self.code_files and self.target.code_in_image:  # the cell, into the image's folder
            (key,) = self.code_files
            container["volumeMounts"] = [
                {
                    "name": CODE_VOLUME,
                    "subPath": key,
                    "mountPath": posixpath.join(self.workdir, key),
                }
            ]
        elif self.code_files:
            container["volumeMounts"] = [{"name": CODE_VOLUME, "mountPath": CODE_MOUNT}]
        return container

    def pod(self, container: dict) -> dict:
        pod: dict[str, Any] = {"containers": [container], "restartPolicy": "Never"}
        if self.code_files:
            source: dict[str, Any] = {"name": self.code_map}
            items = [
                {"key": key, "path": path, **({"mode": 0o755} if executable else {})}
                for key, (path, _content, executable) in self.code_files.items()
            ]
            if any(item["key"] != item["path"] or "mode" in item for item in items):
                source["items"] = items  # a folder's layout, and scripts that stay runnable
            pod["volumes"] = [{"name": CODE_VOLUME, "configMap": source}]
        return pod

    @property
    def code_map(self) -> str:
        return f"{self.name}-code"

    def documents(self, resource: dict, what: str) -> str:
        """The manifest: a header, the cell's ConfigMap if any, then the resource."""
        source = f" from {self.target.source}" if self.target.source else ""
        header = [f"# {MARKER}{source}: {what}."]
        if self.code is not None:
            header.append(f"# Its ConfigMap carries the code folder {self.code.root}.")
            if self.code.left_out():
                header.append(f"# Not carried from it: {self.code.left_out()}.")
        docs = []
        if self.code_files:
            text = {k: c for k, (_, c, _) in self.code_files.items() if isinstance(c, str)}
            binary = {
                key: base64.b64encode(content).decode()
                for key, (_, content, _) in self.code_files.items()
                if isinstance(content, bytes)
            }
            config_map: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.code_map},
            }
            if text:
                config_map["data"] = text
            if binary:
                config_map["binaryData"] = binary
            docs.append(dump_yaml(config_map))
        docs.append(dump_yaml(resource))
        return "\n".join(header) + "\n" + "---\n".join(docs)

    def node_container(
        self,
        shell_vars: dict[str, str],
        port_name: str | None = None,
        provided: frozenset[str] | set[str] = frozenset(),
    ) -> dict:
        """The container of every node's pod: one torchrun, its node rank from the pod's
        index; node 0's address from the operator (MASTER_ADDR) or a literal. `provided`:
        what the operator sets itself, left out of our environment; `port_name`: the name
        the operator knows the master port by."""
        planned = symbolic_plan(self.spec.with_overrides(launcher="torchrun"), self.target.python)
        template = node_template(planned, self.fmt, "its pods run one command each")
        env = {k: v for k, v in template.env.items() if k not in provided}
        port = (port_name, planned.master_port) if port_name else None
        return self.container("pytorch", template.argv, env, shell_vars, port)


def render_kubeflow(
    spec: JobSpec, target: ExportTarget, cell: str | None = None, code: CodeFolder | None = None
) -> str:
    pods = _Pods(spec, target, "kubeflow", cell, code)
    if spec.job_type == "pytorch":
        kind, body = "PyTorchJob", _pytorchjob(pods)
    elif spec.job_type == "tensorflow":
        kind, body = "TFJob", _tfjob(pods)
    elif spec.job_type == "mpi":
        kind, body = "MPIJob", _mpijob(pods)
    else:
        raise unsupported(
            "kubeflow",
            f"distribution.type: {spec.job_type}",
            "Kubeflow Training runs pytorch, tensorflow and mpi jobs",
        )
    job = {"apiVersion": KUBEFLOW, "kind": kind, "metadata": {"name": pods.name}, "spec": body}
    return pods.documents(job, f"a {kind}")


def render_jobset(
    spec: JobSpec, target: ExportTarget, cell: str | None = None, code: CodeFolder | None = None
) -> str:
    if spec.job_type != "pytorch":
        raise unsupported(
            "jobset",
            f"distribution.type: {spec.job_type}",
            "the jobset format writes PyTorch jobs; use kubeflow for this one",
        )
    pods = _Pods(spec, target, "jobset", cell, code)
    nodes = spec.instance_count
    # JobSet's DNS name of the first pod: <jobset>-<replicated job>-<job index>-<pod index>
    pods.literal[placeholder("addr0")] = f"{pods.name}-node-0-0.{pods.name}"
    container = pods.node_container({"index": "JOB_COMPLETION_INDEX"})
    job_template = {
        "spec": {
            "parallelism": nodes,
            "completions": nodes,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": pods.pod(container)},
        }
    }
    jobset = {
        "apiVersion": JOBSET,
        "kind": "JobSet",
        "metadata": {"name": pods.name},
        "spec": {
            "network": {"enableDNSHostnames": True},
            # As jupyter-dist's restarts: the whole job again, up to limits.max_restarts.
            "failurePolicy": {"maxRestarts": spec.max_restarts},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": job_template}],
        },
    }
    return pods.documents(jobset, "a JobSet")


def _pytorchjob(pods: _Pods) -> dict:
    # The operator's RANK is the pod's index (Master 0, Worker i is i+1); MASTER_ADDR its
    # master Service.
    container = pods.node_container(
        {"index": "RANK", "addr0": "MASTER_ADDR"}, "pytorchjob-port", PROVIDED["PyTorchJob"]
    )
    replicas = {"Master": _replica(1, pods.pod(container))}
    if pods.spec.instance_count > 1:
        replicas["Worker"] = _replica(pods.spec.instance_count - 1, pods.pod(container))
    return {
        "pytorchReplicaSpecs": replicas,
        "nprocPerNode": str(pods.spec.distribution.process_count_per_instance),
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
    }


def _tfjob(pods: _Pods) -> dict:
    planned = symbolic_plan(pods.spec, pods.target.python)
    replicas = {}
    for role, replica_type in TF_REPLICAS.items():
        procs = [p for p in planned.processes if p.role == role]
        if not procs:
            continue
        # Every task of a type shares its pod template: its own address is the operator's.
        env = _shared_env(procs, PROVIDED["TFJob"], pods.fmt)
        port = ("tfjob-port", _tf_port(procs[0]))
        container = pods.container("tensorflow", procs[0].argv, env, port=port)
        replicas[replica_type] = _replica(len(procs), pods.pod(container))
    body: dict[str, Any] = {
        "tfReplicaSpecs": replicas,
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
    }
    if not pods.spec.distribution.chief_count:  # as jupyter-dist: done when every worker is
        body["successPolicy"] = "AllWorkers"
    return body


def _tf_port(proc: ProcessPlan) -> int:
    """The port a task listens at (its own address in TF_CONFIG)."""
    task = proc.tf_config["task"]
    own = proc.tf_config["cluster"][task["type"]][task["index"]]
    return int(own.rsplit(":", 1)[1])


def _mpijob(pods: _Pods) -> dict:
    dist = pods.spec.distribution
    if dist.launcher == "horovodrun":
        raise unsupported(
            "kubeflow",
            "distribution.launcher: horovodrun",
            "the MPIJob's launcher runs mpirun; use launcher: mpirun (Horovod runs under it)",
        )
    # The operator gives mpirun its hosts (a hostfile in OMPI_MCA_orte_default_hostfile).
    planned = symbolic_plan(
        pods.spec, pods.target.python, mpi_launch=lambda ctx: MpiLaunch(hostfile=False)
    )
    (proc,) = planned.processes
    dropped = PROVIDED["MPIJob"]
    env = {k: v for k, v in proc.env.items() if k not in dropped}
    env |= {"DISTRUN_MPI_HOSTFILE": MPI_HOSTFILE, "AZUREML_MPI_HOSTFILE": MPI_HOSTFILE}
    launcher = pods.container("mpi", _without_forwarding(proc.argv, dropped), env, gpus=False)
    if dist.launcher_limits:
        limits = {key: str(value) for key, value in dist.launcher_limits.items()}
        launcher["resources"] = {"limits": limits}
    worker = pods.container("mpi", None, {})
    return {
        "slotsPerWorker": dist.process_count_per_instance,
        "cleanPodPolicy": "Running",
        "mpiReplicaSpecs": {
            "Launcher": _replica(1, pods.pod(launcher)),
            "Worker": _replica(pods.spec.instance_count, pods.pod(worker)),
        },
    }


def _shared_env(procs: list[ProcessPlan], provided: set[str], fmt: str) -> dict[str, str]:
    """The environment every process of a replica type shares (the operator sets the
    `provided` ones per pod); anything else that differs cannot be one template."""
    env = {k: v for k, v in procs[0].env.items() if k not in provided}
    for proc in procs[1:]:
        differing = [k for k, v in env.items() if proc.env.get(k) != v]
        if differing:
            raise unsupported(fmt, differing[0], "it differs between pods of one replica type")
    return env


def _without_forwarding(argv: list[str], names: set[str]) -> list[str]:
    """mpirun's argv without `-x NAME` for the variables that are not set."""
    out: list[str] = []
    for arg in argv:
        if arg in names and out and out[-1] == "-x":
            out.pop()
            continue
        out.append(arg)
    return out


def _replica(count: int, pod: dict) -> dict:
    return {"replicas": count, "restartPolicy": "Never", "template": {"spec": pod}}


# A ConfigMap's file: (its path under the mount, its content, whether it is executable).
CodeFile = tuple[str, str | bytes, bool]


def _code_files(
    fmt: str, code: CodeFolder | None, cell: str | None, cell_name: str
) -> dict[str, CodeFile]:
    """The ConfigMap's files by key: the code folder's, then the cell's. A key is the path
    where it can be one (a name of letters, digits, '-', '_', '.'), else the path made one."""
    files: dict[str, CodeFile] = {}
    total = 0
    if code is not None:
        if cell is not None and cell_name in code.files:
            raise unsupported(
                fmt,
                f"code: {code.root}",
                f"it holds a {cell_name} of its own, where the cell's code would go; give the "
                "export another name",
            )
        total = code.size + (len(cell.encode()) if cell is not None else 0)
        if total > CONFIGMAP_BYTES - _CONFIGMAP_ROOM:
            raise unsupported(
                fmt,
                f"code: {code.root}",
                f"its files hold {total / 2**20:.1f} MiB and a ConfigMap about 1 MiB; build the "
                "folder into the image and give --code-in-image PATH (where the image has it)",
            )
        for path in code.files:
            try:
                content: str | bytes = (code.root / path).read_bytes()
            except OSError as exc:
                raise unsupported(fmt, f"code: {code.root}", f"{path}: {exc.strerror}") from None
            with contextlib.suppress(UnicodeDecodeError):  # else kept as bytes: binaryData
                content = content.decode("utf-8")
            files[_key(path, files)] = (path, content, path in code.executable)
    if cell is not None:
        files[_key(cell_name, files)] = (cell_name, cell, False)
    return files


def _key(path: str, taken: dict[str, CodeFile]) -> str:
    """A ConfigMap key for `path`, unlike every key `taken`."""
    key = path if _KEY.match(path) else re.sub(r"[^-._a-zA-Z0-9]", "_", path.replace("/", "."))
    key = key[-200:]
    if key.startswith(".."):  # a key may not be "..", nor start with it
        key = key.lstrip(".") or "file"
    unique, n = key, 1
    while unique in taken:
        n += 1
        unique = f"{key}.{n}"
    return unique
