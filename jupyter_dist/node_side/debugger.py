"""`breakpoint()` in a rank pauses that rank, and a front talks to its pdb from afar.

Standard library only, Python 3.8+. Shipped into each job's folder beside the stack hook as
`$DISTRUN_JOB_DIR/pyhook/distrun_debug.py`; the agent sets PYTHONBREAKPOINT to
`distrun_debug.set_trace` (unless the job's environment names its own, or 0), and the stack
hook routes `pdb.set_trace()` here too. A rank's stdin is not a terminal (/dev/null, or a
warm session's feed): plain pdb would read end of input, raise BdbQuit and kill the job.
Under `--post-mortem` (DISTRUN_POST_MORTEM: seconds to wait), an uncaught exception pauses
the same way at the frame that raised (`post_mortem`), before the rank exits with it.

In a rank, a pause:

- serves a pdb on a Unix socket in the job's private folder,
  `$DISTRUN_JOB_DIR/debug/MACHINE-PID.sock` (0600 in a 0700 folder; no port is opened),
  one client at a time: a client that goes away leaves the rank paused for the next;
- writes `MACHINE-PID.json` beside it while pdb waits for a command: {"pid", "rank",
  "node_rank", "host", "file", "line", "function", "reason", "since", "exception"} (the
  front lists these), and takes it away when the rank runs on;
- says so on the rank's stderr, in one line;
- tells the launcher, on the rank's stdout, in a line it takes out of the output (as
  report()'s): `MARK {"paused": RECORD}` at each stop (a step included), and
  `MARK {"running": PID}` when the rank runs on (run/job.py marks the rank paused where
  the views show it).

On a node, run as `python -c SOURCE ...` (diagnose/debug.py does, through the backend):

- `list JOB_DIR`: the pause records of live processes, as a JSON array;
- `do JOB_DIR PID COMMAND [TIMEOUT]`: one pdb command to that paused process; prints
  {"answer": TEXT, "paused": BOOL} once pdb asks for the next command (`paused`), or once
  the process runs on (a `c`, an `n` over a long line); exit 3 with one line on stderr when
  the process is not paused;
- `interrupt JOB_DIR JOB_ID RANK [TIMEOUT]`: pause that rank where it is (PAUSE_SIGNAL,
  which the stack hook catches); prints {"paused": RECORD}, or {"paused": null} when it did
  not pause within TIMEOUT (its main thread is in native code: it pauses once back in
  Python); exit 3 with one line on stderr when no process of that rank here catches it.
- `serve`: the same requests, many, while its stdin is open (a job's owner keeps one per
  node through one SSH session: a command then costs no Python's start). Each line in is
  a JSON array `[ID, WORDS]` (WORDS: one of the commands above, as a list), each line out
  `[ID, CODE, STDOUT, STDERR]`, as the command run alone would have ended; requests are
  answered as they finish (one rank's slow `n` does not hold another's). It ends at end
  of input: its owner closed the session, or the owner or its link died.
"""

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time

PROMPT = "(Pdb) "
MARK = "\x1edistrun-debug "  # a line to the launcher, among the rank's output
DEBUG_FOLDER = "debug"
BIND_TRIES = 20  # the debug folder made again, where another rank's agent took it away
SETTLE_S = 0.3  # after a pause record goes, how long a prompt may still come (a quick `n`)


