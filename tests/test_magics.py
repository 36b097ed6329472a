"""%%distrun in a real IPython kernel, driven by nbclient and jupyter_client."""

from __future__ import annotations

import os
import queue
import re
import time

import pytest
from helpers import (
    execute_notebook,
    interrupt_and_reply,
    job_processes,
    running_kernel,
    stream_text,
)
from nbclient.exceptions import CellExecutionError


@pytest.mark.slow
def test_a_pytorch_job_from_a_cell(kernel_env):
    nb = execute_notebook(
        "%%distrun --nodes 2 --procs-per-node 2 --env GREETING=hi\n"
        "import os\n"
        "print(os.environ['GREETING'], 'from rank', os.environ['RANK'],\n"
        "      'of', os.environ['WORLD_SIZE'], 'node', os.environ['NODE_RANK'])\n"
    )
    text = stream_text(nb.cells[1])
    for rank in range(4):
        assert f"[rank {rank}] hi from rank {rank} of 4 node {rank // 2}" in text
    # The saved notebook keeps the lines; the store has them too.
    (job,) = os.listdir(kernel_env)
    assert (
        (kernel_env / job / "logs" / "rank-3.stdout.log")
        .read_text()
        .endswith("hi from rank 3 of 4 node 1\n")
    )


@pytest.mark.slow
def test_a_finished_cell_ends_like_python_without_finalization_crashes(kernel_env, tmp_path):
    # What a normal exit does still happens: threads are waited for, exit handlers run with
    # the cell's globals, files the cell left open are flushed, C's stdout is not lost
    # (MPI_Finalize: the MPI example notebook). A native crash during interpreter teardown
    # (here an object that aborts when its module is finalized) does not turn a cell that
    # did its work into a failed rank.
    nb = execute_notebook(
        "%%distrun --nodes 2\n"
        "import atexit, ctypes, os, sys, threading, time, types\n"
        "rank = os.environ['RANK']\n"
        "ctypes.CDLL(None).printf(b'native line %s\\n', rank.encode())\n"
        f"folder = {str(tmp_path)!r}\n"
        "left_open = open(f'{folder}/open-{rank}.txt', 'w')\n"
        "left_open.write('buffered, never closed')\n"
        "late = lambda: (time.sleep(0.5), open(f'{folder}/thread-{rank}.txt', 'w').write('x'))\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(lambda: print('exit handler sees rank', rank))\n"
        "class AbortsWhenFinalized:\n"
        "    def __del__(self):\n"
        "        os.abort()\n"
        "sys.modules['bomb'] = bomb = types.ModuleType('bomb')\n"
        "bomb.it = AbortsWhenFinalized()\n"
    )
    text = stream_text(nb.cells[1])
    for rank in (0, 1):
        assert f"[rank {rank}] exit handler sees rank {rank}" in text
        assert f"[rank {rank}] native line {rank}" in text
        assert (tmp_path / f"open-{rank}.txt").read_text() == "buffered, never closed"
        assert (tmp_path / f"thread-{rank}.txt").read_text() == "x"


@pytest.mark.slow
def test_a_cell_runs_as_python_would_run_it_as_a_script(kernel_env):
    # __file__, argv and a real __main__ module: spawned processes find the cell's functions.
    nb = execute_notebook(
        "%%distrun --nodes 1\n"
        "import multiprocessing, os, sys\n"
        "def square(x):\n"
        "    return x * x\n"
        "if __name__ == '__main__':\n"
        "    print('file', os.path.basename(__file__), 'argv', [a[-9:] for a in sys.argv])\n"
        "    with multiprocessing.get_context('spawn').Pool(2) as pool:\n"
        "        print('squares', pool.map(square, [1, 2, 3]))\n"
    )
    text = stream_text(nb.cells[1])
    assert "file script.py argv ['script.py']" in text
    assert "squares [1, 4, 9]" in text


