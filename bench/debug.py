"""The debugger's speed, measured in one run on this machine.

    .venv/bin/python bench/debug.py [--rounds 10]

A local job of 2 nodes x 1 rank, started here (this process is its owner, as a kernel is);
rank 1 loops: note the time, `breakpoint()`, and is continued by the bench each round.

1. Listed: from the moment before `breakpoint()` to the rank being listed by the request a
   front sends (`jupyter distrun debug JOB` sends it), median of `--rounds`. Goal: <= 0.3 s.
2. Round trip of `p x` through the owner (request file, owner, helper on the node, the
   rank's pdb, and back), median, against the floor measured in the same run: the same
   command over a direct connection to the paused rank's socket. Prints the ratio. Goal:
   <= 50 ms through the owner.
3. The same command through the CLI (`jupyter distrun debug JOB --rank 1 --do "p x"`), where
   a user at a terminal feels it (its own start included), median of 3.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store, mark = JobStore(Path(tmp) / "jobs"), Path(tmp) / "mark"
        script = RANK.format(mark=str(mark), rounds=args.rounds)
        spec = LaunchOptions(nodes=2, procs_per_node=1).to_spec(script, base_dir=tmp)
        job = launch(spec, store=store)
        listed, owner, floor, cli = [], [], [], []
        try:
            for x in range(args.rounds):
                while not mark.exists() or mark.stat().st_size == 0:
                    time.sleep(0.001)
                while True:
                    found = request_debug(job.record, {"action": "list"}, 30)["paused"]
                    if found:
                        break
                listed.append(time.time() - float(mark.read_text()))
                mark.write_text("")
                ask = {"action": "send", "rank": 1, "command": "p x"}
                for _ in range(5):
                    started = time.perf_counter()
                    answer = request_debug(job.record, ask, 30)["answer"]
                    owner.append(time.perf_counter() - started)
                    assert answer == f"{x}\n", answer
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
        return statistics.median(values) * 1000

    print(json.dumps({"rounds": args.rounds, "listed_ms": round(ms(listed), 1),
                      "owner_round_trip_ms": round(ms(owner), 1),
                      "direct_round_trip_ms": round(ms(floor), 2),
                      "cli_round_trip_ms": round(ms(cli), 1)}))  # fmt: skip
    print(f"1. listed after breakpoint(): {ms(listed):.0f} ms (goal <= 300 ms)")
    print(f"2. p x through the owner: {ms(owner):.0f} ms; directly: {ms(floor):.2f} ms; "
          f"ratio {ms(owner) / ms(floor):.0f}x (goal: <= 50 ms through the owner)")  # fmt: skip
    print(f"3. p x through the CLI, its start included: {ms(cli):.0f} ms")


if __name__ == "__main__":
    main()
