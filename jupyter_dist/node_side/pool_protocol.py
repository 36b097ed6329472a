"""What a node's pool programs agree on: where pools live, how a pool is keyed and reached,
the files it leaves and the messages it takes. Run alone, `list` and `stop` this user's
pools here (`jupyter distrun pool` sends this file's text to each node: they need nothing
else).

Standard library only, Python 3.8+. Shipped into a job's folder, where the job preloads
modules, as `pyhook/distrun_pool_protocol.py`, beside the three programs that import it:

- the pool (pool_server.py, shipped as `distrun_pool.py`): imports the modules, forks ranks;
- the front (pool_front.py, `distrun_pool_front.py`): what a job's `python` is;
- the agent's part (pool_agent.py, `distrun_pool_agent.py`): starts a node's pool, writes
  the job's `python` shims, or says why the ranks start cold.

**Where.** `$TMPDIR/distrun-pools-UID` (`pools_folder`, 0700, refused when it is not this
user's own), per pool of key KEY (`pool_key`: its Python, modules, PYTHONPATH, Python's
startup variables, namespaces, and the text of this file and the pool's):

- `KEY.sock`: the pool's Unix socket (0600);
- `KEY.json`: what the pool is (`info`), written before it listens: {"pid", "python",
  "modules", "started", "last_used", "ranks", "ready" (imported), "idle_limit", "where"};
- `KEY.failed`: a pool that could not import its modules says why, and ends:
  {"error": one line, "where"};
- `start.lock` (START_LOCK): held by whoever starts a pool, until it listens.

"where" (`here`) tells this node from another that shares the folder.

**Messages.** One JSON object a line, each way, on a connection to `KEY.sock`:

- a front's rank: {"kind": "script"|"module"|"code", "target", "args", "unbuffered",
  "env", "argv", "cwd", "executable", "cpus"}, sent with its stdin, stdout and stderr
  (SCM_RIGHTS); the pool answers {"pid"} (the forked rank waits) or {"refused": why}; the
  front sends `go` once the rank is in its cgroup and named for its agent; the pool says
  {"exit": code} when the rank ended (a negative code: the signal that ended it). The
  connection dropping either way ends the other side's part: the rank, or the front.
- {"ping": true}: {"pong": true} from a pool that serves;
- {"stop": true}: {"stopped": true}; the pool takes no new rank and ends after its last.
"""

import contextlib
import hashlib
import json
import os
import socket
import sys
import time

PRELOAD_VAR = "DISTRUN_PRELOAD"  # the modules, comma-separated
# "1": the backend holds this node's pool (the agent's part, `hold`); an agent uses it and
# never starts one.
HELD_VAR = "DISTRUN_POOL_HELD"
LOCK_FD_VAR = "DISTRUN_POOL_LOCK_FD"  # `hold` to the pool: the start lock it holds
IDLE_VAR = "DISTRUN_POOL_IDLE"  # seconds a pool waits, idle, before it ends
ROOM_VAR = "DISTRUN_POOL_ROOM"  # the pool's empty room for a rank's environment
ENV_ROOM = 96 * 1024  # bytes: in two variables (Linux takes at most 128 KiB in one)
ARGV_ROOM = 4096  # bytes of command line a rank may have
FORKS_FOLDER = "pool-forks"  # in the job's folder: TOKEN -> the pids forked for that agent
START_LOCK = "start.lock"  # in the pools' folder: held while a pool starts
START_S = 30.0  # how long a front waits for a pool that is starting (it imports first)
# What a front says on its rank's stderr where the rank ended because the pool it was
# forked from ended (diagnose/hints.py reads it, in place of the out-of-memory killer's hint).
POOL_ENDED = "distrun: the node's pool that forked this rank ended"

# The pool's programs, by their names here and as shipped (node_side/__init__.py's
# SHIPPED, which tests/test_architecture.py holds this to).
SHIPPED = {
    "pool_protocol.py": "distrun_pool_protocol.py",
    "pool_server.py": "distrun_pool.py",
    "pool_front.py": "distrun_pool_front.py",
    "pool_agent.py": "distrun_pool_agent.py",
}
# What a pool's key holds the text of: what decides how a rank is forked and run.
KEYED = ("pool_protocol.py", "pool_server.py")


