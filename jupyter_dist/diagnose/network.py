"""The network check before a job's ranks start: a node that cannot reach the address its
ranks will meet at (MASTER_ADDR:MASTER_PORT, a TensorFlow task's port, the Dask scheduler)
would hang in the rendezvous until torch's timeout and say nothing useful; here it is one
line, in seconds, naming the pair and the likely fix. So is an interface named in
GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME or OMPI_MCA_btl_tcp_if_include that a node lacks.

    check_network(backend.run_on_node, plan, nodes)    # NodeError, or nothing to say
    plan = gloo_interfaces(backend.run_on_node, plan, nodes)   # NodeError, or the plan

For each meeting point, the node it is on listens at its port for a moment
(node_side/netcheck.py, run as the job's helpers run: `python -c SOURCE`), and every other
machine of the job connects to it, all at once. Nodes on one machine (local nodes) reach
each other: nothing is asked of them but their interfaces.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from jupyter_dist import node_side
from jupyter_dist.errors import NodeError
from jupyter_dist.nodes import Node
from jupyter_dist.plan.model import LaunchPlan

NETCHECK_SOURCE = node_side.source("netcheck.py")
CONNECT_S = 3.0  # how long a node tries to connect (a refused one again, while it is)
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include")

# Runs argv on a node: (exit code, stdout, stderr) (Backend.run_on_node).
RunOnNode = Callable[[Node, list[str], float], tuple[int, str, str]]

# What each connect error most likely means, said after it.
# (A node's address is its inventory entry's host:, or Slurm's NodeAddr.)
_LIKELY = {
    "connection timed out": "a firewall that drops it, or {far}'s address is one {near} "
    "cannot route to",
    "no route to host": "{near} has no route to it: check {far}'s address, or the network "
    "between them",
    "network is unreachable": "{near} has no route to that network: check {far}'s address",
    "connection refused": "a firewall that rejects it, or {far}'s address is not its own as "
    "{near} sees it",
}


@dataclass(frozen=True)
class MeetingPoint:
    """An address and port the job's ranks connect to, on one of its nodes."""

    what: str  # "master", "Dask scheduler", "TensorFlow worker 0"
    host: str
    port: int


def meeting_points(plan: LaunchPlan) -> list[MeetingPoint]:
    """Where the job's ranks will connect, from its plan (each address and port once)."""
    found: dict[tuple[str, int], MeetingPoint] = {}

    def add(what: str, host: str, port: int) -> None:
        found.setdefault((host, port), MeetingPoint(what, host, port))

    if plan.master_port:
        add("master", plan.master_addr, plan.master_port)
    for proc in plan.processes:
        address = proc.env.get("DASK_SCHEDULER_ADDRESS", "")
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if host and port.isdigit():
            add("Dask scheduler", host, int(port))
        for role, addresses in ((proc.tf_config or {}).get("cluster") or {}).items():
            for index, where in enumerate(addresses):
                host, _, port = where.rpartition(":")
                if port.isdigit():
                    add(f"TensorFlow {role} {index}", host, int(port))
    return list(found.values())


def check_network(run_on_node: RunOnNode, plan: LaunchPlan, nodes: list[Node]) -> None:
    """NodeError, in one line, for the first problem found: an interface a node lacks, or
    a node that cannot reach a meeting point on another machine; nothing otherwise."""
    by_name = {node.name: node for node in nodes}
    problems = _interfaces(run_on_node, plan, by_name)
    if problems:
        raise NodeError(problems[0])
    one_per_host = list({node.host: node for node in reversed(nodes)}.values())[::-1]
    if len(one_per_host) < 2:
        return  # one machine: its nodes reach each other
    problems = []
    for point in meeting_points(plan):
        far = next((n for n in nodes if n.host == point.host), None)
        if far is None:
            continue  # not on one of the job's nodes: nothing of ours can listen there
        near = [node for node in one_per_host if node.host != point.host]
        problems += _reach(run_on_node, point, far, near)
    if problems:
        raise NodeError(problems[0])


