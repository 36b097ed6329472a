"""Warm sessions through a real kernel: ranks started once keep their namespaces (a
variable, a model, an initialised gloo process group) across cells; a rank's exception
fails the cell, not the session; stopping leaves nothing."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import pytest
from helpers import (
    await_text,
    execute_notebook,
    interrupt_and_reply,
    job_processes,
    run_cli,
    running_kernel,
    stream_text,
)

from jupyter_dist.run.session import Session, SessionEnded
from jupyter_dist.spec import parse_spec

CELL_1 = (
    "%%distrun\n"
    "import os, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "rank = dist.get_rank()\n"
    "model = torch.nn.Linear(2, 1)\n"
    "print('ready', rank, os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'])\n"
)
CELL_2 = (
    "%%distrun\ncalls = rank * 10\nprint('model', sum(p.numel() for p in model.parameters()))\n"
)
CELL_3 = (
    "%%distrun\n"
    "total = torch.tensor([float(calls)])\n"
    "dist.all_reduce(total)\n"  # the group of cell 1, still formed
    "print('sum', total.item())\n"
)


@pytest.mark.slow
def test_state_persists_across_cells_and_a_failing_rank_fails_only_its_cell(kernel_env):
    home = str(kernel_env.parent)
    nb = execute_notebook(
        "%distrun session start --nodes 2 --procs-per-node 2",
        CELL_1,
        CELL_2,
        CELL_3,
        "%%distrun\nif rank == 1:\n    raise ValueError(f'rank {rank} has a bad shard')\n",
        "%%distrun\nprint('after', rank)",
        "%%distrun --nodes 1\nprint('cold')",
        "%distrun session",
        "%distrun session stop",
        "%distrun session stop nope",
        allow_errors=True,
    )
    out = [stream_text(cell) for cell in nb.cells[1:]]
    started = re.search(
        r"Session session ready in [\d.]+ s \(job (\S+)\): 4 ranks on 2 nodes", out[0]
    )
    assert started, out[0]
    job_id = started.group(1)
    for rank in range(4):
        assert f"[rank {rank}] ready {rank} 4 {rank % 2}" in out[1]
        assert f"[rank {rank}] model 3" in out[2]
        assert f"[rank {rank}] sum 60.0" in out[3]  # 0 + 10 + 20 + 30: one group since cell 1
        assert f"[rank {rank}] after {rank}" in out[5]
    error = nb.cells[5].outputs[-1]
    assert error.output_type == "error" and error.ename == "CellFailed"
    assert error.evalue.startswith("rank 1: ValueError: rank 1 has a bad shard\n")
    assert "[rank 1] ValueError: rank 1 has a bad shard" in out[4]
    refused = nb.cells[7].outputs[-1]
    assert refused.ename == "DistrunError" and "--new" in refused.evalue
    assert "\n" not in refused.evalue
    listed = re.match(
        r"session: 4 ranks on 2 nodes \(local\), job \S+, up \d+ s, 5 cells run\n"
        r"  memory \(each rank's, after its last cell\): rank 0 (\d+) MiB, rank 1 \d+ MiB, "
        r"rank 2 \d+ MiB, rank 3 \d+ MiB\n",
        out[7],
    )
    assert listed and int(listed.group(1)) > 50, out[7]  # torch is imported: tens of MiB
    assert out[8].startswith(f"Session session stopped (job {job_id}): 4 ranks on 2 nodes")
    assert job_processes(job_id) == []
    unknown = nb.cells[10].outputs[-1]
    assert unknown.evalue == (
        "%distrun session stop: no open session named 'nope' (open: none is open)"
    )
    # The store keeps each cell's lines after its marker: one cell's output comes back.
    second = run_cli("logs", job_id, "--cell", "2", env={**os.environ, "DISTRUN_HOME": home})
    assert second.returncode == 0, second.stderr
    assert sorted(second.stdout.splitlines()) == [f"[rank-{r}] model 3" for r in range(4)]
    failed = run_cli("logs", job_id, "--cell", "4", "--rank", "1",
                     env={**os.environ, "DISTRUN_HOME": home})  # fmt: skip
    assert failed.stdout.splitlines()[-1] == "ValueError: rank 1 has a bad shard"
    assert "ready" not in failed.stdout and "after" not in failed.stdout
    whole = run_cli("logs", job_id, "--rank", "0", env={**os.environ, "DISTRUN_HOME": home})
    assert [line for line in whole.stdout.splitlines() if "cell" in line] == [
        f"\u2500\u2500 cell {n} \u2500\u2500" for n in range(1, 6)
    ]
    nope = run_cli("logs", job_id, "--cell", "9", env={**os.environ, "DISTRUN_HOME": home})
    assert nope.returncode != 0
    assert nope.stderr.strip().endswith(f"job {job_id} has no cell 9 (its cells: 1-5)")


def _session_in(kc) -> str:
    """Start a 2x2 session in the running kernel; its job id."""
    said: list[str] = []
    reply = kc.execute_interactive(
        "%distrun session start --nodes 2 --procs-per-node 2\n"
        "from jupyter_dist.magics import DistrunMagics\n"
        "print('JOB', DistrunMagics.last_job_id)", timeout=120,
        output_hook=lambda msg: said.append(msg["content"].get("text", "")),
    )  # fmt: skip
    assert reply["content"]["status"] == "ok", said
    return re.search(r"JOB (\S+)", "".join(said)).group(1)


@pytest.mark.slow
def test_an_interrupt_stops_every_ranks_cell_and_the_session_lives_on(kernel_env):
    with running_kernel() as (km, kc):
        _session_in(kc)
        msg_id = kc.execute("%%distrun\nimport time\nprint('sleeping', flush=True)\n"
                            "time.sleep(300)\n")  # fmt: skip
        assert await_text(kc, "sleeping", 4) == 4
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        outputs = []
        after = kc.execute_interactive(
            "%%distrun\nprint('awake')", timeout=60,
            output_hook=lambda msg: outputs.append(msg["content"].get("text", "")),
        )  # fmt: skip
        assert after["content"]["status"] == "ok"
        assert "".join(outputs).count("awake") == 4  # the same ranks, still there


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_session_with_its_root_cause(kernel_env):
    nb = execute_notebook(
        "%distrun session start --nodes 2 --procs-per-node 2",
        "%%distrun\nimport os, time\nif os.environ['RANK'] == '2':\n    os._exit(3)\n"
        "time.sleep(60)\n",
        "%%distrun\nprint('never')",
        "%%distrun\nprint('a job of its own', flush=True)",
        allow_errors=True,
    )
    job_id = re.search(r"\(job (\S+)\)", stream_text(nb.cells[1])).group(1)
    died = nb.cells[2].outputs[-1]
    assert died.ename == "SessionEnded"
    assert died.evalue.startswith(f"session session has ended: Job {job_id} failed.")
    assert "Root cause: rank 2 on local1 (127.0.0.1) exited with code 3" in died.evalue
    told = nb.cells[3].outputs[-1]  # the next cell says so once ...
    assert told.ename == "SessionEnded" and told.evalue == died.evalue
    assert "[rank 0] a job of its own" in stream_text(nb.cells[4])  # ... then cells are jobs
    assert job_processes(job_id) == []


def test_a_session_across_ssh_nodes_keeps_its_process_group(ssh_nodes, kernel_env, tmp_path):
    """The same session over the SSH test nodes: ranks on each node, the group of cell 1
    used by cell 2; stopping leaves nothing on a node (the ssh_nodes fixture checks)."""
    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    nb = execute_notebook(
        f"%distrun session start --nodes 2 --procs-per-node 2 --nodes-file {inventory} "
        "--env GLOO_SOCKET_IFNAME=eth0",
        "%%distrun\nimport socket, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\nrank = dist.get_rank()",
        "%%distrun\nt = torch.tensor([float(rank)])\ndist.all_reduce(t)\n"
        "print(rank, socket.gethostname(), t.item())",
        "%distrun session stop",
    )
    text = stream_text(nb.cells[3])
    for rank in range(4):
        assert f"[rank {rank}] {rank} node{rank // 2} 6.0" in text, text


@pytest.mark.slow
def test_values_in_and_out_and_a_cell_on_some_ranks(kernel_env):
    nb = execute_notebook(
        "%distrun session start --nodes 2 --procs-per-node 2",
        "scale = 5",
        "%%distrun -i scale -o result --out-all\nimport os\nrank = int(os.environ['RANK'])\n"
        "result = rank * scale",
        "print(result)",
        "%%distrun -o result\nresult = (rank, scale + 1)",
        "print(result)",
        "%%distrun --ranks 0,2\nprint('only', rank)\nresult = -rank",
        "%%distrun -o result\nprint('all', rank)",
        "print(result)",
        "%%distrun --ranks 7\nprint('never')",
        "%distrun session start --name other --ranks 1",
        "%distrun session stop",
        allow_errors=True,
    )
    out = [stream_text(cell) for cell in nb.cells[1:]]
    assert out[3] == "[0, 5, 10, 15]\n"  # every rank's value, pushed scale included
    assert out[5] == "(0, 6)\n"  # rank 0's, the pushed global still there a cell later
    assert sorted(out[6].splitlines()) == ["[rank 0] only 0", "[rank 2] only 2"]
    assert out[8] == "0\n"  # rank 0 ran the --ranks cell: its result is -0
    wrong = nb.cells[10].outputs[-1]
    assert wrong.evalue == "--ranks: session session has no rank 7 (its ranks: 0-3)"
    misplaced = nb.cells[11].outputs[-1]
    assert misplaced.evalue == "--ranks applies to a cell, not to %distrun session start"


@pytest.mark.slow
def test_a_killed_kernel_leaves_no_rank_behind(kernel_env):
    """SIGKILL of the kernel: every rank's agent sees its input end and stops its rank."""
    import signal
    import time

    with running_kernel() as (km, kc):
        job_id = _session_in(kc)
        assert len(job_processes(job_id)) >= 4
        km.signal_kernel(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while job_processes(job_id):
            assert time.monotonic() < deadline, job_processes(job_id)
            time.sleep(0.2)


# Prints "waiting" once the cell's thread has sat on one instruction inside all_reduce for
# half a second (stuck in gloo, where SIGINT cannot reach it); rank 0 at once. Printed before
# the call, it let an interrupt on a busy machine land before the all_reduce began.
_SAY_WAITING_WHEN_STUCK = """import sys, threading, time
def _say_waiting(main=threading.main_thread().ident):
    seen, since = None, time.monotonic()
    while time.monotonic() - since < 0.5 or seen is None:
        time.sleep(0.05)
        frame, names = sys._current_frames()[main], set()
        here = (frame.f_code, frame.f_lasti)
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if here != seen or 'all_reduce' not in names:
            seen, since = (here if 'all_reduce' in names else None), time.monotonic()
    print('waiting', flush=True)
if rank == 0:
    print('waiting', flush=True)
else:
    threading.Thread(target=_say_waiting, daemon=True).start()"""


@pytest.mark.slow
def test_an_interrupt_while_ranks_hang_in_a_collective_breaks_the_session(kernel_env):
    """Ranks 1-3 wait in an all_reduce rank 0 never joins: SIGINT cannot reach them inside
    gloo, so after the grace period the session is broken, and nothing is left."""
    with running_kernel() as (km, kc):
        job_id = _session_in(kc)
        kc.execute_interactive(
            "%%distrun\nimport torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\nrank = dist.get_rank()",
            timeout=120,
        )
        msg_id = kc.execute(f"%%distrun\n{_SAY_WAITING_WHEN_STUCK}\nif rank != 0:\n"
                            "    dist.all_reduce(torch.ones(1))\n")  # fmt: skip
        assert await_text(kc, "waiting", 4) == 4
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["ename"] == "SessionEnded", reply["content"]
        assert (
            "ranks 1-3 did not come back from an interrupt within 10 s"
            in (reply["content"]["evalue"])
        )
        assert job_processes(job_id) == []


def test_a_dropped_ssh_connection_ends_the_session_and_leaves_nothing(ssh_nodes, store, tmp_path):
    """node1's link drops while the session waits between cells: its agents stop their
    ranks, node0's are stopped too, and the next cell says the session ended and why."""
    spec = parse_spec(
        "command: unused\nresources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    inventory = ssh_nodes.load_inventory(tmp_path)
    session = Session.start(spec, name="s", store=store, inventory=inventory, grace_period=3)
    try:
        assert session.run_cell("import os\nrank = int(os.environ['RANK'])").ok
        job_id = session.job.job_id
        assert len(ssh_nodes.job_processes(job_id)) >= 4
        ssh_nodes.drop_sessions(ssh_nodes.nodes[1])
        result = session.job.wait(60)
        assert result is not None and result.state == "failed"
        assert result.root_cause.node == "node1"
        assert "lost its SSH connection" in result.root_cause.summary()
        with pytest.raises(
            SessionEnded, match=r"(?s)session s has ended: .*lost its SSH connection"
        ):
            session.run_cell("print(rank)")
    finally:
        if session.alive:
            session.stop()
    deadline = time.monotonic() + 15
    while ssh_nodes.job_processes(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ssh_nodes.job_processes(job_id) == []


@pytest.mark.slow
def test_an_interrupt_that_comes_after_its_cell_ended_leaves_the_rank_alive(tmp_path):
    """The kernel's interrupt races a rank's report of a cell that just ended: one that
    arrives while the rank reports is ignored (it used to end the rank); one that arrives
    in a cell's code fails that cell; the rank runs the next cell either way."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from jupyter_dist import node_side
    from jupyter_dist.node_side.session_worker import MARK

    worker = Path(node_side.__file__).parent / "session_worker.py"
    env = {**os.environ, "DISTRUN_JOB_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(worker)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip

    def run(cell: int, code: str) -> dict:
        proc.stdin.write(json.dumps({"cell": cell, "code": code}) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith(f"{MARK} done "):
                return json.loads(line[len(MARK) + 6 :])
        raise AssertionError(f"the rank ended (exit {proc.wait()})")

    interrupt_in = (
        "import os, signal, threading\n"
        "threading.Timer({}, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
    )
    try:
        assert proc.stdout.readline().startswith(f"{MARK} ready ")
        # the report (its memory reading) takes 1 s; the interrupt comes 0.3 s into it
        slow_report = ("import __main__, time\nread = __main__.memory\n"
                       "__main__.memory = lambda: (time.sleep(1), read())[1]\n")  # fmt: skip
        assert run(1, slow_report + interrupt_in.format(0.3))["ok"] is True
        failed = run(2, interrupt_in.format(0.3) + "import time\ntime.sleep(30)\n")
        assert failed["ok"] is False and failed["type"] == "KeyboardInterrupt"
        assert run(3, "x = 1\n")["ok"] is True
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_an_interrupt_while_a_cell_is_handed_over_interrupts_it_on_every_rank(store):
    """A Ctrl-C that lands while the kernel writes the cell to the ranks (as it did on a
    busy machine, in the write to the first rank's stdin) is held until every rank has
    the cell, then interrupts it on all of them; the session stays in step: the next
    cell runs on every rank."""
    import signal

    session = Session.start(
        parse_spec("command: unused\nresources: {instance_count: 1}\n"
                   "distribution: {type: pytorch, process_count_per_instance: 2}"),
        store=store,
    )  # fmt: skip
    try:
        real_feed, fed = session.job.feed, []

        def feed_interrupted(name: str, data: bytes) -> None:
            if not fed:  # Ctrl-C arrives as the first rank is being written to
                os.kill(os.getpid(), signal.SIGINT)
            real_feed(name, data)
            fed.append(name)

        session.job.feed = feed_interrupted
        with pytest.raises(KeyboardInterrupt):
            session.run_cell("import time\nfor _ in range(300): time.sleep(0.1)\n")
        assert len(fed) == 2  # both ranks got the cell before the interrupt was raised
        session.job.feed = real_feed
        result = session.run_cell("print('next', 1)\n")
        assert result.ok and len(result.reports) == 2, result
    finally:
        session.stop()
    assert job_processes(session.job.job_id) == []


def _pipes(pid: int) -> dict[str, int]:
    """The pipes process `pid` holds open: `pipe:[INODE]` -> its descriptor."""
    held = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("pipe:"):
                held[target] = int(fd)
    return held


def test_a_local_ranks_cells_reach_it_without_its_agent(store):
    """On local nodes each rank reads its cells from a pipe of its own that the launcher
    writes to: its agent holds no end of it (a relay through the agent woke one more
    process per rank on every warm cell). The pipe goes with the session."""
    session = Session.start(
        parse_spec("command: unused\nresources: {instance_count: 2}\n"),
        store=store,
    )  # fmt: skip
    try:
        commands = {p: Path(f"/proc/{p}/cmdline").read_text()
                    for p in job_processes(session.job.job_id)}  # fmt: skip
        ranks = [p for p, c in commands.items() if "session_worker" in c and "agent" not in c]
        assert len(ranks) == 2, ranks
        inputs = []
        for rank in ranks:
            stdin = os.readlink(f"/proc/{rank}/fd/0")
            assert stdin.startswith("pipe:"), stdin
            agent = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert "agent.py" in Path(f"/proc/{agent}/cmdline").read_text()
            assert stdin not in _pipes(agent)  # the agent relays nothing
            assert stdin in _pipes(os.getpid())  # the launcher writes it
            inputs.append(stdin)
        result = session.run_cell("import os\nprint('rank', os.environ['RANK'])\n")
        assert result.ok and len(result.reports) == 2, result
    finally:
        session.stop()
    assert job_processes(session.job.job_id) == []
    assert not set(inputs) & set(_pipes(os.getpid()))  # closed once the ranks ended
