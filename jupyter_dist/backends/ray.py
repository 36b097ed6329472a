"""The ray backend: a job's nodes are nodes of a Ray cluster (KubeRay, a managed or cloud
cluster, a few `ray start` machines).

Ray only places the job; the node agents do the rest, as they do over SSH:

    acquire   connect (`--ray-address`: auto, ray://HOST:10001 for Ray Client, or a head's
              HOST:PORT; default RAY_ADDRESS, else auto), then one placement group of a
              bundle per planned node (its processes' CPUs, `--ray-gpus-per-node` GPUs),
              STRICT_SPREAD: each node's bundle on a Ray node of its own. While the cluster
              cannot place it, the wait is said (as Slurm's pending reason); a request no
              node of the cluster could ever hold is one line saying what the nodes have.
              Then a RayNodeHost actor (backends/ray_host.py) in each bundle.
    prepare   the agent, the code folder and the plan's files, written by the actors.
    start     the actor starts the agent as its subprocess; RayProcess moves its bytes.
    release   every actor stopped (their agents' input closes: each stops its tree) and
              killed, and the placement group removed.

MASTER_ADDR is the first bundle's Ray node's address and the ports are found free there,
so a notebook outside the cluster (Ray Client) needs no route to the ranks. One Ray
connection per process (Ray's own rule): a job asking for another cluster's address is
refused in one line.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import posixpath
import shlex
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_dist.backends import ray_host
from jupyter_dist.backends.agent_client import (
    AGENT_SOURCE,
    AgentProcess,
    agent_argv,
    agent_file_name,
    agents_say,
)
from jupyter_dist.backends.base import Backend, NodeHealth
from jupyter_dist.backends.node_ports import on_every_node, ports_on_nodes
from jupyter_dist.code_folder import read_code_folder
from jupyter_dist.errors import NodeError
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.options import Option
from jupyter_dist.plan.context import PortRequest
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan
from jupyter_dist.spec import MAX_PROCS_PER_NODE, JobSpec

RAY_OPTIONS = (
    Option(
        "ray_address",
        "the Ray cluster: auto, ray://HOST:10001 (Ray Client, from outside "
        "the cluster) or a head's HOST:PORT (default: RAY_ADDRESS, else auto)",
        metavar="ADDRESS",
        backend="ray",
        spec_key="address",
    ),
    Option(
        "ray_gpus_per_node",
        "GPUs each node's bundle asks for (default 0)",
        kind="int",
        metavar="N",
        backend="ray",
        spec_key="gpus_per_node",
        bounds=(0, MAX_PROCS_PER_NODE),
    ),
    Option(
        "ray_cpus_per_node",
        "CPUs each node's bundle asks for (default: its processes)",
        kind="int",
        metavar="N",
        backend="ray",
        spec_key="cpus_per_node",
        bounds=(0, 4096),
    ),
    Option(
        "ray_autoscaling",
        "the cluster adds nodes on demand (KubeRay's or a cloud "
        "cluster's autoscaler): a request for more nodes than it has now waits for them, "
        "where it would be refused",
        kind="flag",
        backend="ray",
        spec_key="autoscaling",
    ),
)

CALL_TIMEOUT_S = 60.0  # an actor that does not answer a short call in this long is lost
READ_WAIT_S = 1.0  # how long one read (or wait) call waits on the Ray node for something
PENDING_SAY_AFTER_S = 2.0  # a placement not done by then is said to be waiting
START_TIMEOUT_S = 120.0  # the actors' start on their nodes (a worker process each)
WITHDRAW_WAIT_S = 10.0  # after Ctrl-C, how long the placing thread gets to give all back
RELEASE_WAIT_S = 30.0  # how long giving the actors and the placement back may take
GROUP_REMOVED_WAIT_S = 10.0  # how long an actor's removal of the group may take to show
PUT_BYTES = 16 << 20  # the most of the job's files one actor call carries

# Between tries of a connection Ray Client's server could not give (it starts a process per
# client, and on a busy head that start fails now and then, for seconds at a time).
CONNECT_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)
REACH_TIMEOUT_S = 10.0  # how long the head's port gets to accept a connection
# Ray Client's server could not start its per-client process (it answers either way).
_TRANSIENT = ("Starting Ray client server failed", "Initialization failure from server")
# How Ray words a cluster's refusal of a client without its token: Ray Client's connection
# times out, a driver's GCS connection fails (the reason goes to stderr alone).
_NOT_LET_IN = ("connection timeout", "Failed to connect", "Unauthenticated", "AuthToken")
_connection: dict[str, Any] = {}  # "address": what this process connected to
_connection_lock = threading.Lock()
SHUTDOWN_WAIT_S = 10.0  # what Ray's disconnect gets when the process exits


def _import_ray():
    try:
        import ray
    except ImportError:
        raise NodeError(
            "the ray backend needs Ray where the notebook runs: pip install 'jupyter-dist[ray]'"
        ) from None
    return ray


def connect(address: str):
    """Ray, connected to `address` (once per process); NodeError in one line if it cannot
    be, or if this process is connected to another cluster."""
    ray = _import_ray()
    with _connection_lock:
        if ray.is_initialized():
            held = _connection.get("address")
            if held is not None and held != address:
                raise NodeError(
                    f"ray: this process is connected to {held}; Ray allows one cluster per "
                    f"process (restart the kernel to use {address})"
                )
            return ray
        _check_reachable(address)
        # Sent by value: the Ray nodes need nothing of jupyter-dist to run the actor.
        ray.cloudpickle.register_pickle_by_value(ray_host)
        for delay in (*CONNECT_RETRY_DELAYS_S, None):
            try:
                with warnings.catch_warnings():  # Ray Client's timeout warning: our line says it
                    warnings.simplefilter("ignore", UserWarning)
                    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
                break
            except Exception as exc:  # Ray's own words, on one line
                said = " ".join(str(exc).split()) or type(exc).__name__
                # Asked again, later each time, as a user would (CONNECT_RETRY_DELAYS_S).
                if any(word in said for word in _TRANSIENT) and delay is not None:
                    time.sleep(delay)
                    continue
                hint = _token_hint() if any(w in said for w in _NOT_LET_IN) else ""
                raise NodeError(f"ray: cannot connect to {address}: {said[:300]}{hint}") from None
        _connection["address"] = address
        _bound_shutdown(ray)
        _no_cluster_of_its_own()
        return ray


def _check_reachable(address: str) -> None:
    """A NodeError in one line if nothing accepts a connection at `address`'s host and port.
    Ray itself retries a head it cannot reach for about 12 minutes (20 tries of its GCS
    connection, each logged to stderr), and Ray Client for 30 s. `auto`, and an address
    without a port, are Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdecimal() or not host:
        return
    host = host.removeprefix("[").removesuffix("]")  # [IPv6]:PORT
    said = f"ray: cannot connect to {address}"
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except socket.gaierror:
        raise NodeError(f"{said}: the host {host} is not known here") from None
    except ConnectionRefusedError:
        role = "Ray Client's server" if address.startswith("ray://") else "the head's GCS"
        raise NodeError(
            f"{said}: nothing listens on {host} port {port} (is Ray running there, and is "
            f"that {role} port?)"
        ) from None
    except TimeoutError:
        raise NodeError(
            f"{said}: no answer from {host} port {port} within {REACH_TIMEOUT_S:g} s"
        ) from None
    except OSError as exc:
        raise NodeError(f"{said}: {host} port {port}: {exc.strerror or exc}") from None


