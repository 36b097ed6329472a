"""Every Python stack of a job's processes on this machine, as JSON on stdout.

Standard library only, Python 3.8+: run on a node as `python -c SOURCE JOB_ID [METHOD]`
(diagnose/stacks.py does that through the backend). METHOD is `auto` (the default), `py-spy` or
`faulthandler`:

- py-spy (`py-spy dump --json`, found beside the node's Python or on PATH) reads any
  Python process from outside, whatever started it;
- faulthandler needs nothing installed: every Python process the job's agents start
  (through stack_hook.py, their sitecustomize) registers a signal that makes the
  interpreter itself write every thread's stack, from its C signal handler, into
  `$DISTRUN_JOB_DIR/stacks/MACHINE-PID-sigN.txt`; this sends signal N and reads what was added.
  The signal is sent only to a process whose handler for it is installed (its SigCgt), so a
  process that did not register is never killed by it.

`auto` takes py-spy where it is present and faulthandler where py-spy is missing or could not
read a process. The job's processes are the ones carrying `DISTRUN_JOB_ID=JOB_ID` in their
environment (the ranks under torchrun and mpirun included, and those a pool forked), less
the node agents and the fronts of forked ranks (pool_front.py).

Output: {"host": HOSTNAME, "machine": ID, "py_spy": PATH or null, "processes": [{"pid",
"ppid", "rank", "local_rank", "node_rank", "command", "method", "threads": [{"name", "main",
"frames": [{"function", "file", "line", "code"}, ...innermost first]}], "error"}],
"others": [{"pid", "command"}]}: `error` (one line) where a Python process's stack could not
be read; `others` are the job's processes that are not Python (mpirun, orted; shells left out).
"""

import contextlib
import fcntl
import json
import linecache
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

METHODS = ("auto", "py-spy", "faulthandler")
PY_SPY_TIMEOUT_S = 20
DUMP_TIMEOUT_S = 3.0
_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[(.*)\])? \(most recent call first\):"
)
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = handle.read().split(b"\0")
    except OSError:
        return None
    found = {}
    for pair in pairs:
        name, sep, value = pair.partition(b"=")
        if sep:
            found[name.decode(errors="replace")] = value.decode(errors="replace")
    return found


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [w.decode(errors="replace") for w in handle.read().split(b"\0") if w]
    except OSError:
        return []


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def is_python(pid, argv):
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = os.path.basename(argv[0]) if argv else ""
    return exe.startswith("python") or exe.startswith("pypy")


def is_agent(argv):
    """A node agent (agent.py locally, agent-DIGEST.py as shipped over SSH) or its sweep."""
    words = [w for w in argv[1:3] if not w.startswith("-")]  # (`python -E agent.py`)
    script = os.path.basename(words[0]) if words else ""
    return script.startswith("agent") and script.endswith(".py")


def is_pool_front(argv):
    """A job's `python` standing for a rank its node's pool forked (pool_front.py, run
    from the job's `distrun-pool-bin` folder): the rank itself is looked at, not it."""
    return any("/distrun-pool-bin/" in word for word in argv[:3])


def number(env, *names):
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def job_processes(job_id):
    """(pid, environment, argv) of every live process of the job here, agents left out."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        env = environ(pid)
        if not env or env.get("DISTRUN_JOB_ID") != job_id:
            continue
        argv = command_of(pid)
        if argv and not is_agent(argv) and not is_pool_front(argv):
            found.append((pid, env, argv))
    return sorted(found)


def source_line(path, line):
    with contextlib.suppress(Exception):
        return linecache.getline(path, line).strip() or None
    return None


def frame(function, path, line):
    return {"function": function, "file": path, "line": line, "code": source_line(path, line)}


# -- py-spy ---------------------------------------------------------------------------------


def find_py_spy():
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def by_py_spy(py_spy, pid):
    """The threads of `pid` read by py-spy, or raises RuntimeError with its one-line reason."""
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"py-spy did not answer in {PY_SPY_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        reason = lines[0] if lines else f"exit code {done.returncode}"
        detail = [ln for ln in lines[1:4] if ln[0].isdigit() and ":" in ln]
        if detail:  # "Caused by: 0: Permission denied (os error 13)"
            reason += " (" + detail[0].split(":", 1)[1].strip() + ")"
        if reason.startswith("Error: "):
            reason = reason[len("Error: ") :]
        raise RuntimeError("py-spy: " + reason)
    threads = []
    for thread in json.loads(done.stdout):
        threads.append(
            {
                "name": thread.get("thread_name") or f"thread {thread.get('os_thread_id')}",
                "main": thread.get("os_thread_id") == pid,
                "frames": [frame(f["name"], f["filename"], f["line"]) for f in thread["frames"]],
            }
        )
    threads.sort(key=lambda t: not t["main"])
    return threads


# -- faulthandler ---------------------------------------------------------------------------


def dump_file(env, pid):
    """The file the process's faulthandler writes to, and its signal; (None, None) if it
    registered none."""
    folder = os.path.join(env.get("DISTRUN_JOB_DIR", ""), "stacks")
    prefix = f"{machine_tag()}-{pid}-sig"
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith(prefix) and name.endswith(".txt"):
                with contextlib.suppress(ValueError):
                    return os.path.join(folder, name), int(name[len(prefix) : -4])
    return None, None


def machine_tag():
    """A copy of stack_hook.machine_tag (this file is shipped alone): this machine in a
    file name, its boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()[:13]
    except OSError:
        return socket.gethostname()


