"""Signals that stop a launch from outside, held back where a KeyboardInterrupt would leave
things half done: while processes start, while a session's cell is handed to its ranks.

    with interrupts_deferred():
        start_everything()      # a Ctrl-C here is raised once the block is done
"""

from __future__ import annotations

import contextlib
import signal
import threading

# What stops a launch from outside: Ctrl-C, and `kill` or a closed terminal where a handler
# turns them into KeyboardInterrupt too (the CLI's does).
_STOPPING = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextlib.contextmanager
def interrupts_deferred():
    """Hold back SIGINT, SIGTERM and SIGHUP, where Python handles them, while processes
    start (a half-started process would have nobody watching it; and a KeyboardInterrupt
    raised inside a thread pool's own locking leaves the lock broken: "release unlocked
    lock"), then give the first that came to its handler (SIGINT's raises
    KeyboardInterrupt). A signal whose action is the system's own is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = {}
    for sig in _STOPPING:
        handler = signal.getsignal(sig)
        if callable(handler):  # Python's own (SIGINT's default) or one installed here
            held[sig] = handler
            signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
    if received:
        held[received[0]](received[0], None)
