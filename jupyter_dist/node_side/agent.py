"""The node-side agent: runs one process of a job and makes sure it dies with the job.

Standard library only, Python 3.8+: it is copied to SSH nodes as a single file and run with
the node's Python. Usage::

    python agent.py [--cwd DIR] [--grace SECONDS] [--stdin | --stdin-fd N] [--usage SECONDS]
                    -- COMMAND...
    python agent.py --sweep JOB_ID     (kill what is left of a job on this machine)
    python agent.py --term JOB_ID      (SIGTERM the job's MPI ranks that no agent holds)

It starts COMMAND in a session of its own with this Python's folder first on PATH (after
$DISTRUN_PATH_FIRST, a folder of the job's own programs, where the plan names one) and the
job's startup hook first on PYTHONPATH (`$DISTRUN_JOB_DIR/pyhook`, where the job has one: it
lets every Python of the job dump its stacks, see stack_hook.py), inheriting
stdout and stderr, and writes one handshake line to stderr first (`HANDSHAKE started PID`,
or `HANDSHAKE failed REASON` and exit 127 without an exit report). Then it reads its stdin:

- `term`: SIGTERM to the process tree, SIGKILL after the grace period;
- `kill`: SIGKILL to the process tree at once;
- `int`: SIGINT to the process (a warm session's rank: KeyboardInterrupt in its cell);
- `feed BASE64`: these bytes to the process's standard input (with `--stdin`; without it,
  the process's stdin is /dev/null; with `--stdin-fd N`, the process reads inherited
  descriptor N, a pipe the launcher writes to itself, and the agent keeps no end of it);
- end of input (the launcher died, the SSH connection dropped): as `term`.

With `--usage S`, every S seconds it also reports what its process tree uses (and while it
stops it, that it is alive), one line on
stderr: `HANDSHAKE usage {"cpu": SECONDS, "rss": BYTES, "ranks": {"RANK": [SECONDS, BYTES]}}`:
CPU time used so far and resident memory, of the whole tree and of each rank: the processes
that carry it (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or HOROVOD_RANK in their environment: the
workers of torchrun, the ranks of mpirun or horovodrun on this node, with their shells and
forked workers) together. Where the node has `nvidia-smi` and the tree holds GPU memory, the
report also has `"gpu": [PERCENT, BYTES]` and `"gpus": {"RANK": [PERCENT, BYTES]}`: the
utilisation of the devices they use and the memory they hold there (read every
GPU_EVERY_S). Each report is one write of under 4 KiB, so it never interleaves with the
process's own writes.

The tree is what the child started, however it tried to leave:

- where this machine lets the agent make a cgroup v2 of its own (root, or a delegated
  subtree such as systemd's user@UID.service), the child starts in `distrun-JOB-TOKEN`
  beside the agent, every descendant is born in it, and stopping ends with `cgroup.kill`
  (what Slurm's proctrack/cgroup does). `DISTRUN_CGROUP=off` in the agent's environment
  turns this off;
- everywhere, the agent is the child subreaper of its tree (Linux's
  PR_SET_CHILD_SUBREAPER): a process that daemonizes (`setsid -f`, a double fork) becomes
  the agent's child instead of init's, so its parent link is never lost;
- and the child's process group, every descendant seen (torchrun moves its workers to
  sessions of their own), and any process still carrying this agent's token in its
  environment (an orphan of an agent that was killed, found by a later `--sweep`).

Whatever remains of the tree when the child exits is killed too. The agent exits with the
child's exit code, or 128+N when a signal N ended it, and says so last on stderr
(`HANDSHAKE exited CODE`): without that line, the link or the agent died. Where the
kernel's OOM killer ended processes under a memory limit over the tree while it ran (its
cgroup's, or one of the agent's cgroups: a container, a Slurm job), a line before it says
so: `HANDSHAKE oom {"cgroup": FOLDER, "kills": N, "limit": BYTES, "peak": BYTES}`.

Where the job preloads modules (`DISTRUN_PRELOAD`, and the pool's programs shipped in the
hook's folder), the agent first starts the node's pool of them unless one runs (outside its
tree: the pool outlives the job) and puts the job's `python` front first on PATH
(pool_agent.py): a Python rank is then forked from the pool, and the front names it in the
job's folder, so the tree holds it as its own (pool_front.py). The launcher's side of the
protocol is the same either way.
"""

import base64
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

HANDSHAKE = "\x1edistrun-agent"
TOKEN_VAR = "DISTRUN_AGENT_TOKEN"
PATH_FIRST_VAR = "DISTRUN_PATH_FIRST"
# Copies of node_side/__init__.py's HOOK_FOLDER and SHIPPED (this file is shipped alone;
# tests/test_architecture.py holds them to it). The job's startup hook (stack_hook.py as
# sitecustomize.py) is in that folder of the job's: the agent puts it first on PYTHONPATH;
# the debugger beside it (PYTHONBREAKPOINT's target), and the pool's agent part
# (node_side/pool_agent.py, which imports the other pool programs beside it) where the job
# preloads modules (DISTRUN_PRELOAD).
HOOK_FOLDER = "pyhook"
STACK_HOOK_NAME = "sitecustomize.py"
DEBUGGER_NAME = "distrun_debug.py"
POOL_NAME = "distrun_pool_agent.py"
POOL_MODULE = POOL_NAME[: -len(".py")]


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _command_name(pid):
    """The process's command name (/proc/PID/comm), or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


# Shells that die of a SIGTERM while they wait for the command they run.
_SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh"})


def _family(pids):
    """Each process's parent and process group, read once from /proc (None: gone)."""
    return {pid: _parent_of(pid) for pid in pids}, {pid: _group_of(pid) for pid in pids}


