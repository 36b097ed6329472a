"""What in a plan would make ranks run differently from what torchrun gives them, collide
with each other, or differ between nodes (what the SSH preflight read on each: Python and
torch versions, NCCL_*/GLOO_* variables) or lack on some nodes (what of the code folder
stays behind: `LaunchPlan.code_left_out`), or what was set from what the nodes said
(`LaunchPlan.network_notes`), said before anything starts: one line per
finding (nodes alike in it share the line), shown by `--dry-run`, `jupyter distrun plan`,
`jupyter distrun inspect` and the live view. Nothing is refused: a note names what it saw
and what to set. First come the lines that say how the spec's file was read, where it was
written in the design proposal's shape (`LaunchPlan.read_as`, spec_dialect.py), and what
it took from the user's earlier jobs (`LaunchPlan.remembered`).

    notes = parity_notes(plan)   # [] when nothing stands out
"""

from __future__ import annotations

from jupyter_dist.plan.model import MPI_LAUNCHER_ROLES, LaunchPlan, ProcessPlan

# The processes on a node whose environment its ranks get: a rank's own, torchrun's for
# its workers (mpirun passes its own on to every node's ranks).
_STARTERS = ("rank", "torchrun")


def parity_notes(plan: LaunchPlan) -> list[str]:
    """One line per finding in `plan`, in a fixed order."""
    found: dict[tuple, list[str]] = {}  # (kind, details...) -> node names
    per_node = _ranks_per_node(plan)
    mpirun = next((p for p in plan.processes if p.role in MPI_LAUNCHER_ROLES), None)
    # Local nodes are one machine: their ranks share its GPUs (said once, below the loop).
    local = [n["name"] for n in plan.nodes if n.get("backend") == "local"]
    for node in plan.nodes:
        name, gpus = node["name"], node.get("gpus")
        own = [p for p in plan.processes if p.node == name and p.role in _STARTERS]
        source = own[0] if own else mpirun  # whose environment this node's ranks get
        count = per_node.get(name, 0)
        if count < 2 or source is None:
            continue
        env = source.env
        if "OMP_NUM_THREADS" not in env and source.role != "torchrun":  # torchrun sets it
            found.setdefault(("omp", count), []).append(name)
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        devices = [d for d in visible.split(",") if d.strip()]  # "": no GPU, on purpose
        if devices and len(devices) < count:
            found.setdefault(("visible", count, visible, len(devices)), []).append(name)
        elif gpus and count > gpus and not (len(local) > 1 and name in local):
            found.setdefault(("gpus", count, gpus), []).append(name)
    if len(local) > 1:
        key = _machine_gpus(plan, per_node, local)
        if key:
            found[key] = local
    notes = [*plan.read_as]  # how the spec was read, first: the rest follows from it
    notes += plan.remembered  # what it took from earlier jobs (run/preload_memory.py)
    notes += plan.network_notes  # what the nodes' answers set (diagnose/network.py)
    notes += [_say(key, names) for key, names in found.items()] + _between_nodes(plan)
    if plan.code_left_out:
        notes.append(f"the nodes' copies of {plan.code_dir} lack {plan.code_left_out}")
    return notes


def _machine_gpus(plan: LaunchPlan, per_node: dict[str, int], local: list[str]) -> tuple | None:
    """The finding where the ranks of all local nodes outnumber this machine's GPUs."""
    gpus = next(n.get("gpus") for n in plan.nodes if n["name"] == local[0])
    ranks = sum(per_node.get(name, 0) for name in local)
    return ("machine-gpus", ranks, gpus) if gpus and ranks > gpus else None


# Job types whose ranks talk through torch's collectives (Horovod's too: mpi).
_TORCH_JOBS = ("pytorch", "mpi")


