"""What a plan is: every process of a job, where it runs, with what argv and environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_dist.errors import DamagedJob

# How a process's output lines map to ranks: `plain` lines belong to the process itself;
# `torchrun` lines carry "[default<local rank>]:", `mpi` lines "[<job>,<rank>]<stdout>:".
LINE_TAGS = ("plain", "torchrun", "mpi")


def rank_key(rank: int) -> tuple[str, str]:
    """The log key and label of a rank's lines: ("rank-3", "rank 3")."""
    return f"rank-{rank}", f"rank {rank}"


# The roles of an MPI launcher in a plan: one process on node 0 that starts every rank.
MPI_LAUNCHER_ROLES = ("mpirun", "horovodrun")


@dataclass(frozen=True)
class PlannedFile:
    """A file the runner writes on a node before starting processes (an MPI hostfile)."""

    node_rank: int
    path: str
    content: str
    executable: bool = False  # a program a launcher runs (the `ssh` horovodrun calls)


@dataclass(frozen=True)
class MpiLaunch:
    """What a backend adds to the mpirun on node 0 so that it reaches the job's other nodes
    (Backend.mpi_launch): SSH names an rsh agent and its ssh_config, Slurm its own launcher.

    horovodrun takes no rsh agent: it runs the `ssh` it finds on PATH, itself and through
    the mpirun it starts (so does an mpirun the user's command runs). A backend whose nodes
    they must reach plans an `ssh` program of its own and names its folder in `ssh_env`
    (DISTRUN_PATH_FIRST: the agent puts that folder first on PATH)."""

    args: tuple[str, ...] = ()  # mpirun options, before the user's mpi_args
    files: tuple[PlannedFile, ...] = ()  # files those options (and ssh_env) name
    forward: tuple[str, ...] = ()  # variables the other nodes' ranks must get too (-x)
    hostfile: bool = True  # give mpirun the job's hostfile; False: `args` name the hosts
    hosts: str = ""  # with hostfile False: the hosts, as horovodrun's -H wants them
    # The environment of a launcher that runs `ssh` itself (its `ssh`, Open MPI's MCA).
    ssh_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessPlan:
    """One process to start on one node."""

    name: str  # unique in the job, used for its logs: "rank-3", "worker-1", "torchrun-0"
    label: str  # shown as the line prefix: "rank 3", "worker 1", "node 0"
    role: (
        str  # rank, torchrun, chief, worker, ps, evaluator, mpirun, scheduler, dask-worker, client
    )
    node: str
    node_rank: int
    host: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    world_size: int
    rank: int | None = None
    local_rank: int | None = None
    ranks: tuple[int, ...] = ()  # ranks whose output comes through this process
    line_tags: str = "plain"  # one of LINE_TAGS: how its lines name their ranks
    # Runs until the job's other processes finish, then is stopped (Dask scheduler and
    # workers, TensorFlow parameter servers): its SIGTERM then is no failure.
    service: bool = False
    tf_config: dict[str, Any] | None = None
    # Reads what the job feeds it on stdin (a warm session's rank); else stdin is /dev/null.
    stdin: bool = False

    @property
    def log_keys(self) -> list[str]:
        """The logs its lines go to: its own, and those of the ranks a launcher carries."""
        if self.line_tags == "plain":
            return [self.name]
        return [self.name, *(rank_key(rank)[0] for rank in self.ranks)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = list(self.ranks)
        return data


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    job_type: str
    nodes: list[dict[str, Any]]  # name, host, backend per node rank
    master_addr: str
    master_port: int | None
    world_size: int
    processes: list[ProcessPlan]
    files: list[PlannedFile] = field(default_factory=list)
    code_dir: str | None = None  # the local folder shipped to every node
    code_left_out: str = ""  # what of it stays behind when it is copied (CodeFolder.left_out)
    read_as: list[str] = field(default_factory=list)  # how the spec's file was read (JobSpec)
    # The spec's outputs: name -> {"type": uri_folder | uri_file, "path": absolute or None}.
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What was set from what the nodes said, before they start, one line each (the gloo
    # interface of nodes whose hostname is a loopback address: diagnose/network.py).
    network_notes: list[str] = field(default_factory=list)
    # The same choice in a few words, for the job's header line: "gloo over eth0 on node0,
    # node1 (their hostnames resolve to 127.0.1.1)"; "" where nothing was chosen.
    network_choice: str = ""
    # What the job made of its preload, one line each: one remembered from the user's
    # earlier jobs (run/preload_memory.py), or one its backend cannot keep (run/launch.py).
    remembered: list[str] = field(default_factory=list)

    def process(self, name: str) -> ProcessPlan:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(name)

    def mpi_daemon_nodes(self) -> set[str]:
        """The nodes where an MPI launcher's daemons run the job's ranks, outside any agent
        of ours: those with no process of the plan, in a job with an mpirun."""
        if not any(p.role in MPI_LAUNCHER_ROLES for p in self.processes):
            return set()
        return {n["name"] for n in self.nodes} - {p.node for p in self.processes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "nodes": self.nodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "world_size": self.world_size,
            "processes": [p.to_dict() for p in self.processes],
            "files": [asdict(f) for f in self.files],
            "code_dir": self.code_dir,
            "code_left_out": self.code_left_out,
            "read_as": self.read_as,
            "outputs": self.outputs,
            "network_notes": self.network_notes,
            "network_choice": self.network_choice,
            "remembered": self.remembered,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        """The plan a job stored (plan.json); DamagedJob if it is not one."""
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DamagedJob(
                f"job {data.get('job_id', '?') if isinstance(data, dict) else '?'}: its "
                f"plan.json is damaged ({type(exc).__name__}: {exc})"
            ) from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        procs = [ProcessPlan(**_process_fields(p)) for p in data["processes"]]
        files = [PlannedFile(**f) for f in data.get("files", [])]
        return cls(
            job_id=data["job_id"],
            job_type=data["job_type"],
            nodes=data["nodes"],
            master_addr=data["master_addr"],
            master_port=data["master_port"],
            world_size=data["world_size"],
            processes=procs,
            files=files,
            code_dir=data.get("code_dir"),
            code_left_out=str(data.get("code_left_out") or ""),
            read_as=[str(line) for line in data.get("read_as") or []],
            outputs=dict(data.get("outputs") or {}),
            network_notes=[str(line) for line in data.get("network_notes") or []],
            network_choice=str(data.get("network_choice") or ""),
            remembered=[str(line) for line in data.get("remembered") or []],
        )


def _process_fields(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored process's fields as ProcessPlan takes them; plans stored before the rename
    of `output` to `line_tags` name it the old way."""
    fields = {**stored, "ranks": tuple(stored.get("ranks", ()))}
    if "output" in fields:
        fields["line_tags"] = fields.pop("output")
    return fields
