"""Network namespaces as test hosts (for the sshd nodes and the Slurm nodes): a bridge on
this machine, and per host a namespace joined to it by a veth pair, with its own address."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# Each kind of test cluster has its own range of /24 subnets (the second octet), so that
# clusters of one test run, which share a tag (the pid), never share a subnet: a bridge
# holding another cluster's addresses takes their traffic (the Ray cluster's, once, when
# its subnet was the Slurm cluster's for 1 pid in 5).
SUBNET_RANGES = {"ssh": (200, 50), "slurm": (150, 40), "ray": (100, 50)}


def tag(second: bool = False) -> int:
    """The tag (under 10,000) of this process's test cluster of a kind, or of a `second` one
    beside it: it names the cluster's namespaces, bridge and interfaces and picks its subnet
    and ports. Under pytest-xdist every worker runs clusters of its own at once, so the tag
    is the run's (PYTEST_XDIST_TESTRUNUID, shared by its workers) and the worker's index,
    spaced so that no two workers' clusters, first or second, share a name or a subnet;
    elsewhere it comes from the pid."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if run_id and worker and worker.startswith("gw") and worker[2:].isdigit():
        base, index = int(run_id[:8], 16) % 500, int(worker[2:]) % 10
    else:
        base, index = os.getpid() % 500, 0
    # base * 20 is 0, 10, 20, 30 or 40 modulo 50, the subnet's period: + index * 2 + second
    # (under 20) keeps each worker's clusters apart within one run.
    return base * 20 + index * 2 + int(second)


def subnet(kind: str, tag: int) -> str:
    """The /24 (its first three octets) of the `kind` cluster with this tag."""
    first, count = SUBNET_RANGES[kind]
    return f"10.{first + tag % count}.{tag % 250}"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def add_bridge(name: str, address: str) -> None:
    """A bridge holding `address` (CIDR, e.g. 10.1.2.1/24): this machine's side."""
    run("ip", "link", "add", name, "type", "bridge")
    run("ip", "addr", "add", address, "dev", name)
    run("ip", "link", "set", name, "up")


def add_host(namespace: str, veth: str, bridge: str, address: str) -> None:
    """A namespace whose eth0 (holding `address`, CIDR) is on the bridge, lo up."""
    run("ip", "netns", "add", namespace)
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
    run("ip", "link", "set", veth, "master", bridge)
    run("ip", "link", "set", veth, "up")
    inside = ["ip", "netns", "exec", namespace]
    run(*inside, "ip", "addr", "add", address, "dev", "eth0")
    run(*inside, "ip", "link", "set", "eth0", "up")
    run(*inside, "ip", "link", "set", "lo", "up")


def up_from_command_line(script: str, start: Callable, stop: Callable, describe: Callable) -> None:
    """`python tests/SCRIPT up COUNT DIR`: start test hosts by hand, say what is up
    (`describe(cluster)`), hold them until Ctrl-C or SIGTERM, then stop them."""
    if len(sys.argv) != 4 or sys.argv[1] != "up":
        raise SystemExit(f"usage: python tests/{script} up COUNT DIR")
    cluster = start(int(sys.argv[2]), Path(sys.argv[3]))
    hold_until_interrupted(describe(cluster), lambda: stop(cluster))


def hold_until_interrupted(message: str, stop: Callable[[], object]) -> None:
    """Say `message`, wait for Ctrl-C or SIGTERM, then `stop()`."""
    print(message, flush=True)
    print("Ctrl-C (or SIGTERM) tears them down.", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        stop()
