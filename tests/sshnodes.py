"""Real sshd servers as separate hosts, for tests and for trying jupyter-dist by hand.

Each node is a network namespace with its own IP on a private bridge, its own hostname and
/etc/hosts, and an sshd that accepts a key generated here. Where namespaces are not allowed,
the nodes are sshd servers on 127.0.0.2, 127.0.0.3, ... instead (one hostname, one port space).
Keys are generated at start-up and never stored in the repository.

By hand (as root)::

    python tests/sshnodes.py up 2 /tmp/nodes     # prints the inventory path; Ctrl-C tears down
    DISTRUN_NODES_FILE=/tmp/nodes/nodes.yml jupyter distrun nodes
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import netns
import yaml

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSHD_NAMES = ("sshd", "sshd-session")  # the listener and its per-connection sessions


@dataclass
class TestNode:
    name: str
    host: str
    port: int
    namespace: str | None
    workdir: Path
    sshd: subprocess.Popen | None = None
    veth: str | None = None  # this machine's end of its link to the bridge


@dataclass
class SshNodes:
    """N running test nodes and the files a client needs to reach them."""

    root: Path
    nodes: list[TestNode] = field(default_factory=list)
    key_file: Path | None = None
    known_hosts: Path | None = None
    inventory: Path | None = None
    bridge: str | None = None
    python: str = sys.executable

    def inventory_entries(self, **extra) -> list[dict]:
        return [
            {
                "name": n.name, "host": n.host, "port": n.port, "user": "root",
                "key_file": str(self.key_file), "known_hosts": str(self.known_hosts),
                "python": self.python, "workdir": str(n.workdir), **extra,
            }
            for n in self.nodes
        ]  # fmt: skip

    def write_inventory(self, path: Path, **extra) -> Path:
        path.write_text(yaml.safe_dump({"nodes": self.inventory_entries(**extra)}))
        return path

    def load_inventory(self, folder: Path, **extra):
        """The nodes as a job sees them: the inventory written to `folder`/nodes.yml, loaded."""
        from jupyter_dist.nodes import load_inventory

        return load_inventory(self.write_inventory(folder / "nodes.yml", **extra))

    def pids(self, node: TestNode) -> list[int]:
        """Processes running on a node, its sshd (and sshd's own sessions) left out."""
        if node.namespace:
            out = subprocess.run(
                ["ip", "netns", "pids", node.namespace], capture_output=True, text=True
            ).stdout
            pids = [int(p) for p in out.split()]
        else:
            pids = _children_of(node.sshd.pid) if node.sshd else []
        return [p for p in pids if _process_name(p) not in (*SSHD_NAMES, None)]  # None: gone

    def job_processes(self, job_id: str) -> list[int]:
        """The job's live processes on the nodes."""
        from helpers import job_processes

        return job_processes(job_id, among=[p for node in self.nodes for p in self.pids(node)])

    def drop_sessions(self, node: TestNode) -> None:
        """SIGKILL a node's sshd sessions, not its listener: its links drop. Sessions may
        end while we look (a killed parent takes its child), so one gone is fine."""
        _kill_sshd(_children_of(node.sshd.pid))

    def lose(self, node: TestNode) -> None:
        """The node lost, as a machine that goes away: its sshd takes no new connection
        (stopped first: a link dropped while it still listened could be opened again at
        once, by a restart's check), then every session of it is SIGKILLed, those it left
        behind as it stopped included (in a namespace, every sshd process there). What the
        node runs otherwise (agents, ranks) stays, cut off."""
        sessions = set(_children_of(node.sshd.pid)) if node.sshd else set()
        self.stop_sshd(node)
        if node.namespace:
            out = subprocess.run(
                ["ip", "netns", "pids", node.namespace], capture_output=True, text=True
            ).stdout
            sessions.update(int(p) for p in out.split())
        _kill_sshd(sessions)

    def stop_sshd(self, node: TestNode) -> None:
        if node.sshd and node.sshd.poll() is None:
            node.sshd.terminate()
            node.sshd.wait(10)


def _kill_sshd(pids) -> None:
    """SIGKILL those of `pids` that are sshd processes (one gone meanwhile is fine)."""
    for pid in pids:
        if _process_name(pid) in SSHD_NAMES:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _process_name(pid: int) -> str | None:
    """None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _children_of(root: int) -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    return []


def namespaces_allowed() -> bool:
    name = f"drprobe{os.getpid() % 100000}"
    try:
        netns.run("ip", "netns", "add", name)
        netns.run("ip", "netns", "del", name)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def _keygen(path: Path, kind: str = "ed25519") -> None:
    netns.run("ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path))


def start(
    count: int,
    root: Path,
    use_namespaces: bool | None = None,
    tag: int | None = None,
    debian_hosts: bool = False,
) -> SshNodes:
    """Start `count` nodes; files go under `root`. `tag` (default: `netns.tag()`) names
    their namespaces, bridge and subnet: a second cluster beside the first needs its own.
    With `debian_hosts` each node's /etc/hosts is as Debian and Ubuntu write it, its own
    name on 127.0.1.1 (the others' on their addresses); else its name is on its address."""
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    cluster = SshNodes(root=root)
    cluster.key_file = root / "client_key"
    _keygen(cluster.key_file)
    authorized = root / "authorized_keys"
    authorized.write_text(Path(f"{cluster.key_file}.pub").read_text())
    empty = root / "empty"
    empty.write_text("")
    if use_namespaces is None:
        use_namespaces = namespaces_allowed()
    tag = netns.tag() if tag is None else tag
    subnet = netns.subnet("ssh", tag)
    if use_namespaces:
        cluster.bridge = f"drbr{tag}"
        netns.add_bridge(cluster.bridge, f"{subnet}.1/24")
    hosts = ["127.0.0.1 localhost"]
    for i in range(count):
        name = f"node{i}"
        if use_namespaces:
            host, port, ns = f"{subnet}.{i + 2}", 22, f"dr{tag}n{i}"
        else:
            host, port, ns = f"127.0.0.{i + 2}", 2200 + tag % 1000 + i, None
        hosts.append(f"{host} {name}")
        workdir = root / name / "work"
        workdir.mkdir(parents=True)
        cluster.nodes.append(
            TestNode(name=name, host=host, port=port, namespace=ns, workdir=workdir)
        )
    for node in cluster.nodes:
        own = [line for line in hosts if not (debian_hosts and line.endswith(f" {node.name}"))]
        if debian_hosts:
            own.insert(1, f"127.0.1.1 {node.name}")
        (root / node.name / "hosts").write_text("\n".join(own) + "\n")
    known = []
    try:
        for i, node in enumerate(cluster.nodes):
            host_key = root / node.name / "host_key"
            _keygen(host_key)
            known.append(f"[{node.host}]:{node.port} " if node.port != 22 else f"{node.host} ")
            known[-1] += " ".join(Path(f"{host_key}.pub").read_text().split()[:2])
            config = root / node.name / "sshd_config"
            config.write_text(
                f"Port {node.port}\nListenAddress {node.host}\nHostKey {host_key}\n"
                f"AuthorizedKeysFile {authorized}\nPidFile {root / node.name / 'sshd.pid'}\n"
                "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                "StrictModes no\nUseDNS no\nMaxStartups 100:30:200\n"
                "LogLevel ERROR\nSubsystem sftp internal-sftp\n"
            )
            if node.namespace:
                node.veth = f"drv{tag}n{i}"
                netns.add_host(node.namespace, node.veth, cluster.bridge, f"{node.host}/24")
                inside = ["ip", "netns", "exec", node.namespace]
                # Own hostname and /etc/hosts; an empty .bashrc (the image's runs pyenv init
                # on every SSH command); a cgroup v2 at /sys/fs/cgroup, as a node has (`ip
                # netns exec` mounted a fresh /sys without any), so the agents there make
                # cgroups as they would on a real node (where it cannot be mounted, none).
                script = (
                    "{ mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null || true; } && "
                    f"hostname {node.name} && "
                    f"mount --bind {root / node.name / 'hosts'} /etc/hosts && "
                    f"mount --bind {empty} /etc/resolv.conf && "
                    f"{{ [ ! -f /root/.bashrc ] || mount --bind {empty} /root/.bashrc; }} && "
                    f"exec {SSHD} -D -e -f {config}"
                )
                argv = [*inside, "unshare", "--uts", "--mount", "sh", "-c", script]
            else:
                argv = [SSHD, "-D", "-e", "-f", str(config)]
            with open(root / node.name / "sshd.log", "w") as log:
                node.sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=log)
        cluster.known_hosts = root / "known_hosts"
        cluster.known_hosts.write_text("\n".join(known) + "\n")
        _wait_listening(cluster)
        cluster.inventory = cluster.write_inventory(root / "nodes.yml")
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _wait_listening(cluster: SshNodes, timeout: float = 20) -> None:
    import socket

    deadline = time.monotonic() + timeout
    for node in cluster.nodes:
        while True:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((node.host, node.port)) == 0:
                    break
            if node.sshd.poll() is not None or time.monotonic() > deadline:
                log = (cluster.root / node.name / "sshd.log").read_text()
                raise RuntimeError(f"sshd of {node.name} did not come up: {log[-500:]}")
            time.sleep(0.05)


def stop(cluster: SshNodes) -> list[str]:
    """Tear every node down; returns what was still running on a node (not sshd)."""
    leftovers = []
    for node in cluster.nodes:
        for pid in cluster.pids(node) if (node.sshd and node.sshd.poll() is None) else []:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                leftovers.append(f"{node.name}: pid {pid}: {cmd.strip()}")
        if node.namespace:
            out = subprocess.run(["ip", "netns", "pids", node.namespace],
                                 capture_output=True, text=True).stdout  # fmt: skip
            for pid in out.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        if node.sshd:
            with contextlib.suppress(OSError):
                node.sshd.kill()
            node.sshd.wait(10)
        if node.namespace:
            subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True)
    if cluster.bridge:
        subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)
    # A namespace goes, with its link, once its last process has: a cluster started next
    # with the same names (a test's own, one after another) must find them gone.
    deadline = time.monotonic() + 10
    for node in cluster.nodes:
        while node.veth and Path(f"/sys/class/net/{node.veth}").exists():
            if time.monotonic() > deadline:
                subprocess.run(["ip", "link", "del", node.veth], capture_output=True)
                break
            time.sleep(0.05)
    return leftovers


if __name__ == "__main__":
    netns.up_from_command_line(
        "sshnodes.py", start, stop, lambda c: f"{len(c.nodes)} nodes up; inventory: {c.inventory}"
    )
