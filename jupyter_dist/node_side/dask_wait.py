"""Waits until every worker of a Dask cluster has registered with its scheduler.

Used in the notebook (an interactive cluster) and shipped to node 0 as a plain file, where it
runs before the cell's code of a `--type dask` job:

    python dask_wait.py          (reads DASK_SCHEDULER_ADDRESS, DISTRUN_DASK_WORKER_NAMES,
                                  DISTRUN_DASK_READY_TIMEOUT; exits 1 naming who is missing)

Needs only `distributed` and the standard library (Python 3.8+)."""

import os
import sys
import time

POLL_SECONDS = 0.2


def registered_names(client):
    """Names of the workers the scheduler knows now."""
    return {str(w.get("name")) for w in client.scheduler_info()["workers"].values()}


def missing_workers(client, expected, timeout, still_starting=lambda: True):
    """Wait until every name in `expected` has registered; the names still missing when
    `timeout` seconds pass or `still_starting()` turns false (none when all came)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = set(expected) - registered_names(client)
        if not missing or time.monotonic() >= deadline or not still_starting():
            return missing
        time.sleep(POLL_SECONDS)


def main():
    from distributed import Client

    address = os.environ["DASK_SCHEDULER_ADDRESS"]
    expected = [n for n in os.environ.get("DISTRUN_DASK_WORKER_NAMES", "").split(",") if n]
    timeout = float(os.environ.get("DISTRUN_DASK_READY_TIMEOUT", "60"))
    started = time.monotonic()
    with Client(address, timeout=timeout, set_as_default=False) as client:
        left = max(1.0, timeout - (time.monotonic() - started))
        missing = missing_workers(client, expected, left)
    if missing:
        names = ", ".join(sorted(missing))
        sys.stderr.write(
            f"jupyter-dist: Dask worker(s) {names} did not register with the scheduler "
            f"within {timeout:g} s\n"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
