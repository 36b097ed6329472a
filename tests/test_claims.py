"""Two jobs never join each other: a fixed port is held by the job that has it, from its
planning to its end; another job that wants it, of the same store or another, is refused at
once, in one line naming the holder; the port is free again once the holder ended, or its
owner died."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from jupyter_dist.errors import DistrunError
from jupyter_dist.run.claims import PortClaims, Wanted, claims_folder
from jupyter_dist.run.launch import launch
from jupyter_dist.spec import parse_spec


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spec(port: int, seconds: float = 1.0):
    # Rank 0 listens on the master port, as torch's store does; every rank says whose it is.
    command = (
        f'{sys.executable} -c "import os, socket, time; s = socket.socket(); '
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "os.environ['RANK'] == '0' and s.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); "
        f"print('job', os.environ['DISTRUN_JOB_ID']); time.sleep({seconds})\""
    )
    return parse_spec(
        f"command: {json.dumps(command)}\nresources: {{instance_count: 1}}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: 2, master_port: {port}}}\n"
    )


def _said(record) -> list[str]:
    return [line.text for key in ("rank-0", "rank-1") for line in record.iter_log(key, "stdout")]


def _claim_of(port: int) -> list[str]:
    """The claims on this port, machine-wide (other tests' ports are other files)."""
    return [path.name for path in claims_folder().glob(f"*_{port}.json")]


def _start(store, port: int, outcomes: list, i: int) -> None:
    try:
        outcomes[i] = launch(_spec(port, seconds=60), store=store, grace_period=1)
    except DistrunError as exc:
        outcomes[i] = exc


@pytest.mark.slow
@pytest.mark.parametrize("stores", ["one store", "two stores"])
def test_ten_rounds_of_two_jobs_on_one_fixed_port_one_runs_one_is_refused(stores, store, tmp_path):
    """Both at once, from one store or from two (another DISTRUN_HOME): never both run."""
    from jupyter_dist.store import JobStore

    both = [store, store if stores == "one store" else JobStore(tmp_path / "other-store")]
    for _ in range(10):  # both jobs start at once
        port = _free_port()
        outcomes: list[object] = [None, None]
        threads = [threading.Thread(target=_start, args=(both[i], port, outcomes, i))
                   for i in range(2)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        jobs = [o for o in outcomes if not isinstance(o, DistrunError)]
        refused = [o for o in outcomes if isinstance(o, DistrunError)]
        assert len(jobs) == 1 and len(refused) == 1, outcomes
        (job,), (error,) = jobs, refused
        owner = both[outcomes.index(job)]
        elsewhere = f" of the store {owner.root}" if stores == "two stores" else ""
        assert str(error) == (
            f"master_port: port {port} on local0 (127.0.0.1) is held by job {job.job_id}"
            f"{elsewhere} (still running); its ranks would join that job's: choose another "
            "port, or leave master_port out for a free one"
        )
        record = owner.get(job.job_id)
        deadline = time.monotonic() + 30
        while len(_said(record)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(_said(record)) == {f"job {job.job_id}"}  # its own ranks, nobody else's
        job.cancel()
        result = job.wait(60)
        assert result is not None and result.state == "cancelled", result.describe()
        assert _claim_of(port) == []  # given back


def test_a_claim_whose_owner_died_is_taken_over(store, tmp_path):
    port = _free_port()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    claims = PortClaims(store)
    claims.claim("old-job", [Wanted("127.0.0.1", "local0", port, "master_port")])
    (name,) = _claim_of(port)
    path = claims_folder() / name
    path.write_text(json.dumps({"job": "old-job", "pid": int(dead), "host": socket.gethostname()}))
    result = launch(_spec(port, seconds=0.1), store=store).wait(60)
    assert result.state == "succeeded"


def test_a_job_that_ended_gives_its_port_to_the_next(store):
    port = _free_port()
    first = launch(_spec(port, seconds=0.1), store=store).wait(60)
    second = launch(_spec(port, seconds=0.1), store=store).wait(60)
    assert (first.state, second.state) == ("succeeded", "succeeded")
    assert _claim_of(port) == []


def test_a_claim_of_a_live_owner_whose_store_is_gone_is_taken_over(store, tmp_path):
    """A kernel lives on, but the store its job was in was deleted (a test's tmp folder):
    once past the moment of starting, the claim is stale."""
    port = _free_port()
    gone = tmp_path / "deleted-store"
    claim = {"job": "j", "pid": os.getpid(), "host": socket.gethostname(), "store": str(gone)}
    path = claims_folder()
    path.mkdir(parents=True, exist_ok=True)
    (path / f"127.0.0.1_{port}.json").write_text(json.dumps({**claim, "since": time.time()}))
    with pytest.raises(DistrunError, match=f"held by job j of the store {gone}"):
        launch(_spec(port, seconds=0.1), store=store)  # it may be starting right now
    (path / f"127.0.0.1_{port}.json").write_text(json.dumps({**claim, "since": 0}))
    assert launch(_spec(port, seconds=0.1), store=store).wait(60).state == "succeeded"
    assert _claim_of(port) == []


def test_the_claims_are_this_users_alone(store):
    folder = claims_folder()
    assert folder.parent.stat().st_mode & 0o777 == 0o700
    assert folder.parent.stat().st_uid == os.getuid()
    port = _free_port()
    job = launch(_spec(port, seconds=30), store=store, grace_period=1)
    try:
        (name,) = _claim_of(port)
        assert (folder / name).stat().st_mode & 0o777 == 0o600
        assert folder.stat().st_mode & 0o777 == 0o700
    finally:
        job.cancel()
        job.wait(60)


def test_only_fixed_ports_are_claimed(store):
    spec = parse_spec("command: 'true'\ndistribution: {type: pytorch}\n")
    job = launch(spec, store=store)
    assert job.wait(60).state == "succeeded"
    assert _claim_of(job.plan.master_port) == []
