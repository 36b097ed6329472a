"""From a warm session to a job (issue 45): the cells that worked, in the order they ran,
exported from a real kernel and run again with `jupyter distrun run`."""

from __future__ import annotations

import os
import re
import subprocess

import k8s_schema
import pytest
import yaml
from helpers import execute_notebook, run_cli, stream_text

pytestmark = pytest.mark.slow  # a real kernel, a session of 2 ranks with torch, then a job

JOIN = (
    "%%distrun\n"
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "rank = dist.get_rank()\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)
FAILS_ON_RANK_1 = "%%distrun\nif rank == 1:\n    raise ValueError('bad batch')\n"
TRAIN = (
    "%%distrun\n"
    "g = torch.Generator().manual_seed(rank)\n"
    "for step in range(5):\n"
    "    loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
)
CHECKSUM = (
    "%%distrun\nsums = round(sum(float(p.sum()) for p in model.parameters()), 6)\n"
    "print('checksum', rank, sums)\n"
)


def test_a_sessions_cells_that_worked_run_again_as_one_job(kernel_env, tmp_path):
    """A 2-rank session: join and build a model, a cell failing on rank 1, train, a
    checksum of the weights, a cell given a value from the notebook. The export refuses
    that last cell in one line; without it (--cells), the job spec runs with `jupyter
    distrun run` and prints the session's very checksum; the failed cell is named in the
    header and left out. sbatch and Kubeflow exports of the same pass `bash -n` and
    Kubernetes' own models; bad --cells are one line each."""
    out = tmp_path / "export"
    nb = execute_notebook(
        "%distrun session start --nodes 2",
        JOIN, FAILS_ON_RANK_1, TRAIN, CHECKSUM,
        "v = 3",
        "%%distrun -i v\nw = v + 1\n",
        "%distrun session export",  # refused: its cell 5 used -i
        f"%distrun session export --cells 1-4 -o {out}/",
        f"%distrun session export --cells 1-4 --to sbatch -o {out}/sbatch/",
        f"%distrun session export --cells 1-4 --to kubeflow --image python:3.11 -o {out}/kf/",
        "%distrun session export --cells 2",
        "%distrun session export --cells 9",
        "%distrun session export --cells 1-x",
        "%distrun session stop",
        allow_errors=True, timeout=300,
    )  # fmt: skip
    text = [stream_text(cell) for cell in nb.cells]
    sums = re.findall(r"\[rank \d\] checksum (\d) (\S+)", text[5])  # (cell 0 loads us)
    assert len(sums) == 2 and sums[0][1] == sums[1][1], text[5]  # DDP: the same weights

    def error(cell: int) -> str:
        (found,) = [o for o in nb.cells[cell].outputs if o.output_type == "error"]
        assert "\n" not in found.evalue, found.evalue
        return found.evalue

    assert error(8) == (
        "cell 5 was given values from the notebook (-i), which a job cannot have; leave it "
        "out with --cells (e.g. --cells 1,3,4)"
    )
    assert error(12) == "session session: no cell to export (none ended well on every rank)"
    assert error(13) == "--cells: the session ran no cell 9 (it ran cells 1-5)"
    assert error(14) == "--cells: '1-x' is no cell number or range (e.g. 1,3-5)"

    spec_path = out / "session-export.yml"
    said = text[9]
    assert f"wrote {spec_path}" in said, said
    assert "cell 2 left out: failed: rank 1: ValueError: bad batch" in said, said
    assert "cell 5 left out: not in --cells" in said, said
    exported = spec_path.read_text()
    assert oct(spec_path.stat().st_mode & 0o777) == "0o600"
    script = yaml.safe_load(exported)["script"]
    assert re.search(r"#   cell 2, run [\d-]+ [\d:]+: left out: failed: rank 1: ValueError", script)
    assert "raise ValueError" not in script and "w = v + 1" not in script
    assert [int(n) for n in re.findall(r"^# -- cell (\d+)", script, re.M)] == [1, 3, 4]

    again_home = {**os.environ, "DISTRUN_HOME": str(tmp_path / "again")}
    ran = run_cli("run", str(spec_path), env=again_home, timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    again = re.findall(r"\[rank \d\] checksum (\d) (\S+)", ran.stdout)
    assert sorted(again) == sorted(sums), (again, sums)

    sbatch = next((out / "sbatch").glob("*.sbatch"))
    checked = subprocess.run(["bash", "-n", str(sbatch)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert (out / "sbatch" / "session-export.py").read_text().endswith(script)
    for document in yaml.safe_load_all(next((out / "kf").glob("*.yaml")).read_text()):
        k8s_schema.check(document)


def test_a_session_is_exported_from_a_terminal_by_its_name(kernel_env, tmp_path):
    """`jupyter distrun export NAME --to yaml` for a session started in a kernel (stopped
    since), with a cell run on rank 1 alone: the job runs that cell on rank 1 alone too; a
    spec file's options and a name nobody has are one line."""
    nb = execute_notebook(
        "%distrun session start --nodes 1 --procs-per-node 2 --name warm",
        "%%distrun\nimport os\nx = int(os.environ['RANK']) + 40\n",
        "%%distrun --ranks 1\nx += 100\n",
        "%%distrun\nprint('x is', x)\n",
        "%distrun session stop",
    )
    said = stream_text(nb.cells[4])
    assert "[rank 0] x is 40" in said and "[rank 1] x is 141" in said, said
    home = {**os.environ, "DISTRUN_HOME": str(kernel_env.parent)}
    done = run_cli("export", "warm", "--to", "yaml", "-o", f"{tmp_path}/", env=home)
    assert done.returncode == 0, done.stderr
    spec_path = tmp_path / "warm-export.yml"
    script = yaml.safe_load(spec_path.read_text())["script"]
    assert "x = int(os.environ['RANK']) + 40" in script and "print('x is', x)" in script
    assert "# (on rank 1 only)" in script, script
    ran = run_cli("run", str(spec_path), env={**home, "DISTRUN_HOME": str(tmp_path / "again")})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "[rank 0] x is 40" in ran.stdout and "[rank 1] x is 141" in ran.stdout, ran.stdout
    for args, said in (
        (["nobody"], f"error: no session named 'nobody' or with job id 'nobody' in {kernel_env}"),
        (["warm", "--nodes", "3"], "error: --nodes applies to a spec file; a session's export "
                                   "has the session's own nodes and ranks"),
    ):  # fmt: skip
        refused = run_cli("export", *args, "--to", "yaml", env=home)
        assert refused.returncode != 0 and refused.stderr.strip() == said, refused.stderr


def test_an_interrupted_cell_is_left_out_and_named(kernel_env, tmp_path):
    """A cell interrupted in a session (Ctrl-C in the notebook) is named in the export's
    header, `interrupted`, and left out; the cells around it are kept."""
    from helpers import await_text, interrupt_and_reply, running_kernel

    with running_kernel() as (km, kc):
        for code in ("%distrun session start --nodes 1 --procs-per-node 2 --name cut",
                     "%%distrun\nx = 1"):  # fmt: skip
            assert kc.execute_interactive(code, timeout=120)["content"]["status"] == "ok"
        msg_id = kc.execute("%%distrun\nimport time\nprint('sleeping', flush=True)\n"
                            "time.sleep(300)\n")  # fmt: skip
        assert await_text(kc, "sleeping", 2) == 2
        assert interrupt_and_reply(km, kc, msg_id)["content"]["ename"] == "KeyboardInterrupt"
        for code in ("%%distrun\ny = x + 1", f"%distrun session export -o {tmp_path}/",
                     "%distrun session stop"):  # fmt: skip
            assert kc.execute_interactive(code, timeout=120)["content"]["status"] == "ok"
    script = yaml.safe_load((tmp_path / "cut-export.yml").read_text())["script"]
    assert re.search(r"^#   cell 2, run [\d-]+ [\d:]+: left out: interrupted$", script, re.M)
    assert [int(n) for n in re.findall(r"^# -- cell (\d+)", script, re.M)] == [1, 3], script
