"""One line of advice under a root cause, for failures everybody hits, recognised by their
signature in the failed rank's last stderr lines or in how it ended:

    hint_for(cause) -> "Hint: ..." or None

Each hint names the evidence it matched, so a wrong guess is easy to see through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # events.py imports this module
    from jupyter_dist.run.events import RootCause


def hint_for(cause: RootCause) -> str | None:
    """The advice for `cause`, or None where nothing is recognised."""
    tail = "\n".join(cause.stderr_tail).lower()
    if "address already in use" in tail or "eaddrinuse" in tail:
        return (
            f'Hint: a port {cause.label} needed on {cause.node} was taken ("address already '
            'in use"). jupyter-dist gives MASTER_PORT a free port; a script that binds a '
            "fixed port, or a leftover process still holding one, causes this: stop it "
            "(jupyter distrun jobs) or let the port come from MASTER_PORT."
        )
    if cause.signal == "SIGKILL" and not cause.note:
        return (
            f"Hint: {cause.label} got SIGKILL from outside (not from jupyter-dist): on "
            "Linux that is most often the out-of-memory killer (see `dmesg` or `journalctl "
            f"-k` on {cause.node}, or the memory limit of the Slurm job or container)."
        )
    return None