def _held_launchers(parents):
    """The MPI launchers among `parents`' processes that still have children: their ranks
    here, or their links (ssh, srun) to their daemons on other nodes, whose ranks the
    launcher's side signals there (`terminate_ranks`)."""
    launchers = {pid for pid in parents if _command_name(pid) in MPI_LAUNCHERS}
    return set(parents.values()) & launchers


def _terminate_rank(pid, parents, groups):
    """SIGTERM to what runs in `pid`'s process group but a shell waiting for a child (it
    would die of it, and its launcher would take that as the rank's end); the group."""
    group = {p for p, g in groups.items() if g == groups.get(pid)} | {pid}
    waiting = set(parents.values())  # processes with a live child
    for member in sorted(group):
        if not (member in waiting and _command_name(member) in _SHELLS):
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGTERM)
    return group


def terminate_ranks(job_id):
    """SIGTERM, once each, the job's MPI ranks on this machine that no agent of the job
    holds: a daemon of the launcher on another node started them (Open MPI's orted, over
    ssh or srun), and would give them about a second. Returns their pids."""
    marker = f"DISTRUN_JOB_ID={job_id}".encode()
    token_prefix = f"{TOKEN_VAR}=".encode()
    parents, groups = _family(set(_all_pids()) - {os.getpid()})
    launchers = {pid for pid in parents if _command_name(pid) in MPI_LAUNCHERS}
    termed = set()
    for pid in sorted(parents):
        if pid in termed or parents[pid] not in launchers or type(_rank_of(pid)) is not int:
            continue
        pairs = _environ(pid) or []
        if marker not in pairs:
            continue
        token = next((p[len(token_prefix) :] for p in pairs if p.startswith(token_prefix)), b"")
        if _live_agent(_agent_of_token(token.decode(errors="replace")), marker):
            continue  # an agent's own: it stops it
        termed |= _terminate_rank(pid, parents, groups)
    return sorted(termed)


def _parent_of(pid):
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _group_of(pid):
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def _all_pids():
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _environ(pid):
    """The NAME=VALUE pairs of a process's environment, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return None


def _carries_token(pid, marker):
    return marker in (_environ(pid) or [])


def become_subreaper():
    """Orphans of our descendants become our children instead of init's (Linux 3.4+); False
    where that is not possible."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _cgroup2_mounts():
    """(root inside the hierarchy, mount point) of every cgroup v2 mount this process sees."""
    return _cgroup_mounts(lambda fstype, options: fstype == "cgroup2")


def _cgroup_mounts(wanted):
    """(root inside the hierarchy, mount point) of the cgroup mounts for which
    `wanted(fstype, super options)` holds."""
    mounts = []
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                left, _, right = line.partition(" - ")
                fstype, _, options = [*right.strip().split(" "), "", "", ""][:3]
                if fstype.startswith("cgroup") and wanted(fstype, options.split(",")):
                    fields = left.split()
                    mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    except OSError:
        pass
    return mounts


def _memory_scopes():
    """Where a memory limit over this process is set and the kernel counts its OOM kills:
    its memory cgroup and every ancestor up to the mount, innermost first, as (folder,
    counter file): cgroup v2's memory.events, or v1's memory.oom_control."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    scopes = []
    for line in lines:
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and not controllers:
            mounts, counter = _cgroup2_mounts(), "memory.events"
        elif "memory" in controllers.split(","):
            mounts = _cgroup_mounts(lambda fstype, opts: fstype == "cgroup" and "memory" in opts)
            counter = "memory.oom_control"
        else:
            continue
        for root, point in mounts:
            inside = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
            if inside.startswith(".."):
                continue
            folder = os.path.normpath(os.path.join(point, inside))
            while folder.startswith(point):
                if os.path.isfile(os.path.join(folder, counter)):
                    scopes.append((folder, counter))
                if folder == point:
                    break
                folder = os.path.dirname(folder)
            break
    return scopes


def _read_number(path, key=None):
    """An int from a cgroup file (with `key`: from its `KEY N` line); None if unreadable or
    unlimited ("max", or v1's huge no-limit value)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        return None
    if key is not None:
        text = next((ln.split()[1] for ln in text.splitlines() if ln.startswith(key + " ")), "")
    text = text.strip()
    if not text.isdigit() or int(text) >= 1 << 60:
        return None
    return int(text)


class OomWatch:
    """What the kernel's OOM killer did under this tree's memory limits while it ran: the
    oom_kill counters of every memory scope (its own cgroup, then the agent's and its
    ancestors), read at the start and again at the end."""

    def __init__(self, own_cgroup=None):
        self.scopes = _memory_scopes()
        if own_cgroup is not None and os.path.isfile(os.path.join(own_cgroup, "memory.events")):
            self.scopes.insert(0, (own_cgroup, "memory.events"))
        self.before = {folder: self._kills(folder, counter) for folder, counter in self.scopes}

    @staticmethod
    def _kills(folder, counter):
        return _read_number(os.path.join(folder, counter), "oom_kill") or 0

    def report(self):
        """The innermost scope whose OOM kills rose, with its limit and peak, or None."""
        for folder, counter in self.scopes:
            kills = self._kills(folder, counter) - self.before.get(folder, 0)
            if kills > 0:
                v2 = counter == "memory.events"
                limit = _read_number(
                    os.path.join(folder, "memory.max" if v2 else "memory.limit_in_bytes")
                )
                peak = _read_number(
                    os.path.join(folder, "memory.peak" if v2 else "memory.max_usage_in_bytes")
                )
                return {"cgroup": folder, "kills": kills, "limit": limit, "peak": peak}
        return None


def _unescape(field):
    """A mountinfo path: spaces, tabs, newlines and backslashes come octal-escaped."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _own_cgroup_dir():
    """The folder of this process's cgroup v2, or None (no cgroup v2 here)."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None or not path.startswith("/"):
        return None
    for root, point in _cgroup2_mounts():
        inside = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
        if inside.startswith(".."):
            continue
        folder = os.path.normpath(os.path.join(point, inside))
        if os.path.isfile(os.path.join(folder, "cgroup.procs")):
            return folder
    return None


def _safe_name(text):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:100]


