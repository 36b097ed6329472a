"""What a rank is, as one RESULT line: the same whether it started cold or forked from a
node's pool (tests/test_pool.py), but for what says which it was."""

import sys

TORCH_BEFORE = "torch" in sys.modules  # a forked rank has it already: the one difference

import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

cycle = []
cycle.append(cycle)
del cycle
collected = gc.collect()  # the rank's own garbage goes, forked or not
if os.environ["RANK"] == "0":  # the others ask for the store before it opens
    time.sleep(float(os.environ.get("PROBE_LATE_RANK0") or 0))
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open("/proc/self/environ", "rb") as handle:
    proc_env = dict(p.split(b"=", 1) for p in handle.read().split(b"\0") if b"=" in p)
with open("/proc/self/cmdline", "rb") as handle:
    cmdline = [w.decode() for w in handle.read().split(b"\0") if w]
hook = sys.modules.get("sitecustomize")
from distrun import report  # noqa: E402 (the job's own module, beside the hook)

report(step=1, rank=dist.get_rank())
print(
    "RESULT "
    + json.dumps(
        {
            "rank": dist.get_rank(),
            "allreduce": total.item(),
            "argv": sys.argv,
            "name": __name__,
            "cwd": os.getcwd(),
            "path0": sys.path[0],
            "threads": torch.get_num_threads(),
            "torch_rand": torch.rand(2).tolist(),
            "random": random.random(),
            "numpy": float(numpy.random.rand()),
            "proc_rank": proc_env.get(b"RANK", b"").decode(),
            "proc_job": proc_env.get(b"DISTRUN_JOB_ID", b"").decode(),
            "cmdline": cmdline[1:],
            "hook": getattr(hook, "__file__", "").endswith("pyhook/sitecustomize.py"),
            "breakpoint": os.environ.get("PYTHONBREAKPOINT"),
            "ppid": os.getppid(),
            "torch_before": TORCH_BEFORE,
            "main_file": getattr(sys.modules["__main__"], "__file__", ""),
            "stdout_line_buffered": sys.stdout.line_buffering,
            "stdin": sys.stdin.fileno(),
            "host": socket.gethostname(),
            "collects": collected >= 1,
            "frozen": gc.get_freeze_count() > 0,  # the pool's objects, not the rank's
            "store_wait": hasattr(
                sys.modules["torch.distributed.rendezvous"]._create_c10d_store, "__wrapped__"
            ),
        }
    ),
    flush=True,
)
dist.destroy_process_group()
