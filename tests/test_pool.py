"""A node's pool (node_side/pool_*.py, `--preload`): real ranks of real torch.distributed
(gloo) forked from a Python that imported torch once, compared with the same job started
cold; what is left when a rank, the job or the pool is killed; a pool whose module changed,
an idle one, `jupyter distrun pool list|stop`; the pools' folder private."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import (
    POOL_PROBE,
    job_processes,
    not_private,
    paused_ranks,
    pool_programs,
    result_reports,
    run_cli,
    ship_pool_programs,
    start_cli_run,
)

from jupyter_dist.run.launch import launch, run
from jupyter_dist.spec import parse_spec

pytestmark = pytest.mark.torch
protocol, server, front, agent_part = pool_programs()


@pytest.fixture
def tmpdir_for_pools():
    """The jobs' TMPDIR, where their pools live: the test's own (short: a socket's path
    must be), every pool in it killed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield folder
    for info in folder.glob("distrun-pools-*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def _spec(command: str, tmpdir: Path | None, preload: str | dict | None = "torch,numpy",
          nodes: int = 2, per_node: int = 2, env: dict | None = None,
          extra: dict | None = None):  # fmt: skip
    data = {
        "command": command, "resources": {"instance_count": nodes},
        "distribution": {"type": "pytorch", "process_count_per_instance": per_node},
        "environment_variables": {"OMP_NUM_THREADS": "1", **(env or {}),
                                  **({"TMPDIR": str(tmpdir)} if tmpdir else {})},
        **({"preload": preload} if preload else {}), **(extra or {}),
    }  # fmt: skip
    return parse_spec(json.dumps(data))