class Cgroup:
    """A cgroup v2 of the process tree's own: `distrun-JOB-TOKEN` beside the agent's (a
    child of the agent's cgroup, so moving the tree's first process in needs no more rights
    than the agent has over its own). Every process forked inside stays inside, whatever it
    does to its session, parent or environment."""

    PREFIX = "distrun-"

    def __init__(self, folder):
        self.folder = folder

    @classmethod
    def make(cls, job_id, token):
        """A new, empty one, or None where this machine does not allow it."""
        parent = _own_cgroup_dir()
        if parent is None:
            return None
        folder = os.path.join(parent, f"{cls.PREFIX}{_safe_name(job_id)}-{token}")
        try:
            os.mkdir(folder)
        except OSError:
            return None  # not ours to divide (not root, not delegated), or read-only
        return cls(folder)

    def enter(self):
        """Move the calling process in (called in the child, between fork and exec, so that
        it is inside before it can fork); a failure leaves it where it was."""
        try:
            fd = os.open(os.path.join(self.folder, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError:
            pass

    def pids(self):
        try:
            with open(os.path.join(self.folder, "cgroup.procs")) as handle:
                return [int(line) for line in handle if line.strip()]
        except (OSError, ValueError):
            return []

    def populated(self):
        try:
            with open(os.path.join(self.folder, "cgroup.events")) as handle:
                return "populated 1" in handle.read()
        except OSError:
            return False

    def kill(self, timeout=5.0):
        """SIGKILL to every process inside, those forked meanwhile included: `cgroup.kill`
        (Linux 5.14+), else freeze it and kill each process until none is left."""
        try:
            with open(os.path.join(self.folder, "cgroup.kill"), "w") as handle:
                handle.write("1")
        except OSError:
            with (
                contextlib.suppress(OSError),
                open(os.path.join(self.folder, "cgroup.freeze"), "w") as handle,
            ):
                handle.write("1")  # no more forks; SIGKILL still ends a frozen process
        deadline = time.monotonic() + timeout
        while self.populated() and time.monotonic() < deadline:
            for pid in self.pids():  # without cgroup.kill, or a fork that was in flight
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self):
        """Remove the cgroup once it is empty; True when it is gone."""
        try:
            os.rmdir(self.folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    @classmethod
    def of_job(cls, job_id, limit=20000):
        """Every cgroup the agents of `job_id` made on this machine, found by name."""
        prefix = f"{cls.PREFIX}{_safe_name(job_id)}-"
        found, seen = [], 0
        for _root, point in _cgroup2_mounts():
            for folder, subfolders, _files in os.walk(point):
                seen += 1
                if seen > limit:
                    return found
                for name in list(subfolders):
                    if name.startswith(prefix):
                        found.append(cls(os.path.join(folder, name)))
                        subfolders.remove(name)
        return found


class Tree:
    """The child and everything it started, remembered while the links still exist."""

    def __init__(self, root, token, cgroup=None, forked=None):
        self.root = root
        # The ranks a node's pool forked for this agent (pool_front.py names them): not
        # our descendants, yet ours.
        self.forked = forked or (lambda: [])
        self.marker = f"{TOKEN_VAR}={token}".encode()
        self.cgroup = cgroup  # the tree's own cgroup, where the machine allows one
        self.seen = {root}
        self.termed = set()  # processes sent SIGTERM (terminate)
        self.terminating = False  # terminate was called
        self.lock = threading.Lock()
        self._parents = {}  # pid -> parent, of every process on the machine (refresh)
        self._parents_lock = threading.Lock()  # refresh runs in the stopping thread too

    def refresh(self, orphans=False):
        """Add new descendants, the cgroup's processes and the orphans adopted by the agent
        (reaping those that ended); with `orphans`, also processes carrying the token
        (slower: it reads every environment, so only when stopping)."""
        me = os.getpid()
        parents = self._parents_now(me)
        inside = self.cgroup.pids() if self.cgroup else []
        for pid, parent in parents.items():
            if parent == me and pid != self.root:  # adopted: a daemon of the tree, or its zombie
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)
        with self.lock:
            # Forget the ended (their pids may be reused by strangers), never the child.
            self.seen.intersection_update([*parents, self.root])
            self.termed.intersection_update([*parents, self.root])
            self.seen.update(pid for pid in inside if pid != me)
            self.seen.update(pid for pid, parent in parents.items() if parent == me)
            self.seen.update(pid for pid in self.forked() if pid in parents)
            grew = True
            while grew:
                grew = False
                for pid, parent in parents.items():
                    if parent in self.seen and pid not in self.seen:
                        self.seen.add(pid)
                        grew = True
            if orphans:
                for pid in parents:
                    if pid not in self.seen and _carries_token(pid, self.marker):
                        self.seen.add(pid)

    def _parents_now(self, me):
        """Each process's parent: read at first sight, and again each time for the tree's
        own (and whoever could not be read). A stranger's parent changes only when its
        parent ends, and never to one of ours: an orphan goes to its ancestors' reaper,
        which is us only for our descendants. Reading every process's parent at every look
        cost each agent a read of all /proc twice a second: with 64 ranks on a node, 64
        agents doing so took more CPU than the ranks."""
        pids = set(_all_pids())
        pids.discard(me)
        with self.lock:
            ours = set(self.seen)
        with self._parents_lock:
            known = self._parents
            for pid in [pid for pid in known if pid not in pids]:
                del known[pid]  # ended (its pid may come back as a stranger's)
            for pid in pids:
                if known.get(pid) is None or pid in ours:
                    known[pid] = _parent_of(pid)
            return dict(known)

    def signal(self, sig):
        """`sig` to the child's process group and to every process of the tree."""
        self.refresh(orphans=True)
        with contextlib.suppress(OSError):
            os.killpg(self.root, sig)
        with self.lock:
            pids = list(self.seen)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def kill(self, timeout=5.0):
        """SIGKILL to the whole tree until none of it is left: the cgroup at once where there
        is one; else again and again, since a process may fork between a look at /proc and
        the kill (its child, adopted by the agent, is seen at the next look)."""
        if self.cgroup is not None:
            self.cgroup.kill(timeout)
        deadline = time.monotonic() + timeout
        self.signal(signal.SIGKILL)
        while self.alive() and time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            time.sleep(0.01)

    def terminate(self):
        """SIGTERM once to each process (twice, and its handler would run twice): the child's
        process group at the first call, then each other process of the tree once no live
        process of the tree is its parent. A launcher (torchrun, mpirun) passes it on to its
        workers itself; a process orphaned meanwhile (its shell died) or daemonized has
        nobody to. An MPI launcher (`_held_launchers`) would pass it on late and cut the
        grace period to about a second (Open MPI: SIGCONT, a second, SIGTERM, a second,
        SIGKILL): its ranks here get it from us instead, what runs in each rank's process
        group but the shell waiting for it (the shell would die of it, and the launcher
        would take that as the rank's end and stop the others its way); its ranks on other
        nodes get it from the launcher's side (`terminate_ranks`, there); the launcher gets
        none while it has children: it ends when they do. Called again while the grace
        period runs; returns the processes that were still alive (none: the tree is
        gone)."""
        first, self.terminating = not self.terminating, True
        self.refresh(orphans=first)
        live = set(self._live())
        parents, groups = _family(live)
        held = _held_launchers(parents)
        group = {pid for pid in live if groups[pid] == self.root} | {self.root}
        if self.root not in self.termed and held.isdisjoint(group):  # else one by one
            with contextlib.suppress(OSError):
                os.killpg(self.root, signal.SIGTERM)
            self.termed.update(group)
        for pid in sorted(live - self.termed):
            if pid in held:
                continue  # its ranks get it from us; it ends when they do
            parent = parents[pid]
            if parent in held:
                if type(_rank_of(pid)) is int:  # a rank: what runs in its group, its shell aside
                    self.termed.update(_terminate_rank(pid, parents, groups))
                continue  # else the launcher's link to its daemons elsewhere: kept meanwhile
            if groups[pid] != self.root and parent in live:
                continue  # its parent, one of ours, passes it on
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            self.termed.add(pid)
        return live

    def alive(self):
        self.refresh()
        return self._live()

    def _live(self):
        """The processes seen that still run (zombies are done)."""
        with self.lock:
            pids = list(self.seen)
        return [pid for pid in pids if (_stat_fields(pid) or ["Z"])[0] != "Z"]


# Launchers that give their ranks about a second between SIGTERM and SIGKILL (Open MPI's
# mpirun and daemons, MPICH's hydra): the agent signals their ranks itself.
MPI_LAUNCHERS = frozenset(
    {
        "mpirun",
        "mpiexec",
        "orterun",
        "orted",
        "prterun",
        "prted",
        "hydra_pmi_proxy",
        "mpiexec.hydra",
    }
)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# torchrun and per-process ranks, Open MPI, MPICH and Slurm, horovodrun --gloo
_RANK_VARS = (b"RANK=", b"OMPI_COMM_WORLD_RANK=", b"PMI_RANK=", b"HOROVOD_RANK=")
_MAX_REPORT = 4000  # bytes: below PIPE_BUF, so one write is never split


def _rank_of(pid):
    """The rank a process carries in its environment, None if it carries none, or False
    when its environment cannot be read now, or reads empty (a process caught in exec: its
    old memory is gone, the new one not there yet): ask again later."""
    pairs = _environ(pid)
    if not pairs or pairs == [b""]:  # read in the middle of its exec (or emptied): ask again
        return False
    for prefix in _RANK_VARS:
        for pair in pairs:
            if pair.startswith(prefix) and pair[len(prefix) :].isdigit():
                return int(pair[len(prefix) :])
    return None


def _cpu_and_rss(pid):
    """(CPU seconds used, resident bytes) of a live process, or None."""
    fields = _stat_fields(pid)
    if not fields or fields[0] == "Z":
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE


class Usage:
    """What a process tree uses, sampled (see the module's `--usage`)."""

    def __init__(self, tree):
        self.tree = tree
        self.ranks = {}  # pid -> rank or None, read once per process
        self.gpus = GpuUsage()

    def _rank(self, pid):
        rank = self.ranks.get(pid, False)
        if rank is False:
            rank = _rank_of(pid)
            if rank is not False:  # known for good; unreadable is asked again
                self.ranks[pid] = rank
        return rank if isinstance(rank, int) and rank is not False else None

    def report(self):
        with self.tree.lock:
            pids = list(self.tree.seen)
        cpu, rss, ranks = 0.0, 0, {}
        for pid in pids:
            found = _cpu_and_rss(pid)
            if found is None:
                continue
            cpu, rss = cpu + found[0], rss + found[1]
            rank = self._rank(pid)
            if rank is not None:  # with its shell and forks
                before = ranks.get(rank, (0.0, 0))
                ranks[rank] = (before[0] + found[0], before[1] + found[1])
        report = {
            "cpu": round(cpu, 2),
            "rss": rss,
            "ranks": {str(r): [round(c, 2), m] for r, (c, m) in sorted(ranks.items())},
        }
        held = self.gpus.sample(pids)  # {pid: {uuid: bytes}}
        if held:
            report["gpu"] = self.gpus.reading(held.values())
            by_rank = {}
            for pid, devices in held.items():
                rank = self._rank(pid)
                if rank is not None:
                    by_rank.setdefault(rank, []).append(devices)
            report["gpus"] = {str(r): self.gpus.reading(d) for r, d in sorted(by_rank.items())}
        line = json.dumps(report)
        if len(line) > _MAX_REPORT:  # hundreds of ranks under one agent: totals only
            report["ranks"] = {}
            report.pop("gpus", None)
            line = json.dumps(report)
        return line


# nvidia-smi costs tens of milliseconds of CPU a call: GPUs are read less often than /proc.
GPU_EVERY_S = 5.0
_GPU_APPS = ("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")
_GPU_UTILISATION = ("--query-gpu=uuid,utilization.gpu", "--format=csv,noheader,nounits")


def _nvidia_smi(program, query):
    """nvidia-smi's CSV rows for `query`, or None when it fails (no driver, a timeout)."""
    try:
        done = subprocess.run(
            [program, *query],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    lines = done.stdout.decode(errors="replace").splitlines()
    return [[field.strip() for field in line.split(",")] for line in lines if line.strip()]


def _number(text):
    """A number nvidia-smi printed, or None for its "[N/A]" and "[Not Supported]"."""
    try:
        return float(text)
    except ValueError:
        return None


class GpuUsage:
    """The GPU memory each process of a tree holds and the utilisation of the devices it
    uses, from nvidia-smi where the node has it (its compute apps, by host PID: in a
    container with a PID namespace of its own none match, and nothing is reported). Read
    every GPU_EVERY_S; the last reading stands in between. A failing nvidia-smi is not
    asked again."""

    def __init__(self):
        self.program = shutil.which("nvidia-smi")
        self.next_read = 0.0
        self.held = {}  # pid -> {device uuid: bytes}
        self.utilisation = {}  # device uuid -> percent

    def sample(self, pids):
        """{pid: {device uuid: bytes}} of the processes in `pids` that hold GPU memory."""
        if self.program and time.monotonic() >= self.next_read:
            self.next_read = time.monotonic() + GPU_EVERY_S
            self._read(set(pids))
        return {pid: devices for pid, devices in self.held.items() if pid in pids}

    def _read(self, pids):
        apps = _nvidia_smi(self.program, _GPU_APPS)
        if apps is None:
            self.program, self.held = None, {}
            return
        held = {}
        for row in apps:
            if len(row) < 3 or not row[0].isdigit() or int(row[0]) not in pids:
                continue
            used = _number(row[2])  # MiB
            devices = held.setdefault(int(row[0]), {})
            devices[row[1]] = devices.get(row[1], 0) + int((used or 0) * 2**20)
        self.held = held
        if held:  # the devices' utilisation only where the tree uses one
            rows = _nvidia_smi(self.program, _GPU_UTILISATION) or []
            self.utilisation = {row[0]: _number(row[1]) for row in rows if len(row) >= 2}

    def reading(self, groups):
        """[percent, bytes] of processes together: the mean utilisation of the devices
        they use (None where no device says), and the memory they hold on them."""
        devices, held = set(), 0
        for group in groups:
            devices.update(group)
            held += sum(group.values())
        known = [self.utilisation[d] for d in devices if self.utilisation.get(d) is not None]
        return [round(sum(known) / len(known), 1) if known else None, held]


class Agent:
    def __init__(self, command, cwd, grace, stdin=False, usage_every=0.0, stdin_fd=None):
        self.command = command
        self.stdin_fd = stdin_fd
        self.usage_every = usage_every
        self.stdin = stdin
        self.cwd = cwd
        self.grace = grace
        self.child = None
        self.tree = None
        self.oom = None  # OomWatch, once the child runs
        self.announced = False  # "started" was said: the exit must be reported too
        self.stopping = threading.Event()
        self.stopped = threading.Event()  # the stop (its grace period included) is over

    def start(self):
        env = dict(os.environ)
        token = f"{os.getpid()}-{time.time_ns()}"
        env[TOKEN_VAR] = token
        path = [os.path.dirname(sys.executable), env.get("PATH", "/usr/bin:/bin")]
        if env.get(PATH_FIRST_VAR):  # the job's own programs (the `ssh` horovodrun calls)
            path.insert(0, env[PATH_FIRST_VAR])
        env["PATH"] = os.pathsep.join(path)
        job_dir = env.get("DISTRUN_JOB_DIR")
        hook = os.path.join(job_dir, HOOK_FOLDER) if job_dir else None
        if hook and os.path.isfile(os.path.join(hook, STACK_HOOK_NAME)):
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook, env.get("PYTHONPATH")]))
            # breakpoint() pauses the rank for a debugger reached from afar (its stdin is no
            # terminal: plain pdb would quit and kill the job), unless the job names its own
            # hook, or 0 (none). Ray sets its own for its workers, which this process is a
            # child of (an actor's): outside a Ray worker it fails, so ours replaces it.
            if (
                os.path.isfile(os.path.join(hook, DEBUGGER_NAME))
                and env.get("PYTHONBREAKPOINT", RAYS_BREAKPOINT) == RAYS_BREAKPOINT
            ):
                env["PYTHONBREAKPOINT"] = "distrun_debug.set_trace"
            # Python caches the hook's bytecode beside it: in a private folder (its files
            # take the source's 0600), as everything in the job's folder is.
            with contextlib.suppress(OSError):
                os.makedirs(os.path.join(hook, "__pycache__"), mode=0o700, exist_ok=True)
        pool, no_pool = _pool_of(hook, env)
        if pool is not None:  # its `python` first: forks from the node's pool
            env["PATH"] = os.pathsep.join([pool.prepared, env["PATH"]])
        # Check first, then say "started", then start: once the child runs, its output
        # shares our stderr, so the handshake line must already be out.
        if self.cwd and not os.path.isdir(self.cwd):
            return self._refuse(f"no folder {self.cwd}")
        if not shutil.which(self.command[0], path=env["PATH"]):
            return self._refuse(f"{self.command[0]!r} not found")
        sys.stderr.write(f"{HANDSHAKE} started {os.getpid()}\n")
        if no_pool is not None:  # after the handshake, which the launcher reads first
            line, failed = no_pool
            if failed:  # for the owner: a preload that cannot be imported is not kept
                sys.stderr.write(f"{HANDSHAKE} preload-failed {json.dumps(line)}\n")
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.announced = True
        become_subreaper()
        cgroup = None
        if os.environ.get("DISTRUN_CGROUP", "auto").lower() not in ("off", "0", "no", "false"):
            cgroup = Cgroup.make(os.environ.get("DISTRUN_JOB_ID", "job"), token)
        try:
            self.child = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=env,
                stdin=self._child_stdin(),
                start_new_session=True,
                preexec_fn=cgroup.enter if cgroup else None,  # no thread runs yet: safe
            )
        except OSError as exc:
            if cgroup is not None:
                cgroup.remove()
            sys.stderr.write(f"distrun agent: cannot start {self.command[0]!r}: {exc}\n")
            return False
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)  # the process holds the only reading end now
        if cgroup is not None and self.child.pid not in cgroup.pids():
            cgroup.remove()  # the move was refused: the subreaper and the links it is
            cgroup = None
        forked = (lambda: pool.forked_for(job_dir, token)) if pool is not None else None
        self.tree = Tree(self.child.pid, token, cgroup, forked)
        self.oom = OomWatch(cgroup.folder if cgroup else None)
        return True

    def _child_stdin(self):
        if self.stdin_fd is not None:  # the launcher writes to it itself (the local backend)
            return self.stdin_fd
        return subprocess.PIPE if self.stdin else subprocess.DEVNULL

    def _refuse(self, reason):
        sys.stderr.write(f"{HANDSHAKE} failed {reason}\n")
        sys.stderr.flush()
        return False

    def listen(self):
        """Commands on stdin; end of input means the launcher is gone. Reads the raw file
        descriptor: a buffered reader's lock would hang the interpreter's shutdown."""
        buffered = b""
        while True:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                self.stop(self.grace)
                return
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                word = line.strip()
                if word == b"term":
                    threading.Thread(target=self.stop, args=(self.grace,), daemon=True).start()
                elif word == b"kill":
                    self.stop(0)
                elif word == b"int":
                    with contextlib.suppress(OSError):
                        os.kill(self.child.pid, signal.SIGINT)
                elif word.startswith(b"feed ") and self.child.stdin is not None:
                    try:
                        self.child.stdin.write(base64.b64decode(word[5:]))
                        self.child.stdin.flush()
                    except (OSError, ValueError):
                        pass  # the process closed its input or ended: its exit tells

    def stop(self, grace):
        """SIGTERM, then SIGKILL to what still runs after `grace` seconds (at once if 0).
        A second stop while one waits only shortens nothing: the first one's deadline
        holds, unless this one kills at once."""
        if self.stopping.is_set() and grace > 0:
            return
        self.stopping.set()
        if grace > 0:
            live = self.tree.terminate()
            deadline = time.monotonic() + grace
            pause = 0.005  # most trees end at once: look again soon, then every 50 ms
            while time.monotonic() < deadline and live:
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
                live = self.tree.terminate()
        self.tree.kill()
        self.stopped.set()

    def run(self):
        if not self.start():
            return 127
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(
                sig,
                lambda *_: threading.Thread(
                    target=self.stop, args=(self.grace,), daemon=True
                ).start(),
            )
        threading.Thread(target=self.listen, daemon=True).start()
        # Remember descendants while they are still linked to the child.
        usage = Usage(self.tree) if self.usage_every > 0 else None
        next_report = time.monotonic()
        while self.child.poll() is None:
            self.tree.refresh()
            if usage is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + self.usage_every
                line = f"{HANDSHAKE} usage {usage.report()}\n".encode()
                with contextlib.suppress(OSError):
                    os.write(2, line)  # one write: atomic on a pipe
            wait = 0.5 if usage is None else max(0.01, min(0.5, next_report - time.monotonic()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(timeout=wait)
        code = self.child.returncode
        oom = self.oom.report() if self.oom is not None else None
        if oom is not None:  # before the exit report: the launcher reads it as evidence
            with contextlib.suppress(OSError):
                os.write(2, f"{HANDSHAKE} oom {json.dumps(oom)}\n".encode())
        if self.stopping.is_set():
            # The grace period is the process's own: a shell around it that died of the
            # SIGTERM does not end it early (the rank may still be saving a checkpoint).
            # Meanwhile the launcher still hears from us: silence means a dead agent.
            every = self.usage_every or None
            while not self.stopped.wait(every):
                with contextlib.suppress(OSError):
                    os.write(2, f"{HANDSHAKE} alive\n".encode())
        elif self.tree.alive() or (self.tree.cgroup and self.tree.cgroup.populated()):
            self.tree.kill()  # leftovers of a finished process are not kept running
        if self.tree.cgroup is not None:
            self.tree.cgroup.remove()
        _make_private(os.environ.get("DISTRUN_JOB_DIR"), WRITTEN_WITH_UMASK)
        _clear_pauses(os.environ.get("DISTRUN_JOB_DIR"))
        return 128 - code if code < 0 else code


def _pool_of(hook, env):
    """(the job's pool module, why not), the module being pool_agent.py, shipped where the job
    preloads modules, with the node's pool started and the job's `python` shims written
    (`.prepared`: their folder). The module is None where the job preloads nothing or no
    pool can be had here: its ranks start cold. Why not: None, or (one line for the job's
    output, whether the modules could not be imported)."""
    if not hook or not env.get("DISTRUN_PRELOAD"):
        return None, None
    path = os.path.join(hook, POOL_NAME)
    if not os.path.isfile(path):
        return None, None
    modules = env["DISTRUN_PRELOAD"]
    try:
        import importlib

        if hook not in sys.path:  # the pool's programs import each other from there
            sys.path.insert(0, hook)
        module = importlib.import_module(POOL_MODULE)
        module.prepared = module.prepare(env, sys.executable)
    except Exception as exc:  # a pool is a speed-up: never the job's failure
        failed = bool(getattr(exc, "failed", False))
        what = f"cannot preload {modules}" if failed else f"no pool of {modules} here"
        return None, (f"distrun: {what} ({exc}); this rank starts cold", failed)
    return (module if module.prepared else None), None


# What processes write into the job's folder with the umask they were given (torchrun's
# per-worker logs, the job's outputs: 0755 folders of 0644 files): made private once their
# tree is gone, as everything in the job's folder is. (They sit in the job's 0700 folder
# meanwhile.)
WRITTEN_WITH_UMASK = ("torchrun-*", "outputs")


def _make_private(job_dir, patterns):
    """Every folder 0700 and file 0600 (a program 0700) below `job_dir`'s `patterns`."""
    if not job_dir:
        return
    tops = [t for p in patterns for t in glob.glob(os.path.join(glob.escape(job_dir), p))]
    for top in tops:
        for folder, _dirs, files in os.walk(top):  # (it enters no link to a folder)
            if not os.path.islink(folder):  # `top` itself may be one
                with contextlib.suppress(OSError):
                    os.chmod(folder, 0o700)
            for name in files:
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    info = os.lstat(path)
                    if not stat.S_ISLNK(info.st_mode):  # a link's target is not the job's
                        os.chmod(path, 0o700 if info.st_mode & 0o100 else 0o600)


RAYS_BREAKPOINT = "ray.util.rpdb.set_trace"  # what Ray gives its workers' environment


def _clear_pauses(job_dir):
    """What a rank killed in its debugger left (debugger.py: `debug/MACHINE-PID.sock` and
    `.json`, taken away at a normal exit): those of this machine's processes that are gone.
    The folder goes once empty."""
    if not job_dir:
        return
    folder = os.path.join(job_dir, "debug")
    machine = machine_tag()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        tag = name.split(".", 1)[0]
        owner, _, pid = tag.rpartition("-")
        if owner == machine and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def machine_tag():
    """A copy of stack_hook.machine_tag (this file is shipped alone): this machine in a
    file name, its boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()[:13]
    except OSError:
        return socket.gethostname()


def _runs_agent(pid):
    """Whether `pid` runs a node agent (agent.py, or agent-DIGEST.py as shipped), not a sweep."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    words = [w for w in argv[1:3] if not w.startswith(b"-")]  # (`python -E agent.py`)
    script = os.path.basename(words[0]) if words else b""
    helper = b"--sweep" in argv or b"--term" in argv  # a one-shot, not a process's agent
    return script.startswith(b"agent") and script.endswith(b".py") and not helper


def _agent_of_token(token):
    """The pid of the agent that made `token` (`PID-NANOSECONDS`, see Agent.start), or None."""
    owner = token.split("-", 1)[0]
    return int(owner) if owner.isdigit() else None


def _live_agent(owner, marker):
    """Whether `owner` (a pid, or None) is a running agent of the job `marker` names."""
    return owner is not None and _runs_agent(owner) and _carries_token(owner, marker)


def sweep(job_id):
    """Kill every process on this machine in a cgroup of the job's agents or carrying
    DISTRUN_JOB_ID=job_id (the last safety net after a job); returns their pids. A live
    agent's tree is left to it, and the agent too: it is still in its grace period (the
    launcher sweeps as soon as it lost the link), and will take its tree down whole."""
    marker = f"DISTRUN_JOB_ID={job_id}".encode()
    token_prefix = f"{TOKEN_VAR}=".encode()
    me = os.getpid()
    killed = []
    for cgroup in Cgroup.of_job(job_id):  # a killed agent's tree, cleared environments too
        token = "-".join(os.path.basename(cgroup.folder).rsplit("-", 2)[-2:])
        if _live_agent(_agent_of_token(token), marker):
            continue
        killed += cgroup.pids()
        cgroup.kill()
        cgroup.remove()
    for pid in _all_pids():
        pairs = _environ(pid) or []
        if pid == me or marker not in pairs or _runs_agent(pid):
            continue  # an agent of the job carries its id, and stops its own tree
        token = next((p[len(token_prefix) :] for p in pairs if p.startswith(token_prefix)), b"")
        if _live_agent(_agent_of_token(token.decode(errors="replace")), marker):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def parse(argv):
    cwd, grace, stdin, usage_every, stdin_fd = None, 5.0, False, 0.0, None
    args = list(argv)
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag == "--stdin":
            stdin = True
        elif flag == "--stdin-fd" and args:
            stdin_fd = int(args.pop(0))
        elif flag == "--cwd" and args:
            cwd = args.pop(0)
        elif flag == "--grace" and args:
            grace = float(args.pop(0))
        elif flag == "--usage" and args:
            usage_every = float(args.pop(0))
        else:
            raise SystemExit(f"distrun agent: unknown option {flag!r}")
    if not args or len(args) < 2:
        raise SystemExit("distrun agent: usage: agent.py [--cwd DIR] [--grace S] -- COMMAND...")
    return args[1:], cwd, grace, stdin, usage_every, stdin_fd


def main():
    if sys.argv[1:2] == ["--sweep"] and len(sys.argv) == 3:
        print(" ".join(str(pid) for pid in sweep(sys.argv[2])))
        sys.exit(0)
    if sys.argv[1:2] == ["--term"] and len(sys.argv) == 3:
        print(" ".join(str(pid) for pid in terminate_ranks(sys.argv[2])))
        sys.exit(0)
    command, cwd, grace, stdin, usage_every, stdin_fd = parse(sys.argv[1:])
    agent = Agent(command, cwd, grace, stdin, usage_every, stdin_fd)
    code = agent.run()
    # The launcher's proof that the exit code is the process's, not a dead link's: every
    # process that was announced as started gets it, whatever its code (a shell's 127 for
    # "command not found" included).
    if agent.announced:
        sys.stderr.write(f"{HANDSHAKE} exited {code}\n")
    sys.stderr.flush()
    os._exit(code)  # no interpreter shutdown: the stdin thread may still be reading


if __name__ == "__main__":
    main()