def catches(pid, signum):
    """Whether `pid` has a handler installed for `signum` (else the signal would kill it)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def by_faulthandler(env, pid):
    path, signum = dump_file(env, pid)
    if path is None:
        raise RuntimeError(
            "it registered no stack signal (started without jupyter-dist's startup hook: "
            "python -S, -I or -E, or outside the job's agents), so only py-spy can read it "
            "(pip install py-spy on the node)"
        )
    if not catches(pid, signum):
        raise RuntimeError(f"its stack signal ({signum}) is no longer handled by faulthandler")
    with open(path, "rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one dump at a time, whoever asks
        try:
            start = os.fstat(handle.fileno()).st_size
            os.kill(pid, signum)
            text = wait_for_dump(handle, start)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    if not text:
        raise RuntimeError(f"wrote no stack within {DUMP_TIMEOUT_S:g} s of its stack signal")
    return parse_faulthandler(text)


def wait_for_dump(handle, start):
    """What the process appended after `start`, once it stopped growing."""
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    size, steady_since = start, None
    while time.monotonic() < deadline:
        now = os.fstat(handle.fileno()).st_size
        if now != size:
            size, steady_since = now, time.monotonic()
        elif steady_since is not None and time.monotonic() - steady_since > 0.15:
            break
        time.sleep(0.02)
    handle.seek(start)
    return handle.read(size - start).decode(errors="replace")


def parse_faulthandler(text):
    """faulthandler's dump: threads newest first, the main thread (the oldest) last."""
    threads = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append({"name": head.group(3) or f"thread {head.group(2)}", "frames": []})
            continue
        found = _FRAME.match(line)
        if found and threads:
            path, number_, function = found.groups()
            threads[-1]["frames"].append(frame(function, path, int(number_)))
    if threads:
        threads[-1]["name"] = "MainThread"
        threads.insert(0, threads.pop())
    for index, thread in enumerate(threads):
        thread["main"] = index == 0
    return threads


# -- all of it ------------------------------------------------------------------------------


SHELLS = ("sh", "bash", "dash", "zsh", "env")
RUNNERS = ("cell_runner.py", "session_worker.py")  # ours: their frames are left out


# The node's pool (pool_server.py), around a rank it forked: in the folder of whichever job
# started the pool, so known by its place in a job's folder.
POOL_FILE = "/pyhook/distrun_pool.py"


def without_runner(threads, env):
    """The stacks less the outermost frames of jupyter-dist's own runner around a cell, and
    of the pool around a rank it forked."""
    job_dir = env.get("DISTRUN_JOB_DIR")
    ours = {os.path.join(job_dir, name) for name in RUNNERS} if job_dir else set()
    for thread in threads:
        frames = thread["frames"]
        while frames and (frames[-1]["file"] in ours or frames[-1]["file"].endswith(POOL_FILE)):
            frames.pop()
    return threads


def collect(job_id, method="auto"):
    py_spy = find_py_spy() if method in ("auto", "py-spy") else None
    processes, others = [], []
    for pid, env, argv in job_processes(job_id):
        if not is_python(pid, argv):
            if os.path.basename(argv[0]) not in SHELLS:  # a command's shell says nothing
                others.append({"pid": pid, "command": " ".join(argv)[:200]})
            continue
        entry = {
            "pid": pid,
            "ppid": parent_of(pid),
            "rank": number(env, "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK"),
            "local_rank": number(
                env, "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK"
            ),
            "node_rank": number(env, "DISTRUN_NODE_RANK"),
            "command": " ".join(argv)[:200],
            "method": None,
            "threads": [],
            "error": None,
        }
        reasons = []
        if method == "py-spy" and py_spy is None:
            reasons.append("py-spy is not installed on this node (pip install py-spy)")
        if py_spy is not None:
            try:
                entry["threads"], entry["method"] = by_py_spy(py_spy, pid), "py-spy"
            except (RuntimeError, ValueError, KeyError) as exc:
                reasons.append(str(exc))
        if entry["method"] is None and method != "py-spy":
            try:
                entry["threads"] = by_faulthandler(env, pid)
                entry["method"] = "faulthandler"
            except (RuntimeError, OSError) as exc:
                reasons.append(str(exc))
        without_runner(entry["threads"], env)
        if entry["method"] is None:
            alive = os.path.exists(f"/proc/{pid}")
            entry["error"] = "; ".join(reasons) if alive else "it ended while being read"
        processes.append(entry)
    return {
        "host": socket.gethostname(),
        "machine": machine(),
        "py_spy": py_spy,
        "processes": processes,
        "others": others,
    }


def machine():
    """Which process table this is (boot id and pid namespace): nodes that share one (test
    nodes in network namespaces of one machine) see the same processes."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def main():
    if len(sys.argv) < 2 or (len(sys.argv) > 2 and sys.argv[2] not in METHODS):
        sys.exit(f"usage: stacks.py JOB_ID [{'|'.join(METHODS)}]")
    # One collector per machine at a time: py-spy cannot attach to a process another one
    # holds (nodes that share a machine are asked at once).
    lock_path = os.path.join(tempfile.gettempdir(), f"distrun-stacks-{os.getuid()}.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = collect(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "auto")
    print(json.dumps(found))


if __name__ == "__main__":
    main()
