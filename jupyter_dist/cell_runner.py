"""Runs a notebook cell on a rank: pushed variables in, the cell, requested values out.

Standard library only (cloudpickle is used when the node has it), Python 3.8+: it is
shipped to every node beside the cell as a plain file. Usage::

    python cell_runner.py OUT_NAMES     (comma-separated; may be empty)

Reads `$DISTRUN_JOB_DIR/script.py` (the cell) and `$DISTRUN_JOB_DIR/push.b64` (pickled
variables, base64), writes `$DISTRUN_JOB_DIR/out/<rank>.pkl`: {"values": {...}, "missing": [...]}.
"""

import base64
import json
import os
import pickle
import sys

try:
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle


def rank_key():
    """This process's place in the job, whatever launched it."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return f"rank-{int(os.environ[name]):06d}"
    if "TF_CONFIG" in os.environ:
        task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
        order = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}.get(task.get("type"), 4)
        return f"tf-{order}-{task.get('type')}-{int(task.get('index', 0)):06d}"
    return "rank-000000"


def main():
    job_dir = os.environ["DISTRUN_JOB_DIR"]
    names = [n for n in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if n]
    namespace = {"__name__": "__main__"}
    push = os.path.join(job_dir, "push.b64")
    if os.path.exists(push):
        with open(push) as handle:
            namespace.update(pickle.loads(base64.b64decode(handle.read())))
    cell = os.path.join(job_dir, "script.py")
    with open(cell) as handle:
        source = handle.read()
    exec(compile(source, cell, "exec"), namespace)  # the user's own cell, on their node
    if names:
        values = {n: namespace[n] for n in names if n in namespace}
        missing = [n for n in names if n not in namespace]
        os.makedirs(os.path.join(job_dir, "out"), exist_ok=True)
        path = os.path.join(job_dir, "out", rank_key() + ".pkl")
        with open(path + ".tmp", "wb") as handle:
            _pickler.dump({"values": values, "missing": missing}, handle)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
