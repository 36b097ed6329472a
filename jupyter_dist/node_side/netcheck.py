"""The network check's helper, run on a node before a job's ranks start (standard library
only: it runs as `python -c SOURCE ARGS` on nodes without jupyter-dist). One JSON line on
stdout says what it found.

    listen PORT SECONDS COUNT     bind every address at PORT (as torch's TCPStore does),
                                  say {"listening": true}, accept until COUNT connections
                                  came or SECONDS passed: {"accepted": N}; or {"error": ...}
    connect HOST PORT SECONDS     connect to HOST:PORT, again while it is refused (the
                                  listener may not be up yet) until SECONDS passed:
                                  {"ok": true} or {"error": "connection timed out", ...}
    interfaces NAME=VALUE...      each variable's interfaces exist and have an address:
                                  {"missing": [[NAME, VALUE, why]], "have": [names]}
    route HOST                    the address and interface this node reaches HOST from,
                                  and what its own hostname resolves to (what gloo
                                  advertises unless told an interface): {"address": A,
                                  "interface": NAME or null, "hostname": H, "resolves_to":
                                  A or null}; or {"error": ...}. Nothing is sent.

Interfaces are matched as each library does: GLOO_SOCKET_IFNAME names them exactly
(comma-separated); NCCL_SOCKET_IFNAME by prefix, `=` for an exact name, `^` to exclude
(not checked); OMPI_MCA_btl_tcp_if_include by name or subnet (subnets not checked).
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import sys
import time

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def say(found):
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()


def listen(port, seconds, count):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", port))
        server.listen(64)
    except OSError as exc:
        say({"error": os.strerror(exc.errno or 0).lower() or str(exc)})
        return 1
    say({"listening": True})
    accepted = 0
    deadline = time.monotonic() + seconds
    while accepted < count and time.monotonic() < deadline:
        server.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            peer, _ = server.accept()
        except OSError:
            continue
        accepted += 1
        peer.settimeout(1)
        with contextlib.suppress(OSError):
            peer.recv(1)  # the connector closes first: no TIME_WAIT on the job's port here
        peer.close()
    server.close()
    say({"accepted": accepted})
    return 0


def connect(host, port, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, left)):
                say({"ok": True})
                return 0
        except socket.timeout:  # noqa: UP041 (not yet TimeoutError on Python 3.8 and 3.9)
            why = "connection timed out"
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED and left > 0.1:
                time.sleep(0.05)  # the listener may not be up yet
                continue
            why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            if exc.errno == errno.EINVAL:  # Linux's answer for a blackhole route
                why = "no route to host"
        say({"error": why})
        return 0


def _address(name):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(
                probe.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
            )
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces(pairs):
    have = sorted(name for _, name in socket.if_nameindex())
    missing = []
    for pair in pairs:
        variable, _, value = pair.partition("=")
        for entry in (v.strip() for v in value.split(",") if v.strip()):
            if entry.startswith("^") or "/" in entry:
                continue  # an exclusion, a subnet: not names to look for
            exact = variable != "NCCL_SOCKET_IFNAME" or entry.startswith("=")
            entry = entry.lstrip("=")
            found = [n for n in have if (n == entry if exact else n.startswith(entry))]
            if not found:
                missing.append([variable, entry, "no such interface"])
            elif not any(_address(n) for n in found):
                missing.append([variable, entry, "it has no IPv4 address"])
    say({"missing": missing, "have": have})
    return 0


def route(host):
    try:
        target = socket.gethostbyname(host)
    except OSError as exc:
        say({"error": f"{host} does not resolve here ({exc})"})
        return 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))  # a datagram socket's connect only picks the route
            address = probe.getsockname()[0]
        except OSError as exc:
            why = os.strerror(exc.errno or 0).lower()
            say({"error": f"no route to {target} ({why})"})
            return 0
    names = [name for _, name in socket.if_nameindex()]
    interface = next((name for name in names if _address(name) == address), None)
    if interface is None and address.startswith("127."):
        interface = "lo"  # 127.0.0.0/8 is all lo's, whichever address lo says it has
    hostname = socket.gethostname()
    try:
        resolves_to = socket.gethostbyname(hostname)
    except OSError:
        resolves_to = None
    say(
        {
            "address": address,
            "interface": interface,
            "hostname": hostname,
            "resolves_to": resolves_to,
        }
    )
    return 0


def main(argv):
    if argv[0] == "listen":
        return listen(int(argv[1]), float(argv[2]), int(argv[3]))
    if argv[0] == "connect":
        return connect(argv[1], int(argv[2]), float(argv[3]))
    if argv[0] == "route":
        return route(argv[1])
    return interfaces(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