def _no_cluster_of_its_own() -> None:
    """Ray answers an API call made while it is not connected by starting a cluster of its
    own on this machine (`ray.init()`, its auto-connect). After the exit hook's disconnect,
    a thread of ours still giving a placement back would do that: Ray's processes, and a
    ~/.ray/auth_token, left on the notebook's machine (seen in the tests). Once connected,
    this process never wants it: such a call fails instead."""
    try:
        from ray._private import auto_init_hook
    except ImportError:  # a Ray without auto-connect: nothing to turn off
        return
    auto_init_hook.enable_auto_connect = False


def _token_hint() -> str:
    """What to check where a cluster may have refused us for want of its token (token
    authentication: Ray's default for every cluster from 2.61)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return (
            "; if the cluster asks for a token: is RAY_AUTH_TOKEN (or ~/.ray/auth_token) the "
            "cluster's token?"
        )
    return (
        "; if the cluster asks for a token (Ray's default from 2.61), set RAY_AUTH_MODE=token "
        "and the token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
    )


def _ended_within(seconds: float, name: str, work: Callable[..., Any], *args, **kwargs) -> bool:
    """`work(*args, **kwargs)` on a daemon thread `name`, waited for `seconds` at most;
    whether it ended (one that did not is left to end, or to go with the process)."""
    thread = threading.Thread(target=work, args=args, kwargs=kwargs, daemon=True, name=name)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def _bound_shutdown(ray) -> None:
    """Ray's own exit hook (`ray.shutdown`) waits, with no limit, for Ray Client's data
    stream to end; on a busy head it once never did, and the launcher outlived its Ctrl-C
    for good. At exit it now has SHUTDOWN_WAIT_S, then the process goes (the cluster drops
    a gone client's actors after its reconnect grace)."""
    shutdown = ray.shutdown

    def bounded() -> None:
        _ended_within(SHUTDOWN_WAIT_S, "distrun-ray-shutdown", shutdown, _exiting_interpreter=True)

    atexit.unregister(shutdown)
    atexit.register(bounded)


def _over_ray_client() -> bool:
    """Whether this process reaches its cluster through Ray Client (`ray://`)."""
    with contextlib.suppress(Exception):
        from ray.util.client import ray as client

        return bool(client.is_connected())
    return False


def _actors_ended(ray: Any, hosts: list[Any], wait: float) -> bool:
    """Whether every one of `hosts` (actors) has ended within `wait` seconds: a call to
    one that ended fails at once (Ray's RayActorError), one that lives answers."""
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline, left = time.monotonic() + wait, list(hosts)
    while left and time.monotonic() < deadline:
        try:
            ray.get(left[0].info.remote(), timeout=max(0.1, deadline - time.monotonic()))
            time.sleep(0.05)  # still there: the removal is on its way
        except RayActorError:
            left.pop(0)
        except GetTimeoutError:
            break
    return not left


def _batches(entries: list[tuple[str, bytes, int]], limit: int = PUT_BYTES) -> list[list]:
    """The files as put_files calls of at most `limit` bytes each: (path, piece, mode,
    offset, size) entries, a large file cut into pieces over several calls, in order."""
    batches: list[list] = [[]]
    room = limit
    for path, content, mode in entries:
        offset = 0
        while True:
            piece = content[offset : offset + room]
            batches[-1].append((path, piece, mode, offset, len(content)))
            offset += len(piece)
            room -= len(piece)
            if room <= 0:
                batches.append([])
                room = limit
            if offset >= len(content):
                break
    return [batch for batch in batches if batch]


class _Withdrawn(Exception):
    """A placement given up while it waited (Ctrl-C on the thread that waits for it)."""


def _outcome(work: Callable[..., Any], *args: Any) -> Any:
    """What `work(*args)` returned, or the exception it raised (handed to another thread)."""
    try:
        return work(*args)
    except BaseException as exc:
        return exc


def _resources(bundle: dict[str, float]) -> str:
    cpus, gpus = bundle.get("CPU", 0), bundle.get("GPU", 0)
    return f"{cpus:g} CPUs" + (f" and {gpus:g} GPUs" if gpus else "")


class RayProcess(AgentProcess):
    """A process whose agent is a subprocess of a RayNodeHost actor: its bytes read and
    written through the actor's calls."""

    def __init__(self, ray, host, key: str, label: str) -> None:
        super().__init__()
        self._ray, self._host, self._key = ray, host, key
        self.label = label
        self._lost: str | None = None

    def _call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        try:
            return self._ray.get(
                getattr(self._host, method).remote(self._key, *args), timeout=timeout
            )
        except Exception as exc:  # the actor (or its node) is gone: the streams end
            self._lost = self._lost or type(exc).__name__
            raise OSError(str(exc)) from None

    def _read(self, stream: str) -> bytes:
        while True:
            try:
                data = self._call("read", stream, READ_WAIT_S)
            except OSError:
                return b""
            if data is not None:
                return data

    def _write_stdin(self, data: bytes) -> None:
        self._call("write", data)

    def _close_stdin(self) -> None:
        self._call("close_stdin")

    def _wait(self) -> int:
        while True:
            try:
                code = self._call("wait", READ_WAIT_S)
            except OSError:
                return 255
            if code is not None:
                return code

    @property
    def exit_note(self) -> str | None:
        note = super().exit_note
        return f"{note} (its Ray actor is gone: {self._lost})" if note and self._lost else note


class RayBackend(Backend):
    """A job's nodes are the Ray nodes its placement group's bundles landed on."""

    name = "ray"
    options = RAY_OPTIONS

    def __init__(self, report=None) -> None:
        self._ray = None
        self._group = None
        self._hosts: dict[str, Any] = {}  # node name -> its RayNodeHost actor
        self._nodes: dict[str, Node] = {}
        self._keys = itertools.count()
        self._report = report or (lambda text: print(text, file=sys.stderr, flush=True))

    # -- placing the job -----------------------------------------------------------------

    def acquire(self, spec: JobSpec, inventory: Inventory, workdir: str, cwd: str) -> list[Node]:
        """A bundle per node, placed (waiting while the cluster cannot), and an actor in each;
        the nodes they landed on. On any failure, nothing is left on the cluster."""
        if spec.job_type == "mpi":
            raise NodeError(
                "ray: MPI jobs do not run on Ray (mpirun starts its daemons on the other nodes "
                "over SSH or Slurm, which Ray does not give); use the ssh or slurm backend, or "
                "a pytorch job"
            )
        if spec.nodes:
            raise NodeError(
                "ray: Ray places the job's nodes itself; give a count (--nodes N), not names"
            )
        # Placed on a thread of its own, with the main thread only waiting for it: Ctrl-C
        # (KeyboardInterrupt, raised wherever the main thread is) must never land inside
        # Ray Client's calls, whose data channel it can leave waiting for ever for an
        # answer (seen: giving the group back then hung the launcher).
        withdrawn = threading.Event()
        placed: list[Any] = []
        placing = threading.Thread(
            target=lambda: placed.append(_outcome(self._place, spec, withdrawn)),
            daemon=True,
            name="distrun-ray-place",
        )
        placing.start()
        try:
            while placing.is_alive():
                placing.join(0.2)
        except KeyboardInterrupt:
            withdrawn.set()  # its wait ends at its next turn, and it gives everything back
            placing.join(WITHDRAW_WAIT_S)
            self.release()  # what it placed meanwhile, or all of it if it is still busy
            raise
        result = placed[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _place(self, spec: JobSpec, withdrawn: threading.Event) -> list[Node]:
        """`acquire`'s work, on its own thread; stops waiting once `withdrawn` is set."""
        section = spec.backend
        address = (section.option("address") if section else None) or os.environ.get(
            "RAY_ADDRESS", "auto"
        )
        self._ray = ray = connect(address)
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        procs = spec.processes_per_node()
        gpus = spec.gpus_per_node() or 0
        cpus = section.option("cpus_per_node") if section else None
        bundle = {"CPU": float(procs if cpus is None else cpus)}
        if gpus:
            bundle["GPU"] = float(gpus)
        count = spec.instance_count
        if not (section and section.option("autoscaling")):
            self._check_placeable(bundle, count)
        bundles = [dict(bundle) for _ in range(count)]
        placed = False
        if _over_ray_client():  # one task in the cluster, not one per call of Ray's API
            maker = ray.remote(num_cpus=0)(ray_host.make_group)
            self._group, placed = ray.get(maker.remote(bundles, PENDING_SAY_AFTER_S / 2))
        else:
            self._group = placement_group(bundles, strategy="STRICT_SPREAD")
        try:
            if not placed:
                self._wait_placed(bundle, count, withdrawn)
            host_class = ray.remote(ray_host.RayNodeHost)
            hosts = [
                host_class.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    max_concurrency=3 * max(procs, 1) + 16,  # a reader per stream, a waiter
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._group, placement_group_bundle_index=index
                    ),
                ).remote()
                for index in range(count)
            ]
            infos = ray.get([host.info.remote() for host in hosts], timeout=START_TIMEOUT_S)
            nodes = []
            taken = set()
            for index, (host, info) in enumerate(zip(hosts, infos, strict=True)):
                name = info["hostname"]
                if name in taken:
                    name = f"{name}-{index}"
                taken.add(name)
                self._hosts[name] = host
                nodes.append(
                    Node(
                        name=name,
                        host=info["ip"],
                        backend="ray",
                        python=info["python"],
                        workdir=info["workdir"],
                        gpus=gpus or None,
                        shares_files=False,
                        software={"python": info["version"]},
                    )
                )
        except BaseException:
            self.release()
            raise
        self._nodes = {node.name: node for node in nodes}
        return nodes

    def _check_placeable(self, bundle: dict[str, float], count: int) -> None:
        """NodeError when fewer of the cluster's live nodes than `count` could ever hold
        the bundle, naming what each node has."""
        alive, fits = self._nodes_that_fit(bundle)
        if len(fits) >= count:
            return
        has = "; ".join(
            f"{n.get('NodeManagerAddress')}: {_resources(n.get('Resources', {}))}" for n in alive
        )
        raise NodeError(
            f"ray: the job needs {count} nodes with {_resources(bundle)} each, and the "
            f"cluster has {len(fits)} such of its {len(alive)} ({has or 'no nodes'}); "
            "where it adds nodes on demand, --ray-autoscaling waits for them"
        )

    def _nodes_that_fit(self, bundle: dict[str, float]) -> tuple[list[dict], list[dict]]:
        """The cluster's live nodes, and those of them that could ever hold `bundle`."""
        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        fits = [
            n
            for n in alive
            if all(n.get("Resources", {}).get(k, 0) >= v for k, v in bundle.items())
        ]
        return alive, fits

    def _wait_placed(
        self, bundle: dict[str, float], count: int, withdrawn: threading.Event
    ) -> None:
        """Until the placement group is placed, saying once a while it waits (short waits:
        an interrupt is never held up); `_Withdrawn` once `withdrawn` is set (the caller
        removes the group)."""
        ready = self._group.ready()
        asked = time.monotonic()
        said = False
        while not self._ray.wait([ready], timeout=0.5)[0]:
            if withdrawn.is_set():
                raise _Withdrawn
            if not said and time.monotonic() - asked > PENDING_SAY_AFTER_S:
                said = True
                self._report(
                    f"ray: waiting for {count} nodes with {_resources(bundle)} each "
                    f"({self._why_waiting(bundle, count)})"
                )
        if said:
            self._report(f"ray: placed after {time.monotonic() - asked:.0f} s")

    def _why_waiting(self, bundle: dict[str, float], count: int) -> str:
        """Why a placement waits: too few nodes that could hold a bundle (an autoscaler's
        to add), or other work holding the cluster's CPUs."""
        fits = len(self._nodes_that_fit(bundle)[1])
        if fits < count:
            return f"the cluster has {fits} such nodes now: waiting for its autoscaler to add more"
        free = self._ray.available_resources().get("CPU", 0)
        total = self._ray.cluster_resources().get("CPU", 0)
        return f"other work holds the cluster: {free:g} of {total:g} CPUs free"

    def preflight(self, nodes: list[Node]) -> list[Node]:
        return [self._nodes.get(node.name, node) for node in nodes]  # acquire asked them

    def cluster_nodes(self, options: dict[str, Any]) -> list[NodeHealth]:
        """Every node of the cluster Ray knows, alive or not, with its resources."""
        ray = connect(options.get("address") or os.environ.get("RAY_ADDRESS", "auto"))
        found = []
        for node in ray.nodes():
            has = node.get("Resources", {})
            alive = bool(node.get("Alive"))
            found.append(
                NodeHealth(
                    node.get("NodeManagerHostname") or node.get("NodeManagerAddress", "?"),
                    node.get("NodeManagerAddress", "?"),
                    None,
                    "ok" if alive else "dead",
                    gpus=int(has.get("GPU", 0)),
                    cpus=has.get("CPU", 0.0),
                    memory=int(has.get("memory", 0)) or None,
                    problem=None if alive else "Ray lost this node",
                )
            )
        return sorted(found, key=lambda h: (h.status != "ok", h.name))

    def spares(self, inventory: Inventory) -> list[Node]:
        """None: Ray places the job's nodes (`place_again` where one was lost)."""
        return []

    def place_again(self, spec: JobSpec, nodes: list[Node]) -> list[Node]:
        """A node was lost (its actor does not answer): the placement group and every actor
        given back, and the job placed anew on the cluster's live nodes (waiting while it
        cannot be), a node placed on the same Ray node as before keeping its node rank."""
        self.release()
        placed = self.acquire(spec, Inventory(), "", "")
        before = [node.name for node in nodes]
        kept = {node.name: node for node in placed if node.name in before}
        new = iter(node for node in placed if node.name not in before)
        return [kept.get(name) or next(new) for name in before]

    def health(self, nodes: list[Node]) -> list[NodeHealth]:
        """Each placed node's actor asked (before a restart's attempt): ok when it answers."""

        def check(node: Node) -> NodeHealth:
            try:
                self._call(node, "info", timeout=10)
            except NodeError as exc:
                return NodeHealth(node.name, node.host, None, "unreachable", problem=str(exc))
            return NodeHealth(node.name, node.host, None, "ok")

        return on_every_node(nodes, check)

    def release(self) -> None:
        """Every actor stopped (each agent's input closed: it stops its tree) and killed;
        the placement group removed. Idempotent; never raises. Waits RELEASE_WAIT_S at
        most, on a thread of its own (a second Ctrl-C lands here, not in Ray's calls); a
        cluster that did not answer by then is said so: Ray gives the job's placement back
        itself once this process's connection ends."""
        ray, hosts, self._hosts = self._ray, list(self._hosts.values()), {}
        group, self._group = self._group, None
        if ray is None or not (hosts or group):
            return
        if not _ended_within(
            RELEASE_WAIT_S, "distrun-ray-release", self._give_back, ray, hosts, group
        ):
            self._report(
                f"ray: the cluster did not confirm in {RELEASE_WAIT_S:.0f} s that the "
                "job's actors and placement are given back; Ray gives them back "
                "once this process's connection ends"
            )

    @staticmethod
    def _give_back(ray: Any, hosts: list[Any], group: Any) -> None:
        stops = []
        for host in hosts:  # a dead actor has nothing to stop; it is killed next either way
            with contextlib.suppress(Exception):
                stops.append(host.stop_all.remote(5.0))
        with contextlib.suppress(Exception):
            if stops:
                ray.wait(stops, num_returns=len(stops), timeout=15)
        if group is not None and hosts:
            # One actor removes the group, which ends every actor in it: quick over Ray
            # Client, where the launcher's own removal is a task (a worker) of its own. Its
            # answer never comes (the actor ends with the group): the group's state does.
            with contextlib.suppress(Exception):
                hosts[0].remove_group.remote(group)
                if _actors_ended(ray, hosts, GROUP_REMOVED_WAIT_S):
                    return
        for host in hosts:
            with contextlib.suppress(Exception):
                ray.kill(host)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # gone with the cluster
                remove_placement_group(group)

    # -- running on the nodes ------------------------------------------------------------

    def _host(self, node: Node):
        host = self._hosts.get(node.name)
        if host is None:
            raise NodeError(f"node {node.name}: not one of this job's Ray nodes")
        return host

    def _call(self, node: Node, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S):
        try:
            return self._ray.get(getattr(self._host(node), method).remote(*args), timeout=timeout)
        except NodeError:
            raise
        except Exception as exc:
            said = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise NodeError(f"node {node.name}: its Ray actor failed: {said}") from None

    def choose_ports(self, requests: list[PortRequest], nodes: list[Node]) -> dict[str, int]:
        return ports_on_nodes(requests, nodes, self.run_on_node, on_every_node)

    def prepare(self, plan: LaunchPlan, nodes: list[Node]) -> None:
        """The agent, the code folder (into the job's folder: `code`) and the plan's files,
        written by each node's actor; private folders and files."""
        agent = (agent_file_name(), AGENT_SOURCE.read_bytes())
        code = Path(plan.code_dir) if plan.code_dir else None
        shipped = read_code_folder(code, ignore_files=False) if code is not None else None
        code_files = (
            [  # read once, sent to every node
                (rel, (code / rel).read_bytes(), 0o700 if rel in shipped.executable else 0o600)
                for rel in shipped.files
            ]
            if shipped is not None
            else []
        )

        def ship(node: Node) -> None:
            job_dir = posixpath.join(node.workdir, plan.job_id)
            folders = [job_dir]
            entries = [(posixpath.join(node.workdir, agent[0]), agent[1], 0o600)]
            if shipped is not None:
                target = posixpath.join(job_dir, "code")
                folders += [target, *(posixpath.join(target, f) for f in shipped.folders)]
                entries += [
                    (posixpath.join(target, rel), data, mode) for rel, data, mode in code_files
                ]
            entries += [
                (p.path, p.content.encode(), 0o700 if p.executable else 0o600)
                for p in plan.files
                if nodes[p.node_rank].name == node.name
            ]
            self._call(node, "make_folders", folders)
            for batch in _batches(entries):
                self._call(node, "put_files", batch)

        on_every_node(nodes, ship)

    def start(self, proc: ProcessPlan, node: Node, grace: float) -> RayProcess:
        node = self._nodes.get(node.name, node)
        key = f"{proc.label}#{next(self._keys)}"
        self._call(node, "start", key, self._argv(proc, node, grace), dict(proc.env), None)
        return RayProcess(self._ray, self._host(node), key, f"{proc.label} on {node.name}")

    def _argv(self, proc: ProcessPlan, node: Node, grace: float) -> list[str]:
        agent = posixpath.join(node.workdir, agent_file_name())
        return agent_argv(node.python, agent, proc.cwd, proc.argv, grace, proc.stdin)

    def command_line(self, proc: ProcessPlan, node: Node, grace: float) -> str:
        """What the node's actor runs (as its subprocess, with these variables added)."""
        node = self._nodes.get(node.name, node)
        env_words = [f"{name}={value}" for name, value in proc.env.items()]
        return shlex.join(["env", *env_words, *self._argv(proc, node, grace)])

    def collect(self, node: Node, folder: str) -> dict[str, bytes]:
        return self._call(node, "collect", folder)

    def list_files(self, node: Node, folder: str) -> dict[str, int]:
        return self._call(node, "list_files", folder)

    def read_piece(self, node: Node, path: str, offset: int, size: int) -> bytes:
        return self._call(node, "read_piece", path, offset, size)

    def run_on_node(self, node: Node, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
        code, out, err = self._call(node, "run", argv, timeout, timeout=timeout + CALL_TIMEOUT_S)
        return code, out, err

    def sweep(self, job_id: str, node_names: set[str]) -> list[int]:
        return self._agents_say("--sweep", job_id, node_names)

    def terminate_ranks(self, job_id: str, node_names: set[str]) -> list[int]:
        return self._agents_say("--term", job_id, node_names)

    def _agents_say(self, flag: str, job_id: str, node_names: set[str]) -> list[int]:
        nodes = [n for n in self._nodes.values() if n.name in node_names and n.name in self._hosts]
        return agents_say(flag, job_id, nodes, self.run_on_node)
