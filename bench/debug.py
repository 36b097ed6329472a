"""The debugger's speed, measured in one run on this machine.

    .venv/bin/python bench/debug.py [--rounds 10] [--no-ssh]

A job of 2 nodes x 1 rank, started here (this process is its owner, as a kernel is), on
local nodes, then on two sshd nodes in network namespaces (tests/sshnodes.py; needs root);
rank 1 loops: note the time, `breakpoint()`, and is continued by the bench each round.

1. Listed: from the moment before `breakpoint()` to the rank being listed by the request a
   front sends (`jupyter distrun debug JOB` sends it), median of `--rounds`. Goal: <= 0.3 s.
2. Round trip of `p x` through the owner (request file, owner, helper on the node, the
   rank's pdb, and back), median, against the floor measured in the same run: the same
   command over a direct connection to the paused rank's socket. Prints the ratio. Goal:
   <= 50 ms through the owner.
3. The same command through the CLI (`jupyter distrun debug JOB --rank 1 --do "p x"`), where
   a user at a terminal feels it (its own start included), median of 3.
4. A cast (`--ranks 1 --do "p x"`, the live view's console's request) through the owner,
   median. Goal: as the round trip.

Goals over SSH: listed within 0.3 s; a round trip within 100 ms.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import sshnodes

from jupyter_dist.backends.ssh import CONNECTIONS
from jupyter_dist.nodes import load_inventory
from jupyter_dist.options import LaunchOptions
from jupyter_dist.run.launch import launch
from jupyter_dist.run.requests import request_debug
from jupyter_dist.store import JobStore

RANK = """
import os, pathlib, time
mark = pathlib.Path({mark!r})
if os.environ["RANK"] == "1":
    for x in range({rounds}):
        mark.write_text(repr(time.time()))
        breakpoint()
"""


def direct(folder: Path, tag: str, command: str) -> str:
    """`command` over the paused rank's own socket: the floor of a round trip."""
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(folder / f"{tag}.sock"))
    client.sendall(command.encode() + b"\n")
    answer = b""
    while not answer.endswith(b"(Pdb) "):
        answer += client.recv(65536)
    client.close()
    return answer[: -len(b"(Pdb) ")].decode()


def measure(rounds: int, tmp: Path, inventory=None) -> dict[str, float]:
    """The figures of one job (on `inventory`'s nodes, else local ones), in ms."""
    store, mark = JobStore(tmp / "jobs"), tmp / "mark"
    script = RANK.format(mark=str(mark), rounds=rounds)
    spec = LaunchOptions(nodes=2, procs_per_node=1).to_spec(script, base_dir=str(tmp))
    job = launch(spec, store=store, inventory=inventory)
    listed, owner, floor, cli, cast = [], [], [], [], []
    try:
        for x in range(rounds):
            while not mark.exists() or mark.stat().st_size == 0:
                time.sleep(0.001)
            while not request_debug(job.record, {"action": "list"}, 30)["paused"]:
                pass
            listed.append(time.time() - float(mark.read_text()))
            mark.write_text("")
            ask = {"action": "send", "rank": 1, "command": "p x"}
            for _ in range(5):
                started = time.perf_counter()
                answer = request_debug(job.record, ask, 30)["answer"]
                owner.append(time.perf_counter() - started)
                assert answer == f"{x}\n", answer
            for _ in range(5):
                started = time.perf_counter()
                (found,) = request_debug(job.record, {**ask, "action": "cast", "ranks": [1]},
                                         30)["answers"]  # fmt: skip
                cast.append(time.perf_counter() - started)
                assert found["answer"] == f"{x}\n", found
            folder = Path(job.plan.processes[1].env["DISTRUN_JOB_DIR"]) / "debug"
            (record,) = folder.glob("*.json")
            for _ in range(5):
                started = time.perf_counter()
                assert direct(folder, record.stem, "p x") == f"{x}\n"
                floor.append(time.perf_counter() - started)
            if x == 0:
                for _ in range(3):
                    started = time.perf_counter()
                    done = subprocess.run(
                        [sys.executable, "-m", "jupyter_dist.cli", "debug", job.job_id,
                         "--rank", "1", "--do", "p x", "--store", str(store.root)],
                        capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    cli.append(time.perf_counter() - started)
                    assert done.stdout == "0\n", done.stdout
            request_debug(job.record, {**ask, "command": "c"}, 30)
        result = job.wait(60)
    finally:
        job.cancel()
    if result is None or not result.ok:
        raise SystemExit("the job did not end well")

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 2)

    return {"listed_ms": ms(listed), "owner_round_trip_ms": ms(owner), "cast_ms": ms(cast),
            "direct_round_trip_ms": ms(floor), "cli_round_trip_ms": ms(cli)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-ssh", action="store_true", help="local nodes only")
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        figures["local"] = measure(args.rounds, Path(tmp) / "local")
        if not args.no_ssh:
            cluster = sshnodes.start(2, Path(tmp) / "nodes")
            try:
                inventory = load_inventory(cluster.inventory)
                figures["ssh"] = measure(args.rounds, Path(tmp) / "ssh", inventory)
            finally:
                CONNECTIONS.close_all()
                sshnodes.stop(cluster)
    print(json.dumps({"rounds": args.rounds, **figures}))
    for where, goal in (("local", 50), ("ssh", 100)):
        if where not in figures:
            continue
        f = figures[where]
        print(f"{where}: 1. listed after breakpoint(): {f['listed_ms']:.0f} ms (goal <= 300 ms)")
        print(f"{where}: 2. p x through the owner: {f['owner_round_trip_ms']:.0f} ms; directly: "
              f"{f['direct_round_trip_ms']:.2f} ms; ratio "
              f"{f['owner_round_trip_ms'] / f['direct_round_trip_ms']:.0f}x "
              f"(goal: <= {goal} ms through the owner)")  # fmt: skip
        print(f"{where}: 3. p x through the CLI, its start included: "
              f"{f['cli_round_trip_ms']:.0f} ms")  # fmt: skip
        print(
            f"{where}: 4. a cast to rank 1 through the owner: {f['cast_ms']:.0f} ms "
            f"(goal <= {goal} ms)"
        )


if __name__ == "__main__":
    main()
