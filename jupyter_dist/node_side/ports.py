"""Free and taken TCP ports on a machine.

Standard library only, Python 3.8+: SSH nodes run this file's source as it is (`python -c`)::

    python -c SOURCE COUNT [PORT ...]   -> line 1: COUNT free ports; then `PORT reason` for
                                           each given PORT that cannot be listened on
"""

import errno
import socket
import sys


def why_taken(port):
    """None if this machine can listen on `port` now, else why not ("address in use")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers do: a closed connection still in TIME_WAIT does not own the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            sock.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "already in use"
            return exc.strerror.lower() if exc.strerror else str(exc)
    return None


def free_ports(count):
    """`count` different ports nothing listens on now (bound together, then let go)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


if __name__ == "__main__":
    print(" ".join(str(p) for p in free_ports(int(sys.argv[1]))))
    for given in sys.argv[2:]:
        reason = why_taken(int(given))
        if reason:
            print(given, reason)
