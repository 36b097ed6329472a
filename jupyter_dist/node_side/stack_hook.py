"""Stack dumps for every Python process of a job, with nothing installed on the node.

Standard library only, Python 3.8+. Shipped into each job's folder as
`$DISTRUN_JOB_DIR/pyhook/sitecustomize.py`; the agent puts that folder first on PYTHONPATH,
so every Python the job starts (a command's `python train.py`, torchrun and its workers, a
cell's runner, a warm session's ranks, data loader workers) imports it at startup. It makes
the interpreter write every thread's stack, from C, into
`$DISTRUN_JOB_DIR/stacks/MACHINE-PID-sigN.txt` on signal N (node_side/stacks.py sends N and
reads what was added), so that a rank stuck in native code (a collective, a lock) still
answers. Then it runs the sitecustomize it hides, if the interpreter has one, as Python
would have. Where PYTHONBREAKPOINT is ours (the agent sets it), `pdb.set_trace()` pauses
as `breakpoint()` does (node_side/debugger.py).

A process that skips site or PYTHONPATH (`python -S`, `-I`, `-E`) registers nothing: only
py-spy reads it. Anything that fails here only costs the stacks.
"""

import atexit
import faulthandler
import os
import signal
import socket
import sys

# Real-time signals, which nothing else in a training job uses: a stack dump, and a pause
# in the debugger (`jupyter distrun debug JOB --interrupt --rank R`; debugger.py sends it).
STACK_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
PAUSE_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else None
_dump_files = []  # kept open: faulthandler writes to the descriptor


def machine_tag():
    """This machine in a file name (a job's folder may be shared by several): its boot id,
    which network namespaces of one machine share, as they share its process ids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()[:13]
    except OSError:
        return socket.gethostname()


def enable_stack_dumps():
    """Register this process's dump file and signal; forked children (data loader workers)
    register their own file."""

    def register():
        try:
            folder = os.path.join(os.environ["DISTRUN_JOB_DIR"], "stacks")
            os.makedirs(folder, mode=0o700, exist_ok=True)  # private, as the job's folder
            name = f"{machine_tag()}-{os.getpid()}-sig{int(STACK_SIGNAL)}.txt"
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            handle = os.fdopen(fd, "a")  # kept open: faulthandler writes to it
            faulthandler.register(STACK_SIGNAL, file=handle, all_threads=True)
            _dump_files.append(handle)
            atexit.register(_remove_if_unused, path, os.getpid())
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError):
            pass

    register()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=register)


def _remove_if_unused(path, pid):
    """At exit, the dump file no stack was written to goes (every process of every attempt
    left one, empty); a forked child that inherits this leaves its parent's alone."""
    if os.getpid() != pid:
        return
    try:
        if os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


def run_hidden_sitecustomize():
    """The sitecustomize this file hides on sys.path (a distribution's, a user's), run as
    the interpreter would have run it."""
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


class PdbSetTrace:
    """An import finder that gives `pdb`, once imported, our set_trace: `pdb.set_trace()`
    then pauses as `breakpoint()` does (debugger.py), rather than reading the rank's stdin,
    which is no terminal. pdb itself is imported only where the code imports it."""

    def find_spec(self, name, path=None, target=None):
        if name != "pdb":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.set_trace = _pdb_set_trace

        spec.loader.exec_module = exec_module
        return spec


def _pdb_set_trace(*, header=None):
    import distrun_debug

    distrun_debug.set_trace(frame=sys._getframe(1), header=header)


def pause_on_signal():
    """PAUSE_SIGNAL pauses the main thread in the remote pdb where it is (debugger.py), at
    its next Python line: a rank busy in a Python loop at once, one waiting in native code
    (a collective, a lock) once that returns. A handler the program set is left alone."""
    if PAUSE_SIGNAL is None or signal.getsignal(PAUSE_SIGNAL) != signal.SIG_DFL:
        return

    def pause(_signum, frame):
        try:
            import distrun_debug

            distrun_debug.set_trace(frame=frame, reason="interrupt")
        except Exception:  # the debugger failing must not end the rank
            pass

    try:
        signal.signal(PAUSE_SIGNAL, pause)
    except (OSError, ValueError):  # not the main thread; no such signal here
        return


def pause_on_uncaught_exceptions():
    """--post-mortem: an uncaught exception of the main thread pauses where it was raised
    (debugger.py), then Python prints it and exits with it as it would have."""
    previous = sys.excepthook

    def hook(kind, error, traceback):
        if traceback is not None and issubclass(kind, Exception):
            try:
                import distrun_debug

                distrun_debug.post_mortem(error, traceback)
            except Exception:  # the debugger failing must not hide the error itself
                pass
        previous(kind, error, traceback)

    sys.excepthook = hook


if __name__ == "sitecustomize":
    if "DISTRUN_JOB_DIR" in os.environ:
        enable_stack_dumps()
        if os.environ.get("PYTHONBREAKPOINT") == "distrun_debug.set_trace":
            sys.meta_path.insert(0, PdbSetTrace())
            if "pdb" in sys.modules:  # imported already (a pool's, that forked this rank)
                sys.modules["pdb"].set_trace = _pdb_set_trace
            pause_on_signal()
        if os.environ.get("DISTRUN_POST_MORTEM"):
            pause_on_uncaught_exceptions()
    run_hidden_sitecustomize()
