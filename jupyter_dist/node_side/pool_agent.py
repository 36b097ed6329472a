"""The agent's part of a node's pool: where a job preloads modules, start the node's pool
of them (pool_server.py) unless one runs, and write the job's `python` shims that call the
front (pool_front.py); or say why the ranks start cold here (`NoPool`: an import error, a
pool stopped or silent, a startup variable a fork cannot honour).

Standard library only, Python 3.9+; shipped into the job's folder as
`pyhook/distrun_pool_agent.py`, where the node's agent (agent.py) loads it (`prepare`,
`forked_for`); what it shares with the pool and the front is pool_protocol.py's. A pool is
started outside the job's process tree (it outlives the job). Where the backend holds the
node's pool itself (HELD_VAR: Slurm, whose steps end what they start), it starts none: the
backend ran `hold` (this file run alone), a pool in a job step of its own.
"""

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time

_FOLDER = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path[:1] != [_FOLDER]:  # (PYTHONSAFEPATH)
    sys.path.insert(0, _FOLDER)
import distrun_pool_protocol as protocol  # noqa: E402 (after the path it is on)

START_WAIT_S = 30.0  # how long an agent that started the node's pool waits for it to listen
PING_S = 10.0  # how long a pool that has imported its modules may take to answer a ping
SHIM_FOLDER = "distrun-pool-bin"  # in the job's folder: `python` and `python3`
# Variables that differ between ranks or jobs: never the pool's, never its key.
_PER_JOB = (
    "DISTRUN_",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CONFIG",
    "OMPI_",
    "PMI_",
    "HOROVOD_",
    "TORCHELASTIC_",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)


class NoPool(Exception):
    """Why a job's ranks start cold on this node, in words for the job's output; `failed`:
    its modules could not be imported (the preload itself is wrong, not this node's pool)."""

    def __init__(self, reason, failed=False):
        super().__init__(reason)
        self.failed = failed


def _pool_env(env, hook):
    """The pool's environment: the job's, less what differs between ranks and jobs, and
    the room a forked rank writes its own into."""
    kept = {k: v for k, v in env.items() if not k.startswith(_PER_JOB)}
    if env.get(protocol.IDLE_VAR):
        kept[protocol.IDLE_VAR] = env[protocol.IDLE_VAR]
    paths = protocol.pythonpath_of(env, hook)
    kept.pop("PYTHONPATH", None)
    if paths:
        kept["PYTHONPATH"] = os.pathsep.join(paths)
    kept.pop("PYTHONBREAKPOINT", None)
    half = protocol.ENV_ROOM // 2
    kept[protocol.ROOM_VAR + "_A"] = "x" * half
    kept[protocol.ROOM_VAR + "_B"] = "x" * half
    return kept


def prepare(env, python):
    """For an agent whose job preloads modules: start this node's pool for them unless one
    runs, and write the job's `python` shims. Returns the shims' folder (first on PATH),
    or None: the ranks start cold and nothing need be said (no modules; another agent of
    the node started the pool and said why it failed). Raises NoPool (or OSError: the
    pools' folder is not private) where they start cold and the job's output should say
    why: a pool that cannot import its modules, a pool that is stopped or does not answer,
    a startup variable a fork cannot honour."""
    modules = protocol.modules_of(env)
    job_dir = env.get("DISTRUN_JOB_DIR")
    if not modules or not job_dir or sys.version_info < (3, 9):
        return None
    variable = protocol.unforkable(env)
    if variable:
        raise NoPool(f"{variable} is set, which a forked rank cannot honour")
    hook = _FOLDER
    key = protocol.pool_key(python, modules, protocol.pythonpath_of(env, hook), env)
    path = protocol.socket_path(key)
    asked = time.time() - 0.05
    started = None
    # One lock for the folder, not one per pool (those would pile up, one per key ever
    # used): a start holds it only until the new pool listens, before it imports.
    lock = protocol.start_lock()
    with os.fdopen(lock, "w") as lock:  # one agent of the node starts it; the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(path):
            _check_responsive(key)
        elif protocol.failure_since(key, asked) is not None:
            return None  # one started while this agent waited, and failed: its agent said so
        elif env.get(protocol.HELD_VAR) == "1":  # one started here would end with this agent
            error = protocol.failure_since(key, 0)  # a held pool that started well left none
            if error is not None:
                raise NoPool(error, failed=True)
            raise OSError("the node's pool, which the backend starts, does not answer")
        else:
            # (less a little: a file's time comes from the kernel's coarser clock)
            started = time.time() - 0.05
            _start_pool(python, key, modules, _pool_env(env, hook), started)
    if started is not None:  # its import's end, outside the lock: the others go on meanwhile
        _wait_until_ready(key, started)
    return _write_shims(job_dir, python)


