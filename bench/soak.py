"""Soak: is anything of a job left running after it is stopped, however it is stopped and
however its processes try to escape?

    .venv/bin/python bench/soak.py [--trials 20] [--nodes local,ssh] [--scenarios ...]
                                   [--cgroup auto|off]     (as root for ssh: network namespaces)

Every trial runs a job of two ranks (local: one node x 2; ssh: two real sshd nodes x 1,
tests/sshnodes.py) whose rank ignores SIGTERM and, before it says READY, starts

- a grandchild (a child of its own, also ignoring SIGTERM),
- a daemon (`setsid -f`: a session of its own, reparented away from the rank),
- a daemon with a cleared environment (`setsid -f env -i`: no marker of the job left in it),

then stops the job one way (a scenario):

- ctrl-c:           SIGINT to `jupyter distrun run` (a terminal's Ctrl-C);
- launcher-sigkill: SIGKILL to `jupyter distrun run` (it cleans up nothing);
- cancel:           `jupyter distrun cancel JOB` from another process;
- kernel-sigkill:   SIGKILL to a Jupyter kernel running the job as a `%%distrun` cell;
- dropped-ssh:      every sshd session on the nodes killed (ssh nodes only);
- fail-fast:        rank 1 exits 3 after READY; the launcher stops the rest;
- agent-sigkill:    SIGKILL to the node agent of one rank (a node lost): the launcher
                    must fail the job at once and sweep what that agent left.

and counts what is still running once the grace period (1 s) and a margin (5 s) are over:
the ranks, grandchildren, daemons and cleared-environment daemons, by their tags. Leftovers
are killed after each trial, so trials are independent. "hung" counts launchers that did
not end within 30 s of the stop (a leftover holding their output pipe open, say). Prints
one table row per scenario and node kind. Goal: 0 in every column.

`--cgroup off` sets DISTRUN_CGROUP=off for the agents (and nodes), to measure what the
fallback catches (the agent as child subreaper, process links, environment markers) where
no cgroup can be made.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from jupyter_dist.node_side.stacks import is_agent  # the one test of "an agent"

GRACE_S = 1
MARGIN_S = 5.0
HANG_S = 30.0
BEHAVIOURS = ("rank", "grandchild", "daemon", "envi")
SCENARIOS = (
    "ctrl-c", "launcher-sigkill", "cancel", "kernel-sigkill", "dropped-ssh", "fail-fast",
    "agent-sigkill",
)  # fmt: skip

# A rank that does everything it can to outlive its job. {tag}: this trial's; {fail}: the
# rank that fails on purpose ("" for none).
RANK_SCRIPT = """\
import os, signal, subprocess, sys, time
TAG = "{tag}"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join("{pids}", TAG + "-rank-" + str(os.getpid())), "w"):
    pass
sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
py = sys.executable
subprocess.Popen([py, "-c", sleeper, TAG + "-grandchild"])
subprocess.run(["setsid", "-f", py, "-c", sleeper, TAG + "-daemon"])
subprocess.run(["setsid", "-f", "env", "-i", py, "-c", sleeper, TAG + "-envi"])
print("READY", flush=True)
if os.environ.get("RANK") == "{fail}":
    time.sleep(0.5)
    sys.exit(3)
while True:
    time.sleep(1000)
"""


@dataclass
class Nodes:
    """Where a trial's job runs: `kind` local or ssh, with the options that say so."""

    kind: str
    options: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cluster: object | None = None


@dataclass
class Outcome:
    left: Counter
    hung: bool = False
    started: bool = True


def _tagged() -> dict[int, str]:
    """pid -> argument carrying a soak tag, for every live process (zombies are gone)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        tags = [a.decode(errors="replace") for a in args if a.startswith(b"soak-")]
        if tags and state != "Z":
            found[int(entry)] = tags[-1]
    return found


def leftovers(tag: str, pid_dir: Path) -> dict[int, str]:
    """The trial's live processes: pid -> behaviour."""
    left = {pid: arg.rsplit("-", 1)[1] for pid, arg in _tagged().items() if arg.startswith(tag)}
    for note in pid_dir.glob(f"{tag}-rank-*"):
        pid = int(note.name.rsplit("-", 1)[1])
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                left[pid] = "rank"
    return left


def _count_ready(stream, ranks: int, timeout: float) -> bool:
    """Read `stream` (in a thread) until READY came `ranks` times."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen, deadline = 0, time.monotonic() + timeout
    while seen < ranks and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            seen += "READY" in lines.get(timeout=0.2)
    return seen >= ranks


def _await_escapes(tag: str, pid_dir: Path, ranks: int, timeout: float = 10) -> None:
    """Until every rank's escapers run under their own names (setsid -f returns before its
    child has exec'd)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(leftovers(tag, pid_dir)) >= ranks * len(BEHAVIOURS):
            return
        time.sleep(0.05)


