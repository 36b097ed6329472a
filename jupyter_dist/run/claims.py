"""Ports a job holds, so that two jobs never join each other.

Two jobs given the same fixed port (`master_port`, `base_port`, a Dask port) on one machine
would meet: one's rank 0 fails to bind, and its other ranks run a collective with the other
job's rank 0. So a job claims each fixed host:port it will listen on before it starts, in
one folder for every store of this user on this machine (`claims_folder()`:
`$XDG_RUNTIME_DIR/jupyter-dist/ports`, else `<tmp>/jupyter-dist-<uid>/ports`; a file
`<host>_<port>.json` per port, created exclusively), and gives it back when it ends. A
second job that wants a held port, from any store, is refused at once, in one line naming
the job that holds it and its store. A claim whose job has ended, or whose owner process is
gone (a killed kernel), is stale and taken over.

The folder is the machine's, not the store's: two stores (another DISTRUN_HOME, a test's
store beside the user's) run on the same ports. Not a shared one: another user's jobs do not
see these claims; for them, the port check at planning still refuses a port in use.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_dist.errors import DistrunError
from jupyter_dist.events import JobListener, JobResult
from jupyter_dist.run.requests import SETTLED_STATES, effective_state, pid_alive
from jupyter_dist.store import PRIVATE_FILE, JobStore, UnknownJob, private_dir, read_regular

# A claim whose job's folder is not there yet is a job starting now, for so long; after
# that its store is gone (deleted while its owner lived on).
_STARTING_S = 120.0


def claims_folder() -> Path:
    """Where this user's claims on this machine are: a folder of theirs alone, on local
    storage (a home folder may be shared between machines, whose claims differ)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        root = Path(runtime) / "jupyter-dist"
    else:
        root = Path(tempfile.gettempdir()) / f"jupyter-dist-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise DistrunError(
            f"{root} is not a folder of yours, so jupyter-dist cannot keep its port claims "
            "there; remove it, or set XDG_RUNTIME_DIR to a folder of yours"
        )
    private_dir(root)
    return root / "ports"


@dataclass(frozen=True)
class Wanted:
    """A fixed port a job will listen on: where, and the setting that chose it."""

    host: str
    node: str
    port: int
    setting: str


class PortClaims:
    """The claims of this user's jobs on this machine, made for the jobs of `store`."""

    def __init__(self, store: JobStore, folder: Path | None = None):
        self.store = store
        self.folder = folder or claims_folder()

    def claim(self, job_id: str, wanted: list[Wanted]) -> None:
        """Hold every port in `wanted` for `job_id`, or none: DistrunError naming the job
        that holds one."""
        if not wanted:
            return
        private_dir(self.folder)
        taken: list[Path] = []
        try:
            for want in wanted:
                taken.append(self._claim_one(job_id, want))
        except BaseException:
            for path in taken:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise

    def release(self, job_id: str) -> None:
        """Give back every port `job_id` holds."""
        if not self.folder.is_dir():
            return
        for path in self.folder.glob("*.json"):
            if self._holder(path).get("job") == job_id:
                with contextlib.suppress(OSError):
                    path.unlink()

    def _claim_one(self, job_id: str, want: Wanted) -> Path:
        path = self.folder / f"{re.sub(r'[^A-Za-z0-9.-]', '_', want.host)}_{want.port}.json"
        mine = json.dumps(
            {
                "job": job_id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "store": str(self.store.root),
                "since": time.time(),
            }
        )
        # Written whole beside it, then linked into place: the link is the exclusive step,
        # and a reader never sees a claim half written.
        draft = self.folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
        with open(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE), "w") as f:
            f.write(mine)
        try:
            for _ in range(3):
                try:
                    os.link(draft, path)
                    return path
                except FileExistsError:
                    holder = self._holder(path)
                if holder.get("job") == job_id:  # one port wanted twice: held already
                    return path
                if self._live(holder):
                    theirs = holder.get("store")
                    elsewhere = (
                        f" of the store {theirs}"
                        if isinstance(theirs, str)
                        and Path(theirs).resolve() != self.store.root.resolve()
                        else ""
                    )
                    raise DistrunError(
                        f"{want.setting}: port {want.port} on {want.node} ({want.host}) is "
                        f"held by job {holder.get('job')}{elsewhere} (still running); its "
                        "ranks would join that job's: choose another port, or leave "
                        f"{want.setting} out for a free one"
                    )
                with contextlib.suppress(OSError):  # stale: its job is over
                    path.unlink()
            os.replace(draft, path)  # lost three races with stale claims: take it
            return path
        finally:
            with contextlib.suppress(OSError):
                draft.unlink()

    @staticmethod
    def _holder(path: Path) -> dict:
        try:
            found = json.loads(read_regular(path))
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _live(self, holder: dict) -> bool:
        """Whether the claim's job may still use its port."""
        pid, host = holder.get("pid"), holder.get("host")
        if not isinstance(pid, int) or host != socket.gethostname():
            return bool(holder)  # another machine's owner: assume it runs
        if not pid_alive(pid):
            return False
        theirs = holder.get("store")
        store = JobStore(Path(theirs)) if isinstance(theirs, str) else self.store
        try:
            state = effective_state(store.get(str(holder.get("job"))).status())
        except UnknownJob:  # claimed a moment ago, before its folder: it starts now
            since = holder.get("since")
            return not isinstance(since, (int, float)) or time.time() - since < _STARTING_S
        except DistrunError:  # its store is not one any more
            return False
        return state not in SETTLED_STATES


class ReleaseClaims(JobListener):
    """Gives a job's ports back when it ends."""

    def __init__(self, claims: PortClaims, job_id: str):
        self.claims, self.job_id = claims, job_id

    def on_finish(self, result: JobResult) -> None:
        self.claims.release(self.job_id)