def beside(name):
    """The path of pool program `name` (a key of SHIPPED) beside this file: by its shipped
    name in a job's folder, by its own in the package."""
    here = os.path.abspath(__file__)
    shipped = os.path.basename(here) == SHIPPED["pool_protocol.py"]
    return os.path.join(os.path.dirname(here), SHIPPED[name] if shipped else name)


# -- where pools live -------------------------------------------------------------------


def pools_folder():
    """The user's private folder of pools, made if missing; refused (OSError) when it is
    not a folder of this user's that nobody else can enter."""
    base = os.environ.get("TMPDIR") or "/tmp"
    folder = os.path.join(base, f"distrun-pools-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or info.st_uid != os.getuid():
        raise OSError(f"{folder} is not this user's folder")
    if info.st_mode & 0o077:
        raise OSError(f"{folder} is open to other users (mode {info.st_mode & 0o777:o})")
    return folder


def modules_of(env):
    """The modules the job's environment preloads (PRELOAD_VAR), in its order."""
    return [m for m in (env.get(PRELOAD_VAR) or "").replace(" ", "").split(",") if m]


def pythonpath_of(env, hook):
    """The environment's PYTHONPATH entries, less the job's hook folder `hook`."""
    return [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p and p != hook]


def namespaces():
    """This process's network and mount namespaces: a rank forked by a pool has the pool's,
    so a pool serves only processes that share them (containers, or test nodes, that
    share /tmp and not a network)."""
    found = []
    for name in ("net", "mnt"):
        with contextlib.suppress(OSError):
            found.append(os.stat(f"/proc/self/ns/{name}").st_ino)
    return found


def here():
    """What tells this node from another that shares the pools' folder (a TMPDIR on a shared
    filesystem, or test nodes that share /tmp): its hostname and namespaces."""
    return [socket.gethostname(), *namespaces()]


# Python's own variables that a fork needs nothing for: read again by the rank itself
# (PYTHONBREAKPOINT at each breakpoint(), PYTHONIOENCODING and PYTHONUNBUFFERED as its
# streams are made), in the key already (PYTHONPATH), or only for an interactive prompt
# (PYTHONSTARTUP).
_READ_BY_THE_RANK = (
    "PYTHONPATH",
    "PYTHONBREAKPOINT",
    "PYTHONIOENCODING",
    "PYTHONUNBUFFERED",
    "PYTHONSTARTUP",
)
# Those whose effect a pool cannot pass on: what they do happens while the interpreter
# starts and imports (the pool's output goes nowhere) or after the script (a prompt).
UNFORKABLE = (
    "PYTHONINSPECT",
    "PYTHONVERBOSE",
    "PYTHONDEBUG",
    "PYTHONPROFILEIMPORTTIME",
    "PYTHONTRACEMALLOC",
)


def startup_variables(env):
    """The job's variables that Python reads as it starts (PYTHONHASHSEED, PYTHONOPTIMIZE,
    PYTHONWARNINGS, PYTHONDEVMODE, PYTHONSAFEPATH, PYTHON_GIL, ...), sorted: a pool started
    with them is what a cold start with them is, so they are part of its key. A
    PYTHONHASHSEED of `random` is Python's default, as if unset."""
    found = []
    for name in sorted(env):
        if not name.startswith("PYTHON") or name in _READ_BY_THE_RANK:
            continue
        if name == "PYTHONHASHSEED" and env[name] == "random":
            continue
        found.append((name, env[name]))
    return found


def unforkable(env):
    """The first of the job's variables a pool cannot honour (UNFORKABLE), or None."""
    return next((name for name in UNFORKABLE if env.get(name)), None)


def pool_key(python, modules, pythonpath, env):
    """A pool serves ranks of the same Python, modules, PYTHONPATH, startup variables,
    namespaces and pool programs (KEYED)."""
    sources = []
    for name in KEYED:
        with open(beside(name), "rb") as handle:
            sources.append(hashlib.sha256(handle.read()).hexdigest())
    text = json.dumps(
        [
            os.path.realpath(python),
            sorted(modules),
            pythonpath,
            startup_variables(env),
            namespaces(),
            sources,
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(key):
    return os.path.join(pools_folder(), f"{key}.sock")


def info_path(key):
    return os.path.join(pools_folder(), f"{key}.json")


def info(key):
    """What the pool of `key` wrote of itself (see the module's docstring), or {}."""
    with contextlib.suppress(OSError, ValueError), open(info_path(key)) as handle:
        return json.load(handle)
    return {}


def failure_path(key):
    return os.path.join(pools_folder(), f"{key}.failed")


def write_failure(key, exc):
    """What a pool that could not import its modules leaves for the agent that started it."""
    text = "".join(f"{type(exc).__name__}: {exc}".splitlines()[:1])[:500]
    with contextlib.suppress(OSError):
        write_private(failure_path(key), json.dumps({"error": text, "where": here()}))


def failure_since(key, since):
    """The import error of a pool of `key` that failed here after `since` (epoch s), or None."""
    path = failure_path(key)
    with contextlib.suppress(OSError, ValueError, KeyError):
        if os.stat(path).st_mtime >= since:
            with open(path) as handle:
                found = json.load(handle)
            if found.get("where", here()) == here():
                return found["error"]
    return None


def start_lock():
    """The descriptor of the pools' START_LOCK (for `fcntl.flock`)."""
    return os.open(os.path.join(pools_folder(), START_LOCK), os.O_WRONLY | os.O_CREAT, 0o600)


def write_private(path, text, mode=0o600):
    """`text` into `path` whole (a reader never sees half, and several writers at once
    leave one whole file), with `mode`: 0600, or 0700 for a program."""
    partial = f"{path}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(partial, path)


# -- messages ---------------------------------------------------------------------------


def read_message(conn):
    """The next message on `conn` (one JSON line), or None where it closed first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data.decode())


def encode(message):
    """`message` as the line that carries it."""
    return json.dumps(message).encode() + b"\n"


def ask(key, message, timeout):
    """`message` to the pool of `key`, and its answer (None where it closed first); OSError
    or ValueError where it cannot be reached or answers nonsense within `timeout` s."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(socket_path(key))
        conn.sendall(encode(message))
        return read_message(conn)
    finally:
        conn.close()


# -- list and stop ----------------------------------------------------------------------


def stop_pools():
    """Tell every pool of this user here to take no new rank: each ends after its last
    (at once where none runs). The pools told (as `list_pools` shows them)."""
    told = []
    for pool in list_pools():
        with contextlib.suppress(OSError, ValueError):
            if (ask(pool["key"], {"stop": True}, 5) or {}).get("stopped"):
                told.append(pool)
    return told


def _rss(pid):
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def _serves(pid, key):
    """Whether `pid` is the pool of `key` (a pid may have been reused)."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
        return b"serve" in words and key.encode() in words
    return False


def list_pools():
    """This user's live pools here: pid, modules, python, ranks, rss (bytes), idle and
    age (seconds). The files of pools that ended without a word are removed; those of
    another node's (a shared folder) are left alone."""
    found = []
    folder = pools_folder()
    now = time.time()
    this_node = here()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        key = name[: -len(".json")]
        path = os.path.join(folder, name)
        try:
            with open(path) as handle:
                pool = json.load(handle)
        except (OSError, ValueError):
            continue
        if pool.get("where", this_node) != this_node:  # its pid means nothing here
            continue
        if not _serves(pool.get("pid", -1), key):
            for stale in (path, os.path.join(folder, key + ".sock")):
                with contextlib.suppress(OSError):
                    os.unlink(stale)
            continue
        idle = 0.0 if pool.get("ranks") else max(0.0, now - pool.get("last_used", now))
        found.append(
            {
                "key": key,
                "pid": pool["pid"],
                "modules": pool.get("modules", []),
                "python": pool.get("python"),
                "ranks": pool.get("ranks", 0),
                "rss": _rss(pool["pid"]),
                "idle": round(idle, 1),
                "age": round(now - pool.get("started", now), 1),
                "ready": pool.get("ready", False),
                "idle_limit": pool.get("idle_limit"),
            }
        )
    return found


def main(argv=None):
    """`list`, `stop`: this user's pools here, as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("list", "stop"):
        try:
            pools = list_pools() if argv[0] == "list" else stop_pools()
        except OSError as exc:
            print(f"distrun pool: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(pools))
        return 0
    print("usage: pool_protocol.py list | stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