def gloo_interfaces(run_on_node: RunOnNode, plan: LaunchPlan, nodes: list[Node]) -> LaunchPlan:
    """`plan`, with GLOO_SOCKET_IFNAME set on each node whose ranks gloo would otherwise
    have advertise an address the other machines cannot reach, and a note saying so.

    Without that variable gloo advertises the address the node's hostname resolves to, and
    Debian and Ubuntu put the hostname on 127.0.1.1 in /etc/hosts: on two such machines a
    job's ranks start, then fail to connect (`remote=[127.0.1.1]`). So each machine of a
    PyTorch job on more than one is asked (node_side/netcheck.py `route`) which interface
    reaches the master and what its hostname resolves to; where the two differ, its ranks
    get that interface. A job that names one, or whose nodes' environments do, is left as it
    is. NodeError, in one line, where a node cannot say which interface it uses, and for a
    Horovod job with its Gloo controller on a node whose hostname is on a loopback address
    (no variable makes Horovod's process sets use another: `_refuse_horovod_gloo`)."""
    if plan.job_type == "mpi" and _horovod_gloo(plan):
        _refuse_horovod_gloo(_routes(run_on_node, plan, nodes), nodes)
        return plan
    if plan.job_type != "pytorch" or not plan.master_port:
        return plan
    if any(p.env.get("GLOO_SOCKET_IFNAME") for p in plan.processes):
        return plan  # the job names it
    if any("GLOO_SOCKET_IFNAME" in ((n.software or {}).get("comm_env") or {}) for n in nodes):
        return plan  # a node's own environment names it: the user chose per node
    answers = _routes(run_on_node, plan, nodes)
    chosen: dict[str, str] = {}  # host -> interface
    why: dict[tuple[str, str | None], list[str]] = {}  # (interface, resolved) -> node names
    for node, found in answers:
        if "error" in found:
            continue  # no route, no answer: the reach check below names what is wrong
        interface, address = found.get("interface"), found.get("address")
        if interface == "lo":
            continue  # the master is on this machine (sshd nodes on 127.0.0.2, .3): lo it is
        if not interface:
            raise NodeError(
                f"{node.name}: cannot tell which interface gloo should use to reach the "
                f"master {plan.master_addr} (no interface holds {address}, the address it "
                "reaches the master from); name it for the job (--env "
                "GLOO_SOCKET_IFNAME=NAME, or environment_variables in the spec)"
            )
        resolved = found.get("resolves_to")
        if resolved == address:
            continue  # gloo advertises the address the others reach: nothing to change
        chosen[node.host] = interface
        names = [n.name for n in nodes if n.host == node.host]
        why.setdefault((interface, resolved), []).extend(names)
    if not chosen:
        return plan
    procs = [
        dataclasses.replace(p, env={**p.env, "GLOO_SOCKET_IFNAME": chosen[p.host]})
        if p.host in chosen
        else p
        for p in plan.processes
    ]
    notes = [
        f"{', '.join(names)}: GLOO_SOCKET_IFNAME={interface}, the interface that reaches the "
        f"master {plan.master_addr}: {'its hostname' if len(names) == 1 else 'their hostnames'} "
        + (
            f"resolve{'s' * (len(names) == 1)} to {resolved}, which gloo would advertise to "
            "the other nodes"
            if resolved
            else f"do{'es' * (len(names) == 1)} not resolve"
        )
        for (interface, resolved), names in why.items()
    ]
    choice = "; ".join(
        f"gloo over {interface} on {', '.join(names)} ("
        + f"{'its hostname' if len(names) == 1 else 'their hostnames'} "
        + (
            f"resolve{'s' * (len(names) == 1)} to {resolved})"
            if resolved
            else f"do{'es' * (len(names) == 1)} not resolve)"
        )
        for (interface, resolved), names in why.items()
    )
    return dataclasses.replace(
        plan, processes=procs, network_choice=choice, network_notes=[*plan.network_notes, *notes]
    )


def _routes(run_on_node: RunOnNode, plan: LaunchPlan, nodes: list[Node]) -> list[tuple[Node, dict]]:
    """Each machine's answer to `route` (the interface and address it reaches the master
    from, what its hostname resolves to), one node per machine; none for a job on one."""
    one_per_host = list({node.host: node for node in reversed(nodes)}.values())[::-1]
    if len(one_per_host) < 2:
        return []  # one machine: its ranks meet on it, whatever they advertise
    with ThreadPoolExecutor(max_workers=min(16, len(one_per_host))) as pool:
        answers = list(
            pool.map(
                lambda node: _helper(run_on_node, node, ["route", plan.master_addr], 30),
                one_per_host,
            )
        )
    return list(zip(one_per_host, answers, strict=True))


def _horovod_gloo(plan: LaunchPlan) -> bool:
    """Whether horovodrun runs the job with its Gloo controller (`--gloo`, or
    HOROVOD_CONTROLLER=gloo), as its own launcher or inside the command."""
    for proc in plan.processes:
        words = []
        for arg in proc.argv:
            try:
                words += shlex.split(arg) if " " in arg else [arg]
            except ValueError:  # unbalanced quotes: its words as they stand
                words += arg.split()
        if any(os.path.basename(w) == "horovodrun" for w in words) and (
            "--gloo" in words or proc.env.get("HOROVOD_CONTROLLER") == "gloo"
        ):
            return True
    return False


