"""A real Ray cluster on one machine, for tests and for trying the ray backend by hand: a head
and workers, each a `ray start --block` in a network namespace of its own (own IP on a
private bridge, own hostname and /etc/hosts, a cgroup v2 as a node has), the recipe of
shared/FIELD-NOTES.md. This machine's outward interface carries none of its traffic.

Never `ray stop` (it kills Ray processes by name across the whole machine): each node is
stopped by the PID of its `ray start`, workers before the head, then whatever is left in
its namespace.

By hand (as root)::

    python tests/raynodes.py up 2 /var/tmp/ray   # prints the addresses; Ctrl-C tears down
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import netns

RAY = Path(sys.executable).with_name("ray")
CPUS_PER_NODE = 2
# Declared, not real: Ray trusts what `ray start` says a node has, and hands the ids of a
# bundle's GPUs to its actor as CUDA_VISIBLE_DEVICES (what the ranks then inherit).
GPUS_PER_NODE = 1
CLIENT_PORT = 10001
GCS_PORT = 6379


@dataclass
class RayNode:
    name: str
    host: str
    namespace: str
    process: subprocess.Popen | None = None


@dataclass
class RayCluster:
    root: Path
    bridge: str
    temp_dir: Path  # Ray's session files (short: they hold unix sockets)
    nodes: list[RayNode] = field(default_factory=list)
    # Token authentication's token (every node started with RAY_AUTH_MODE=token), or None.
    auth_token: str | None = None
    driver: subprocess.Popen | None = None  # `ask`'s, started on its first question
    _pending: bytes = b""  # what the driver wrote after the last line read

    @property
    def auth_env(self) -> dict[str, str]:
        """What a client's environment holds to be let in: Ray's own variables."""
        if self.auth_token is None:
            return {"RAY_AUTH_MODE": "disabled"}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token}

    @property
    def head(self) -> RayNode:
        return self.nodes[0]

    @property
    def client_address(self) -> str:
        """Ray Client's address: what a notebook outside the cluster connects to."""
        return f"ray://{self.head.host}:{CLIENT_PORT}"

    @property
    def head_address(self) -> str:
        """The head's GCS address: for a driver inside the cluster's network (`inside`)."""
        return f"{self.head.host}:{GCS_PORT}"

    def inside(self, node: RayNode | None = None) -> list[str]:
        """The words that run a command in a node's namespace (the head's by default)."""
        return ["ip", "netns", "exec", (node or self.head).namespace]

    def pids(self, node: RayNode) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", node.namespace],
                             capture_output=True, text=True).stdout  # fmt: skip
        return [int(pid) for pid in out.split()]

    def ask(self, code: str, timeout: float = 120) -> object:
        """What `code` sets `result` to (JSON), run by a driver connected to the head from
        inside its namespace and kept connected: a test that asks Ray's GCS what it holds,
        again and again, pays for one `ray.init` (seconds of a loaded machine's CPU), not
        one per question. RuntimeError with the driver's words where it fails."""
        for _attempt in (1, 2):  # a driver that died (its GCS restarted) is started again
            if self.driver is None or self.driver.poll() is not None:
                with open(self.root / "driver.log", "a") as log:
                    self.driver = subprocess.Popen(
                        [*self.inside(), sys.executable, "-u", "-c", _DRIVER,
                         self.head_address],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                        env={**os.environ, **self.auth_env},
                    )  # fmt: skip
                self._pending = b""
            try:
                self.driver.stdin.write(json.dumps(code).encode() + b"\n")
                self.driver.stdin.flush()
                line = self._answer(time.monotonic() + timeout)
            except BrokenPipeError:
                line = ""
            if line:
                answer = json.loads(line[len(_ANSWER) :])
                if "error" in answer:
                    raise RuntimeError(f"the driver's question failed: {answer['error']}")
                return answer["result"]
            self.close_driver()
        log = (self.root / "driver.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"the driver gave no answer within {timeout} s: {log}")

    def _answer(self, deadline: float) -> str:
        """The driver's next answer line; "" if none comes by `deadline`. Ray prints what
        the cluster says (a node that died, a worker's log) on a driver's stdout too: only
        a line after the answer's mark is ours."""
        fd = self.driver.stdout.fileno()
        while True:
            line, cut, rest = self._pending.partition(b"\n")
            if cut:
                self._pending = rest
                if line.startswith(_ANSWER.encode()):
                    return line.decode()
                continue
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            data = os.read(fd, 65536) if ready else b""
            if not data:
                return ""  # no answer in time, or the driver ended
            self._pending += data

    def server_logs(self, newest: int = 3, lines: int = 30) -> str:
        """The ends of Ray Client's server logs on the head (the proxy's and the newest
        per-client servers'): what a failed connection's "see ray_client_server_PORT.err"
        points to, for a failed test's report."""
        logs = self.temp_dir / "session_latest" / "logs"
        found = sorted(logs.glob("ray_client_server_*.err"), key=lambda p: p.stat().st_mtime)
        chosen = [logs / "ray_client_server.err", *found[-newest:]]
        said = []
        for path in chosen:
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                said.append(f"--- {path.name} ---\n" + "\n".join(tail))
        return "\n".join(said)

    def close_driver(self) -> None:
        if self.driver is None:
            return
        with contextlib.suppress(OSError):
            self.driver.stdin.close()  # its loop ends, and it disconnects
        try:
            self.driver.wait(15)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait(10)
        self.driver = None

    def job_processes(self, job_id: str) -> list[int]:
        """Processes on the cluster's nodes carrying the job's id (DISTRUN_JOB_ID)."""
        found = []
        for node in self.nodes:
            for pid in self.pids(node):
                with contextlib.suppress(OSError):
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if f"DISTRUN_JOB_ID={job_id}".encode() in environ:
                        found.append(pid)
        return found


def start(
    count: int, root: Path, tag: int | None = None, auth_token: str | None = None
) -> RayCluster:
    """A head and `count - 1` workers, CPUS_PER_NODE CPUs each; returns once every node
    has joined. With `auth_token`, the cluster asks every client for that token."""
    tag = netns.tag() if tag is None else tag
    subnet = netns.subnet("ray", tag)
    root.mkdir(parents=True, exist_ok=True)
    cluster = RayCluster(root=root, bridge=f"rybr{tag}", temp_dir=Path(f"/tmp/dray{tag}"),
                         auth_token=auth_token)  # fmt: skip
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    netns.add_bridge(cluster.bridge, f"{subnet}.1/24")
    hosts = ["127.0.0.1 localhost"]
    for i in range(count):
        name = "rayhead" if i == 0 else f"rayworker{i}"
        node = RayNode(name=name, host=f"{subnet}.{i + 2}", namespace=f"ry{tag}n{i}")
        hosts.append(f"{node.host} {name}")
        cluster.nodes.append(node)
    hosts_file = root / "hosts"
    hosts_file.write_text("\n".join(hosts) + "\n")
    empty = root / "empty"  # no DNS: names are the hosts file's
    empty.write_text("")
    try:
        for i, node in enumerate(cluster.nodes):
            netns.add_host(node.namespace, f"ryv{tag}n{i}", cluster.bridge, f"{node.host}/24")
            start_node(cluster, node)
        _wait_usable(cluster)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def start_node(cluster: RayCluster, node: RayNode) -> None:
    """`ray start` on `node` (the head when it is the first), in its namespace; returns
    once Ray says it runs there."""
    common = [f"--node-ip-address={node.host}", f"--num-cpus={CPUS_PER_NODE}",
              f"--num-gpus={GPUS_PER_NODE}", "--object-store-memory=100000000",
              "--disable-usage-stats"]  # fmt: skip
    if node is cluster.head:
        role = ["--head", f"--port={GCS_PORT}", f"--ray-client-server-port={CLIENT_PORT}",
                "--include-dashboard=false", f"--temp-dir={cluster.temp_dir}"]  # fmt: skip
    else:
        role = [f"--address={cluster.head_address}"]
    ray_start = " ".join([str(RAY), "start", "--block", *role, *common])
    hosts_file, empty = cluster.root / "hosts", cluster.root / "empty"
    script = (
        "{ mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null || true; } && "
        f"hostname {node.name} && mount --bind {hosts_file} /etc/hosts && "
        f"mount --bind {empty} /etc/resolv.conf && exec {ray_start}"
    )
    argv = [*cluster.inside(node), "unshare", "--uts", "--mount", "sh", "-c", script]
    # Its own TMPDIR: what jobs leave in a node's folder goes with the cluster's.
    tmp = cluster.root / node.name / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    log_file = cluster.root / f"{node.name}.log"
    if log_file.exists():  # a node started again: its first life's log kept beside
        log_file.rename(log_file.with_suffix(".log.1"))
    # Token authentication on or off, said outright: Ray 2.60 turns it on for `ray start`
    # where ~/.ray/auth_token exists (any local `ray.init()` leaves one), and the tests'
    # clients, given explicit addresses, would then be refused (InvalidAuthToken).
    # gRPC's fork handlers off, as gRPC advises for a process that forks only to exec: Ray
    # Client's proxy forks a server for each client while its other threads are in gRPC,
    # and the child then died at times before its exec (abseil's "Mutex::Fer with pending
    # CondVar queueing"), each such connection refused ("Starting Ray client server
    # failed"). 11 of 80 connections, 4 at once, failed so; none of 80 with this set.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(tmp),
           "GRPC_ENABLE_FORK_SUPPORT": "0", **cluster.auth_env}  # fmt: skip
    with open(log_file, "w") as log:
        node.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    _wait_started(cluster, node)


