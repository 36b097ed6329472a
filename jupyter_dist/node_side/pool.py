"""A node's pool: one Python that imported a job's `preload` modules once and forks ranks
from it, so that a rank starts with torch (say) already imported instead of paying for the
import again.

Standard library only, Python 3.8+ (3.9 to fork: `socket.send_fds`): shipped into each job's
folder as `$DISTRUN_JOB_DIR/pyhook/distrun_pool.py` when the job names modules to preload
(`DISTRUN_PRELOAD=torch,numpy` in its environment). Three parts, one file:

- **the pool** (`serve`): binds a Unix socket in the user's private folder
  (`$TMPDIR/distrun-pools-UID`, 0700, socket 0600), imports the modules, then forks a rank
  for each request. A pool is keyed by its Python, its modules and its PYTHONPATH; it ends
  itself once idle for `DISTRUN_POOL_IDLE` seconds (IDLE_S by default) with no rank
  running (the latest job's `DISTRUN_POOL_IDLE`), at `stop`, and once the file of any
  module it imported changed on disk (a `pip install`, an edited submodule): then it
  answers "stale", takes no new rank and ends after its last. (Its key also holds Python's
  startup variables, the network and mount namespaces and pool.py's own text: `pool_key`.)
  One that cannot import its modules leaves its error (`KEY.failed`) and ends; a ready one
  answers a ping.
- **the front** (`front`): what `python` and `python3` are for the job's commands (the agent
  puts shims that call it first on PATH). It reads its command line like Python does; a
  script, `-m module` or `-c code` (with `-u`, `-B`) goes to the pool with its environment,
  working folder, and its stdin, stdout and stderr; anything else, or no pool, runs the
  real Python in its place (`exec`), as if the front were not there. While the forked rank
  runs, the front stands for it: it passes on the signals it gets (SIGINT, SIGHUP, ...; not
  SIGTERM, which the agent's tree sends the rank itself), and exits as the rank did (its
  code, or the same signal).
- **the agent's part** (`prepare`): starts the job's pool where none runs (outside the
  job's process tree: it outlives the job), waits for its import's end where it started
  it, and writes the shims; or says why the ranks start cold here (`NoPool`: an import
  error, a pool stopped or silent, a startup variable a fork cannot honour). Where the
  backend holds the node's pool itself (`HELD_VAR`: Slurm, whose steps end what they
  start), it starts none: the backend ran `hold`, a pool in a job step of its own.

A forked rank is what a started one would be: before any of its code runs it has its own
session, stdin/stdout/stderr, environment (also what /proc/PID/environ shows: the pool
starts with room for it), command line, working folder, `sys.argv`, `sys.path`,
`sys.executable`, fresh `__main__`, default signal handlers, the job's startup hook
(sitecustomize on its PYTHONPATH), fresh numpy and torch seeds and torch's thread count
from OMP_NUM_THREADS; Python's startup variables are the pool's own, since they are in
its key (`startup_variables`). What a fork cannot be given: a string hash salt of its
own (one per interpreter: the pool's). Two things are quicker than in a cold start, and
nothing else differs for them: the pool's objects are frozen for the garbage collector
(`gc.freeze()` before each fork), and its clients of torch's TCPStore wait for the store
with a short poll instead of torch's backoff (`_prompt_store_clients`). It leaves
without the interpreter's teardown (`_leave`). It dies with the pool (PR_SET_PDEATHSIG)
and with its front (the pool kills it when the front's connection drops). The front
moves it into its own cgroup before it runs, and names it in `$DISTRUN_JOB_DIR/pool-
forks/TOKEN` for the agent, whose tree it joins: stopping, usage and the sweep see it as
the agent's own.
"""

import atexit
import contextlib
import ctypes
import fcntl
import functools
import gc
import hashlib
import importlib
import importlib.machinery
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types

