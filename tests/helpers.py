"""Helpers for tests: the real process table, and the CLI in a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jupyter_dist.store import JobStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def job_processes(job_id: str) -> list[int]:
    """PIDs on this machine whose environment carries the job's id (read from /proc)."""
    marker = f"DISTRUN_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is already dead
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def run_cli(*args: str, store: JobStore | None = None, timeout: float = 120, **kwargs):
    """`jupyter distrun ARGS` in a real subprocess; returns the CompletedProcess."""
    argv = [sys.executable, "-m", "jupyter_dist.cli", *args]
    if store is not None:
        argv += ["--store", str(store.root)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