def lose_node(cluster: RayCluster, node: RayNode) -> None:
    """A worker lost at once, as a machine that dies: every process in its namespace
    (Ray's and any job's) SIGKILLed; the namespace stays for `start_node`."""
    for pid in cluster.pids(node):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if node.process is not None:
        node.process.wait(30)
    deadline = time.monotonic() + 30
    while cluster.pids(node) and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_started(cluster: RayCluster, node: RayNode, timeout: float = 90) -> None:
    log = cluster.root / f"{node.name}.log"
    deadline = time.monotonic() + timeout
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if node.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray on {node.name} did not start: {log.read_text()[-1500:]}")
        time.sleep(0.2)


# Ray Client, from this machine: every node alive. Its server starts a process for each
# client through the runtime-env agent, which may still be starting after `ray start` says
# the runtime started (then the connection fails): tried again until it works.
_PROBE = """
import logging, sys, ray
ray.init(sys.argv[1], logging_level=logging.ERROR)
alive = [n for n in ray.nodes() if n["Alive"]]
sys.exit(0 if len(alive) == int(sys.argv[2]) else 3)
"""


def _wait_usable(cluster: RayCluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, cluster.client_address, str(len(cluster.nodes))],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **cluster.auth_env},
        )  # fmt: skip
        if probe.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray cluster is not usable: {probe.stderr[-1500:]}")
        time.sleep(2)


