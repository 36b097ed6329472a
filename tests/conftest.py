"""Shared fixtures, and the marks every test gets from what it uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_dist.store import JobStore

# A test that uses one of these fixtures (directly or through another fixture) gets the
# mark, so `-m "not ssh"` leaves it out without anyone remembering to mark it by hand.
MARK_BY_FIXTURE = {
    "ssh_cluster": "ssh",
    "debian_ssh_nodes": "ssh",
    "slurm_cluster": "slurm",
    "lab": "browser",
}
# Whole modules that need what no fixture names: a browser, Horovod's build.
MARK_BY_MODULE = {
    "test_lab": "browser",
    "test_notebook7": "browser",
    "test_horovod": "horovod",
    "test_gpu": "gpu",
}
# What `scripts/test.sh --quick` leaves out: the test clusters, the browser, Horovod, and
# the tests marked `slow` by hand (each takes 1.5 s or more here: real framework jobs, kernels
# that wait on purpose, wheel builds).
QUICK_LEAVES_OUT = ("ssh", "slurm", "browser", "horovod", "slow", "gpu")
QUICK_EXPRESSION = "not (" + " or ".join(QUICK_LEAVES_OUT) + ")"
SLOW_S = 1.5


# Under pytest-xdist (`-n`, `--dist loadgroup`, as scripts/test.sh runs), the tests that share
# a cluster too costly or too fixed to start once per worker run on one worker, one after
# another: the Ray cluster (20 s to start) and the Slurm cluster (its nodes' cgroups are
# named by node, sln1 and sln2, whatever the cluster). The sshd nodes take a second, so each
# worker has its own (netns.tag() keeps them apart). A module-scoped fixture (a JupyterLab,
# a built wheel) keeps its module's tests on one worker, so it is made once.
# The browser tests take one worker too: a JupyterLab and a Chromium each, several at once
# on 2 cores, made the pages miss their 60 s deadlines.
GROUP_BY_FIXTURE = {"ray_cluster": "ray", "slurm_cluster": "slurm", "lab": "browser"}
GROUP_BY_MODULE = {"test_lab": "browser", "test_notebook7": "browser"}


def xdist_group(item: pytest.Item) -> str | None:
    """The group whose tests share one worker, or None: any worker may run it."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for name, group in GROUP_BY_FIXTURE.items():
        if name in fixtures:
            return group
    module = item.module.__name__ if getattr(item, "module", None) else ""
    if module in GROUP_BY_MODULE:
        return GROUP_BY_MODULE[module]
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs and defs[-1].scope == "module" for defs in definitions.values()):
        return item.module.__name__
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test's marks, as it is collected: before any pytest_collection_modifyitems, so
    before `-m` selects and before pytest-xdist reads the groups into node ids (its hook
    ran before a tryfirst one of this file in its workers)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    marks = {mark for name, mark in MARK_BY_FIXTURE.items() if name in fixtures}
    module = item.module.__name__ if getattr(item, "module", None) else ""
    if module in MARK_BY_MODULE:
        marks.add(MARK_BY_MODULE[module])
    for mark in sorted(marks - {m.name for m in item.iter_markers()}):
        item.add_marker(mark)
    group = xdist_group(item)
    if group:
        item.add_marker(pytest.mark.xdist_group(group))
        in_a_worker = os.environ.get("PYTEST_XDIST_WORKER")  # loadgroup: a worker's option
        if in_a_worker and getattr(item.config.option, "loadgroup", False):
            _name_group(item, group)


def _name_group(item: pytest.Item, group: str) -> None:
    """pytest-xdist 3.8 sends a group's tests to one worker by the suffix it gives their
    node ids (`...@GROUP`), set as `item._nodeid`, which pytest 9.2 no longer reads (its
    node ids are `item._id`): the groups were silently ignored. The suffix is given here,
    as xdist means to (a second one, should xdist's work again, names the same group)."""
    from _pytest.nodeid import coerce_node_id

    if hasattr(item, "_id") and not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


# Under pytest-xdist, a test with one of these marks runs with no test of another worker
# beside it: a browser test waits on a page for seconds at a time (60 s, 120 s), and one
# that shared the 2 cores with a 4-rank job on each other worker missed those deadlines.
EXCLUSIVE_MARKS = ("browser",)


