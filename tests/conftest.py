"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dist.store import JobStore


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs")


@pytest.fixture
def kernel_env(tmp_path, monkeypatch) -> Path:
    """Kernels started by the test inherit this: their jobs go to a store of the test's own
    (returned), local nodes, and the plain-text view (no Jupyter server around)."""
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DISTRUN_NODES_FILE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return tmp_path / "home" / "jobs"


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory):
    """Two real sshd nodes (network namespaces with their own IPs and hostnames)."""
    import sshnodes

    cluster = sshnodes.start(2, tmp_path_factory.mktemp("sshnodes"))
    yield cluster
    from jupyter_dist.backends.ssh import CONNECTIONS

    CONNECTIONS.close_all()
    leftovers = sshnodes.stop(cluster)
    assert leftovers == [], f"processes left on the nodes: {leftovers}"


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster: a controller and two compute nodes in network namespaces. Its
    files live in a folder the munge user can reach (pytest's own are root's alone)."""
    import shutil
    import tempfile

    import slurmnodes

    problem = slurmnodes.available()
    if problem:
        pytest.fail(f"no Slurm cluster can start here: {problem}")
    root = Path(tempfile.mkdtemp(prefix="distrun-slurm-", dir="/var/tmp"))
    root.chmod(0o755)
    cluster = slurmnodes.start(2, root)
    yield cluster
    leftovers = slurmnodes.stop(cluster)
    shutil.rmtree(root, ignore_errors=True)
    assert leftovers == [], f"processes left on the Slurm nodes: {leftovers}"


@pytest.fixture
def ssh_nodes(ssh_cluster):
    """The cluster, checked after each test: nothing but sshd may run on a node."""
    import time

    yield ssh_cluster
    deadline = time.monotonic() + 10
    left = []
    while time.monotonic() < deadline:
        left = [(n.name, pid) for n in ssh_cluster.nodes for pid in ssh_cluster.pids(n)]
        if not left:
            return
        time.sleep(0.2)
    pytest.fail(f"processes left running on the nodes after the test: {left}")