# RayCluster.ask's driver: one question (code, as a JSON string) a line, one answer a line,
# after a mark (what else Ray prints on a driver's stdout has none).
_ANSWER = "\x1eanswer "
_DRIVER = f"""
import json, logging, sys, ray
ray.init(sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
for line in sys.stdin:
    scope = {{"ray": ray}}
    try:
        exec(json.loads(line), scope)
        answer = {{"result": scope.get("result")}}
    except Exception as exc:
        answer = {{"error": repr(exc)}}
    print({_ANSWER!r} + json.dumps(answer), flush=True)
"""


def stop(cluster: RayCluster) -> list[str]:
    """Every node down, workers first; returns what of a job was still running there."""
    cluster.close_driver()
    leftovers = []
    for node in reversed(cluster.nodes):
        for pid in cluster.pids(node):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                if b"DISTRUN_JOB_ID=" in environ:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    leftovers.append(f"{node.name}: pid {pid}: {cmd.decode().strip()}")
        if node.process is not None and node.process.poll() is None:
            node.process.terminate()  # a blocking `ray start` stops what it started
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(10)
        for pid in cluster.pids(node):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True)
    # Ray's own logs stay with the cluster's folder (a failed run is read there later).
    logs = cluster.temp_dir / "session_latest" / "logs"
    if logs.is_dir():
        shutil.copytree(logs, cluster.root / "ray-logs", dirs_exist_ok=True)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    return leftovers


if __name__ == "__main__":
    netns.up_from_command_line(
        "raynodes.py", start, stop,
        lambda c: f"{len(c.nodes)} Ray nodes up: Ray Client {c.client_address}, head "
                  f"{c.head_address} (from inside: {' '.join(c.inside())} ...)",
    )  # fmt: skip