def _between_nodes(plan: LaunchPlan) -> list[str]:
    """What the nodes' preflights read (Node.software) that differs between them: the
    Python version, torch's, and NCCL_*/GLOO_* variables the job does not set itself."""
    probed = [(node["name"], node["software"]) for node in plan.nodes if node.get("software")]
    if len(probed) < 2:
        return []
    notes = []
    pythons = _grouped(probed, lambda sw: sw.get("python"))
    if len(pythons) > 1:
        notes.append(
            f"Python differs between nodes ({_listed(pythons, 'unknown')}): cells, pushed "
            "variables and whatever ranks pickle for each other can fail; use one Python "
            "version everywhere (the inventory's python:)"
        )
    if plan.job_type not in _TORCH_JOBS:
        return notes
    torches = _grouped(probed, lambda sw: sw.get("torch"))
    if len(torches) > 1:
        notes.append(
            f"torch differs between nodes ({_listed(torches, 'not installed')}): ranks of "
            "different versions can fail or hang in their first collective; install one "
            "version everywhere"
        )
    set_by_job = {name for proc in plan.processes for name in proc.env}
    seen = sorted({name for _, sw in probed for name in sw.get("comm_env") or {}} - set_by_job)
    for name in seen:
        values = _grouped(probed, lambda sw, name=name: (sw.get("comm_env") or {}).get(name))
        if len(values) > 1:
            notes.append(
                f"{name} differs between nodes ({_listed(values, 'unset')}), as their "
                "environments set it: NCCL and gloo must reach every node alike; set it for "
                f"the job (--env {name}=...) or alike on every node"
            )
    return notes


def _grouped(probed: list[tuple[str, dict]], read) -> dict:
    """Node names by the value `read` gives for their software, in node order."""
    groups: dict = {}
    for name, software in probed:
        groups.setdefault(read(software), []).append(name)
    return groups


def _listed(groups: dict, missing: str) -> str:
    """Each value with its nodes: `2.13.0 on node0; 2.4.1 on node1, node2` (None reads as
    `missing`)."""
    return "; ".join(
        f"{missing if value is None else value} on {_nodes(names)}"
        for value, names in groups.items()
    )


def _say(key: tuple, names: list[str]) -> str:
    kind, count = key[0], key[1]
    where = _nodes(names)
    if kind == "omp":
        return (
            f"OMP_NUM_THREADS is unset and {where} {_runs(names)} {count} ranks: each one's "
            "math libraries would take every core (torchrun sets 1 here); set it, e.g. "
            "--env OMP_NUM_THREADS=1"
        )
    if kind == "visible":
        visible, devices = key[2], key[3]
        return (
            f"the {count} ranks on {'each of ' * (len(names) > 1)}{where} all see "
            f"CUDA_VISIBLE_DEVICES={visible} "
            f"({devices} device{'s' * (devices != 1)}): ranks using CUDA would share one "
            "(NCCL refuses that); list one device per rank, or pick each rank's by LOCAL_RANK"
        )
    gpus = key[2]
    if kind == "machine-gpus":
        return (
            f"this machine has {gpus} GPU{'s' * (gpus != 1)} for the {count} ranks of its "
            f"local nodes ({where}): ranks using CUDA would share one (NCCL refuses that); "
            f"run at most {gpus} in all (--nodes times --procs-per-node)"
        )
    return (
        f"{where} {'has' if len(names) == 1 else 'have'} {gpus} GPU{'s' * (gpus != 1)} for "
        f"{count} ranks: ranks using CUDA would share one (NCCL refuses that); use "
        f"--procs-per-node {gpus}"
    )


def _nodes(names: list[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{len(names)} nodes ({names[0]}, {names[1]}, ..., {names[-1]})"


def _runs(names: list[str]) -> str:
    return "runs" if len(names) == 1 else "each run"


def _ranks_per_node(plan: LaunchPlan) -> dict[str, int]:
    """How many ranks each node runs: its own rank processes, those its torchrun starts,
    and an even share of mpirun's."""
    counts: dict[str, int] = {}
    for proc in plan.processes:
        for node, n in _ranks_of(proc, plan):
            counts[node] = counts.get(node, 0) + n
    return counts


def _ranks_of(proc: ProcessPlan, plan: LaunchPlan) -> list[tuple[str, int]]:
    if proc.role in MPI_LAUNCHER_ROLES:  # its ranks are spread evenly over the job's nodes
        share = len(proc.ranks) // max(len(plan.nodes), 1)
        return [(node["name"], share) for node in plan.nodes]
    if proc.role in ("rank", "torchrun"):
        return [(proc.node, max(len(proc.ranks), 1))]
    return []


def describe(notes: list[str]) -> str:
    """The notes as printed under a plan ("" when there are none)."""
    return "\n".join(f"Check: {note}" for note in notes)