def _machine_cpu() -> tuple[float, float]:
    """The whole machine's (busy, all) CPU seconds since boot, from /proc/stat ((0, 0)
    where there is none): a test's share of the cores is the difference over its run."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    hertz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hertz, sum(ticks[:8]) / hertz


_CPU_AT_START = pytest.StashKey[tuple[float, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The teardown's report carries the machine's busy and total CPU seconds over the
    test's whole run (as a user property: pytest-xdist brings it to the controller). A
    failed Ray test's report carries the ends of Ray Client's server logs."""
    outcome = yield
    cluster = getattr(item, "funcargs", {}).get("ray_cluster")
    if call.when == "call" and cluster is not None and outcome.get_result().failed:
        # Ray Client's failures name a log on the head that goes with the cluster.
        outcome.get_result().sections.append(("Ray Client's server logs", cluster.server_logs()))
    start = item.stash.get(_CPU_AT_START, None)
    if call.when == "teardown" and start is not None and start[1]:
        busy, total = _machine_cpu()
        report = outcome.get_result()
        report.user_properties.append(("machine_cpu_s", (busy - start[0], total - start[1])))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Notes the machine's CPU seconds as a test begins (its report says how busy the cores
    were). Under pytest-xdist, each test holds the run's lock while it runs (set-up, call,
    teardown): shared, or alone for those with an EXCLUSIVE_MARKS mark."""
    item.stash[_CPU_AT_START] = _machine_cpu()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    # The workers' base folders share a parent: the run's (pytest-of-USER/pytest-N).
    lock_file = item.config._tmp_path_factory.getbasetemp().parent / "exclusive.lock"
    alone = any(item.get_closest_marker(mark) for mark in EXCLUSIVE_MARKS)
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_unmarked_slow: list[tuple[str, float]] = []
_file_seconds: dict[str, float] = {}  # test file -> its tests' set-up, call and teardown
_file_cpu: dict[str, list[float]] = {}  # test file -> the machine's busy and all CPU seconds


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the quick loop, note each test that took SLOW_S or more: it belongs in the full
    run only (mark it slow), or the loop stops being quick. Add up each file's time."""
    if report.when == "call" and report.duration >= SLOW_S and report.passed:
        _unmarked_slow.append((report.nodeid, report.duration))
    test_file = report.nodeid.split("::", 1)[0]
    _file_seconds[test_file] = _file_seconds.get(test_file, 0.0) + report.duration
    for name, value in report.user_properties:
        if name == "machine_cpu_s":
            cpu = _file_cpu.setdefault(test_file, [0.0, 0.0])
            cpu[0], cpu[1] = cpu[0] + value[0], cpu[1] + value[1]


def _busy_share(busy: float, total: float) -> str:
    """The cores' busy share as the table shows it: a percentage, or a dash unmeasured."""
    return f"{busy / total:4.0%}" if total else "   -"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if config.getoption("durations", None) is not None and _file_seconds:
        # With --durations: each file's time (its tests' set-up, call and teardown, on
        # whichever worker ran them), slowest first: where a whole run's time goes. Beside
        # it, how busy the machine's cores were meanwhile (all of them, whatever ran on
        # them): a file that leaves them idle waits, one that fills them computes.
        terminalreporter.section("time per test file (cores busy: the machine's share)")
        ranked = sorted(_file_seconds.items(), key=lambda found: -found[1])
        for test_file, seconds in ranked:
            share = _busy_share(*_file_cpu.get(test_file, (0.0, 0.0)))
            terminalreporter.write_line(f"{seconds:7.1f} s  {share}  {test_file}")
        share = _busy_share(*(sum(cpu[i] for cpu in _file_cpu.values()) for i in (0, 1)))
        terminalreporter.write_line(f"{sum(_file_seconds.values()):7.1f} s  {share}  in all")
    audit = os.environ.get("DISTRUN_TEST_CPU")
    if audit and os.path.isdir(audit) and not os.environ.get("PYTEST_XDIST_WORKER"):
        import cpu_audit  # DISTRUN_TEST_CPU=FOLDER scripts/test.sh: the CPU, by test

        terminalreporter.section("CPU by test: every Python process it started")
        for line in cpu_audit.summary(Path(audit)):
            terminalreporter.write_line(line)
    if config.getoption("markexpr", "") != QUICK_EXPRESSION or not _unmarked_slow:
        return
    terminalreporter.section("slow tests in the quick loop")
    for nodeid, seconds in sorted(_unmarked_slow, key=lambda found: -found[1]):
        terminalreporter.write_line(f"{seconds:5.1f} s  {nodeid}: mark it @pytest.mark.slow")


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


@pytest.fixture
def debian_ssh_nodes(tmp_path):
    """Two real sshd nodes whose /etc/hosts are as Debian and Ubuntu write them: each
    node's own hostname on 127.0.1.1 (a cluster of the test's own, beside ssh_cluster)."""
    import netns
    import sshnodes

    cluster = sshnodes.start(2, tmp_path / "debian", tag=netns.tag(second=True),
                             debian_hosts=True)  # fmt: skip
    yield cluster
    from jupyter_dist.backends.ssh import CONNECTIONS

    CONNECTIONS.close_all()
    leftovers = sshnodes.stop(cluster)
    assert leftovers == [], f"processes left on the nodes: {leftovers}"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A real Ray cluster: a head and a worker, each in a network namespace of its own. Its
    tests are one module's (and one worker's group): it goes when they are done, since an
    idle Ray cluster keeps about 8 % of a core busy (its raylets, log monitors, idle
    workers), taken from every test after it. It asks every client for a token, as Ray's
    clusters do by default from 2.61 (one cluster for the token's test and the others: a
    second cost a minute); the token is in this process's environment, as a user's would
    be, while its tests run."""
    import secrets

    import raynodes

    token = secrets.token_hex(16)  # made here: no key or token is ever committed
    cluster = raynodes.start(2, tmp_path_factory.mktemp("raynodes"), auth_token=token)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in cluster.auth_env.items():
            patch.setenv(name, value)
        yield cluster
    leftovers = raynodes.stop(cluster)
    assert leftovers == [], f"processes of a job left on the Ray nodes: {leftovers}"


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
