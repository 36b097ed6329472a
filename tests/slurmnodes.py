"""A real Slurm cluster on one machine, for tests and for trying jupyter-dist by hand: a
slurmctld and one slurmd per compute node, each node a network namespace with its own IP on
a private bridge, its own hostname and /etc/hosts (the recipe of shared/FIELD-NOTES.md).
munge runs with a key and a socket of the cluster's own; /etc/munge and /run/munge are left
alone. Nothing is stored in the repository; the key is made at start-up.

By hand (as root)::

    python tests/slurmnodes.py up 2 /var/tmp/slurm   # prints SLURM_CONF; Ctrl-C tears down
    SLURM_CONF=/var/tmp/slurm/slurm.conf srun -N2 hostname
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import netns

CONTROLLER = "slctl"
CPUS_PER_NODE = 2


@dataclass
class SlurmNode:
    name: str
    host: str
    namespace: str
    slurmd: subprocess.Popen | None = None


@dataclass
class SlurmCluster:
    """A running cluster: `env` is what a client needs (SLURM_CONF)."""

    root: Path
    conf: Path
    bridge: str
    nodes: list[SlurmNode] = field(default_factory=list)
    munged: subprocess.Popen | None = None
    slurmctld: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command (sinfo, srun, squeue, ...) against this cluster."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self, timeout: float = 60) -> list[str]:
        """Ids of the jobs Slurm still knows as pending or running."""
        out = self.run("squeue", "-h", "-o", "%i", timeout=timeout).stdout
        return out.split()

    def pids(self, node: SlurmNode) -> list[int]:
        """Processes in a node's namespace, its slurmd (and slurmd's own helpers) left out."""
        out = subprocess.run(
            ["ip", "netns", "pids", node.namespace], capture_output=True, text=True
        ).stdout
        return [p for p in map(int, out.split()) if _live(p) and _name(p) not in ("slurmd", "sh")]

    def clients(self) -> dict[int, str]:
        """This cluster's client commands still running on this machine (an salloc that
        holds an allocation, an srun, ...: a process named after one whose SLURM_CONF is
        this cluster's): pid -> command line."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or _name(int(entry.name)) not in SLURM_CLIENTS:
                continue
            with contextlib.suppress(OSError):
                environ = (entry / "environ").read_bytes().split(b"\0")
                if f"SLURM_CONF={self.conf}".encode() in environ and _live(int(entry.name)):
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    found[int(entry.name)] = cmd.strip()
        return found


SLURM_CLIENTS = ("salloc", "srun", "sbatch", "scancel", "squeue", "sinfo", "scontrol")