PRELOAD_VAR = "DISTRUN_PRELOAD"  # the modules, comma-separated
# "1": the backend holds this node's pool (`hold`); an agent uses it and never starts one.
HELD_VAR = "DISTRUN_POOL_HELD"
_LOCK_FD_VAR = "DISTRUN_POOL_LOCK_FD"  # `hold` to `serve`: the start lock it holds
IDLE_VAR = "DISTRUN_POOL_IDLE"  # seconds a pool waits, idle, before it ends
IDLE_S = 600
# How often an idle pool looks whether its socket is still its own: one whose socket another
# pool took (a start that lost a race) serves nobody, and ends once its last rank ends.
OWNED_CHECK_S = 5.0
START_WAIT_S = 30.0  # how long an agent that started the node's pool waits for it to listen
# What a front says where its rank ended because the pool it was forked from ended
# (diagnose/hints.py reads it, in place of the out-of-memory killer's hint).
POOL_ENDED = "distrun: the node's pool that forked this rank ended"
PING_S = 10.0  # how long a pool that has imported its modules may take to answer a ping
ROOM_VAR = "DISTRUN_POOL_ROOM"  # the pool's empty room for a rank's environment
ENV_ROOM = 96 * 1024  # bytes: in two variables (Linux takes at most 128 KiB in one)
ARGV_ROOM = 4096  # bytes of command line a rank may have
FORKS_FOLDER = "pool-forks"  # in the job's folder: TOKEN -> the pids forked for that agent
SHIM_FOLDER = "distrun-pool-bin"  # in the job's folder: `python` and `python3`
TOKEN_VAR = "DISTRUN_AGENT_TOKEN"  # as agent.py names it
START_LOCK = "start.lock"  # in the pools' folder: held while an agent starts a pool
START_S = 30.0  # how long a front waits for a pool that is starting (it imports first)
# How often a forked rank's client of torch's TCPStore looks whether the job's store
# listens yet (`_prompt_store_clients`), and for how long at most before it leaves the
# waiting to torch.
STORE_POLL_S = 0.005
STORE_POLL_LIMIT_S = 60.0
_STORE_PARAMS = ("hostname", "port", "rank", "world_size", "timeout")  # what it wraps takes
# What a front passes on to its rank: what the agent sends its child alone (SIGINT: a warm
# session's interrupt), and what a user may send a rank's process.
FORWARDED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# What it ignores: SIGTERM (the agent's tree holds the forked rank, which gets it from the
# agent itself, once; the front waits for its end to exit as it did) and the stack and
# pause signals (stack_hook.py) that a look at the job's processes might send it too.
IGNORED = (signal.SIGTERM,) + (
    (signal.SIGRTMIN + 6, signal.SIGRTMIN + 7) if hasattr(signal, "SIGRTMIN") else ()
)
_PR_SET_PDEATHSIG = 1
# Variables that differ between ranks or jobs: never the pool's, never its key.
_PER_JOB = ("DISTRUN_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "OMPI_", "PMI_",
            "HOROVOD_", "TORCHELASTIC_", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")  # fmt: skip


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
    return [m for m in (env.get(PRELOAD_VAR) or "").replace(" ", "").split(",") if m]


def _pythonpath(env, hook):
    return [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p and p != hook]


def _namespaces():
    """This process's network and mount namespaces: a rank forked by a pool has the pool's,
    so a pool serves only processes that share them (containers, or test nodes, that
    share /tmp and not a network)."""
    found = []
    for name in ("net", "mnt"):
        with contextlib.suppress(OSError):
            found.append(os.stat(f"/proc/self/ns/{name}").st_ino)
    return found


def _here():
    """What tells this node from another that shares the pools' folder (a TMPDIR on a shared
    filesystem, or test nodes that share /tmp): its hostname and namespaces."""
    return [socket.gethostname(), *_namespaces()]


# Python's own variables that a fork needs nothing for: read again by the rank itself
# (PYTHONBREAKPOINT at each breakpoint(), PYTHONIOENCODING and PYTHONUNBUFFERED by `_stdio`),
# in the key already (PYTHONPATH), or only for an interactive prompt (PYTHONSTARTUP).
_READ_BY_THE_RANK = ("PYTHONPATH", "PYTHONBREAKPOINT", "PYTHONIOENCODING", "PYTHONUNBUFFERED",
                     "PYTHONSTARTUP")  # fmt: skip
# Those whose effect a pool cannot pass on: what they do happens while the interpreter
# starts and imports (the pool's output goes nowhere) or after the script (a prompt).
UNFORKABLE = ("PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONDEBUG", "PYTHONPROFILEIMPORTTIME",
              "PYTHONTRACEMALLOC")  # fmt: skip


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
    namespaces and pool.py."""
    with open(__file__, "rb") as handle:
        source = hashlib.sha256(handle.read()).hexdigest()
    text = json.dumps([os.path.realpath(python), sorted(modules), pythonpath,
                       startup_variables(env), _namespaces(), source])  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(key):
    return os.path.join(pools_folder(), f"{key}.sock")


class NoPool(Exception):
    """Why a job's ranks start cold on this node, in words for the job's output; `failed`:
    its modules could not be imported (the preload itself is wrong, not this node's pool)."""

    def __init__(self, reason, failed=False):
        super().__init__(reason)
        self.failed = failed


def _failure_path(key):
    return os.path.join(pools_folder(), f"{key}.failed")


def _write_failure(key, exc):
    """What a pool that could not import its modules leaves for the agent that started it."""
    text = "".join(f"{type(exc).__name__}: {exc}".splitlines()[:1])[:500]
    with contextlib.suppress(OSError):
        _write_private(_failure_path(key), json.dumps({"error": text, "where": _here()}))


def _failure_since(key, since):
    """The import error of a pool of `key` that failed here after `since` (epoch s), or None."""
    path = _failure_path(key)
    with contextlib.suppress(OSError, ValueError, KeyError):
        if os.stat(path).st_mtime >= since:
            with open(path) as handle:
                info = json.load(handle)
            if info.get("where", _here()) == _here():
                return info["error"]
    return None


def _write_private(path, text, mode=0o600):
    """`text` into `path` whole (a reader never sees half, and several writers at once
    leave one whole file), with `mode`: 0600, or 0700 for a program."""
    partial = f"{path}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(partial, path)


# -- the pool ---------------------------------------------------------------------------


def _imported_files(modules):
    """What a pool's ranks would read again if they started cold: the file of every module
    it imported (a package's `__init__` and each submodule alike: an edited `model.py` is
    as stale as a new version of torch), and the named modules' folders and the folders
    above (site-packages changes when any distribution is installed)."""
    paths = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.isabs(path):
            paths.add(path)
    for name in modules:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            paths.update({os.path.dirname(path), os.path.dirname(os.path.dirname(path))})
    return sorted(paths)


def _fingerprint(paths):
    """Each path's time, size and inode: what an edit, a copy over it or a new version
    installed changes (a missing path is None: removed is changed too)."""
    found = {}
    for path in paths:
        try:
            info = os.stat(path)
            found[path] = (info.st_mtime_ns, info.st_size, info.st_ino)
        except OSError:
            found[path] = None
    return found


def _proc_block(first_field):
    """(start, end) of this process's argv (48) or environment (50) block, from /proc."""
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[first_field - 3]), int(fields[first_field - 2])


def _nul_block(words):
    """`words` as the kernel keeps a command line or an environment: each NUL-ended."""
    return b"".join(w.encode(errors="surrogateescape") + b"\0" for w in words)


def _env_words(env):
    return [f"{name}={value}" for name, value in env.items()]


def _rewrite_block(first_field, words):
    """Make /proc/self/cmdline or /proc/self/environ say `words`, in the room the process
    started with; False when they do not fit."""
    data = _nul_block(words)
    start, end = _proc_block(first_field)
    if len(data) > end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True


class _Rank:
    """What a forked child runs once it is the rank (see `_become`): the request, and the
    rank's sys.path made as a cold start makes it, from the pool's (`base_path`, less the
    pool's PYTHONPATH `pool_pythonpath`) and the rank's PYTHONPATH."""

    def __init__(self, request, base_path, pool_pythonpath):
        self.kind = request["kind"]  # "script", "module" or "code"
        self.target = request["target"]
        self.args = request["args"]
        self.unbuffered = request["unbuffered"]
        self.executable = request.get("executable")
        self.base_path = base_path
        self.pythonpath = _pythonpath(request["env"], None)
        # What the rank's PYTHONPATH adds (the job's startup hook): its sitecustomize runs.
        self.hook_paths = [p for p in self.pythonpath if p not in pool_pythonpath]


class Pool:
    def __init__(self, key, modules, idle):
        self.key = key
        self.modules = modules
        self.idle = idle
        self.path = socket_path(key)
        self.ranks = {}  # pid -> (front's connection, the go pipe's write end)
        self.stale = False
        self.selector = selectors.DefaultSelector()

    def bind(self):
        """Listen first (fronts that come meanwhile wait in the backlog), then import."""
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        self.inode = os.stat(self.path).st_ino
        self.info_path = self.path[: -len(".sock")] + ".json"
        self.started = time.time()
        self.last_used = self.started
        self.write_info()  # first: whoever finds the pool answering finds what it is
        with contextlib.suppress(OSError):  # an earlier pool's import error is not this one's
            os.unlink(_failure_path(self.key))
        self.listener.listen(256)

    def write_info(self):
        """What `list_pools` shows: the pool's modules, ranks and when it was last used."""
        info = {"pid": os.getpid(), "python": sys.executable, "modules": self.modules,
                "started": self.started, "last_used": self.last_used,
                "ranks": sum(1 for conn, _ in self.ranks.values() if conn is not None),
                "ready": hasattr(self, "fingerprint"), "idle_limit": self.idle,
                "where": _here()}  # fmt: skip
        with contextlib.suppress(OSError):
            _write_private(self.info_path, json.dumps(info))

    def remove_info(self):
        mine = False
        with contextlib.suppress(OSError, ValueError), open(self.info_path) as handle:
            mine = json.load(handle).get("pid") == os.getpid()
        if mine:
            with contextlib.suppress(OSError):
                os.unlink(self.info_path)

    def preload(self):
        """Import the modules (a failure ends the pool: its fronts start their ranks cold,
        and the ranks' own import says what is wrong)."""
        for name in self.modules:
            importlib.import_module(name)
        self.watched = _imported_files(self.modules)
        self.fingerprint = _fingerprint(self.watched)
        _prompt_store_clients()
        # What a forked rank's sys.path is built from: the pool's, less its PYTHONPATH
        # (the rank's own comes first, as in a cold start).
        self.pythonpath = _pythonpath(os.environ, None)
        self.base_path = [p for p in sys.path if p not in self.pythonpath]

    def serve(self):
        """Serve until idle, stopped or stale with no rank left; in a forked child, return
        the rank it is to be."""
        wake_read, wake_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_write)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.wake = (wake_read, wake_write)
        self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        self.selector.register(wake_read, selectors.EVENT_READ, "wake")
        last = time.monotonic()
        while True:
            if self.ranks:
                timeout = None
            elif self.stale or not self._owns_socket():
                return None
            else:
                timeout = last + self.idle - time.monotonic()
                if timeout <= 0:
                    return None
                timeout = min(timeout, OWNED_CHECK_S)
            for key, _ in self.selector.select(timeout):
                if key.data == "listen":
                    rank = self._accept()
                    if rank is not None:
                        return rank  # the forked child
                    last, self.last_used = time.monotonic(), time.time()
                    self.write_info()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(wake_read, 512)
                    if self._reap():
                        last, self.last_used = time.monotonic(), time.time()
                        self.write_info()
                else:
                    self._from_front(key.data)

    def _owns_socket(self):
        """Whether the socket at its path is still the one it bound (no other pool of the
        same key took the path: no job can reach this one any more)."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def _on_signal(self, signum, _frame):
        if signum != signal.SIGCHLD:
            self.stop_taking()

    def stop_taking(self):
        """Take no new rank: the socket goes (a later job starts a new pool)."""
        self.stale = True
        if self._owns_socket():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)

    def _accept(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        conn.settimeout(10)
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while message and not message.endswith(b"\n"):  # a stream: it may come in pieces
                more = conn.recv(1 << 20)
                if not more:
                    break
                message += more
            request = json.loads(message.decode())
            if request.get("stop") or request.get("ping"):
                if request.get("stop"):
                    self.stop_taking()
                conn.sendall(b'{"stopped": true}\n' if request.get("stop") else b'{"pong": true}\n')
                conn.close()
                return None
            if len(fds) != 3:
                raise ValueError("a rank needs its stdin, stdout and stderr")
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"refused": str(exc)}).encode() + b"\n")
            conn.close()
            return None
        with contextlib.suppress(ValueError, TypeError):  # the latest job's idle time
            self.idle = float(request["env"].get(IDLE_VAR) or self.idle)
        refusal = self._refusal(request)
        if refusal:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
            conn.close()
            for fd in fds:
                os.close(fd)
            return None
        go_read, go_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # What the pool holds is never the rank's garbage: frozen, the rank's collections
        # skip it (a full one over torch's objects took each rank 80 ms at its exit) and
        # leave its pages shared with the pool instead of copying them (Python's gc docs).
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            return self._become(request, fds, go_read, conn)
        os.close(go_read)
        for fd in fds:
            os.close(fd)
        self.ranks[pid] = (conn, go_write)
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            self._front_gone(pid)
            return None
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)
        return None

    def _refusal(self, request):
        if self.stale:
            return "stale"
        if _fingerprint(self.watched) != self.fingerprint:
            self.stop_taking()
            return "stale"
        if len(_nul_block(_env_words(request["env"]))) > ENV_ROOM:
            return "environment too large"
        if len(_nul_block(request["argv"])) > ARGV_ROOM:
            return "command line too long"
        return None

    def _from_front(self, pid):
        """The front said go (its rank is in its cgroup and named for its agent), or it
        ended: then so does the rank."""
        conn, go_write = self.ranks[pid]
        try:
            data = conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data.startswith(b"go") and go_write is not None:
            with contextlib.suppress(OSError):
                os.write(go_write, b"g")
                os.close(go_write)
            self.ranks[pid] = (conn, None)
        elif not data:
            self._front_gone(pid)

    def _front_gone(self, pid):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # its session's group: what it started too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        conn, go_write = self.ranks[pid]
        if go_write is not None:
            with contextlib.suppress(OSError):
                os.close(go_write)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        conn.close()
        self.ranks[pid] = (None, None)

    def _reap(self):
        """Tell each ended rank's front how it ended; whether any ended."""
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            reaped = True
            conn, go_write = self.ranks.pop(pid, (None, None))
            code = os.waitstatus_to_exitcode(status)
            if go_write is not None:
                with contextlib.suppress(OSError):
                    os.close(go_write)
            if conn is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.setblocking(True)
                    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
                conn.close()

    # -- in the forked child --------------------------------------------------------------

    def _become(self, request, fds, go_read, conn):
        """Turn this fresh fork into the rank the request describes; return what it runs."""
        pool_pid = os.getppid()
        signal.set_wakeup_fd(-1)
        for sig in signal.valid_signals():  # first: the pool's own handlers are not the rank's
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                signal.signal(sig, signal.SIG_DFL)
        self.selector.close()
        for fd in self.wake:
            os.close(fd)
        self.listener.close()
        for other, _ in self.ranks.values():
            if other is not None:
                other.close()
        conn.close()
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != pool_pid:  # the pool died before PDEATHSIG was set
            os._exit(137)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        _rewrite_block(50, _env_words(env))
        _rewrite_block(48, request["argv"])
        if hasattr(sys, "orig_argv"):
            sys.orig_argv = list(request["argv"])
        if request.get("cpus"):  # the CPUs its front may use (a Slurm step's), not the pool's
            with contextlib.suppress(OSError, ValueError):
                os.sched_setaffinity(0, request["cpus"])
        try:
            os.chdir(request["cwd"])
        except OSError as exc:
            os.write(2, f"distrun pool: cannot enter {request['cwd']}: {exc}\n".encode())
            os._exit(2)
        # Wait for the front: it moves this process into its cgroup and names it to its
        # agent, so that nothing the rank starts is ever outside the job.
        if os.read(go_read, 1) != b"g":
            os._exit(137)
        os.close(go_read)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets them at start
        if hasattr(signal, "SIGXFSZ"):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        return _Rank(request, self.base_path, self.pythonpath)