def machine_tag():
    """A copy of stack_hook.machine_tag (this file is shipped alone): this machine in a
    file name, its boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()[:13]
    except OSError:
        return socket.gethostname()


def _folder(job_dir):
    return os.path.join(job_dir, DEBUG_FOLDER)


@contextlib.contextmanager
def _reachable(path):
    """A path a Unix socket can be bound to or reached at, however long the folder's path
    is (sun_path holds 107 bytes): through a descriptor of the folder, held meanwhile."""
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_RDONLY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def _rank():
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


class _Console:
    """pdb's stdin and stdout: the client connected to this process's socket. Reading waits
    for a client and for its next line; a client that leaves is replaced by the next one,
    so pdb never reads end of input. What pdb writes with no client connected is dropped."""

    def __init__(self, job_dir):
        folder = _folder(job_dir)
        base = os.path.join(folder, f"{machine_tag()}-{os.getpid()}")
        self.socket_path, self.record_path = base + ".sock", base + ".json"
        self.pid = os.getpid()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for attempt in range(BIND_TRIES):
            os.makedirs(folder, mode=0o700, exist_ok=True)
            try:
                self._bind()
                break
            except FileNotFoundError:
                # The agent of a rank that ended on this node takes the folder away while
                # it is empty (agent._clear_pauses): between our makedirs and the bind it
                # may have. Once the socket is in it, the folder is not empty and stays.
                if attempt == BIND_TRIES - 1:
                    raise
        self.server.listen(4)
        self.client = None
        self.pending = b""
        # Post-mortem: how long to wait for a client before pdb is told to quit (None: for
        # ever, as at a breakpoint).
        self.wait = None
        atexit.register(self.close)

    def _bind(self):
        with _reachable(self.socket_path) as short:
            with contextlib.suppress(OSError):
                os.unlink(short)
            old = os.umask(0o077)  # private from the moment the bind makes it
            try:
                self.server.bind(short)
            finally:
                os.umask(old)
            os.chmod(short, 0o600)

    # -- pdb's stdin ---------------------------------------------------------------------

    def readline(self):
        while True:
            if self.client is None:
                self.server.settimeout(self.wait)
                try:
                    self.client, _ = self.server.accept()
                except socket.timeout:  # noqa: UP041 (TimeoutError only from 3.10)
                    return "q\n"  # nobody came: the rank goes on to exit with its error
                self.client.settimeout(None)
                self.pending = b""
            cut = self.pending.find(b"\n")
            if cut >= 0:
                line, self.pending = self.pending[: cut + 1], self.pending[cut + 1 :]
                return line.decode("utf-8", errors="replace")
            try:
                data = self.client.recv(65536)
            except OSError:
                data = b""
            if not data:  # the client left: the rank stays paused for the next one
                self._drop_client()
                continue
            self.pending += data

    # -- pdb's stdout --------------------------------------------------------------------

    def write(self, text):
        if self.client is not None and text:
            try:
                self.client.sendall(text.encode("utf-8", errors="replace"))
            except OSError:
                self._drop_client()
        return len(text)

    def flush(self):
        pass

    @property
    def encoding(self):
        return "utf-8"

    def _drop_client(self):
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.close()
        self.client = None

    # -- the pause record ----------------------------------------------------------------

    def paused(self, frame, reason, exception=None):
        code = frame.f_code
        import linecache

        job_dir = os.environ.get("DISTRUN_JOB_DIR")
        record = {
            "pid": self.pid,
            "rank": _rank(),
            "node_rank": int(os.environ.get("DISTRUN_NODE_RANK", "0") or 0),
            "host": socket.gethostname(),
            "file": code.co_filename,
            "line": frame.f_lineno,
            "function": code.co_name,
            "reason": reason,
            "since": time.time(),
            "exception": exception,
            # A %%distrun cell is the job's script.py: the views say "cell line N" and show
            # the line, as the user knows it, not the store's file.
            "cell": bool(job_dir) and code.co_filename == os.path.join(job_dir, "script.py"),
            "source": linecache.getline(code.co_filename, frame.f_lineno).strip() or None,
        }
        temporary = self.record_path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(temporary, self.record_path)  # a reader sees all of it or none
        _tell({"paused": record})
        return record

    def running(self):
        try:
            os.unlink(self.record_path)
        except OSError:
            return  # was not paused
        _tell({"running": self.pid})

    def close(self):
        if os.getpid() != self.pid:
            return  # a forked child's copy: the parent's socket stays
        self.running()
        self._drop_client()
        try:
            self.server.close()
            os.unlink(self.socket_path)
        except OSError:
            pass


def _tell(message):
    """One line to the launcher on stdout's descriptor (a redirected sys.stdout must not
    swallow it; a line the rank left open is taken as output up to the mark)."""
    data = (MARK + json.dumps(message) + "\n").encode()
    with contextlib.suppress(Exception):  # what the rank printed before it paused, first
        sys.stdout.flush()
    try:
        while data:
            data = data[os.write(1, data) :]
    except OSError:
        pass  # stdout is gone: so is whoever would read it


_debugger = []  # this process's one pdb, made at its first pause
# The modules of ours a rank's stack can hold when it pauses (the shipped names of the stack
# hook, this file and the pool's front), never a place to stop in.
OUR_MODULES = ("sitecustomize", "distrun_debug", "distrun_pool")
INTERACT_REFUSED = (
    "interact is not available in jupyter-dist's debugger (the rank has no terminal): "
    "run code in the frame with ! or p"
)


class _NoInput:
    """sys.stdin while a pdb command runs: a read says at once that there is no input."""

    encoding = "utf-8"

    def _refuse(self, *_args):
        raise EOFError("no input to read in jupyter-dist's debugger (the rank has no terminal)")

    read = readline = readlines = _refuse

    def isatty(self):
        return False

    def fileno(self):
        raise OSError("no input in jupyter-dist's debugger")


_NO_INPUT = _NoInput()


def _make_debugger(console):
    import pdb

    class RemotePdb(pdb.Pdb):
        """pdb over the console; each stop writes the pause record, each resume takes it."""

        reason = "breakpoint"
        exception = None  # post-mortem: the error's one line
        announce = False  # said once a pause, on the rank's stderr; not at each step

        # The thread that pauses (from set_trace to the end of its prompt): a second pause
        # of it meanwhile (a queued pause signal, a breakpoint in a command) is none.
        waiting = None

        def interaction(self, frame, traceback):
            self.take_turn()
            shown = frame or (_innermost(traceback).tb_frame if traceback else None)
            if shown is not None:
                record = console.paused(shown, self.reason, self.exception)
                if self.announce:
                    _announce(record)
                    self.announce = False
            try:
                pdb.Pdb.interaction(self, frame, traceback)
            finally:
                console.running()
                with self.turns:
                    self.waiting = None
                    self.turns.notify_all()

        def take_turn(self):
            """One thread at a time pauses (the process has one pdb, one console): another
            thread's pause waits for this one's end, and says so once."""
            me = threading.get_ident()
            with self.turns:
                if self.waiting not in (None, me):
                    _say(
                        f"distrun: {_who()} thread {threading.current_thread().name!r} "
                        "waits to pause: another thread of it is paused (it pauses once "
                        "that one goes on)\n"
                    )
                while self.waiting not in (None, me):
                    self.turns.wait()
                self.waiting = me

        # What a command's code reads is never the rank's own stdin (a warm session's feed
        # of cells, which a read would take and wedge) nor the console's next command.
        def onecmd(self, line):
            saved, sys.stdin = sys.stdin, _NO_INPUT
            try:
                return pdb.Pdb.onecmd(self, line)
            finally:
                sys.stdin = saved

        def default(self, line):  # `!code`: pdb points sys.stdin at its own stdin for it
            saved, self.stdin = self.stdin, _NO_INPUT
            try:
                return pdb.Pdb.default(self, line)
            finally:
                self.stdin = saved

        def do_interact(self, arg):
            """interact is not available here: run code with ! or p."""
            self.error(INTERACT_REFUSED)

    RemotePdb.turns = threading.Condition()
    # nosigint: the rank's own SIGINT handling stays as it was (pdb would take it over).
    # skip: a step never stops in our own frames (the pause signal's handler, this file):
    # a pause lands in the rank's code.
    debugger = RemotePdb(stdin=console, stdout=console, nosigint=True, skip=OUR_MODULES)
    debugger.prompt = PROMPT
    return debugger


def _innermost(traceback):
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback


def _who():
    rank = _rank()
    return f"rank {rank}" if rank is not None else f"pid {os.getpid()}"


def _say(line):
    """`line` on the rank's stderr descriptor itself: the program may hold sys.stderr in a
    buffer of its own until it exits (torch's excepthook once a process group exists), and
    the user must read this while the rank waits."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    data = line.encode("utf-8", errors="replace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data) :]