@pytest.mark.slow
def test_real_ddp_in_a_cell(kernel_env):
    nb = execute_notebook(
        "%%distrun --nodes 2 --procs-per-node 2 --env OMP_NUM_THREADS=1\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item())\n"
        "dist.destroy_process_group()\n"
    )
    assert stream_text(nb.cells[1]).count("sum 10.0") == 4


@pytest.mark.slow
def test_a_failing_rank_fails_the_cell_with_the_root_cause(kernel_env):
    with pytest.raises(CellExecutionError) as info:
        execute_notebook(
            "%%distrun --nodes 2 --procs-per-node 2\n"
            "import os, time\n"
            "if os.environ['RANK'] == '3':\n"
            "    raise KeyError('missing shard')\n"
            "time.sleep(60)\n"
        )
    error = info.value
    assert error.ename == "JobFailed"
    assert "Root cause: rank 3 on local1 (127.0.0.1) exited with code 1" in error.evalue
    assert "KeyError: 'missing shard'" in error.evalue
    # Headless (nbclient, the text view): no view above it, so the error holds it all.
    assert "(details above)" not in str(error) and "KeyError: 'missing shard'" in str(error)
    assert 'script.py", line 3, in <module>' in error.evalue  # the cell's own traceback
    assert "jupyter_dist/" not in str(error)  # no traceback through our internals
    assert "cell_runner" not in str(error)


@pytest.mark.slow
def test_dry_run_shows_spec_plan_and_tf_config(kernel_env):
    nb = execute_notebook(
        "%%distrun --type tensorflow --nodes 2 --worker-count 2 --ps-count 1 --chief --dry-run\n"
        "print('never runs')\n"
    )
    text = stream_text(nb.cells[1])
    assert "type: tensorflow" in text and "parameter_server_count: 1" in text
    assert re.search(r"ps-0\s+ps\s+local1", text)
    assert '"task": {\n    "type": "ps",\n    "index": 0\n  }' in text  # pretty-printed
    assert re.search(r"\nps 0 on local1:\n  env .*TF_CONFIG=.*agent\.py", text)  # its command
    assert "never runs" not in text.replace("print('never runs')", "")
    assert not kernel_env.exists() or os.listdir(kernel_env) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--nodes 0", "resources.instance_count: 0 is not valid"),
        ("--type pytorch --worker-count 2", "--worker-count applies to tensorflow jobs only"),
        ("--type caffe", "unknown type 'caffe'"),
        ("--env NOEQUALS", "--env: 'NOEQUALS' is not NAME=VALUE"),
        ("--nodes two", "argument -n/--nodes: invalid int value: 'two'"),
        ("--env RANK=3", "RANK cannot be set here"),
        ("--backend ssh --partition gpu", "--partition applies to the slurm backend only"),
    ],
)
def test_bad_options_give_one_line(kernel_env, line, message):
    with pytest.raises(CellExecutionError) as info:
        execute_notebook(f"%%distrun {line}\nprint(1)\n")
    assert info.value.ename == "DistrunError"
    assert message in info.value.evalue and "\n" not in info.value.evalue.strip()


