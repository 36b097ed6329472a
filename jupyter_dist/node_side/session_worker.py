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
SIGINT raises KeyboardInterrupt in the running cell (it fails; the rank lives on); one that
arrives outside a cell's code (between cells, or while a finished cell reports) is ignored:
the cell it was meant for has ended. `MARK ready` is its first line. End of input ends it.
"""

import base64
import json
import os
import pickle
import signal
import sys
import traceback

MARK = "\x1edistrun-session"
_in_cell = [False]  # whether SIGINT should interrupt: only a cell's own code is stopped


def on_interrupt(_signum, _frame):
    if _in_cell[0]:
        raise KeyboardInterrupt


def run_cell(code, cell, namespace):
    """Run one cell; its report (without the mark)."""
    try:
        _in_cell[0] = True
        try:
            exec(compile(code, f"<cell {cell}>", "exec"), namespace)
        finally:
            _in_cell[0] = False
    except BaseException as exc:  # KeyboardInterrupt and SystemExit fail the cell too
        kind, text = type(exc).__name__, str(exc)
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        shown = "".join(lines[:1] + lines[2:])  # leave this file's own frame out
        sys.stderr.write(shown)
        return {"cell": cell, "ok": False, "type": kind, "message": text, "traceback": shown}
    return {"cell": cell, "ok": True}


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
        line = sys.stdin.readline()
        if not line:
            return
        request = json.loads(line)
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