def _announce(record):
    attach = "jupyter distrun debug " + os.environ.get("DISTRUN_JOB_ID", "JOB")
    if record["rank"] is None:
        rank = f"pid {record['pid']}"
    else:
        rank, attach = f"rank {record['rank']}", f"{attach} --rank {record['rank']}"
    after, then = "", ""
    if record.get("exception"):
        after = f" after {record['exception']},"
        wait = os.environ.get("DISTRUN_POST_MORTEM", "")
        then = "; it exits with this error once you continue or quit" + (
            f", or in {wait} s if nobody looks" if wait.isdigit() else ""
        )
    where = f"{record['file']}:{record['line']}"
    if record.get("cell"):
        where = f"cell line {record['line']}" + (
            f" ({record['source']})" if record.get("source") else ""
        )
    line = (
        f"distrun: {rank} paused{after} at {where} in "
        f"{record['function']} ({record['reason']}); to look: {attach}{then}\n"
    )
    _say(line)


_making = [threading.Lock()]  # two threads' first pauses at once make one debugger
if hasattr(os, "register_at_fork"):  # a child forked while another thread held it
    os.register_at_fork(after_in_child=lambda: _making.__setitem__(0, threading.Lock()))


def _debugger_here(job_dir):
    with _making[0]:
        if not _debugger or _debugger[0][0] != os.getpid():  # first pause, or a forked child
            console = _Console(job_dir)
            _debugger[:] = [(os.getpid(), _make_debugger(console), console)]
        return _debugger[0][1], _debugger[0][2]