@pytest.mark.slow
def test_a_cell_that_is_not_python_is_refused_before_anything_starts(kernel_env):
    """A shell escape, a magic or a syntax error in a cell would fail on every rank once
    the nodes were taken: it is one line naming the line, and no job is made. In a warm
    session the cell is refused the same way, and the session lives on."""
    nb = execute_notebook(
        "%%distrun --nodes 2\nimport os\n!nvidia-smi\n",
        "%%distrun --nodes 2\nfor rank in range(2)\n    print(rank)\n",
        "%distrun session start --nodes 1 --procs-per-node 2",
        "%%distrun\nx = 1\n%time y = 2\n",
        "%%distrun\nimport os\nprint('still here', os.environ['RANK'])",
        "%distrun session stop",
        allow_errors=True,
    )
    refusals = [nb.cells[n].outputs[-1] for n in (1, 2, 4)]
    assert [(r.output_type, r.ename) for r in refusals] == [("error", "DistrunError")] * 3
    assert refusals[0].evalue == (
        "%%distrun: script: line 2, '!nvidia-smi', is IPython syntax, not Python: the ranks "
        "run the cell as a Python script (run a shell command with subprocess.run, and a "
        "magic in a cell of its own)"
    )
    assert refusals[1].evalue.startswith(
        "%%distrun: script: line 1, 'for rank in range(2)': expected ':' (the ranks run it "
        "as Python; checked with Python "
    )
    assert refusals[2].evalue.startswith("session session: line 2, '%time y = 2', is IPython")
    assert all("\n" not in r.evalue for r in refusals)
    out = stream_text(nb.cells[5])
    assert "[rank 0] still here 0" in out and "[rank 1] still here 1" in out
    jobs = sorted(os.listdir(kernel_env))
    assert len(jobs) == 1  # the session's: the refused cells made none


@pytest.mark.slow
def test_line_commands(kernel_env, tmp_path):
    spec = tmp_path / "job.yml"
    spec.write_text("command: echo from $RANK\nresources: {instance_count: 2}\n")
    nb = execute_notebook(
        f"%distrun run {spec}", "%distrun jobs", "%distrun logs --rank 0", allow_errors=True
    )
    assert "[rank 1] from 1" in stream_text(nb.cells[1])
    assert stream_text(nb.cells[3]) == "from 0\n"  # no JOB: the latest of this kernel
    (job,) = os.listdir(kernel_env)
    nb = execute_notebook(
        f"%distrun logs {job} --rank 1", "%distrun bogus", f"%distrun inspect {job}",
        "%distrun inspect", allow_errors=True,
    )  # fmt: skip
    assert stream_text(nb.cells[1]) == "from 1\n"
    assert nb.cells[2].outputs[0].ename == "DistrunError"
    assert "unknown command 'bogus'" in nb.cells[2].outputs[0].evalue
    assert nb.cells[3].outputs and all(o.output_type != "error" for o in nb.cells[3].outputs)
    assert "no job has run in this kernel yet" in nb.cells[4].outputs[0].evalue


@pytest.mark.slow
def test_logs_in_a_notebook_show_the_last_lines_unless_told(kernel_env):
    """A cell holding a whole long log would stall the page: `%distrun logs` shows the
    last NOTEBOOK_LOG_LINES and says how many came before; --tail 0 shows every one."""
    from jupyter_dist.job_commands import NOTEBOOK_LOG_LINES

    total = NOTEBOOK_LOG_LINES + 7
    nb = execute_notebook(
        f"%%distrun\nfor i in range({total}):\n    print(i)\n",
        "%distrun logs",
        "%distrun logs --tail 0",
    )
    shown = [o for o in nb.cells[2].outputs if o.output_type == "stream"]
    said = {o.name: o.text for o in shown}
    assert said["stderr"] == "(7 earlier lines left out; --tail 0 shows every one)\n"
    assert said["stdout"].split() == [str(i) for i in range(7, total)]
    assert len(stream_text(nb.cells[3]).split()) == total


@pytest.mark.slow
def test_interrupt_cancels_every_rank_and_the_kernel_lives_on(kernel_env):
    with running_kernel() as (km, kc):
        msg_id = kc.execute("%%distrun --nodes 2 --procs-per-node 2\nimport time\n"
                            "print('started', flush=True)\ntime.sleep(300)\n")  # fmt: skip
        seen, job_id = 0, None
        deadline = time.monotonic() + 60
        while seen < 4 and time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            text = msg["content"].get("text", "")
            seen += text.count("started")
            found = re.search(r"job (\S+):", text)
            job_id = job_id or (found and found.group(1))
        assert seen == 4 and job_id
        assert len(job_processes(job_id)) >= 8
        started = time.monotonic()
        reply = interrupt_and_reply(km, kc, msg_id)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - started < 30
        assert job_processes(job_id) == []
        assert (kernel_env / job_id / "status.json").read_text().count('"cancelled"') == 1
        after = kc.execute_interactive("print(6 * 7)", timeout=30)
        assert after["content"]["status"] == "ok"