def _state(pid):
    """The process's state letter (/proc/PID/stat: R, S, T for stopped, Z, ...), or None."""
    with contextlib.suppress(OSError, IndexError, TypeError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
    return None


def _check_responsive(key):
    """NoPool where the running pool of `key` would leave its ranks waiting: stopped
    (SIGSTOP, a debugger), or imported and yet silent to a ping within PING_S."""
    info = protocol.info(key)
    pid = info.get("pid")
    if _state(pid) in ("T", "t"):
        raise NoPool(f"the node's pool of these modules (pid {pid}) is stopped")
    if not info.get("ready"):
        return  # still importing: its fronts wait for it, as they would for a cold start
    with contextlib.suppress(OSError, ValueError):
        if (protocol.ask(key, {"ping": True}, PING_S) or {}).get("pong"):
            return
    if protocol.failure_since(key, info.get("started", 0)) is None:
        raise NoPool(f"the node's pool of these modules (pid {pid}) does not answer")


def _wait_until_ready(key, since):
    """Until the pool started at `since` has imported its modules; NoPool (failed) with its
    import error where it could not, or where it ended without one. A pool still
    importing after START_S is left to its fronts, which wait for it."""
    deadline = time.monotonic() + protocol.START_S
    while time.monotonic() < deadline:
        error = protocol.failure_since(key, since)
        if error is not None:
            raise NoPool(error, failed=True)
        info = protocol.info(key)
        if info.get("ready"):
            return
        if info and _state(info.get("pid")) in (None, "Z"):
            error = protocol.failure_since(key, since)
            raise NoPool(error or "the pool ended as it imported", failed=True)
        time.sleep(0.005)


def hold_main():
    """`hold`: be this node's pool of the modules the environment preloads, in this very
    process, unless one runs; says `running` or `started` (once the new pool listens, before
    it imports) on stdout, then nothing. Run as a Slurm job step of its own, held from
    outside the job (backends/slurm.py): that step outlives the job's, where a pool an
    agent started would end with the agent's step, and take the ranks it forked with it."""
    env = dict(os.environ)
    modules = protocol.modules_of(env)
    if not modules or sys.version_info < (3, 9):
        print("no pool: nothing to preload, or a Python older than 3.9", flush=True)
        return 2
    hook = _FOLDER
    python = sys.executable
    key = protocol.pool_key(python, modules, protocol.pythonpath_of(env, hook), env)
    lock = protocol.start_lock()
    fcntl.flock(lock, fcntl.LOCK_EX)  # held by the pool until it listens (serve_main)
    if _answers(protocol.socket_path(key)):
        print("running", flush=True)
        return 0
    os.set_inheritable(lock, True)
    pool_env = {**_pool_env(env, hook), protocol.LOCK_FD_VAR: str(lock)}
    room = "-" * protocol.ARGV_ROOM
    server = protocol.beside("pool_server.py")
    os.execve(python, [python, server, "serve", key, ",".join(modules), room], pool_env)


def _answers(path):
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _start_pool(python, key, modules, env, since):
    """A pool outside the agent's tree: started through a process that ends at once, so
    the pool belongs to no job. Returns once its socket listens."""
    room = "-" * protocol.ARGV_ROOM
    argv = [python, protocol.beside("pool_server.py"), "serve", key, ",".join(modules), room]
    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        subprocess.run(
            [
                python,
                "-c",
                "import subprocess, sys; subprocess.Popen(sys.argv[1:], "
                "start_new_session=True, close_fds=True)",
                *argv,
            ],
            stdin=null_in,
            stdout=null_out,
            stderr=null_out,
            env=env,
            check=True,
            timeout=30,
        )
    # Until it answers, not until its socket exists: between the pool's bind and its
    # listen, a probe is refused, and the next agent (the lock freed) started a second
    # pool that took the path, leaving this one serving its first ranks and then nobody.
    path = protocol.socket_path(key)
    deadline = time.monotonic() + START_WAIT_S
    while not _answers(path) and time.monotonic() < deadline:
        error = protocol.failure_since(key, since)
        if error is not None:  # it failed before this probe found it listening
            raise NoPool(error, failed=True)
        time.sleep(0.005)


_SHIM = """#!{python} -IS
import sys
sys.path.insert(0, {hook!r})
import distrun_pool_front
sys.exit(distrun_pool_front.front({python!r}, sys.argv[1:]))
"""


def _write_shims(job_dir, python):
    folder = os.path.join(job_dir, SHIM_FOLDER)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    text = _SHIM.format(python=python, hook=_FOLDER)
    for name in ("python", "python3"):
        target = os.path.join(folder, name)
        if not os.path.exists(target):  # several agents of a node may write it at once
            protocol.write_private(target, text, 0o700)
    return folder


def forked_for(job_dir, token):
    """The pids the pool forked for an agent (`FORKS_FOLDER/TOKEN`), for its tree."""
    path = os.path.join(job_dir, protocol.FORKS_FOLDER, token)
    with contextlib.suppress(OSError, ValueError), open(path) as handle:
        return [int(line) for line in handle if line.strip()]
    return []


def main(argv=None):
    """`hold`: be the environment's pool unless one runs (see `hold_main`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "hold":
        return hold_main()
    print("usage: distrun_pool_agent.py hold", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