def _refuse_horovod_gloo(answers: list[tuple[Node, dict]], nodes: list[Node]) -> None:
    """NodeError naming the nodes whose hostname resolves to a loopback address: Horovod's
    Gloo controller (0.28.1, its last release) sets up its process sets on that address
    whatever HOROVOD_GLOO_IFACE says (its global context honours the variable, the process
    sets' do not), so the other nodes' ranks are sent to 127.0.1.1 and fail."""
    # (Reaching the master over lo, the nodes are one machine's: a loopback address serves.)
    found = [
        (node, answer["resolves_to"])
        for node, answer in answers
        if _is_loopback(answer.get("resolves_to")) and answer.get("interface") != "lo"
    ]
    if not found:
        return
    names = [n.name for n in nodes if any(n.host == node.host for node, _ in found)]
    resolved = found[0][1]
    raise NodeError(
        f"{', '.join(names)}: Horovod's Gloo controller would send the other nodes' ranks to "
        f"{resolved}, the loopback address {_whose(names)} to (its process sets use the "
        "hostname's address, whatever HOROVOD_GLOO_IFACE says); "
        "use Horovod's MPI controller (leave out --gloo), or map the hostname to the node's "
        "own address in /etc/hosts"
    )


def _whose(names: list[str]) -> str:
    return "its hostname resolves" if len(names) == 1 else "their hostnames resolve"


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _interfaces(run_on_node: RunOnNode, plan: LaunchPlan, by_name: dict[str, Node]) -> list[str]:
    """Each node's named interfaces, checked there."""
    asked: dict[str, set[str]] = {}
    for proc in plan.processes:
        for variable in INTERFACE_VARIABLES:
            if proc.env.get(variable):
                asked.setdefault(proc.node, set()).add(f"{variable}={proc.env[variable]}")
    if not asked:
        return []

    def check(name: str) -> list[str]:
        node = by_name[name]
        found = _helper(run_on_node, node, ["interfaces", *sorted(asked[name])], 30)
        if "error" in found:
            return [f"{node.name}: its interfaces could not be read ({found['error']})"]
        have = ", ".join(found.get("have", [])) or "none"
        return [
            f"{node.name}: {variable}={value} names no interface there with an address "
            f"({why}; its interfaces: {have})"
            for variable, value, why in found.get("missing", [])
        ]

    with ThreadPoolExecutor(max_workers=min(16, len(asked))) as pool:
        return [line for lines in pool.map(check, sorted(asked)) for line in lines]


def _reach(run_on_node: RunOnNode, point: MeetingPoint, far: Node, near: list[Node]) -> list[str]:
    """`far` listens at the point's port while every node of `near` connects to it."""
    listened: dict = {}

    def listen() -> None:
        seconds = str(CONNECT_S + 2)
        listened.update(
            _helper(
                run_on_node,
                far,
                ["listen", str(point.port), seconds, str(len(near))],
                CONNECT_S + 30,
            )
        )

    listener = threading.Thread(target=listen, daemon=True, name=f"distrun-netcheck-{far.name}")
    listener.start()

    def connect(node: Node) -> str | None:
        found = _helper(
            run_on_node,
            node,
            ["connect", point.host, str(point.port), str(CONNECT_S)],
            CONNECT_S + 30,
        )
        if found.get("ok"):
            return None
        error = found.get("error", "no answer")
        if listened.get("error"):  # it could not listen: that is the news
            return None
        likely = _LIKELY.get(error, "").format(near=node.name, far=far.name)
        return (
            f"{node.name} cannot reach {far.name}'s {point.what} {point.host}:{point.port} "
            f"({error}" + (f": {likely}" if likely else "") + ")"
        )

    with ThreadPoolExecutor(max_workers=min(16, len(near))) as pool:
        problems = [p for p in pool.map(connect, near) if p]
    listener.join(CONNECT_S + 30)
    if listened.get("error"):
        return [
            f"{far.name} cannot listen at port {point.port} for the {point.what} "
            f"({listened['error']}); leave the port out of the spec for a free one"
        ]
    return problems


def _helper(run_on_node: RunOnNode, node: Node, args: list[str], timeout: float) -> dict:
    """The helper's answer on `node` (its last JSON line), or {"error": why}."""
    try:
        code, out, err = run_on_node(node, [node.python, "-c", NETCHECK_SOURCE, *args], timeout)
    except Exception as exc:  # an unreachable node: the preflight said so before
        return {"error": str(exc)}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        return {"error": (err.strip().splitlines() or [f"exit code {code}"])[-1]}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": f"unreadable answer {lines[-1][:80]!r}"}
