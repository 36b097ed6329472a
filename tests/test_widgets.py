"""The live view, checked through a real kernel: its state, the messages it sent, and
the plain-text form that notebooks saved without widgets keep."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import execute_notebook, running_kernel

import jupyter_dist.widgets.live as live

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


STATE = (
    "from jupyter_dist.widgets.live import LiveView\n"
    "v = LiveView.last\n"
    "print(v.state, sorted(p['state'] for p in v.processes), v.messages_sent, v.lines_sent,\n"
    "      v.lines_skipped, v.lines_total, sep='|')"
)


@pytest.mark.slow
def test_live_view_state_messages_and_text_form(kernel_env):
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --nodes 2 --procs-per-node 4\n"
        "import os, time\n"
        "for i in range(5000):\n"
        "    print('\\x1b[32mstep\\x1b[0m', i, 'of rank', os.environ['RANK'])\n"
        "    if i % 1000 == 0:\n"
        "        time.sleep(0.1)\n",
        STATE,
    )
    (display,) = nb.cells[2].outputs
    assert display.output_type == "display_data" and WIDGET_MIME in display.data
    text = display.data["text/plain"]
    assert text.startswith("job ") and ": succeeded (full logs: " in text
    assert text.count(": succeeded (0)") == 8  # every process, with its exit code
    assert "step\x1b[0m 4999 of rank" in text  # the last lines, prefixed by rank
    state, statuses, messages, sent, skipped, total = nb.cells[3].outputs[0].text.strip().split("|")
    assert state == "succeeded" and statuses == str(["succeeded"] * 8)
    assert int(sent) + int(skipped) == 8 * 5000  # every line, or counted as left to the store
    assert int(total) == 8 * 5000  # what a page loaded again knows it missed
    assert 1 <= int(messages) <= 8 * 5000 / 100  # deltas in batches, not a message per line


@pytest.mark.slow
def test_messages_are_rate_bounded(kernel_env):
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "import time\nstarted = time.monotonic()",
        "%%distrun --nodes 1 --procs-per-node 4\n"
        "import time\nend = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n    print('tick', flush=True)\n    time.sleep(0.001)\n",
        STATE + "\nprint(int(v.messages_sent / (time.monotonic() - started) * 10))",
    )
    per_second_x10 = int(nb.cells[4].outputs[0].text.strip().splitlines()[-1])
    assert per_second_x10 <= 110  # at most about ten messages a second


@pytest.mark.slow
def test_failed_job_shows_the_root_cause_in_the_view(kernel_env):
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --nodes 2\nimport os\nif os.environ['RANK'] == '1':\n"
        "    raise SystemExit('rank 1 is out of memory')\n",
        "from jupyter_dist.widgets.live import LiveView\nprint(LiveView.last.root_cause)",
        allow_errors=True,
    )
    display, error = nb.cells[2].outputs
    assert "Root cause: rank 1 on local1" in display.data["text/plain"]
    assert error.ename == "JobFailed"
    # The view shows the cause in full; the cell's error is one line pointing at it.
    assert error.traceback == [
        "JobFailed: rank 1 on local1 (127.0.0.1) exited with code 1: rank 1 is out of memory "
        "(details above)"
    ]
    assert "Root cause: rank 1" in error.evalue  # the whole text, for code that reads it
    assert (
        nb.cells[3]
        .outputs[0]
        .text.startswith(
            "Root cause: rank 1 on local1 (127.0.0.1) exited with code 1: rank 1 is out of memory"
        )
    )


@pytest.mark.slow
def test_auto_picks_the_widget_under_a_jupyter_server(kernel_env, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/work/analysis.ipynb")  # set by Jupyter Server
    nb = execute_notebook("%%distrun\nprint('hello')")
    assert WIDGET_MIME in nb.cells[1].outputs[0].data
    monkeypatch.delenv("JPY_SESSION_NAME")
    nb = execute_notebook("%%distrun\nprint('hello')")  # nbclient / papermill: plain text
    assert "[rank 0] hello" in "".join(o.get("text", "") for o in nb.cells[1].outputs)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("name", ["live.js", "live_loader.js"])
def test_front_end_module_parses(name):
    source = Path(live.__file__).with_name(name)
    done = subprocess.run(["node", "--check", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_form_validates_previews_and_submits_through_the_magics_path(kernel_env):
    nb = execute_notebook(
        "from jupyter_dist.widgets.form import SubmitForm\nf = SubmitForm()\n"
        "print(f.problem.value)\nprint(f.submit_button.disabled)",
        "f.script.value = \"import os\\nprint(os.environ['GREETING'], os.environ['RANK'])\"\n"
        "f.nodes.value = 0\nprint(f.problem.value)\nprint(f.submit_button.disabled)",
        "f.nodes.value = 2\nf.procs_per_node.value = 2\nf.env.value = 'GREETING=hi'\n"
        "print(f.problem.value == '', f.submit_button.disabled)\nprint(f.preview.value)",
        "result = f.submit()\nprint(result.state)\n"
        "from jupyter_dist.widgets.live import LiveView\n"
        "print(sorted(LiveView.last.text().splitlines()[-4:]))",
        "f.type.value = 'tensorflow'\nf.ps_count.value = 1\nf.chief.value = True\n"
        "print(f.preview.value)",
        "%distrun form",
        "print(repr(f.backend.label), repr(f.backend.value), f.spec().backend)",
    )
    out = ["".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells[1:]]
    assert "code: write the code every process runs" in out[0] and out[0].endswith("True\n")
    assert "resources.instance_count: 0 is not valid; expected a whole number from 1 to" in out[1]
    assert out[1].endswith("True\n")  # nothing to submit while the spec is invalid
    assert out[2].startswith("True False\n")
    assert "GREETING: hi" in out[2] and "process_count_per_instance: 2" in out[2]
    assert out[3].startswith("succeeded\n")
    assert "'[rank 3] hi 3'" in out[3]
    assert "type: tensorflow" in out[4] and "parameter_server_count: 1" in out[4]
    assert "chief_count: 1" in out[4] and "process_count_per_instance" not in out[4]
    assert WIDGET_MIME in nb.cells[6].outputs[0].data  # %distrun form shows the form
    # The backend control starts on a visible choice, "automatic": no backend section.
    assert out[6] == "'automatic' '' None\n"


@pytest.mark.slow
def test_the_live_view_carries_the_inspector_columns(kernel_env):
    """Who is who in the cell's view: ranks, master, role and each task's TF_CONFIG."""
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        # The ps waits as a real parameter server would: the workers' end stops it,
        # so its state is "stopped" every time rather than a race with its own exit.
        "%%distrun --type tensorflow --worker-count 2 --ps-count 1\n"
        "import json, os, time\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'ps':\n"
        "    time.sleep(60)\n"
        "print('ok')\n",
        "import json\nfrom jupyter_dist.widgets.live import LiveView\n"
        "print(json.dumps(LiveView.last.processes))",
        # Every rank sees the one GPU: a check the view shows (the job itself runs on CPU).
        "%%distrun --nodes 2 --procs-per-node 2 --env CUDA_VISIBLE_DEVICES=0\nprint('ok')\n",
        "print(json.dumps(LiveView.last.processes))\nprint(json.dumps(LiveView.last.checks))",
        # Where a job's outputs are (inspect says it too): among the inspector's lines.
        "import os, tempfile\nspec_file = os.path.join(tempfile.mkdtemp(), 'outputs.yml')\n"
        "open(spec_file, 'w').write('command: echo hi > ${{outputs.model}}/f\\n'\n"
        "                           'outputs: {model: {}}\\n')",
        "%distrun run $spec_file",
        "print(json.dumps(LiveView.last.checks))",
    )
    import json

    tf_rows = json.loads(nb.cells[3].outputs[0].text)
    assert [(r["process"], r["role"], r["state"]) for r in tf_rows] == [
        ("worker-0", "worker", "succeeded"), ("worker-1", "worker", "succeeded"),
        ("ps-0", "ps", "stopped"),
    ]  # fmt: skip
    configs = [json.loads(r["tf_config"]) for r in tf_rows]
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1}, {"type": "ps", "index": 0},
    ]  # fmt: skip
    assert len(configs[0]["cluster"]["ps"]) == 1
    rows_text, checks_text = nb.cells[5].outputs[0].text.splitlines()
    assert json.loads(checks_text) == [
        "the 2 ranks on each of local0, local1 all see CUDA_VISIBLE_DEVICES=0 (1 device): "
        "ranks using CUDA would share one (NCCL refuses that); list one device per rank, or "
        "pick each rank's by LOCAL_RANK"
    ]
    (outputs_line,) = json.loads(nb.cells[8].outputs[0].text)
    assert re.fullmatch(r"outputs\.model: /.+/\d{8}-\d{6}-\d{3}-\w{6}/outputs/model", outputs_line)
    final_text = nb.cells[4].outputs[-1].data["text/plain"]  # the settled view's text form
    assert "Check: the 2 ranks on each of local0, local1" in final_text
    torch_rows = json.loads(rows_text)
    assert [r["rank"] for r in torch_rows] == ["0", "1", "2", "3"]
    assert [(r["node_rank"], r["local_rank"]) for r in torch_rows] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert {r["world_size"] for r in torch_rows} == {4}
    assert len({r["master"] for r in torch_rows}) == 1 and ":" in torch_rows[0]["master"]


@pytest.mark.slow
def test_a_page_loaded_again_gets_the_last_lines_of_every_tab_from_the_store(kernel_env):
    """What the view answers a page that missed lines (the browser side is test_lab's)."""
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%%distrun --nodes 2\nimport os, sys\nfor i in range(30):\n"
        "    print('line', i, 'of rank', os.environ['RANK'], flush=True)\n"
        "print('done', file=sys.stderr)\n",
        "import json\nfrom jupyter_dist.widgets.live import LiveView\n"
        "v = LiveView.last\nv.max_lines = 4\nprint(json.dumps(v.stored_lines()))\n"
        "v.max_lines = 100\nprint(v.lines_total, json.dumps(v.stored_lines()))",
    )
    last_four, everything = nb.cells[3].outputs[0].text.splitlines()
    total, everything = everything.split(" ", 1)
    assert int(total) == 2 * 31
    for rank in (0, 1):
        key, label = f"rank-{rank}", f"rank {rank}"
        own = [line for line in json.loads(last_four) if line[0] == key]
        assert len(own) == 4 and all(line[1] == label for line in own)
        # stdout and stderr are separate pipes, so "done" may be stamped before the last
        # stdout lines: the last four by time hold it or not, and stdout's own order.
        out = [text for _, _, stream, text in own if stream == "stdout"]
        assert len(out) >= 3 and out == [
            f"line {i} of rank {rank}" for i in range(30 - len(out), 30)
        ]
        assert [line for line in own if line[2] == "stderr"] in (
            [],
            [[key, label, "stderr", "done"]],
        )
        every = [line for line in json.loads(everything) if line[0] == key]
        assert [line[3] for line in every if line[2] == "stdout"] == [
            f"line {i} of rank {rank}" for i in range(30)
        ]
        assert [line for line in every if line[2] == "stderr"] == [[key, label, "stderr", "done"]]