def _pools(tmpdir: Path) -> list[dict]:
    """`jupyter distrun pool list`'s rows, read where the jobs' TMPDIR puts the pools."""
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    listed = run_cli("pool", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    folder = tmpdir / f"distrun-pools-{os.getuid()}"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))], listed.stdout


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _ends(pid: int, within: float = 15) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.slow
def test_ddp_forked_from_a_pool_is_what_a_cold_start_is(store, tmpdir_for_pools, tmp_path):
    """The same 4-rank DDP job, cold and then twice forked from the nodes' pool of torch and
    numpy: each rank's all_reduce, RANK (in os.environ and in /proc/PID/environ), argv,
    __name__, __file__, cwd, sys.path[0], torch's threads, command line, the job's startup
    hook and breakpoint hook and `report()` are what a cold start gives; `random`'s, numpy's
    and torch's seeds differ between ranks; the forked ranks found torch imported and are the
    pool's children, both jobs' from one pool, the second one's rank 0 late to the store.
    A rank collects its own garbage; a forked one leaves the pool's frozen. Nothing of the
    jobs is left; the pool is, carrying no job's id, shown by `nodes` and `pool list`,
    until `pool stop`."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(POOL_PROBE, code / "probe.py")
    extra = {"code": str(code)}
    cold = run(_spec("python probe.py --flag x", tmpdir_for_pools, None, extra=extra), store=store)
    assert cold.ok, cold.describe()
    # The second comes with its rank 0 late: its other ranks wait for the store, and then
    # join it, as cold ranks do.
    warm = [
        run(_spec("python probe.py --flag x", tmpdir_for_pools, extra=extra,
                  env={"PROBE_LATE_RANK0": late}), store=store)
        for late in ("0", "1.5")
    ]  # fmt: skip
    assert all(result.ok for result in warm), [r.describe() for r in warm]
    before = result_reports(store, cold.job_id)
    assert sorted(before) == [0, 1, 2, 3]
    pools, listed = _pools(tmpdir_for_pools)
    assert len(pools) == 1 and pools[0]["modules"] == ["torch", "numpy"]
    assert "torch,numpy" in listed and str(pools[0]["pid"]) in listed
    pool_pid = pools[0]["pid"]
    same = ("allreduce", "argv", "name", "cwd", "path0", "threads", "proc_rank", "cmdline",
            "hook", "breakpoint", "main_file", "stdout_line_buffered", "stdin",
            "collects")  # fmt: skip
    for result in warm:
        after = result_reports(store, result.job_id)
        assert sorted(after) == [0, 1, 2, 3]
        for rank in range(4):
            assert {k: after[rank][k] for k in same} == {k: before[rank][k] for k in same}
            assert after[rank]["proc_rank"] == str(rank) and after[rank]["allreduce"] == 10
            assert after[rank]["proc_job"] == result.job_id
            assert after[rank]["torch_before"] and not before[rank]["torch_before"]
            assert after[rank]["ppid"] == pool_pid
            # The pool's objects are frozen (a rank's collection skips them); torch's store
            # clients of a forked rank wait for its port (pool_server.py's _prompt_store_clients).
            assert after[rank]["frozen"] and not before[rank]["frozen"]
            assert after[rank]["store_wait"] and not before[rank]["store_wait"]
        for seeded in ("random", "numpy", "torch_rand"):  # each rank's own, as when cold
            assert len({json.dumps(after[r][seeded]) for r in range(4)}) == 4, seeded
            assert len({json.dumps(before[r][seeded]) for r in range(4)}) == 4, seeded
        assert job_processes(result.job_id) == []
        metrics = store.get(result.job_id).path / "metrics.jsonl"
        assert metrics.exists() and len(metrics.read_text().splitlines()) == 4  # report()
    assert before[0]["argv"] == ["probe.py", "--flag", "x"] and before[0]["threads"] == 1
    assert before[0]["cmdline"] == ["probe.py", "--flag", "x"]
    environ = Path(f"/proc/{pool_pid}/environ").read_bytes()
    assert b"DISTRUN_JOB_ID=" not in environ and b"\0RANK=" not in environ
    env = {**os.environ, "TMPDIR": str(tmpdir_for_pools)}
    nodes = run_cli("nodes", env=env)  # the local machine's pools, beside its line
    assert nodes.returncode == 0 and str(pool_pid) in nodes.stdout, nodes.stdout
    stopped = run_cli("pool", "stop", env=env)
    assert stopped.returncode == 0 and str(pool_pid) in stopped.stdout, stopped.stderr
    assert _ends(pool_pid)
    assert _pools(tmpdir_for_pools)[0] == []


@pytest.mark.slow
def test_a_killed_rank_a_cancelled_job_and_a_killed_pool_leave_nothing(store, tmpdir_for_pools):
    """A forked rank that SIGKILLs itself fails the job as a cold one does (named by the
    signal); a running job's forked ranks show their stacks (the job's startup hook ran in
    each), and once cancelled get one SIGTERM each and their grace period;
    a pool SIGKILLed under a running job takes its ranks with it. Nothing is left of any."""
    killed = run(_spec(
        "python -c 'import os, signal, torch\nif os.environ[\"RANK\"] == \"1\": "
        "os.kill(os.getpid(), signal.SIGKILL)\nimport time; time.sleep(300)'",
        tmpdir_for_pools, "torch",
    ), store=store, grace_period=2)  # fmt: skip
    assert not killed.ok
    by_rank = {p.rank: p for p in killed.processes}
    assert by_rank[1].signal == "SIGKILL" and not by_rank[1].stopped_by_us
    assert job_processes(killed.job_id) == []
    (pool,) = _pools(tmpdir_for_pools)[0]

    handler = (
        "import signal, sys, time, torch\n"
        "def term(*_):\n    print('TERM', flush=True)\n    time.sleep(0.5)\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\nprint('started', flush=True)\ntime.sleep(300)\n"
    )
    job = launch(_spec(f"python -c {shlex.quote(handler)}", tmpdir_for_pools, "torch"),
                 store=store, grace_period=10)  # fmt: skip
    _wait_for_lines(job, "started", 4)
    forked = [pid for pid in job_processes(job.job_id) if _parent(pid) == pool["pid"]]
    assert len(forked) == 4  # the ranks, forked from the pool, found by their job's id
    dump = job.watch.stacks(method="faulthandler")  # through the job's startup hook, in each
    assert sorted(p.rank for p in dump.processes) == [0, 1, 2, 3], dump.format()
    assert sorted(p.pid for p in dump.processes) == sorted(forked)  # not their fronts
    assert len(dump.groups()) == 1  # the four in the same place
    text = dump.format()  # the rank's own frames: the time.sleep(300) line, no pool's
    assert "<string>:8 in <module>" in text and "distrun_pool" not in text, text
    assert dump.problems == []
    job.cancel()
    result = job.wait(60)
    assert result is not None and result.state == "cancelled"
    assert _count_lines(job, "TERM") == 4  # once each: not from the agent and the front both
    assert all(p.state in ("stopped", "succeeded") for p in result.processes)
    assert job_processes(job.job_id) == []

    job = launch(_spec(f"python -c {shlex.quote(handler)}", tmpdir_for_pools, "torch"),
                 store=store, grace_period=2)  # fmt: skip
    _wait_for_lines(job, "started", 4)
    os.kill(pool["pid"], signal.SIGKILL)
    result = job.wait(60)
    assert result is not None and not result.ok
    said = result.describe()  # the pool's end, not the out-of-memory killer
    assert protocol.POOL_ENDED in said and "its node's pool (--preload)" in said, said
    assert "out-of-memory" not in said, said
    assert job_processes(job.job_id) == []
    assert _pools(tmpdir_for_pools)[0] == []  # its files went with it (at the next look)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


def _count_lines(job, text: str) -> int:
    record = job.record
    return sum(line.text == text for key in record.log_keys()
               for line in record.iter_log(key, "stdout"))  # fmt: skip


def _wait_for_lines(job, text: str, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while _count_lines(job, text) < count:
        assert time.monotonic() < deadline, f"fewer than {count} {text!r} lines"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_pool_whose_module_changed_is_replaced_and_an_idle_one_ends(store, tmpdir_for_pools,
                                                                     tmp_path):  # fmt: skip
    """A module the pool preloaded changes on disk (a new version installed): the next
    job's ranks get the new one (the stale pool takes no more ranks and ends), and the job
    after that a new pool. A pool idle for DISTRUN_POOL_IDLE seconds ends by itself. The
    pools' folder is the user's alone: 0700, its files 0600; the jobs' folders stay private."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mymod.py").write_text("VALUE = 1\n")
    command = "python -c 'import os, mymod; print(\"VALUE\", mymod.VALUE, os.getppid())'"
    env = {"PYTHONPATH": str(lib)}

    def values(result) -> set[tuple[str, int]]:
        record = store.get(result.job_id)
        return {(line.text.split()[1], int(line.text.split()[2]))
                for key in record.log_keys() for line in record.iter_log(key, "stdout")
                if line.text.startswith("VALUE")}  # fmt: skip

    first = run(_spec(command, tmpdir_for_pools, "mymod", 1, 2, env), store=store)
    assert first.ok, first.describe()
    (old,) = _pools(tmpdir_for_pools)[0]
    assert values(first) == {("1", old["pid"])}
    (lib / "mymod.py").write_text("VALUE = 2  # a new version\n")
    later = time.time() + 5
    os.utime(lib / "mymod.py", (later, later))
    second = run(_spec(command, tmpdir_for_pools, "mymod", 1, 2, env), store=store)
    assert second.ok, second.describe()
    assert {value for value, _ in values(second)} == {"2"}
    assert old["pid"] not in {parent for _, parent in values(second)}
    assert _ends(old["pid"])
    third = run(_spec(command, tmpdir_for_pools, "mymod", 1, 2, env), store=store)
    assert third.ok, third.describe()
    (new,) = _pools(tmpdir_for_pools)[0]
    assert new["pid"] != old["pid"] and values(third) == {("2", new["pid"])}

    folder = tmpdir_for_pools / f"distrun-pools-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not_private(folder) == []  # the socket, its lock and its description: 0600
    for result in (first, second, third):
        job_folder = store.get(result.job_id).path
        assert not_private(job_folder) == []  # the shims (0700) and the pool's script
    stopped = run_cli("pool", "stop", env={**os.environ, "TMPDIR": str(tmpdir_for_pools)})
    assert stopped.returncode == 0 and _ends(new["pid"])

    idle = run(_spec(command, tmpdir_for_pools, {"modules": ["mymod"], "idle": 1}, 1, 1, env),
               store=store)  # fmt: skip
    assert idle.ok, idle.describe()
    ((_, pool_pid),) = values(idle)  # the pool it forked from, which others would have kept
    assert _ends(pool_pid, within=20)