def _stdio(unbuffered):
    """sys.stdin, stdout and stderr on descriptors 0, 1, 2, made as Python makes them."""
    encoding = (os.environ.get("PYTHONIOENCODING") or "utf-8").split(":")[0] or "utf-8"

    def stream(fd, writing, errors):
        raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
        tty = raw.isatty()
        if writing and unbuffered:
            buffer = raw
        else:
            buffer = (io.BufferedWriter if writing else io.BufferedReader)(raw)
        return io.TextIOWrapper(
            buffer, encoding=encoding, errors=errors,
            line_buffering=writing and (tty or fd == 2), write_through=writing and unbuffered,
        )  # fmt: skip

    sys.stdin = sys.__stdin__ = stream(0, False, "strict")
    sys.stdout = sys.__stdout__ = stream(1, True, "strict")
    sys.stderr = sys.__stderr__ = stream(2, True, "backslashreplace")


def _fresh_state():
    """What a cold start has that a fork shares with its pool: numpy's and torch's global
    seeds (each process draws its own from the OS at import) and torch's threads (read
    from OMP_NUM_THREADS at start). Python's `random` reseeds itself after a fork."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        with contextlib.suppress(Exception):
            torch.set_num_threads(int(threads))


def _prompt_store_clients():
    """Where the pool imported torch.distributed: its ranks' TCPStore clients connect
    within milliseconds of the store's start. torch's client, refused because rank 0 has
    not opened the store yet, asks again after 0.1 s, then 0.2, 0.4, up to 1 s apart (with
    jitter); a cold rank 0 takes seconds to import torch, but forked ranks all reach
    `init_process_group` within milliseconds of each other, and whichever client asks before
    rank 0 listens then waits most of a second for a store that came up meanwhile (and rank
    0 waits for it). So a forked rank that is a client (not rank 0; not under torchrun's
    agent store) first looks every STORE_POLL_S whether the port takes connections, then
    lets torch connect as before: what it connects to, and every error, are torch's own.
    Only a refusal is waited on (anything else: torch's own retry and error), and for at
    most STORE_POLL_LIMIT_S or the store's timeout. Nothing changes where torch's private
    `_create_c10d_store` is not what this expects."""
    rendezvous = sys.modules.get("torch.distributed.rendezvous")
    create = getattr(rendezvous, "_create_c10d_store", None)
    code = getattr(create, "__code__", None)
    if code is None or code.co_varnames[: len(_STORE_PARAMS)] != _STORE_PARAMS:
        return

    @functools.wraps(create)
    def create_once_listening(hostname, port, rank, world_size, timeout, *args, **kwargs):
        if rank != 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            seconds = getattr(timeout, "total_seconds", lambda: STORE_POLL_LIMIT_S)()
            _wait_for_listener(hostname, port, min(seconds, STORE_POLL_LIMIT_S))
        return create(hostname, port, rank, world_size, timeout, *args, **kwargs)

    rendezvous._create_c10d_store = create_once_listening


def _wait_for_listener(host, port, limit):
    """Until `host:port` takes a connection, while it refuses one, for at most `limit`
    seconds; at once on any other answer (torch's client says what is wrong)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except ConnectionRefusedError:
            if time.monotonic() + STORE_POLL_S >= deadline:
                return
            time.sleep(STORE_POLL_S)
        except (OSError, ValueError, TypeError):
            return


def _run_hooks(paths):
    """The sitecustomize of a folder the rank's PYTHONPATH adds (the job's startup hook),
    which site would have imported at start."""
    for folder in paths:
        if os.path.isfile(os.path.join(folder, "sitecustomize.py")):
            sys.modules.pop("sitecustomize", None)
            with contextlib.suppress(Exception):
                importlib.import_module("sitecustomize")
            return


def _trimmed(tb):
    """The traceback from the rank's own code on (a cold start shows no frame of ours)."""
    ours = {
        os.path.abspath(__file__),
        os.path.abspath(getattr(sys.modules["runpy"], "__file__", "")),
    }
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in ours:
        tb = tb.tb_next
    return tb


def run_rank(rank):
    """Run the rank as `python SCRIPT|-m MODULE|-c CODE ARGS` would, then exit as it would."""
    _stdio(rank.unbuffered)
    import runpy  # imported before the rank runs: _trimmed leaves its frames out

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if rank.kind == "script":
        sys.argv = [rank.target, *rank.args]
        first = os.path.dirname(os.path.realpath(rank.target))
        rank.target = os.path.abspath(rank.target)  # as Python names the file it runs
    elif rank.kind == "module":
        sys.argv = ["-m", *rank.args]  # runpy puts the module's file first
        first = os.getcwd()
    else:
        sys.argv = ["-c", *rank.args]
        first = ""
    if rank.executable:
        sys.executable = rank.executable
    before = [] if getattr(sys.flags, "safe_path", False) else [first]  # PYTHONSAFEPATH
    sys.path[:] = [*before, *rank.pythonpath, *rank.base_path]
    _run_hooks(rank.hook_paths)
    _fresh_state()
    try:
        if rank.kind == "script":
            with io.open_code(rank.target) as handle:
                code = compile(handle.read(), rank.target, "exec")
            main.__file__ = rank.target
            main.__cached__ = None
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", rank.target)
            exec(code, main.__dict__)
        elif rank.kind == "module":
            runpy._run_module_as_main(rank.target, alter_argv=True)
        else:
            exec(compile(rank.target, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:  # as Python reads it: None 0, a number, else said and 1
        if exc.code is None or isinstance(exc.code, int):
            _leave(main, exc.code or 0)
        print(exc.code, file=sys.stderr)
        _leave(main, 1)
    except BaseException as exc:
        exc.__traceback__ = _trimmed(exc.__traceback__)  # what Python prints is the error's
        sys.excepthook(type(exc), exc, exc.__traceback__)
        # As Python: one that a KeyboardInterrupt ended dies of the SIGINT.
        _leave(main, 1, signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 0)
    _leave(main, 0)


def _leave(main, code, die_of=0):
    """Exit as Python would, less the interpreter's teardown (as node_side/cell_runner.py's
    `finish`, for the same reasons, and because torch's teardown costs a rank about a
    second of CPU): threads left running are waited for and exit handlers run while the
    globals exist; then the globals are dropped and collected while the interpreter is
    whole (files left open are flushed); MPI is finalized; the standard streams flushed."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    main.__dict__.clear()
    gc.collect()
    mpi = sys.modules.get("mpi4py.MPI")
    with contextlib.suppress(Exception):
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to lose
            stream.flush()
    if die_of:
        signal.signal(die_of, signal.SIG_DFL)
        os.kill(os.getpid(), die_of)
    os._exit(code)


def serve_main(argv):
    """`serve KEY MODULES [ROOM]`: run a pool (what `prepare` starts)."""
    key, modules = argv[0], [m for m in argv[1].split(",") if m]
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and sys.path[0] == here:  # the job's hook folder this file came from
        sys.path.pop(0)  # (not there under PYTHONSAFEPATH): not the pool's
    try:
        idle = float(os.environ.get(IDLE_VAR) or IDLE_S)
    except ValueError:
        idle = float(IDLE_S)
    for name in [n for n in os.environ if n.startswith(ROOM_VAR)]:
        del os.environ[name]  # the room is the ranks'; the pool needs none of it
    lock = os.environ.pop(_LOCK_FD_VAR, None)
    pool = Pool(key, modules, idle)
    pool.bind()
    if lock is not None:  # `hold`'s: the lock freed once listening, said, then quiet
        os.close(int(lock))
        print("started", flush=True)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # its step's pipes carry nothing more
            os.dup2(null, fd)
        os.close(null)
    try:
        pool.preload()
    except BaseException as exc:
        pool.stop_taking()
        pool.remove_info()
        _write_failure(key, exc)  # for the agent that started it: one line, and cold
        return 1
    pool.write_info()
    rank = pool.serve()
    if rank is None:
        pool.stop_taking()
        pool.remove_info()
        return 0
    run_rank(rank)
    return 0


# -- the front ----------------------------------------------------------------------------


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
    folder = os.path.join(job_dir, FORKS_FOLDER)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    path = os.path.join(folder, token)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as handle:
        handle.write(f"{pid}\n")
    return path


def _read_message(conn):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data.decode())


def front(real_python, argv):
    """What a job's `python` is: the rank forked from the pool where it can be, else the
    real Python in this process's place."""
    parsed = parse_command(argv)
    modules = modules_of(os.environ)
    executable = _executable(real_python)
    if parsed is None or not modules or unforkable(os.environ):
        return _cold(executable, argv)
    if os.path.realpath(executable) != os.path.realpath(real_python):
        return _cold(executable, argv)  # another Python comes first on PATH: the user's
    kind, target, rest, unbuffered = parsed
    unbuffered = unbuffered or bool(os.environ.get("PYTHONUNBUFFERED"))
    hook = os.path.dirname(os.path.abspath(__file__))
    try:
        key = pool_key(real_python, modules, _pythonpath(os.environ, hook), os.environ)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(START_S)
        conn.connect(socket_path(key))
        shown = [os.path.basename(sys.argv[0]), *argv]
        request = {"kind": kind, "target": target, "args": rest, "unbuffered": unbuffered,
                   "env": dict(os.environ), "argv": shown, "cwd": os.getcwd(),
                   "executable": executable,
                   "cpus": sorted(os.sched_getaffinity(0))}  # fmt: skip
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        answer = _read_message(conn)
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
        ended = _read_message(conn)
    except OSError:
        ended = None
    if named:
        _unname(named, pid)
    if not ended:  # the pool's end took the rank (PR_SET_PDEATHSIG): say so, not an OOM kill
        with contextlib.suppress(OSError):
            os.write(2, f"{POOL_ENDED} (it was killed or crashed); this rank with it\n".encode())
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
        p for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and os.path.abspath(p) != shims
    )  # fmt: skip
    found = shutil.which(os.path.basename(sys.argv[0]), path=path)
    return os.path.abspath(found) if found else real_python


def _cold(python, argv):
    os.execv(python, [python, *argv])


# -- the agent's part ---------------------------------------------------------------------


def _pool_env(env, hook):
    """The pool's environment: the job's, less what differs between ranks and jobs, and
    the room a forked rank writes its own into."""
    kept = {k: v for k, v in env.items() if not k.startswith(_PER_JOB)}
    if env.get(IDLE_VAR):
        kept[IDLE_VAR] = env[IDLE_VAR]
    paths = _pythonpath(env, hook)
    kept.pop("PYTHONPATH", None)
    if paths:
        kept["PYTHONPATH"] = os.pathsep.join(paths)
    kept.pop("PYTHONBREAKPOINT", None)
    half = ENV_ROOM // 2
    kept[ROOM_VAR + "_A"] = "x" * half
    kept[ROOM_VAR + "_B"] = "x" * half
    return kept


def prepare(env, python):
    """For an agent whose job preloads modules: start this node's pool for them unless one
    runs, and write the job's `python` shims. Returns the shims' folder (first on PATH),
    or None: the ranks start cold and nothing need be said (no modules; another agent of
    the node started the pool and said why it failed). Raises NoPool (or OSError: the
    pools' folder is not private) where they start cold and the job's output should say
    why: a pool that cannot import its modules, a pool that is stopped or does not answer,
    a startup variable a fork cannot honour."""
    modules = modules_of(env)
    job_dir = env.get("DISTRUN_JOB_DIR")
    if not modules or not job_dir or sys.version_info < (3, 9):
        return None
    variable = unforkable(env)
    if variable:
        raise NoPool(f"{variable} is set, which a forked rank cannot honour")
    hook = os.path.dirname(os.path.abspath(__file__))
    key = pool_key(python, modules, _pythonpath(env, hook), env)
    path = socket_path(key)
    asked = time.time() - 0.05
    started = None
    # One lock for the folder, not one per pool (those would pile up, one per key ever
    # used): a start holds it only until the new pool listens, before it imports.
    lock = os.open(os.path.join(pools_folder(), START_LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(lock, "w") as lock:  # one agent of the node starts it; the others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(path):
            _check_responsive(key)
        elif _failure_since(key, asked) is not None:
            return None  # one started while this agent waited, and failed: its agent said so
        elif env.get(HELD_VAR) == "1":  # one started here would end with this agent
            error = _failure_since(key, 0)  # a held pool that started well left none
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


def _info(key):
    path = os.path.join(pools_folder(), f"{key}.json")
    with contextlib.suppress(OSError, ValueError), open(path) as handle:
        return json.load(handle)
    return {}


def _state(pid):
    """The process's state letter (/proc/PID/stat: R, S, T for stopped, Z, ...), or None."""
    with contextlib.suppress(OSError, IndexError, TypeError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
    return None


def _check_responsive(key):
    """NoPool where the running pool of `key` would leave its ranks waiting: stopped
    (SIGSTOP, a debugger), or imported and yet silent to a ping within PING_S."""
    info = _info(key)
    pid = info.get("pid")
    if _state(pid) in ("T", "t"):
        raise NoPool(f"the node's pool of these modules (pid {pid}) is stopped")
    if not info.get("ready"):
        return  # still importing: its fronts wait for it, as they would for a cold start
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(PING_S)
    try:
        conn.connect(socket_path(key))
        conn.sendall(b'{"ping": true}\n')
        if (_read_message(conn) or {}).get("pong"):
            return
    except (OSError, ValueError):
        pass
    finally:
        conn.close()
    if _failure_since(key, info.get("started", 0)) is None:
        raise NoPool(f"the node's pool of these modules (pid {pid}) does not answer")


def _wait_until_ready(key, since):
    """Until the pool started at `since` has imported its modules; NoPool (failed) with its
    import error where it could not, or where it ended without one. A pool still
    importing after START_S is left to its fronts, which wait for it."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        error = _failure_since(key, since)
        if error is not None:
            raise NoPool(error, failed=True)
        info = _info(key)
        if info.get("ready"):
            return
        if info and _state(info.get("pid")) in (None, "Z"):
            error = _failure_since(key, since)
            raise NoPool(error or "the pool ended as it imported",
                         failed=True)  # fmt: skip
        time.sleep(0.005)


def hold_main():
    """`hold`: be this node's pool of the modules the environment preloads, in this very
    process, unless one runs; says `running` or `started` (once the new pool listens, before
    it imports) on stdout, then nothing. Run as a Slurm job step of its own, held from
    outside the job (backends/slurm.py): that step outlives the job's, where a pool an
    agent started would end with the agent's step, and take the ranks it forked with it."""
    env = dict(os.environ)
    modules = modules_of(env)
    if not modules or sys.version_info < (3, 9):
        print("no pool: nothing to preload, or a Python older than 3.9", flush=True)
        return 2
    hook = os.path.dirname(os.path.abspath(__file__))
    python = sys.executable
    key = pool_key(python, modules, _pythonpath(env, hook), env)
    lock = os.open(os.path.join(pools_folder(), START_LOCK), os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held by the pool until it listens (serve_main)
    if _answers(socket_path(key)):
        print("running", flush=True)
        return 0
    os.set_inheritable(lock, True)
    pool_env = {**_pool_env(env, hook), _LOCK_FD_VAR: str(lock)}
    room = "-" * ARGV_ROOM
    os.execve(python, [python, os.path.abspath(__file__), "serve", key, ",".join(modules), room],
              pool_env)  # fmt: skip


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
    room = "-" * ARGV_ROOM
    argv = [python, os.path.abspath(__file__), "serve", key, ",".join(modules), room]
    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        subprocess.run(
            [python, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:], "
             "start_new_session=True, close_fds=True)", *argv],
            stdin=null_in, stdout=null_out, stderr=null_out, env=env, check=True, timeout=30,
        )  # fmt: skip
    # Until it answers, not until its socket exists: between the pool's bind and its
    # listen, a probe is refused, and the next agent (the lock freed) started a second
    # pool that took the path, leaving this one serving its first ranks and then nobody.
    path = socket_path(key)
    deadline = time.monotonic() + START_WAIT_S
    while not _answers(path) and time.monotonic() < deadline:
        error = _failure_since(key, since)
        if error is not None:  # it failed before this probe found it listening
            raise NoPool(error, failed=True)
        time.sleep(0.005)


_SHIM = """#!{python} -IS
import sys
sys.path.insert(0, {hook!r})
import distrun_pool
sys.exit(distrun_pool.front({python!r}, sys.argv[1:]))
"""


def _write_shims(job_dir, python):
    folder = os.path.join(job_dir, SHIM_FOLDER)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    text = _SHIM.format(python=python, hook=os.path.dirname(os.path.abspath(__file__)))
    for name in ("python", "python3"):
        target = os.path.join(folder, name)
        if not os.path.exists(target):  # several agents of a node may write it at once
            _write_private(target, text, 0o700)
    return folder


def forked_for(job_dir, token):
    """The pids the pool forked for an agent (`FORKS_FOLDER/TOKEN`), for its tree."""
    path = os.path.join(job_dir, FORKS_FOLDER, token)
    with contextlib.suppress(OSError, ValueError), open(path) as handle:
        return [int(line) for line in handle if line.strip()]
    return []


def stop_pools():
    """Tell every pool of this user here to take no new rank: each ends after its last
    (at once where none runs). The pools told (as `list_pools` shows them)."""
    told = []
    for pool in list_pools():
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        with contextlib.suppress(OSError, ValueError):
            conn.connect(socket_path(pool["key"]))
            conn.sendall(b'{"stop": true}\n')
            if (_read_message(conn) or {}).get("stopped"):
                told.append(pool)
        conn.close()
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
    here = _here()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        key = name[: -len(".json")]
        path = os.path.join(folder, name)
        try:
            with open(path) as handle:
                info = json.load(handle)
        except (OSError, ValueError):
            continue
        if info.get("where", here) != here:  # its pid means nothing here
            continue
        if not _serves(info.get("pid", -1), key):
            for stale in (path, os.path.join(folder, key + ".sock")):
                with contextlib.suppress(OSError):
                    os.unlink(stale)
            continue
        idle = 0.0 if info.get("ranks") else max(0.0, now - info.get("last_used", now))
        found.append({"key": key, "pid": info["pid"], "modules": info.get("modules", []),
                      "python": info.get("python"), "ranks": info.get("ranks", 0),
                      "rss": _rss(info["pid"]), "idle": round(idle, 1),
                      "age": round(now - info.get("started", now), 1),
                      "ready": info.get("ready", False),
                      "idle_limit": info.get("idle_limit")})  # fmt: skip
    return found


def main(argv=None):
    """`serve KEY MODULES`: be a pool; `hold`: be the environment's pool unless one runs;
    `list`, `stop`: this user's pools here, as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return serve_main(argv[1:])
    if argv and argv[0] == "hold":
        return hold_main()
    if argv and argv[0] in ("list", "stop"):
        try:
            pools = list_pools() if argv[0] == "list" else stop_pools()
        except OSError as exc:
            print(f"distrun pool: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(pools))
        return 0
    print("usage: pool.py serve KEY MODULES | hold | list | stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