def post_mortem(error, traceback, wait=None):
    """An uncaught exception (the stack hook's excepthook, the cell runner): pause at the
    frame that raised until the user continues or quits, or nobody attached for
    DISTRUN_POST_MORTEM seconds; then the caller prints the error and exits with it, as it
    would have. Does nothing outside a job that asked for it (--post-mortem). With `wait`
    (a warm session's failed cell, looked into on request: session_worker.py), it pauses
    whatever the job asked, that long at most with nobody attached, and says nothing on
    stderr (the one who asked is there)."""
    job_dir, told = os.environ.get("DISTRUN_JOB_DIR"), os.environ.get("DISTRUN_POST_MORTEM", "")
    asked = wait is not None
    if not asked:
        wait = int(told) if told.isdigit() else None
    if not job_dir or wait is None or traceback is None:
        return
    debugger, console = _debugger_here(job_dir)
    line = "".join(_format_exception_only(error)).strip().splitlines()
    debugger.reason, debugger.exception, debugger.announce = "post-mortem", line[-1], not asked
    console.wait = wait
    try:
        debugger.reset()
        debugger.interaction(None, traceback)
    finally:
        console.wait, debugger.exception = None, None


def _format_exception_only(error):
    import traceback

    return traceback.format_exception_only(type(error), error)


def set_trace(*args, frame=None, header=None, reason="breakpoint", **kwargs):
    """PYTHONBREAKPOINT's target: pause the caller (or `frame`) in the remote pdb, saying
    why (`reason`: the stack hook's PAUSE_SIGNAL handler says "interrupt"). Outside a job's
    folder, plain pdb, as Python would have done."""
    # First, before any call pdb's tracing could stop in: this thread pauses already.
    mine = _debugger and _debugger[0][0] == os.getpid()
    if mine and _debugger[0][1].waiting == threading.get_ident():
        return
    frame = frame or sys._getframe(1)
    job_dir = os.environ.get("DISTRUN_JOB_DIR")
    if not job_dir:
        import pdb

        return pdb.Pdb().set_trace(frame)
    debugger, _console = _debugger_here(job_dir)
    if header is not None:
        debugger.message(header)
    debugger.take_turn()  # before pdb's state is set for this thread
    debugger.reason, debugger.announce = reason, True
    debugger.set_trace(frame)


# -- on a node: list, do ------------------------------------------------------------------


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_paused(job_dir):
    found = []
    folder = _folder(job_dir)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue  # taken away as it was read: it runs on
        if isinstance(record, dict) and _alive(int(record.get("pid", 0))):
            record["tag"] = name[: -len(".json")]
            found.append(record)
    return found


def do(job_dir, pid, command, timeout=30.0):
    """Send one command to the paused process `pid`: {"answer", "paused", "state"}, the
    state being what it does after it: "paused" (pdb asks for the next command), "running"
    (it ran on), "busy" (the command still runs after `timeout`: it pauses again once that
    ends) or "ended" (the process is gone)."""
    folder = _folder(job_dir)
    tag = next((r["tag"] for r in list_paused(job_dir) if int(r.get("pid", 0)) == pid), None)
    if tag is None:
        raise LookupError("it is not paused")
    record_path = os.path.join(folder, tag + ".json")
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _reachable(os.path.join(folder, tag + ".sock")) as short:
        client.connect(short)
    client.sendall(command.rstrip("\n").encode() + b"\n")
    answer, deadline, gone_since = b"", time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([client], [], [], 0.01)
        if ready:
            data = client.recv(65536)
            if not data:
                break  # the process ended (a `q`, an exit)
            answer += data
            if answer.endswith(PROMPT.encode()):
                return {
                    "answer": answer[: -len(PROMPT)].decode(errors="replace"),
                    "paused": True,
                    "state": "paused",
                }
            continue
        if os.path.exists(record_path):
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since > SETTLE_S:
            break  # it runs on
    # Still paused (its record there) at the end: the command runs on past `timeout`, or
    # ended the process in the middle of it (a pdb left by `c` or `q` takes its record).
    within = os.path.exists(record_path)
    client.close()
    if not within:
        state = "running"
    elif time.monotonic() >= deadline and _alive(pid) and not _zombie(pid):
        state = "busy"
    else:
        time.sleep(0.05)  # a process that closed its end as it exited: gone by now
        state = "busy" if _alive(pid) and not _zombie(pid) else "ended"
    return {"answer": answer.decode(errors="replace"), "paused": False, "state": state}


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