@pytest.mark.slow
@pytest.mark.slow
def test_a_preload_asked_once_is_taken_by_later_python_jobs_until_none(store, tmpdir_for_pools):
    """The default (run/preload_memory.py): after a job that preloads xml.dom.minidom, a
    Python job that names no preload forks from the pool, and its plan says which job asked;
    a job that is no Python (a shell line) starts no pool and takes none; `--preload none`
    starts cold and forgets it: the next job is cold too. The memory is the store's, 0600."""
    probe = "python -c \"import sys; print('xml.dom.minidom' in sys.modules)\""

    def ran(preload, command=probe) -> tuple[str, list[str]]:
        result = run(_spec(command, tmpdir_for_pools, preload, 1, 1), store=store)
        assert result.ok, result.describe()
        record = store.get(result.job_id)
        said = [line.text for line in record.iter_log("rank-0", "stdout")]
        return said[-1] if said else "", record.plan()["remembered"]

    assert ran(None) == ("False", [])  # nothing asked yet: cold
    asked = run(_spec(probe, tmpdir_for_pools, "xml.dom.minidom", 1, 1), store=store)
    assert asked.ok, asked.describe()
    memory = store.root / "preload.json"
    assert stat.S_IMODE(memory.stat().st_mode) == 0o600 and not_private(store.root) == []
    forked, remembered = ran(None)
    assert forked == "True", "a later job naming no preload did not fork from the pool"
    assert remembered == [
        f"ranks forked from each node's pool of xml.dom.minidom, as job {asked.job_id} asked "
        "(--preload none starts them cold)"
    ]
    pools = {pool["pid"] for pool in _pools(tmpdir_for_pools)[0]}
    assert ran(None, "echo shell") == ("shell", [])  # no Python: no pool, none taken
    assert {pool["pid"] for pool in _pools(tmpdir_for_pools)[0]} == pools
    assert ran("none") == ("False", [])
    assert not memory.exists()
    assert ran(None) == ("False", [])