def _settle(tag: str, pid_dir: Path) -> Counter:
    """What is still running after the grace period and the margin; then killed."""
    deadline = time.monotonic() + GRACE_S + MARGIN_S
    left = leftovers(tag, pid_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(tag, pid_dir)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return Counter(left.values())


def _agent_above(pid: int) -> int | None:
    """The node agent (agent.py, as shipped: agent-DIGEST.py) that `pid` runs under."""
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if is_agent([word.decode(errors="replace") for word in argv]):
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def _kill_an_agent(tag: str, pid_dir: Path) -> None:
    ranks = sorted(int(note.name.rsplit("-", 1)[1]) for note in pid_dir.glob(f"{tag}-rank-*"))
    agent = next(filter(None, map(_agent_above, ranks)), None)
    if agent is None:
        raise SystemExit("agent-sigkill: no node agent above the ranks")
    os.kill(agent, signal.SIGKILL)


def _cli(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cli", *args], env=env, **kwargs
    )  # fmt: skip


def trial_cli(scenario: str, nodes: Nodes, work: Path, env: dict[str, str]) -> Outcome:
    tag = f"soak-{uuid.uuid4().hex[:10]}"
    script = work / f"{tag}.py"
    fail = "1" if scenario == "fail-fast" else ""
    script.write_text(RANK_SCRIPT.format(tag=tag, pids=work, fail=fail))
    spec = work / f"{tag}.yml"
    spec.write_text(
        f"command: {sys.executable} {script}\n"
        "distribution: {type: pytorch}\n"
        f"limits: {{grace_period: {GRACE_S}}}\n"
    )
    store = work / "jobs"
    launcher = _cli(
        "run", str(spec), "--store", str(store), "--color", "never", *nodes.options,
        env={**env, **nodes.env}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    started = _count_ready(launcher.stdout, 2, 60)
    if started:
        _await_escapes(tag, work, 2)
        if scenario == "ctrl-c":
            launcher.send_signal(signal.SIGINT)
        elif scenario == "launcher-sigkill":
            launcher.kill()
        elif scenario == "cancel":
            job = _only_running_job(store)
            _cli("cancel", job, "--store", str(store), env=env,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(60)  # fmt: skip
        elif scenario == "dropped-ssh":
            for node in nodes.cluster.nodes:
                nodes.cluster.drop_sessions(node)
        elif scenario == "agent-sigkill":
            _kill_an_agent(tag, work)
    hung = False
    try:
        launcher.wait(HANG_S)
    except subprocess.TimeoutExpired:
        hung = True
        launcher.kill()
        launcher.wait()
    return Outcome(_settle(tag, work), hung, started)


def _only_running_job(store: Path) -> str:
    from jupyter_dist.store import JobStore

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = [j.job_id for j in JobStore(store).jobs() if j.status().get("state") == "running"]
        if running:
            return running[0]
        time.sleep(0.05)
    raise SystemExit("no running job to cancel")


def trial_kernel(nodes: Nodes, work: Path, env: dict[str, str]) -> Outcome:
    from jupyter_client.manager import start_new_kernel

    tag = f"soak-{uuid.uuid4().hex[:10]}"
    options = " ".join(nodes.options)
    cell = f"%%distrun --type pytorch {options} --grace-period {GRACE_S}\n" + RANK_SCRIPT.format(
        tag=tag, pids=work, fail=""
    )
    km, kc = start_new_kernel(
        kernel_name="python3", env={**env, **nodes.env}, stderr=subprocess.DEVNULL
    )
    try:
        kc.execute_interactive("%load_ext jupyter_dist", timeout=60)
        kc.execute(cell)
        seen, deadline = 0, time.monotonic() + 60
        while seen < 2 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                seen += kc.get_iopub_msg(timeout=0.5)["content"].get("text", "").count("READY")
        if seen >= 2:
            _await_escapes(tag, work, 2)
        km.signal_kernel(signal.SIGKILL)
    finally:
        kc.stop_channels()
        with contextlib.suppress(Exception):
            km.shutdown_kernel(now=True)
    return Outcome(_settle(tag, work), False, seen >= 2)


def run_trial(scenario: str, nodes: Nodes, work: Path, env: dict[str, str]) -> Outcome:
    if scenario == "kernel-sigkill":
        return trial_kernel(nodes, work, env)
    return trial_cli(scenario, nodes, work, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--nodes", default="local,ssh", help="local, ssh or both")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--cgroup", choices=("auto", "off"), default="auto")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; they are {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="distrun-soak-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "DISTRUN_HOME": str(work / "home"), "DISTRUN_CGROUP": args.cgroup}
        env.pop("DISTRUN_NODES_FILE", None)
        kinds = []
        if "local" in args.nodes:
            kinds.append(Nodes("local", ["--nodes", "1", "--procs-per-node", "2"]))
        cluster = None
        if "ssh" in args.nodes:
            import sshnodes

            cluster = sshnodes.start(2, work / "nodes")
            inventory = cluster.write_inventory(work / "nodes.yml")
            kinds.append(
                Nodes(
                    "ssh",
                    ["--nodes", "2", "--procs-per-node", "1", "--nodes-file", str(inventory)],
                    cluster=cluster,
                )
            )
        try:
            print(f"{args.trials} trials per row, cgroup {args.cgroup}; leftover processes:")
            header = f"{'scenario':<17}{'nodes':<7}" + "".join(f"{b:>11}" for b in BEHAVIOURS)
            print(header + f"{'hung':>7}{'no start':>10}{'s/trial':>9}", flush=True)
            for scenario in scenarios:
                for nodes in kinds:
                    if scenario == "dropped-ssh" and nodes.kind != "ssh":
                        continue
                    total, hung, unstarted, began = Counter(), 0, 0, time.monotonic()
                    for _ in range(args.trials):
                        outcome = run_trial(scenario, nodes, work, env)
                        total.update(outcome.left)
                        hung += outcome.hung
                        unstarted += not outcome.started
                    per = (time.monotonic() - began) / max(1, args.trials)
                    counts = "".join(f"{total[b]:>11}" for b in BEHAVIOURS)
                    print(f"{scenario:<17}{nodes.kind:<7}{counts}{hung:>7}{unstarted:>10}"
                          f"{per:>9.1f}", flush=True)  # fmt: skip
        finally:
            if cluster is not None:
                from jupyter_dist.backends.ssh import CONNECTIONS

                CONNECTIONS.close_all()
                sshnodes.stop(cluster)


if __name__ == "__main__":
    main()
