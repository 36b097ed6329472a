"""A node's pool: one Python that imported a job's `preload` modules once and forks ranks
from it, so that a rank starts with torch (say) already imported instead of paying for the
import again.

Standard library only, Python 3.8+ (3.9 to fork: `socket.send_fds`): shipped into a job's
folder as `$DISTRUN_JOB_DIR/pyhook/distrun_pool.py` when the job names modules to preload
(`DISTRUN_PRELOAD=torch,numpy` in its environment), and run as `distrun_pool.py serve KEY
MODULES ROOM` by the agent's part (pool_agent.py). What it shares with the front and the
agent's part, its folder, files and messages, is pool_protocol.py's.

It binds its Unix socket, imports the modules, then forks a rank for each front's request.
It ends itself once idle for `DISTRUN_POOL_IDLE` seconds (IDLE_S by default) with no rank
running (the latest job's `DISTRUN_POOL_IDLE`), at `stop`, and once the file of any module
it imported changed on disk (a `pip install`, an edited submodule): then it answers
"stale", takes no new rank and ends after its last. One that cannot import its modules
leaves its error (`KEY.failed`) and ends; a ready one answers a ping.

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
import functools
import gc
import importlib
import importlib.machinery
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import types

_FOLDER = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and sys.path[:1] != [_FOLDER]:  # (PYTHONSAFEPATH): the protocol
    sys.path.insert(0, _FOLDER)  # is beside it; serve_main takes the folder out again
import distrun_pool_protocol as protocol  # noqa: E402 (after the path it is on)

IDLE_S = 600
# How often an idle pool looks whether its socket is still its own: one whose socket another
# pool took (a start that lost a race) serves nobody, and ends once its last rank ends.
OWNED_CHECK_S = 5.0
# How often a forked rank's client of torch's TCPStore looks whether the job's store
# listens yet (`_prompt_store_clients`), and for how long at most before it leaves the
# waiting to torch.
STORE_POLL_S = 0.005
STORE_POLL_LIMIT_S = 60.0
_STORE_PARAMS = ("hostname", "port", "rank", "world_size", "timeout")  # what it wraps takes
_PR_SET_PDEATHSIG = 1


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
        self.pythonpath = protocol.pythonpath_of(request["env"], None)
        # What the rank's PYTHONPATH adds (the job's startup hook): its sitecustomize runs.
        self.hook_paths = [p for p in self.pythonpath if p not in pool_pythonpath]


class Pool:
    def __init__(self, key, modules, idle):
        self.key = key
        self.modules = modules
        self.idle = idle
        self.path = protocol.socket_path(key)
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
        self.info_path = protocol.info_path(self.key)
        self.started = time.time()
        self.last_used = self.started
        self.write_info()  # first: whoever finds the pool answering finds what it is
        with contextlib.suppress(OSError):  # an earlier pool's import error is not this one's
            os.unlink(protocol.failure_path(self.key))
        self.listener.listen(256)

    def write_info(self):
        """What `list_pools` shows: the pool's modules, ranks and when it was last used."""
        info = {
            "pid": os.getpid(),
            "python": sys.executable,
            "modules": self.modules,
            "started": self.started,
            "last_used": self.last_used,
            "ranks": sum(1 for conn, _ in self.ranks.values() if conn is not None),
            "ready": hasattr(self, "fingerprint"),
            "idle_limit": self.idle,
            "where": protocol.here(),
        }
        with contextlib.suppress(OSError):
            protocol.write_private(self.info_path, json.dumps(info))

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
        self.pythonpath = protocol.pythonpath_of(os.environ, None)
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
                answer = {"stopped": True} if request.get("stop") else {"pong": True}
                conn.sendall(protocol.encode(answer))
                conn.close()
                return None
            if len(fds) != 3:
                raise ValueError("a rank needs its stdin, stdout and stderr")
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(protocol.encode({"refused": str(exc)}))
            conn.close()
            return None
        with contextlib.suppress(ValueError, TypeError):  # the latest job's idle time
            self.idle = float(request["env"].get(protocol.IDLE_VAR) or self.idle)
        refusal = self._refusal(request)
        if refusal:
            with contextlib.suppress(OSError):
                conn.sendall(protocol.encode({"refused": refusal}))
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
            conn.sendall(protocol.encode({"pid": pid}))
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
        if len(_nul_block(_env_words(request["env"]))) > protocol.ENV_ROOM:
            return "environment too large"
        if len(_nul_block(request["argv"])) > protocol.ARGV_ROOM:
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
                    conn.sendall(protocol.encode({"exit": code}))
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
            buffer,
            encoding=encoding,
            errors=errors,
            line_buffering=writing and (tty or fd == 2),
            write_through=writing and unbuffered,
        )

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
    if sys.path[:1] == [_FOLDER]:  # the job's hook folder this file came from: not the pool's
        sys.path.pop(0)
    try:
        idle = float(os.environ.get(protocol.IDLE_VAR) or IDLE_S)
    except ValueError:
        idle = float(IDLE_S)
    for name in [n for n in os.environ if n.startswith(protocol.ROOM_VAR)]:
        del os.environ[name]  # the room is the ranks'; the pool needs none of it
    lock = os.environ.pop(protocol.LOCK_FD_VAR, None)
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
        protocol.write_failure(key, exc)  # for the agent that started it: one line, and cold
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


def main(argv=None):
    """`serve KEY MODULES [ROOM]`: be a pool."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return serve_main(argv[1:])
    print("usage: distrun_pool.py serve KEY MODULES [ROOM]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