@pytest.mark.slow
def test_a_session_cell_has_a_live_view_of_its_own_ranks_and_lines(kernel_env):
    """In a session each cell gets its view: only its ranks, its lines (also read back
    from the store for a reloaded page), each rank's outcome and the errors as the root
    cause; the ranks live on for the next cell."""
    view = (
        "import json\nfrom jupyter_dist.widgets.live import LiveView\nv = LiveView.last\n"
        "from jupyter_dist.widgets.session_view import CellView\n"
        "assert type(v) is CellView, type(v).__mro__  # no class of its own for each view\n"
        "assert v.layout is None  # nor a Layout widget\n"
        "print(json.dumps([v.cell, v.name, v.state, [(p['label'], p['state']) "
        "for p in v.processes], v.lines_total, v.root_cause, v.stored_lines()]))"
    )
    nb = execute_notebook(
        "%config DistrunMagics.view = 'widget'",
        "%distrun session start --nodes 2",
        "%%distrun\nimport os\nrank = int(os.environ['RANK'])\nprint('first', rank)",
        "%%distrun\nprint('second', rank)\nif rank == 1:\n    raise KeyError('no shard')",
        view,
        "%%distrun --ranks 0\nprint('third', rank)",
        view,
        "%distrun session stop",
        allow_errors=True,
    )
    (display,) = [o for o in nb.cells[4].outputs if o.output_type == "display_data"]
    assert WIDGET_MIME in display.data
    text = display.data["text/plain"]
    assert text.startswith("session session cell 2: failed (logs: jupyter distrun logs ")
    assert text.rstrip().endswith("KeyError: 'no shard'")  # the root cause, last
    assert "[rank 1] second 1" in text and "first" not in text
    assert nb.cells[4].outputs[-1].ename == "CellFailed"
    cell, name, state, rows, total, cause, stored = json.loads(nb.cells[5].outputs[0].text)
    assert (cell, name, state) == (2, "session · cell 2", "failed")
    assert rows == [["rank 0", "succeeded"], ["rank 1", "failed"]]
    assert cause.startswith("rank 1: KeyError: 'no shard'\nTraceback")
    stdout = sorted(line[3] for line in stored if line[2] == "stdout")
    assert stdout == ["second 0", "second 1"]  # not cell 1's, not the marker
    assert total == len(stored)  # every line the view had is in the store
    cell, name, state, rows, total, cause, stored = json.loads(nb.cells[7].outputs[0].text)
    assert (cell, state, rows, cause) == (3, "succeeded", [["rank 0", "succeeded"]], "")
    assert [line[:4] for line in stored] == [["rank-0", "rank 0", "stdout", "third 0"]]


