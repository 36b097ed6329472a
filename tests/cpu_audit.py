"""Where a test run's CPU goes, by test: `DISTRUN_TEST_CPU=FOLDER scripts/test.sh`.

A run on 2 cores is bound by its CPU work (docs/development.md), most of it in processes
the tests start: ranks importing torch, CLI calls, kernels, Ray's workers. pytest's
durations say how long a test took, not what it cost the machine, nor what a test running
beside it took from it. This audit counts the processes themselves:

- `install FOLDER` puts a hook into the venv's site-packages (a `.pth` file and its module):
  every Python the venv starts (pytest's workers, ranks, agents, CLI calls, kernels, Ray
  and Dask workers, on any node that shares this machine's files) writes one line as it
  starts (its command line, and the test that started it: PYTEST_CURRENT_TEST, which
  pytest sets and every child inherits) and one as it exits (its CPU seconds, and which
  of some heavy modules it imported), in a file of its own in FOLDER (0600 in 0700);
- `remove` takes the hook away (scripts/test.sh does, when the run ends);
- `summary(FOLDER)` is what tests/conftest.py prints at the end of the run.

What it misses: processes that are not Pythons of this venv (sshd, slurmd, Ray's own
binaries, Chromium, node), `python -S` and `-I -S` ones (the node helpers), a process
killed before it exits (its start is counted, its CPU is not: a rank SIGKILLed), and what
a process's own unwaited children used. So it is a floor, by test, of what each cost.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import sysconfig
from pathlib import Path

MODULE = "_distrun_cpu_audit"
HEAVY = ("torch", "tensorflow", "ray", "horovod", "distributed", "jupyter_server", "IPython")

HOOK = '''"""jupyter-dist's test-run CPU audit (tests/cpu_audit.py): remove with
`python tests/cpu_audit.py remove`."""
import atexit, json, os, sys, time

_FOLDER = @FOLDER@
_PID = os.getpid()


def _note(**fields):
    try:
        fd = os.open(os.path.join(_FOLDER, str(os.getpid())),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, (json.dumps(fields) + "\\n").encode())
        os.close(fd)
    except Exception:
        pass


def _argv():
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return [a.decode(errors="replace")[:200] for a in handle.read().split(b"\\0")[:4]]
    except OSError:
        return list(sys.argv[:4])


def _end():
    if os.getpid() != _PID:
        return  # a fork that exited through Python: its parent's line stands for it
    times = os.times()
    _note(end=round(times.user + times.system, 3),
          imported=[m for m in @HEAVY@ if m in sys.modules])


_note(argv=_argv(), test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0])
atexit.register(_end)
'''


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def install(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    source = HOOK.replace("@FOLDER@", repr(str(folder.resolve()))).replace("@HEAVY@", repr(HEAVY))
    (_site() / f"{MODULE}.py").write_text(source)
    (_site() / f"zz{MODULE}.pth").write_text(f"import {MODULE}\n")


def remove() -> None:
    for name in (f"{MODULE}.py", f"zz{MODULE}.pth"):
        (_site() / name).unlink(missing_ok=True)


def _processes(folder: Path) -> list[dict]:
    found = []
    for path in folder.iterdir():
        process: dict = {}
        for line in path.read_text(errors="replace").splitlines():
            try:
                process.update(json.loads(line))
            except ValueError:
                continue
        if "argv" in process:
            found.append(process)
    return found


def kind(argv: list[str]) -> str:
    """A short name for what a process ran (its script or module, or a known role)."""
    words = [w for w in argv[1:] if w]
    if "-m" in words[:-1]:
        module = words[words.index("-m") + 1]
        if module == "jupyter_dist.cli":
            after = words[words.index("-m") + 2 :]
            return "jupyter distrun " + (after[0] if after else "")
        return "-m " + module
    script = next((w for w in words if not w.startswith("-")), "")
    if "-c" in words:
        return "-c (code)"
    name = os.path.basename(script)
    if name.startswith("agent") and name.endswith(".py"):
        return "node agent"
    return name or os.path.basename(argv[0] if argv else "?")


def summary(folder: Path, top: int = 25) -> list[str]:
    """The audit's tables: CPU by test file, by test, and by kind of process."""
    processes = _processes(folder)
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    by_test: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for process in processes:
        cpu = float(process.get("end") or 0.0)
        torch = cpu if "torch" in process.get("imported", []) else 0.0
        test = process.get("test") or "(outside any test: pytest's own start, set-up)"
        kind_name = kind(process["argv"]) + (" +torch" if torch else "")
        for table, key in ((by_file, test.split("::")[0]), (by_test, test),
                           (by_kind, kind_name)):  # fmt: skip
            row = table[key]
            row[0] += 1
            row[1] += cpu
            row[2] += torch
    total = sum(row[1] for row in by_kind.values())
    lines = [f"{len(processes)} Python processes, {total:.0f} CPU seconds counted "
             "(those that exited through Python: tests/cpu_audit.py)"]  # fmt: skip
    for title, table in (("by test file", by_file), ("by test", by_test),
                         ("by kind of process", by_kind)):  # fmt: skip
        lines.append(f"-- {title}: CPU s, processes, of which in processes that imported torch")
        for key, (count, cpu, torch) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"{cpu:8.1f} s {count:5d}  {torch:7.1f} s  {key}")
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["install"] and len(sys.argv) == 3:
        install(Path(sys.argv[2]))
    elif sys.argv[1:] == ["remove"]:
        remove()
    elif sys.argv[1:2] == ["summary"] and len(sys.argv) == 3:
        print("\n".join(summary(Path(sys.argv[2]))))
    else:
        sys.exit("usage: cpu_audit.py install FOLDER | remove | summary FOLDER")