@pytest.mark.slow
def test_push_variables_in_and_values_out(kernel_env):
    nb = execute_notebook(
        "import numpy as np\nscale = 3\nweights = np.arange(4.0)\ndouble = lambda x: x * 2",
        "%%distrun --nodes 2 --procs-per-node 2 -i scale,weights,double -o result,rank "
        "--out-all\nimport os\nrank = int(os.environ['RANK'])\n"
        "result = double(weights * scale + rank)",
        "print(rank, [r.tolist() for r in result])",
        "%%distrun --nodes 2 -o first\nimport os\nfirst = {'rank': int(os.environ['RANK'])}",
        "print(first)",
    )
    assert stream_text(nb.cells[3]) == (
        "[0, 1, 2, 3] [[0.0, 6.0, 12.0, 18.0], [2.0, 8.0, 14.0, 20.0], "
        "[4.0, 10.0, 16.0, 22.0], [6.0, 12.0, 18.0, 24.0]]\n"
    )
    assert stream_text(nb.cells[5]) == "{'rank': 0}\n"  # -o alone: rank 0's value


@pytest.mark.slow
def test_push_and_out_errors_name_the_variable(kernel_env):
    nb = execute_notebook(
        "import threading\nlock = threading.Lock()",
        "%%distrun -i lock\nprint(1)",
        "%%distrun -i undefined_thing\nprint(1)",
        "%%distrun -o nothere\nx = 1",
        "%%distrun -o 'not-a-name'\nx = 1",
        allow_errors=True,
    )
    errors = [c.outputs[-1] for c in nb.cells[2:]]
    assert all(e.output_type == "error" and e.ename == "DistrunError" for e in errors)
    assert errors[0].evalue.startswith("--push: 'lock' (lock) cannot be sent to the ranks")
    assert errors[1].evalue == "--push: 'undefined_thing' is not defined in the notebook"
    assert errors[2].evalue == "--out: 'nothere' is not defined after the cell on 1 of 1 processes"
    assert "is not a Python variable name" in errors[3].evalue


def test_out_from_ssh_nodes(kernel_env, ssh_nodes, tmp_path):
    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml")
    nb = execute_notebook(
        "offset = 100",
        f"%%distrun --nodes 2 --nodes-file {inventory} -i offset -o where --out-all\n"
        "import os, socket\nwhere = (socket.gethostname(), int(os.environ['RANK']) + offset)",
        "print(where)",
    )
    assert stream_text(nb.cells[3]) == "[('node0', 100), ('node1', 101)]\n"


def test_report_in_a_cell_on_nodes_without_jupyter_dist(kernel_env, ssh_nodes, tmp_path):
    """A cell's ranks on SSH nodes whose Python is the system's (no jupyter-dist): `from
    distrun import report` works there, and the metrics reach the store."""
    from jupyter_dist.run.metrics import read_metrics
    from jupyter_dist.store import JobStore

    inventory = ssh_nodes.write_inventory(tmp_path / "nodes.yml", python="/usr/bin/python3")
    nb = execute_notebook(
        f"%%distrun --nodes 2 --nodes-file {inventory} --name reported\n"
        "import os\nfrom distrun import report\n"
        "for step in range(3):\n    report(step=step, loss=float(os.environ['RANK']) + step)"
    )
    assert nb.cells[1].outputs[-1].get("output_type") != "error"
    (record,) = JobStore(kernel_env).jobs()
    records, _ = read_metrics(record)
    assert sorted((r["k"], r["s"], r["m"]["loss"]) for r in records) == [
        (f"rank-{rank}", step, float(rank + step)) for rank in range(2) for step in range(3)
    ]