def _live(pid: int) -> bool:
    """Running, not a zombie (this machine's pid 1 reaps an orphaned slurmstepd late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def available() -> str | None:
    """Why a cluster cannot start here, or None when it can."""
    for tool in ("slurmctld", "slurmd", "munged", "mungekey", "srun", "ip", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} not found (scripts/setup.sh --test installs slurm-wlm and munge)"
    return None


def _start_munge(root: Path) -> subprocess.Popen:
    folder = root / "munge"
    folder.mkdir(mode=0o755)
    shutil.chown(folder, "munge", "munge")
    as_munge = ["runuser", "-u", "munge", "--"]
    netns.run(*as_munge, "mungekey", "--create", f"--keyfile={folder / 'munge.key'}")
    munged = subprocess.Popen(
        [*as_munge, "munged", "--foreground", f"--socket={folder / 'sock'}",
         f"--key-file={folder / 'munge.key'}", f"--pid-file={folder / 'munged.pid'}",
         f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not (folder / "sock").exists():
        if munged.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start: {_tail(folder / 'munged.log')}")
        time.sleep(0.05)
    return munged


def _tail(path: Path, chars: int = 600) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()[-chars:]
    return ""


def _write_conf(cluster: SlurmCluster, controller_ip: str, ports: tuple[int, int]) -> None:
    root = cluster.root
    for folder in ("state", "spool", "run", "log"):
        (root / folder).mkdir()
    node_lines = [
        f"NodeName={n.name} NodeAddr={n.host} NodeHostname={n.name} CPUs={CPUS_PER_NODE} "
        "RealMemory=4000 State=UNKNOWN"
        for n in cluster.nodes
    ]
    names = ",".join(n.name for n in cluster.nodes)
    # MinJobAge=0 keeps every ended job's record (a test cluster runs a few hundred): with
    # Slurm's default (300 s), `sbatch --wait` polls after 2, 8 and then every 32 s (its
    # backoff stops growing below MinJobAge, so a record is not purged between two polls),
    # and a 12-second job took 42 s to be seen ended. Without purging it polls every 2 s.
    cluster.conf.write_text(
        "\n".join([
            "ClusterName=distrun",
            f"SlurmctldHost={CONTROLLER}({controller_ip})",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={root / 'munge' / 'sock'}",
            "CredType=cred/munge",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}/%n",
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=0",
            "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill",
            *node_lines,
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n"
    )  # fmt: skip
    (cluster.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")


def start(count: int, root: Path) -> SlurmCluster:
    """A controller and `count` compute nodes, every node idle; files go under `root`."""
    problem = available()
    if problem:
        raise RuntimeError(problem)
    root.mkdir(parents=True, exist_ok=True)
    tag = netns.tag()
    subnet = netns.subnet("slurm", tag)
    cluster = SlurmCluster(root=root, conf=root / "slurm.conf", bridge=f"slbr{tag}")
    try:
        netns.add_bridge(cluster.bridge, f"{subnet}.1/24")
        hosts = ["127.0.0.1 localhost", f"{subnet}.1 {CONTROLLER}"]
        for i in range(count):
            node = SlurmNode(
                name=f"sln{i + 1}", host=f"{subnet}.{i + 11}", namespace=f"sl{tag}n{i}"
            )
            cluster.nodes.append(node)
            hosts.append(f"{node.host} {node.name}")
            netns.add_host(node.namespace, f"slv{tag}n{i}", cluster.bridge, f"{node.host}/24")
        (root / "hosts").write_text("\n".join(hosts) + "\n")
        # A lookup that misses /etc/hosts fails at once instead of stalling for 10 s.
        (root / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        ports = (6800 + tag % 500 * 2, 6801 + tag % 500 * 2)
        _write_conf(cluster, f"{subnet}.1", ports)
        cluster.munged = _start_munge(root)
        log = open(root / "log" / "slurmctld.out", "w")  # noqa: SIM115 (the process keeps it)
        # The controller's hostname must be the one slurm.conf names: a UTS namespace of its
        # own, in this machine's network (it listens on the bridge).
        cluster.slurmctld = subprocess.Popen(
            ["unshare", "--uts", "sh", "-c",
             f"hostname {CONTROLLER} && exec slurmctld -D -c -f {cluster.conf}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        for node in cluster.nodes:
            # nsenter, not `ip netns exec` (which remounts /sys, hiding the cgroups slurmd
            # needs); own hostname, /etc/hosts and resolv.conf.
            script = (
                f"mount --bind {root / 'hosts'} /etc/hosts && "
                f"mount --bind {root / 'resolv.conf'} /etc/resolv.conf && "
                f"hostname {node.name} && exec slurmd -D -N {node.name} -f {cluster.conf}"
            )
            out = open(root / "log" / f"slurmd-{node.name}.out", "w")  # noqa: SIM115
            node.slurmd = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "--uts",
                 "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_idle(cluster)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _wait_idle(cluster: SlurmCluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        for name, proc in [("slurmctld", cluster.slurmctld)] + [
            (f"slurmd {n.name}", n.slurmd) for n in cluster.nodes
        ]:
            if proc.poll() is not None:
                logs = cluster.root / "log"
                raise RuntimeError(
                    f"{name} exited: {_tail(logs / 'slurmctld.log')} "
                    f"{_tail(logs / 'slurmctld.out')}"
                )
        done = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
        states = done.stdout.strip()
        if done.returncode == 0 and states.count("idle") == len(cluster.nodes):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Slurm nodes did not become idle: {states!r}")


def stop(cluster: SlurmCluster) -> list[str]:
    """Cancel every job, stop every daemon, remove the namespaces, the bridge and the
    nodes' cgroups; returns what was still running on a node besides slurmd."""
    leftovers = []
    for pid, cmd in cluster.clients().items():  # one left would spin once its controller is gone
        leftovers.append(f"this machine: pid {pid}: {cmd}")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if cluster.slurmctld and cluster.slurmctld.poll() is None:
        with contextlib.suppress(Exception):
            cluster.run("scancel", "--full", *cluster.jobs(timeout=10), timeout=10)
    for node in cluster.nodes:
        with contextlib.suppress(OSError):
            for pid in cluster.pids(node):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                leftovers.append(f"{node.name}: pid {pid}: {cmd.strip()}")
        out = subprocess.run(
            ["ip", "netns", "pids", node.namespace], capture_output=True, text=True
        ).stdout
        for pid in out.split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        if node.slurmd:
            with contextlib.suppress(OSError):
                node.slurmd.kill()
            node.slurmd.wait(10)
        subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True)
        _remove_cgroups(node.name)
    for daemon in (cluster.slurmctld, cluster.munged):
        if daemon and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)
    return leftovers


def _remove_cgroups(node_name: str) -> None:
    """slurmd's cgroups of a node (proctrack/cgroup), deepest first."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / f"slurm_{node_name}"
        if top.is_dir():
            for folder in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if folder.is_dir():
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


if __name__ == "__main__":
    netns.up_from_command_line(
        "slurmnodes.py",
        start,
        stop,
        lambda c: f"{len(c.nodes)} Slurm nodes up; SLURM_CONF={c.conf}",
    )