def test_ranks_on_ssh_nodes_fork_from_each_nodes_own_pool(ssh_nodes, store, tmp_path):
    """Over SSH (real sshd nodes in network namespaces of their own, sharing this machine's
    /tmp): each node's agent starts that node's pool, in that node's namespace, and the
    next job's ranks fork from the same two; DDP meets across the nodes; nothing of the
    jobs is left on either node; `nodes` shows each node's pool, and `pool stop` ends
    both."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(POOL_PROBE, code / "probe.py")
    inventory = ssh_nodes.load_inventory(tmp_path)
    nodes_file = str(tmp_path / "nodes.yml")
    parents = []
    try:
        for _ in range(2):
            spec = _spec("python probe.py", None, "torch", extra={"code": str(code)})
            result = run(spec, store=store, inventory=inventory)
            assert result.ok, result.describe()
            results = result_reports(store, result.job_id)
            assert sorted(results) == [0, 1, 2, 3]
            for rank, report in results.items():
                assert report["host"] == f"node{rank // 2}" and report["allreduce"] == 10
                assert report["torch_before"] and report["cmdline"] == ["probe.py"]
            parents.append([results[rank]["ppid"] for rank in range(4)])
            assert ssh_nodes.job_processes(result.job_id) == []
        first, second = parents
        assert first[0] == first[1] != first[2] == first[3]  # one pool per node
        assert second == first  # and the same two again
        nodes = run_cli("nodes", "--nodes-file", nodes_file)
        assert nodes.returncode == 0, nodes.stderr
        for node, pid in (("node0", first[0]), ("node1", first[2])):  # each node's own
            assert any(node in row and str(pid) in row and "torch" in row
                       for row in nodes.stdout.splitlines()), nodes.stdout  # fmt: skip
    finally:
        stopped = run_cli("pool", "stop", "--nodes-file", nodes_file)
    assert stopped.returncode == 0, stopped.stderr
    assert _ends(first[0]) and _ends(first[2])


@pytest.mark.slow
def test_a_cell_and_a_warm_sessions_ranks_fork_from_the_pool(kernel_env, tmpdir_for_pools):
    """Through a real kernel: a `%%distrun --preload torch` cell's ranks and a warm
    session's (`%distrun session start --preload torch`) are forked from the one pool,
    which `%distrun pool list` shows and `%distrun pool stop` ends."""
    from helpers import execute_notebook

    probe = "import os, sys\nprint('forked', 'torch' in sys.modules, os.getppid())"
    env = f"--env TMPDIR={tmpdir_for_pools}"
    nb = execute_notebook(
        f"%%distrun --nodes 2 --preload torch {env}\n{probe}",
        f"%distrun session start --nodes 1 --procs-per-node 2 --preload torch {env}",
        f"%%distrun\n{probe}",
        "%distrun session stop",
        f"import os\nos.environ['TMPDIR'] = {str(tmpdir_for_pools)!r}",
        "%distrun pool list",
        "%distrun pool stop",
    )
    lines = [line for index in (1, 3) for output in nb.cells[index].outputs
             for line in output.get("text", "").splitlines() if "forked" in line]  # fmt: skip
    assert len(lines) == 4, lines
    assert {line.split("forked ", 1)[1].split()[0] for line in lines} == {"True"}
    (pool_pid,) = {line.split()[-1] for line in lines}  # one pool served both
    listed = str(nb.cells[6].outputs)  # (cell 0 loads the extension)
    assert pool_pid in listed and "torch" in listed
    assert _ends(int(pool_pid))


ENDINGS = {
    "a file left open": "f = open('out.txt', 'w')\nf.write('x' * 100000)\nprint('wrote')",
    "sys.exit(3) after atexit": "import atexit, sys\natexit.register(print, 'atexit ran')\n"
                                "sys.exit(3)",
    "SystemExit with words": "raise SystemExit('gave up: no data')",
    "an uncaught error": "import torch\ndef load():\n    raise ValueError('boom')\nload()",
    "a KeyboardInterrupt": "raise KeyboardInterrupt",
    "a thread left running": "import threading, time\nthreading.Thread(target=lambda: "
                             "(time.sleep(1), print('joined'))).start()",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_forked_rank_ends_as_a_cold_one_does(ending, store, tmpdir_for_pools, tmp_path):
    """However the rank's code ends, the forked rank's exit code or signal, its lines (a
    traceback of its own frames only) and the files it left open are what the cold one's
    are: it leaves without the interpreter's teardown (torch's costs about a second), but
    after what a normal exit does first."""
    seen = []
    for preload in (None, "torch"):
        folder = tmp_path / (preload or "cold")
        folder.mkdir()
        spec = _spec(f"python -c {shlex.quote(ENDINGS[ending])}", tmpdir_for_pools, preload,
                     1, 1, extra={"code": str(folder)})  # fmt: skip
        result = run(spec, store=store)
        (proc,) = result.processes
        record = store.get(result.job_id)
        lines = {stream: [line.text for line in record.iter_log(proc.name, stream)]
                 for stream in ("stdout", "stderr")}  # fmt: skip
        written = (folder / "out.txt").read_text() if (folder / "out.txt").exists() else None
        seen.append((proc.exit_code, proc.signal, lines, written and len(written)))
    cold, forked = seen
    assert forked == cold
    expected = {"a file left open": (0, None), "sys.exit(3) after atexit": (3, None),
                "SystemExit with words": (1, None), "an uncaught error": (1, None),
                "a KeyboardInterrupt": (130, "SIGINT"),
                "a thread left running": (0, None)}[ending]  # fmt: skip
    assert cold[:2] == expected, cold


def test_a_store_client_waits_for_a_refusing_port_and_nothing_else(monkeypatch):
    """A forked rank's TCPStore client (pool_server.py's `_prompt_store_clients`): where nothing
    listens yet, it waits until the port takes a connection; where the host cannot be
    reached for another reason, it leaves the error to torch at once. torch's own function
    is wrapped only when it has the parameters expected, and never for rank 0 or under
    torchrun's agent store."""
    import socket
    import threading
    import types

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # free: connections to it are refused until the thread listens
    listening = threading.Event()

    def listen_later():
        time.sleep(0.3)
        server = socket.create_server(("127.0.0.1", port))
        listening.set()
        server.accept()[0].close()
        server.close()

    thread = threading.Thread(target=listen_later)
    thread.start()
    server._wait_for_listener("127.0.0.1", port, 60)
    assert listening.is_set()  # it returned because the port took its connection
    thread.join(10)
    began = time.monotonic()
    server._wait_for_listener("no-such-host.invalid", port, 60)  # not a refusal
    assert time.monotonic() - began < 30

    calls = []

    def _create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        calls.append(rank)

    waited = []
    rendezvous = types.ModuleType("torch.distributed.rendezvous")
    rendezvous._create_c10d_store = _create_c10d_store
    monkeypatch.setitem(sys.modules, "torch.distributed.rendezvous", rendezvous)
    monkeypatch.setattr(server, "_wait_for_listener", lambda *a: waited.append(a))
    server._prompt_store_clients()
    wrapped = rendezvous._create_c10d_store
    assert wrapped.__wrapped__ is _create_c10d_store
    wrapped("node-0", 29500, 0, 4, None)
    wrapped("node-0", 29500, 3, 4, None)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    wrapped("node-0", 29500, 2, 4, None)
    assert calls == [0, 3, 2] and waited == [("node-0", 29500, server.STORE_POLL_LIMIT_S)]

    def other(host, port, rank):  # not what it expects: left alone
        pass

    rendezvous._create_c10d_store = other
    server._prompt_store_clients()
    assert rendezvous._create_c10d_store is other


