"""What a job's `python` and `python3` are where its node has a pool of its preload
(pool_server.py): the agent's part (pool_agent.py) writes shims that call `front` first on
the job's PATH. Standard library only, Python 3.9+; shipped into the job's folder as
`pyhook/distrun_pool_front.py`; what it says to the pool is pool_protocol.py's.

It reads its command line like Python does; a script, `-m module` or `-c code` (with
`-u`, `-B`) goes to the pool with its environment, working folder, and its stdin, stdout
and stderr; anything else, or no pool, runs the real Python in its place (`exec`), as if
the front were not there. While the forked rank runs, the front stands for it: it moves
the rank into its own cgroup and names it for its agent (`FORKS_FOLDER/TOKEN`), passes on
the signals it gets (SIGINT, SIGHUP, ...; not SIGTERM, which the agent's tree sends the
rank itself), and exits as the rank did (its code, or the same signal).
"""

import contextlib
import os
import shutil
import signal
import socket
import sys
import time

import distrun_pool_protocol as protocol  # beside this file (pool_protocol.py, shipped)

TOKEN_VAR = "DISTRUN_AGENT_TOKEN"  # as agent.py names it
# What a front passes on to its rank: what the agent sends its child alone (SIGINT: a warm
# session's interrupt), and what a user may send a rank's process.
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# What it ignores: SIGTERM (the agent's tree holds the forked rank, which gets it from the
# agent itself, once; the front waits for its end to exit as it did) and the stack and
# pause signals (stack_hook.py) that a look at the job's processes might send it too.
IGNORED = (signal.SIGTERM,) + (
    (signal.SIGRTMIN + 6, signal.SIGRTMIN + 7) if hasattr(signal, "SIGRTMIN") else ()
)


def parse_command(args):
    """(kind, target, rest, unbuffered) for `[-u] [-B] SCRIPT|-m MODULE|-c CODE ARGS`;
    None for anything else (it starts cold)."""
    unbuffered = False
    i = 0
    while i < len(args):
        word = args[i]
        if word in ("-u", "-B", "-uB", "-Bu"):
            unbuffered = unbuffered or "u" in word
            i += 1
        elif word in ("-m", "-c") and i + 1 < len(args):
            kind = "module" if word == "-m" else "code"
            return kind, args[i + 1], args[i + 2 :], unbuffered
        elif word.startswith("-") or word == "":
            return None
        else:
            if not (word.endswith(".py") and os.path.isfile(word)):
                return None  # a folder or a zip with __main__, or missing: Python says
            return "script", word, args[i + 1 :], unbuffered
    return None


def _cgroup_procs():
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            if line.startswith("0::"):
                return f"/sys/fs/cgroup{line.strip()[3:]}/cgroup.procs"
    return None


def _name_for_agent(pid):
    """Join the agent's tree: move the rank into our cgroup and name it for the agent."""
    with contextlib.suppress(OSError, TypeError):
        procs = _cgroup_procs()
        with open(procs, "w") as handle:
            handle.write(str(pid))
    job_dir, token = os.environ.get("DISTRUN_JOB_DIR"), os.environ.get(TOKEN_VAR)
    if not job_dir or not token:
        return None
    folder = os.path.join(job_dir, protocol.FORKS_FOLDER)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    path = os.path.join(folder, token)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as handle:
        handle.write(f"{pid}\n")
    return path


def front(real_python, argv):
    """What a job's `python` is: the rank forked from the pool where it can be, else the
    real Python in this process's place."""
    parsed = parse_command(argv)
    modules = protocol.modules_of(os.environ)
    executable = _executable(real_python)
    if parsed is None or not modules or protocol.unforkable(os.environ):
        return _cold(executable, argv)
    if os.path.realpath(executable) != os.path.realpath(real_python):
        return _cold(executable, argv)  # another Python comes first on PATH: the user's
    kind, target, rest, unbuffered = parsed
    unbuffered = unbuffered or bool(os.environ.get("PYTHONUNBUFFERED"))
    hook = os.path.dirname(os.path.abspath(__file__))
    try:
        key = protocol.pool_key(
            real_python, modules, protocol.pythonpath_of(os.environ, hook), os.environ
        )
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(protocol.START_S)
        conn.connect(protocol.socket_path(key))
        shown = [os.path.basename(sys.argv[0]), *argv]
        request = {
            "kind": kind,
            "target": target,
            "args": rest,
            "unbuffered": unbuffered,
            "env": dict(os.environ),
            "argv": shown,
            "cwd": os.getcwd(),
            "executable": executable,
            "cpus": sorted(os.sched_getaffinity(0)),
        }
        socket.send_fds(conn, [protocol.encode(request)], [0, 1, 2])
        answer = protocol.read_message(conn)
    except (OSError, ValueError):
        return _cold(executable, argv)
    if not answer or "pid" not in answer:
        return _cold(executable, argv)
    pid = answer["pid"]
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _f: _pass_on(pid, signum))
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    named = _name_for_agent(pid)
    conn.settimeout(None)
    conn.sendall(b"go\n")
    try:
        ended = protocol.read_message(conn)
    except OSError:
        ended = None
    if named:
        _unname(named, pid)
    if not ended:  # the pool's end took the rank (PR_SET_PDEATHSIG): say so, not an OOM kill
        with contextlib.suppress(OSError):
            said = f"{protocol.POOL_ENDED} (it was killed or crashed); this rank with it\n"
            os.write(2, said.encode())
    code = ended["exit"] if ended else -signal.SIGKILL
    if code < 0:  # the same signal ends us: the agent reads 128+N, as for a cold rank
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code if code >= 0 else 128 - code


def _pass_on(pid, signum):
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def _unname(path, pid):
    with contextlib.suppress(OSError):
        with open(path) as handle:
            left = [line for line in handle if line.strip() != str(pid)]
        if left:
            with open(path, "w") as handle:
                handle.writelines(left)
        else:
            os.unlink(path)


def _executable(real_python):
    """The Python a cold start of this command would be: the shim's name (`python` or
    `python3`) found on PATH after the shims' folder, as the shell would have found it
    without them (its `sys.executable`); the real Python where none is."""
    shims = os.path.dirname(os.path.abspath(sys.argv[0]))
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != shims
    )
    found = shutil.which(os.path.basename(sys.argv[0]), path=path)
    return os.path.abspath(found) if found else real_python


def _cold(python, argv):
    os.execv(python, [python, *argv])