@pytest.mark.slow
def test_a_warm_cells_view_reaches_the_page_settled_in_one_opening_message(kernel_env):
    """A session cell that ends within LIVE_AFTER_S: the page hears of its view once, as
    it ended (the comm's opening message carries the final state), then its lines, then the
    display; no state update follows (there were two, and one open as running, before).
    The view's code came once, with the kernel's first view (LiveCode): the cell's opening
    message carries a loader that names it, not live.js and live.css (68 KB a cell). A
    quick cell that succeeded and said nothing shows nothing (no widget, no display), as
    a Python cell that prints nothing; one that failed without a word shows its view."""
    earlier: list[dict] = []
    with running_kernel() as (_km, kc):
        for code in ("%config DistrunMagics.view = 'widget'",
                     "%distrun session start --nodes 2",
                     "%%distrun\nimport os\nrank = int(os.environ['RANK'])\nprint(1)"):  # fmt: skip
            reply = kc.execute_interactive(code, timeout=120, output_hook=earlier.append)
            assert reply["content"]["status"] == "ok"
        silent: list[dict] = []
        reply = kc.execute_interactive("%%distrun\nx = rank", timeout=60,
                                       output_hook=silent.append)  # fmt: skip
        assert reply["content"]["status"] == "ok"
        heard: list[dict] = []
        reply = kc.execute_interactive(
            "%%distrun\nprint('hello from', x)", timeout=60, output_hook=heard.append
        )
        assert reply["content"]["status"] == "ok"
        failed: list[dict] = []
        reply = kc.execute_interactive("%%distrun\nif rank == 1:\n    del x\nx", timeout=60,
                                       output_hook=failed.append)  # fmt: skip
        assert reply["content"]["status"] == "error"
        kc.execute_interactive("%distrun session stop", timeout=60)
    assert [m["msg_type"] for m in silent] == ["status", "execute_input", "status"]
    kinds = [m["msg_type"] for m in failed]
    assert "comm_open" in kinds and "display_data" in kinds, kinds
    (opened,) = [m for m in failed if m["msg_type"] == "comm_open"]
    assert opened["content"]["data"]["state"]["state"] == "failed"
    kinds = [m["msg_type"] for m in heard if m["msg_type"] != "status"]
    opened = [m for m in heard if m["msg_type"] == "comm_open"]
    assert len(opened) == 1, kinds
    comm_id, state = opened[0]["content"]["comm_id"], opened[0]["content"]["data"]["state"]
    assert len(json.dumps(opened[0]["content"])) < 8000
    assert state["_esm"] == live.LiveView._esm.default_value  # the loader alone
    code = {m["content"]["comm_id"]: m["content"]["data"]["state"]
            for m in earlier if m["msg_type"] == "comm_open"}[state["_code"]]  # fmt: skip
    assert code["code"] == Path(live.__file__).with_name("live.js").read_text()
    assert code["style"] == Path(live.__file__).with_name("live.css").read_text()
    assert (state["cell"], state["state"], state["lines_total"]) == (3, "succeeded", 2)
    assert state["final"] is True  # the page's last view of this cell (distrun-final)
    assert [row["state"] for row in state["processes"]] == ["succeeded", "succeeded"]
    own = [m for m in heard if m["content"].get("comm_id") == comm_id]
    sent = [m["content"]["data"] for m in own if m["msg_type"] == "comm_msg"]
    assert [s["method"] for s in sent] == ["custom"], sent  # no "update"
    lines = sent[0]["content"]
    assert lines["type"] == "lines" and lines["total"] == 2
    assert sorted(line[3] for line in lines["lines"]) == ["hello from 0", "hello from 1"]
    assert kinds.index("comm_open") < kinds.index("comm_msg") < kinds.index("display_data")
    (shown,) = [m for m in heard if m["msg_type"] == "display_data"]
    assert shown["content"]["data"][WIDGET_MIME]["model_id"] == comm_id


@pytest.mark.slow
def test_the_form_exports_the_job_it_shows_and_says_what_cannot_be(kernel_env, tmp_path):
    nb = execute_notebook(
        "from jupyter_dist.widgets.form import SubmitForm\nf = SubmitForm()\n"
        "f.script.value = 'print(1)'\nf.nodes.value = 2\nf.name.value = 'train'\n"
        f"f.export_to.value = '{tmp_path}/out/'\n"
        "exported = f.export()\nprint(sorted(exported.files), exported.format)\n"
        "print(f.output.outputs)",
        "f.type.value = 'dask'\nf.export_format.value = 'azureml'\nprint(f.export())\n"
        "print(f.problem.value)",
    )
    out = ["".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells[1:]]
    assert out[0].startswith("['train.py', 'train.sbatch'] sbatch\n")
    script = (tmp_path / "out" / "train.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --job-name=train" in script
    assert (tmp_path / "out" / "train.py").read_text().endswith("print(1)\n")
    assert "azureml: distribution.type: dask cannot be exported" in out[1]
    assert out[1].startswith("None\n")
