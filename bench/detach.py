"""Detached jobs against their attached baselines, measured in one run on this machine.

    .venv/bin/python bench/detach.py [--lines 100000] [--idle 10]

1. Attach: a job with `--lines` stored lines; the time from `jupyter distrun attach JOB` to
   its first line on stdout, against `jupyter distrun logs JOB` (which reads every line)
   to its first. Prints both and the ratio attach / logs. Goal: attach <= 0.5 s.
2. Idle owner: a job whose ranks sleep; the CPU its owner uses over `--idle` seconds, as a
   share of one core: the detached job's supervisor against an attached `jupyter distrun
   run`. Goal: the supervisor < 0.5 %.
3. Cold start: from the command to every rank running, `run --detach` (it returns then)
   against `run` (its 4 ranks have each said "started"), median of 3. Prints the ratio
   detached / attached. Goal: <= 1.0 plus the supervisor's own start (a Python's).
4. Restart: a 2x2 job allowed one restart (no delay) whose rank 1 dies at once on its first
   attempt; the time from its death (the time it printed last) to every rank of the second
   attempt running, median of 3, against a cold launch of the same job: `run` (3., what a
   user starts) and, stricter, `launch()` in this process (no interpreter to start). Prints
   both ratios. Goal: restart / cold launch <= 1.2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "jupyter_dist.cli"]
SLEEPER = (
    "command: echo started; sleep {seconds}\nresources: {{instance_count: 2}}\n"
    "distribution: {{type: pytorch, process_count_per_instance: 2}}\n"
)


def _first_line_after(argv: list[str]) -> float:
    """Seconds from starting `argv` to its first line on stdout (the process is then
    stopped)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.readline()
    took = time.perf_counter() - started
    proc.kill()
    proc.wait()
    return took


def attach(folder: Path, store: str, lines: int) -> None:
    spec = folder / "printer.yml"
    per_rank = lines // 4
    spec.write_text(
        f"command: python -c \"[print('line', i) for i in range({per_rank})]\"\n"
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    done = subprocess.run([*CLI, "run", str(spec), "--store", store], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"the printing job failed: {done.stderr.decode()[-2000:]}")
    job = subprocess.run([*CLI, "jobs", "--json", "--store", store], capture_output=True,
                         text=True).stdout  # fmt: skip
    job_id = job.split('"job_id": "', 1)[1].split('"', 1)[0]
    attached = statistics.median(
        _first_line_after([*CLI, "attach", job_id, "--store", store]) for _ in range(3)
    )
    logs = statistics.median(
        _first_line_after([*CLI, "logs", job_id, "--store", store]) for _ in range(3)
    )
    print(f"attach, {lines} lines stored: first line after {attached:.2f} s (goal <= 0.5 s); "
          f"logs: {logs:.2f} s; ratio attach / logs {attached / logs:.2f}")  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share_over(pid: int, seconds: float) -> float:
    before = _cpu_seconds(pid)
    time.sleep(seconds)
    return (_cpu_seconds(pid) - before) / seconds * 100


def idle_owner(folder: Path, store: str, seconds: float) -> None:
    spec = folder / "sleeper.yml"
    spec.write_text(SLEEPER.format(seconds=int(seconds * 3 + 20)))
    job_id = subprocess.run([*CLI, "run", str(spec), "--detach", "--store", store],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    status = Path(store, job_id, "status.json").read_text()
    supervisor = int(status.split('"owner_pid": ', 1)[1].split(",", 1)[0])
    time.sleep(1)  # past the start
    detached = _share_over(supervisor, seconds)
    subprocess.run([*CLI, "cancel", job_id, "--store", store], capture_output=True)
    run = subprocess.Popen([*CLI, "run", str(spec), "--store", store],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    assert run.stdout is not None
    for _ in range(4):
        run.stdout.readline()
    time.sleep(1)
    attached = _share_over(run.pid, seconds)
    run.terminate()
    run.wait()
    print(f"idle owner over {seconds:g} s: supervisor {detached:.2f} % of a core (goal < 0.5 "
          f"%), attached run {attached:.2f} %")  # fmt: skip


def cold_start(folder: Path, store: str) -> float:
    spec = folder / "sleeper.yml"
    spec.write_text(SLEEPER.format(seconds=30))
    detached, attached = [], []
    for _ in range(3):
        started = time.perf_counter()
        job_id = subprocess.run(
            [*CLI, "run", str(spec), "--detach", "--store", store],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        detached.append(time.perf_counter() - started)  # fmt: skip
        subprocess.run([*CLI, "cancel", job_id, "--store", store], capture_output=True)
        started = time.perf_counter()
        run = subprocess.Popen([*CLI, "run", str(spec), "--store", store],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        assert run.stdout is not None
        for _ in range(4):
            run.stdout.readline()
        attached.append(time.perf_counter() - started)
        run.terminate()
        run.wait()
    d, a = statistics.median(detached), statistics.median(attached)
    print(
        f"cold start to every rank running: run --detach {d:.2f} s, run {a:.2f} s; "
        f"ratio {d / a:.2f}"
    )
    return a


RESTARTING = (
    "command: >-\n"
    "  if [ $RANK = 1 ] && [ $DISTRUN_RESTART_COUNT = 0 ];\n"
    "  then python -c 'import time; print(time.time())'; exit 1; fi; sleep 30\n"
    "resources: {instance_count: 2}\n"
    "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    "limits: {max_restarts: 1, restart_delay: 0}\n"
)


def restart(folder: Path, store_root: str, cli_cold: float) -> None:
    from jupyter_dist.run.launch import launch
    from jupyter_dist.spec import parse_spec
    from jupyter_dist.store import JobStore

    store = JobStore(store_root)
    spec = parse_spec(RESTARTING)
    cold_spec = parse_spec(SLEEPER.format(seconds=30))
    restarts, colds = [], []
    for _ in range(3):
        started = time.time()
        job = launch(cold_spec, store=store)
        colds.append(max(p.started for p in job.processes.values()) - started)
        job.cancel()
        job.wait()
        job = launch(spec, store=store)
        while job.attempt < 2 or job.state != "running" or job.attempts[-1] is None:
            time.sleep(0.01)
        while any(p.state != "running" for p in job.processes.values()):
            time.sleep(0.01)
        record = store.get(job.job_id)
        died = float(next(record.iter_log("rank-1", "stdout")).text)
        restarts.append(max(p.started for p in job.processes.values()) - died)
        job.cancel()
        job.wait()
    r, c = statistics.median(restarts), statistics.median(colds)
    print(f"restart, from a rank's death to every rank of the next attempt running: {r:.3f} s; "
          f"ratio to a cold `run` ({cli_cold:.2f} s) {r / cli_cold:.2f} (goal <= 1.2); to "
          f"launch() in process ({c:.3f} s) {r / c:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = str(folder / "jobs")
        attach(folder, store, args.lines)
        idle_owner(folder, store, args.idle)
        restart(folder, store, cold_start(folder, store))


if __name__ == "__main__":
    main()