# What the stack hook (stack_hook.py, the ranks' sitecustomize) pauses a rank on.
PAUSE_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else None
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = handle.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _status(pid):
    """(parent pid, the signals it catches as a mask) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        return int(fields["PPid"]), int(fields["SigCgt"], 16)
    except (OSError, KeyError, ValueError):
        return None


def interrupt(job_dir, job_id, rank, timeout=5.0):
    """Pause rank `rank` of job `job_id` on this machine where it is: PAUSE_SIGNAL to its
    Python that caught it (the topmost: its forked workers carry its rank too); then its
    pause record once it paused, or None if it did not within `timeout` (its main thread
    is in native code: it pauses once back in Python). LookupError when no process of
    that rank here catches the signal (not here, not started with the job's hook)."""
    if PAUSE_SIGNAL is None:
        raise LookupError("this system has no real-time signals to pause a rank with")
    ours = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        env = _environ(int(name))
        if env.get("DISTRUN_JOB_ID") != job_id:
            continue
        if next((env[v] for v in _RANK_VARS if v in env), None) != str(rank):
            continue
        found = _status(int(name))
        if found and found[1] >> (int(PAUSE_SIGNAL) - 1) & 1:
            ours[int(name)] = found[0]
    top = [pid for pid, parent in ours.items() if parent not in ours]
    if not top:
        raise LookupError(f"no process of rank {rank} here can be paused")
    pid = min(top)
    record = next((r for r in list_paused(job_dir) if r.get("pid") == pid), None)
    if record is not None:  # paused already: told so, and its pdb left as it is
        return {**record, "already": True}
    os.kill(pid, PAUSE_SIGNAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = next((r for r in list_paused(job_dir) if r.get("pid") == pid), None)
        if record is not None:
            return record
        time.sleep(0.02)
    return None


def answer(args):
    """What the helper says to `args` (see `main`): (exit code, stdout, stderr). A caller
    on this machine (the owner of a job on local nodes) asks it in its own process."""
    try:
        if args[:1] == ["list"] and len(args) == 2:
            return 0, json.dumps(list_paused(args[1])) + "\n", ""
        if args[:1] == ["do"] and len(args) in (4, 5):
            timeout = float(args[4]) if len(args) == 5 else 30.0
            return 0, json.dumps(do(args[1], int(args[2]), args[3], timeout)) + "\n", ""
        if args[:1] == ["interrupt"] and len(args) in (4, 5):
            timeout = float(args[4]) if len(args) == 5 else 5.0
            paused = interrupt(args[1], args[2], int(args[3]), timeout)
            return 0, json.dumps({"paused": paused}) + "\n", ""
    except (LookupError, OSError) as exc:
        return 3, "", f"{exc}\n"
    return (
        1,
        "",
        (
            "usage: debugger.py list JOB_DIR | do JOB_DIR PID COMMAND [TIMEOUT] | "
            "interrupt JOB_DIR JOB_ID RANK [TIMEOUT]\n"
        ),
    )


def serve(lines_in, out):
    """Answer `[ID, WORDS]` lines from `lines_in` (bytes) on `out` (text) until end of
    input (see the module's `serve`)."""
    writing = threading.Lock()

    def one(ident, words):
        try:
            said = answer([str(word) for word in words])
        except Exception as exc:  # one request's failure is its own answer, not the end
            said = (1, "", f"{type(exc).__name__}: {exc}\n")
        with writing:
            out.write(json.dumps([ident, *said]) + "\n")
            out.flush()

    for line in iter(lines_in.readline, b""):
        try:
            ident, words = json.loads(line)
        except (ValueError, TypeError):
            continue
        threading.Thread(target=one, args=(ident, words), daemon=True).start()
    with writing:  # every whole answer written is out before the caller leaves
        out.flush()


def main():
    if sys.argv[1:] == ["serve"]:
        serve(sys.stdin.buffer, sys.stdout)
        # End of input: the owner closed it, or is gone. A request still running answers
        # nobody, and a thread inside stdout's write at the interpreter's shutdown would
        # abort it (SIGABRT, "could not acquire lock for <stdout>"): leave at once.
        os._exit(0)
    code, out, err = answer(sys.argv[1:])
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.exit(code)


if __name__ == "__main__":
    main()