def test_a_front_reads_its_command_line_as_python_does(tmp_path):
    """What goes to the pool (a script, -m, -c, with -u and -B) and what starts cold."""
    script = tmp_path / "train.py"
    script.write_text("")
    parse = front.parse_command
    assert parse([str(script), "--lr", "1"]) == ("script", str(script), ["--lr", "1"], False)
    assert parse(["-u", "-m", "pkg.main", "-x"]) == ("module", "pkg.main", ["-x"], True)
    assert parse(["-B", "-c", "print(1)", "a"]) == ("code", "print(1)", ["a"], False)
    for cold in (["-X", "dev", str(script)], [str(tmp_path)], ["missing.py"], ["-m"], [],
                 ["-i", str(script)], ["-"]):  # fmt: skip
        assert parse(cold) is None, cold


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preload", "error"),
    [
        ("torch,1numpy", "'1numpy' is not a module name"),
        ("torch;rm -rf", "is not a module name"),
        (",".join(f"m{i}" for i in range(40)), "40 modules; at most 32"),
        ({"torch": 1}, "preload: unknown key 'torch'; valid keys: modules, idle"),
        ({"modules": ["torch"], "idle": 0}, "preload.idle: 0 is not valid"),
    ],
)
def test_a_wrong_preload_is_one_line_naming_it(preload, error, tmp_path):
    spec = tmp_path / "job.yml"
    spec.write_text(json.dumps({"command": "python x.py", "preload": preload}))
    done = run_cli("plan", str(spec))
    assert done.returncode != 0
    assert error in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_a_pool_whose_socket_another_pool_took_ends_and_a_start_waits_until_it_answers(
    tmpdir_for_pools, monkeypatch
):
    """Two starts of one node's pool (the second agent found the first not answering yet):
    the second pool takes the socket's path, and the first, which no job can reach any
    more, ends by itself within seconds, not after its idle time (it was left running
    past its job under load). A start returns once its pool answers, not once its socket
    exists (the window between bind and listen let the next agent start a second pool)."""
    import sys

    monkeypatch.setenv("TMPDIR", str(tmpdir_for_pools))
    env = {**os.environ, "TMPDIR": str(tmpdir_for_pools)}
    key = protocol.pool_key(sys.executable, ["json"], [], env)
    info = Path(protocol.info_path(key))
    hook = ship_pool_programs(tmpdir_for_pools / "job")  # started as an agent starts one

    def start():  # as an agent starts one: its shipped programs, in a Python of their own
        code = (
            "import os, sys, time; sys.path.insert(0, sys.argv[1]); import distrun_pool_agent; "
            "distrun_pool_agent._start_pool(sys.executable, sys.argv[2], ['json'], "
            "dict(os.environ), time.time())"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(hook), key], env=env, check=True, timeout=60
        )

    start()
    assert agent_part._answers(protocol.socket_path(key))
    first = json.loads(info.read_text())["pid"]
    start()  # it lost
    deadline = time.monotonic() + 30  # (the first answered its wait: the second comes)
    while (second := json.loads(info.read_text())["pid"]) == first:
        assert time.monotonic() < deadline, "the second pool never took the socket"
        time.sleep(0.05)
    assert agent_part._answers(protocol.socket_path(key))
    assert second != first and _alive(first) and _alive(second)
    assert _ends(first, within=server.OWNED_CHECK_S + 10)
    assert _alive(second)  # the node's pool, which the next job finds
    stopped = run_cli("pool", "stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert _ends(second)


STARTUP_PROBE = """\
import faulthandler, json, os, pdb, sys, warnings
import mypkg
first = warnings.filters[0] if warnings.filters else None
print("PROBE", json.dumps({
    "value": mypkg.model.VALUE, "hash": hash("abc"), "executable": sys.executable,
    "optimize": sys.flags.optimize, "dev_mode": sys.flags.dev_mode,
    "safe_path": sys.flags.safe_path, "faulthandler": faulthandler.is_enabled(),
    "warning": first and [first[0], first[2].__name__],
    "path0": sys.path[0].replace(os.environ["DISTRUN_JOB_DIR"], "JOB"),
    "ppid": os.getppid(), "ours": pdb.set_trace.__module__,
}), flush=True)
if os.environ.get("PROBE_PAUSE") == os.environ["RANK"]:
    print("started", flush=True)
    pdb.set_trace()
    print("went on", flush=True)
"""


def _probe_code(tmp_path: Path) -> tuple[Path, Path]:
    """(the job's code: probe.py; the library on its PYTHONPATH: mypkg, whose __init__
    imports its submodule `model`, VALUE = 1)."""
    code, lib = tmp_path / "code", tmp_path / "lib"
    (lib / "mypkg").mkdir(parents=True)
    code.mkdir()
    (code / "probe.py").write_text(STARTUP_PROBE)
    (lib / "mypkg" / "__init__.py").write_text("from mypkg import model\n")
    (lib / "mypkg" / "model.py").write_text("VALUE = 1\n")
    return code, lib


def _probes(store, result) -> dict[int, dict]:
    record = store.get(result.job_id)
    return {int(key.split("-")[1]): json.loads(line.text.split(" ", 1)[1])
            for key in record.log_keys() for line in record.iter_log(key, "stdout")
            if line.text.startswith("PROBE ")}  # fmt: skip


def _stderr(store, result) -> list[str]:
    record = store.get(result.job_id)
    return [line.text for key in record.log_keys() for line in record.iter_log(key, "stderr")]


@pytest.mark.slow
def test_a_forked_rank_sees_edited_submodules_and_the_startup_variables_a_cold_one_sees(
    store, tmpdir_for_pools, tmp_path
):
    """A package's submodule edited after its pool imported it: the next job's ranks print
    the new value (the pool is stale, the rank starts cold), the one after forks from a new
    pool. Python's startup variables (PYTHONHASHSEED, PYTHONOPTIMIZE, PYTHONDEVMODE,
    PYTHONFAULTHANDLER, PYTHONSAFEPATH, PYTHONWARNINGS) take effect in forked ranks as in
    cold ones (a pool of their own); `sys.executable` is the one a cold start has; one a
    pool cannot honour (PYTHONPROFILEIMPORTTIME) starts cold, saying so in one line."""
    code, lib = _probe_code(tmp_path)
    base = {"PYTHONPATH": str(lib)}

    def job(preload, env=None):
        spec = _spec("python probe.py", tmpdir_for_pools, preload, 1, 2, {**base, **(env or {})},
                     extra={"code": str(code)})  # fmt: skip
        result = run(spec, store=store)
        assert result.ok, result.describe()
        probes = _probes(store, result)
        assert sorted(probes) == [0, 1]
        return result, probes

    pools = lambda: {p["pid"] for p in _pools(tmpdir_for_pools)[0]}  # noqa: E731
    _, cold = job("none")
    _, warm = job("mypkg")
    (first,) = pools()
    shared = ("value", "executable", "optimize", "dev_mode", "safe_path", "faulthandler",
              "warning", "path0", "ours")  # fmt: skip
    for rank in (0, 1):
        assert warm[rank]["ppid"] == first and cold[rank]["ppid"] != first
        assert {k: warm[rank][k] for k in shared} == {k: cold[rank][k] for k in shared}
    assert warm[0]["value"] == 1 and warm[0]["ours"] == "sitecustomize"

    (lib / "mypkg" / "model.py").write_text("VALUE = 2\n")  # the same size: its time says
    _, edited = job("mypkg")
    assert {p["value"] for p in edited.values()} == {2}
    assert first not in {p["ppid"] for p in edited.values()}
    assert _ends(first)
    _, again = job("mypkg")
    (second,) = pools()
    assert {(p["value"], p["ppid"]) for p in again.values()} == {(2, second)}

    startup = {"PYTHONHASHSEED": "0", "PYTHONOPTIMIZE": "1", "PYTHONDEVMODE": "1",
               "PYTHONFAULTHANDLER": "1", "PYTHONSAFEPATH": "1",
               "PYTHONWARNINGS": "error::DeprecationWarning"}  # fmt: skip
    _, cold = job("none", startup)
    _, warm = job("mypkg", startup)
    (third,) = pools() - {second}  # a pool of their own; the plain one stays
    for rank in (0, 1):
        assert warm[rank]["ppid"] == third
        assert {k: warm[rank][k] for k in (*shared, "hash")} == {
            k: cold[rank][k] for k in (*shared, "hash")
        }
    assert cold[0]["optimize"] == 1 and cold[0]["dev_mode"] and cold[0]["safe_path"]
    assert (
        cold[0]["warning"] == ["error", "DeprecationWarning"] and cold[0]["path0"] == "JOB/pyhook"
    )

    result, verbose = job("mypkg", {"PYTHONPROFILEIMPORTTIME": "1"})
    assert not {p["ppid"] for p in verbose.values()} & pools()
    said = [line for line in _stderr(store, result) if line.startswith("distrun:")]
    assert (
        said
        == [
            "distrun: no pool of mypkg here (PYTHONPROFILEIMPORTTIME is set, which a forked rank "
            "cannot honour); this rank starts cold"
        ]
        * 2
    ), said


@pytest.mark.slow
def test_a_preload_that_fails_a_stopped_pool_and_a_shared_pools_folder_start_cold_in_a_line(
    store, tmpdir_for_pools, tmp_path
):
    """A preload that cannot be imported: the job runs cold, says the import error once,
    and the next job that names no preload does not take it. A pool stopped with SIGSTOP, and
    a pools' folder open to other users: the job starts cold at once, saying why in a line
    (no failed start). A later job's `idle` applies to the pool that runs. `pdb.set_trace()`
    in a rank whose pool imported pdb pauses it in the debugger, as in a cold rank."""
    code, lib = _probe_code(tmp_path)
    env = {"PYTHONPATH": str(lib)}

    def job(preload, extra_env=None, nodes=1):
        spec = _spec("python probe.py", tmpdir_for_pools, preload, nodes, 2,
                     {**env, **(extra_env or {})}, extra={"code": str(code)})  # fmt: skip
        result = run(spec, store=store)
        assert result.ok, result.describe()
        said = [line for line in _stderr(store, result) if line.startswith("distrun:")]
        return result, _probes(store, result), said

    _, probes, said = job("nosuchmod_xyz", nodes=2)  # two agents start it at once
    assert said == [
        "distrun: cannot preload nosuchmod_xyz (ModuleNotFoundError: No module named "
        "'nosuchmod_xyz'); this rank starts cold"
    ], said
    assert sorted(probes) == [0, 1, 2, 3] and _pools(tmpdir_for_pools)[0] == []
    folder = tmpdir_for_pools / f"distrun-pools-{os.getuid()}"
    assert not_private(folder) == []  # the import error's record too
    later, _, said = job(None)
    assert store.get(later.job_id).plan()["remembered"] == [] and said == []

    _, probes, _ = job("mypkg")
    (pool,) = _pools(tmpdir_for_pools)[0]
    assert {p["ppid"] for p in probes.values()} == {pool["pid"]}
    os.kill(pool["pid"], signal.SIGSTOP)
    try:
        _, probes, said = job("mypkg")
    finally:
        os.kill(pool["pid"], signal.SIGCONT)
    assert pool["pid"] not in {p["ppid"] for p in probes.values()}
    assert (
        said
        == [
            f"distrun: no pool of mypkg here (the node's pool of these modules (pid {pool['pid']}) "
            "is stopped); this rank starts cold"
        ]
        * 2
    ), said

    folder.chmod(0o755)
    try:
        _, probes, said = job("mypkg")
    finally:
        folder.chmod(0o700)
    assert sorted(probes) == [0, 1] and len(said) == 2, said
    assert f"{folder} is open to other users (mode 755)" in said[0]
    # Made by another user, or a link to a folder elsewhere: never used, the job cold.
    os.chown(folder, 65534, 65534)
    try:
        _, probes, said = job("mypkg")
    finally:
        os.chown(folder, os.getuid(), os.getgid())
    assert sorted(probes) == [0, 1] and f"{folder} is not this user's folder" in said[0], said
    aside = folder.with_name(folder.name + "-aside")
    folder.rename(aside)
    folder.symlink_to(aside)
    try:
        _, probes, said = job("mypkg")
    finally:
        folder.unlink()
        aside.rename(folder)
    assert sorted(probes) == [0, 1] and f"{folder} is not this user's folder" in said[0], said

    # The running pool (idle 600 s) takes the next job's idle time.
    _, probes, _ = job({"modules": ["mypkg"], "idle": 1})
    assert {p["ppid"] for p in probes.values()} == {pool["pid"]}
    assert _ends(pool["pid"], within=20)

    spec = tmp_path / "pause.yml"
    spec.write_text(json.dumps({
        "command": "python probe.py", "code": str(code), "preload": ["mypkg", "pdb"],
        "resources": {"instance_count": 1},
        "distribution": {"type": "pytorch", "process_count_per_instance": 1},
        "environment_variables": {**env, "TMPDIR": str(tmpdir_for_pools), "PROBE_PAUSE": "0"},
    }))  # fmt: skip
    proc, job_id = start_cli_run(spec, store, ranks=1)
    try:
        (paused,) = paused_ranks(store, job_id, 1)
        assert paused["rank"] == 0 and paused["reason"] == "breakpoint", paused
        going = run_cli("debug", job_id, "--rank", "0", "--do", "c", store=store)
        assert going.returncode == 0, going.stderr
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    record = store.get(job_id)
    (probe,) = [json.loads(line.text.split(" ", 1)[1]) for line in
                record.iter_log("rank-0", "stdout") if line.text.startswith("PROBE ")]  # fmt: skip
    assert probe["ppid"] in {p["pid"] for p in _pools(tmpdir_for_pools)[0]}  # forked
    assert [line.text for line in record.iter_log("rank-0", "stdout")][-1] == "went on"
