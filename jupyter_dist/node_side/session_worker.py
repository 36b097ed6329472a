"""One rank of a warm session: it runs the cells it is sent, one after another, in one
namespace that lives as long as the session (variables, imported modules, models and an
initialised process group stay for the next cell).

Standard library only, Python 3.8+. It reads one request per line on stdin, a JSON object
`{"cell": N, "code": TEXT}`, runs the code as `__main__` would, and after it writes one
line on stderr, `MARK flushed N` (all of the cell's stderr came before it), then one on
stdout: `MARK done {"cell": N, "ok": true}`, or with `"ok": false` and the error (`type`,
`message`, `traceback`), whose traceback also went to stderr as Python prints it.
SIGINT raises KeyboardInterrupt in the running cell (it fails; the rank lives on). `MARK
ready` is its first line. End of input ends it.
"""

import json
import signal
import sys
import traceback

MARK = "\x1edistrun-session"


def run_cell(code, cell, namespace):
    """Run one cell; its report (without the mark)."""
    try:
        exec(compile(code, f"<cell {cell}>", "exec"), namespace)
    except BaseException as exc:  # KeyboardInterrupt and SystemExit fail the cell too
        kind, text = type(exc).__name__, str(exc)
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        shown = "".join(lines[:1] + lines[2:])  # leave this file's own frame out
        sys.stderr.write(shown)
        return {"cell": cell, "ok": False, "type": kind, "message": text, "traceback": shown}
    return {"cell": cell, "ok": True}


def main():
    # SIGINT is KeyboardInterrupt here even where it was inherited ignored (a launcher in
    # the background, `nohup jupyter lab &`): an interrupt must reach the running cell.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    say(sys.stdout, f"{MARK} ready")
    while True:
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:  # an interrupt between cells: nothing runs to stop
            continue
        if not line:
            return
        request = json.loads(line)
        report = run_cell(request["code"], request["cell"], namespace)
        say(sys.stderr, f"{MARK} flushed {request['cell']}")  # the cell's stderr is all out
        say(sys.stdout, f"{MARK} done {json.dumps(report)}")


def say(stream, line):
    stream.flush()
    stream.write(line + "\n")
    stream.flush()


if __name__ == "__main__":
    main()
