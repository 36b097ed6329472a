"""One rank of a warm session: it runs the cells it is sent, one after another, in one
namespace that lives as long as the session (variables, imported modules, models and an
initialised process group stay for the next cell).

Standard library only, Python 3.8+ (shipped beside cell_runner.py, whose value files it
shares). It reads one request per line on stdin, a JSON object `{"cell": N, "code": TEXT}`
with optional `"push"` (base64 of pickled globals, set before the cell) and `"out"` (names
whose values it saves after the cell, as the cell runner does, to
`$DISTRUN_JOB_DIR/out/cell-N/<rank>.pkl`), runs the code as `__main__` would, then writes one
line on stderr, `MARK flushed N` (all of the cell's stderr came before it), then one on
stdout: `MARK done {"cell": N, "ok": true}`, or with `"ok": false` and the error (`type`,
`message`, `traceback`), whose traceback also went to stderr as Python prints it. Both
`ready` (`MARK ready {...}`) and `done` reports carry the rank's memory: `rss` (resident
bytes) and, once the cell used CUDA through torch, `gpu` (bytes torch holds on its device).
A request `{"cell": N, "post_mortem": SECONDS}` (`%distrun debug --rank R` after a failed
cell) pauses the rank in its debugger (pyhook/distrun_debug.py) at the frame where its last
cell raised, with that cell's variables, until the user continues or quits (or nobody
attached within SECONDS), then reports `done` with `"debugged"`: whether there was a
failure to look into (the last cell's: a cell that ends well forgets it).
SIGINT raises KeyboardInterrupt in the running cell (it fails; the rank lives on). One that
arrives after a cell was sent but before its code starts (it is still on its way, or being
read) fails that cell as it starts. One that arrives while a finished cell reports, or
between cells with none sent, is ignored: the cell it was meant for has ended (the launcher
interrupts only ranks that have not reported the cell it runs, and sends the next only
once every rank reported). `MARK ready` is its first line. End of input ends it.
"""

import base64
import json
import linecache
import os
import pickle
import select
import signal
import sys
import traceback

MARK = "\x1edistrun-session"
# What a SIGINT does now: "running" (a cell's own code: it raises), "received" (a cell read,
# not started: it fails as it starts), "waiting" (for a request: as "received" when one is
# already on its way, else ignored), "reporting" (a cell that ended: ignored).
_state = ["waiting"]
_interrupted = [False]  # a SIGINT came for the cell read or on its way
_last_failure = [None]  # the last cell's exception (its frames kept) for a post-mortem


def on_interrupt(_signum, _frame):
    if _state[0] == "running":
        raise KeyboardInterrupt
    if _state[0] == "received" or (_state[0] == "waiting" and _request_waiting()):
        _interrupted[0] = True


def _request_waiting(wait=0):
    """Whether the next request is in stdin's pipe (sent, not read yet), waiting for it
    up to `wait` seconds (None: until it comes, or the input ends)."""
    try:
        return bool(select.select([sys.stdin], [], [], wait)[0])
    except (OSError, ValueError):
        return True  # no select on this input: read it as before


def run_cell(code, cell, namespace):
    """Run one cell; its report (without the mark)."""
    _last_failure[0] = None  # its frames (and what they hold) go as the next cell starts
    try:
        _state[0] = "running"
        try:
            if _interrupted[0]:  # interrupted before it started
                _interrupted[0] = False
                raise KeyboardInterrupt
            name = f"<cell {cell}>"
            # Its lines for tracebacks and pdb (`l`, `where`), as IPython keeps a cell's.
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            exec(compile(code, name, "exec"), namespace)
        finally:
            _state[0] = "reporting"
    except BaseException as exc:  # KeyboardInterrupt and SystemExit fail the cell too
        _last_failure[0] = exc
        kind, text = type(exc).__name__, str(exc)
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        shown = "".join(lines[:1] + lines[2:])  # leave this file's own frame out
        sys.stderr.write(shown)
        return {"cell": cell, "ok": False, "type": kind, "message": text, "traceback": shown}
    return {"cell": cell, "ok": True}


def post_mortem(wait):
    """The rank's debugger on its last cell's exception (module docstring); whether there
    was one. An interrupt meanwhile is ignored, as between cells."""
    error = _last_failure[0]
    if error is None:
        return False
    _state[0] = "reporting"
    try:
        import distrun_debug  # the job's debugger, shipped beside the stack hook
    except ImportError:
        return False
    distrun_debug.post_mortem(error, error.__traceback__, wait=wait)
    return True


def memory():
    """This rank's resident bytes, and the CUDA bytes torch holds where it has used CUDA
    (never initialising CUDA itself)."""
    try:
        with open("/proc/self/statm") as handle:
            report = {"rss": int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")}
    except (OSError, ValueError, IndexError):  # not Linux: the peak is what there is
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = {"rss": peak if sys.platform == "darwin" else peak * 1024}
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            report["gpu"] = int(cuda.memory_reserved())
    except Exception:  # a half-imported or odd torch: memory is a courtesy
        pass
    return report


def save_values(names, cell, namespace):
    """The named values (and which are missing), in the cell runner's format."""
    from cell_runner import save_private  # shipped beside this file

    folder = os.path.join(os.environ["DISTRUN_JOB_DIR"], "out", f"cell-{cell}")
    os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
    values = {n: namespace[n] for n in names if n in namespace}
    save_private(folder, {"values": values, "missing": [n for n in names if n not in namespace]})


def main():
    # SIGINT is handled here even where it was inherited ignored (a launcher in the
    # background, `nohup jupyter lab &`): an interrupt must reach the running cell. One
    # that comes after the cell ended (it raced the report) must not end the rank.
    signal.signal(signal.SIGINT, on_interrupt)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    say(sys.stdout, f"{MARK} ready {json.dumps(memory())}")
    while True:
        # The request stays in the pipe until the state says it came: a SIGINT in between
        # sees it there (a readline first would take it out before the state changed).
        _state[0] = "waiting"
        _request_waiting(None)
        _state[0] = "received"
        line = sys.stdin.readline()
        if not line:
            return
        request = json.loads(line)
        if "post_mortem" in request:
            report = {
                "cell": request["cell"],
                "ok": True,
                "debugged": post_mortem(float(request["post_mortem"])),
            }
        else:
            if request.get("push"):
                namespace.update(pickle.loads(base64.b64decode(request["push"])))
            report = run_cell(request["code"], request["cell"], namespace)
        report.update(memory())
        if request.get("out"):
            save_values(request["out"], request["cell"], namespace)
        say(sys.stderr, f"{MARK} flushed {request['cell']}")  # the cell's stderr is all out
        say(sys.stdout, f"{MARK} done {json.dumps(report)}")


def say(stream, line):
    stream.flush()
    stream.write(line + "\n")
    stream.flush()


if __name__ == "__main__":
    main()
