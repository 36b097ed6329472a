"""Runs a job's inline script (a notebook cell) on a rank: pushed variables in, the
script, requested values out.

Standard library only (cloudpickle is used when the node has it), Python 3.8+: it is
shipped to every node beside the script as a plain file. Usage::

    python cell_runner.py [OUT_NAMES]     (comma-separated)

Runs `$DISTRUN_JOB_DIR/script.py` as `__main__` (as `python script.py` would: `__file__`,
`sys.argv[0]`, a real `__main__` module for multiprocessing), with the variables pickled in
`$DISTRUN_JOB_DIR/push.b64` (base64) as its starting globals when that file exists; writes
the OUT_NAMES to `$DISTRUN_JOB_DIR/out/<rank>.pkl`: {"values": {...}, "missing": [...]}.

A script that finished leaves through `finish`, not through interpreter finalization: native
libraries can abort while the interpreter tears itself down after the work is done (torch's
gloo threads under a DDP model that outlives `destroy_process_group` end in "terminate called
without an active exception" now and then), and a rank that did its work has not failed.
"""

import atexit
import base64
import contextlib
import gc
import json
import os
import pickle
import sys
import threading
import traceback
import types

try:
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle


def rank_key():
    """This process's place in the job, whatever launched it."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK"):
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
    pushed = {}
    push = os.path.join(job_dir, "push.b64")
    if os.path.exists(push):
        with open(push) as handle:
            pushed = pickle.loads(base64.b64decode(handle.read()))
    script = os.path.join(job_dir, "script.py")
    with open(script) as handle:
        source = handle.read()
    # The script becomes __main__, as under `python script.py` (multiprocessing's spawn
    # finds it there); its globals stay reachable for the outputs and for `finish`.
    main_module = types.ModuleType("__main__")
    main_module.__file__ = script
    main_module.__dict__.update(pushed)
    sys.modules["__main__"] = main_module
    sys.argv = [script]
    namespace = main_module.__dict__
    try:
        exec(compile(source, script, "exec"), namespace)  # the user's own script, on their node
    except Exception as error:
        # --post-mortem: paused where it raised, for the debugger, first (as the startup
        # hook's excepthook does for a script; this runner prints the error itself).
        try:
            import distrun_debug  # beside the startup hook, on every rank's PYTHONPATH
        except ImportError:
            pass
        else:
            distrun_debug.post_mortem(error, error.__traceback__.tb_next)
        # The traceback Python would print for the script itself, without this runner's frame.
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        finish(namespace, 1)
    if names:
        values = {n: namespace[n] for n in names if n in namespace}
        missing = [n for n in names if n not in namespace]
        save_private(os.path.join(job_dir, "out"), {"values": values, "missing": missing})
    finish(namespace)


def save_private(folder, report):
    """`report` pickled as `folder`/<rank>.pkl, whole or not at all, readable by its owner
    alone (the job's folder is private: so is what is in it)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, rank_key() + ".pkl")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        _pickler.dump(report, handle)
    os.replace(path + ".tmp", path)


def finish(namespace, code=0):
    """Exit with `code` as Python would, less the teardown native libraries can crash in.

    Threads the script left running are waited for and exit handlers run while its globals
    still exist (both as in a normal exit); then the globals are dropped and collected
    while the interpreter is whole, so files the script left open are flushed and
    native objects stop their threads; MPI is finalized (mpi4py does that at interpreter
    teardown, and mpirun fails a rank that leaves without it); the standard streams are
    flushed (C's are unbuffered: every rank runs with PYTHONUNBUFFERED); then the process
    leaves without finalizing the interpreter.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    namespace.clear()
    gc.collect()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing to lose
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
