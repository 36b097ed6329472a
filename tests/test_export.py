"""Export: a job written for another scheduler. sbatch scripts run with `sbatch --wait` on
the real test cluster and give every rank what jupyter-dist gives it; Azure ML files pass
Azure ML's own loader (azure-ai-ml, strict) and our loader reads them back into the same
job; what a format cannot say is one line naming the setting and the format."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from helpers import AZURE_JOB, DASK_JOB, EXAMPLES, execute_notebook, run_cli, stream_text

from jupyter_dist.backends.slurm import salloc_argv
from jupyter_dist.errors import ExportError
from jupyter_dist.export import ExportTarget, export, write
from jupyter_dist.spec import load_spec, parse_spec

SRC = EXAMPLES / "src"
GLOO = "{GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: '1'}"
JOBS = {
    "per_process": f"""\
        code: {SRC}
        command: python ddp_train.py --epochs 2
        environment_variables: {GLOO}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2}}
        """,
    "torchrun": f"""\
        code: {SRC}
        command: python ddp_train.py --epochs 2
        environment_variables: {GLOO}
        resources: {{instance_count: 2}}
        distribution: {{type: pytorch, process_count_per_instance: 2, launcher: torchrun}}
        """,
    "mpi": f"""\
        code: {SRC}
        command: python mpi_allreduce.py
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, process_count_per_instance: 2}}
        """,
    "tensorflow": f"""\
        code: {SRC}
        command: python tf_mwms_train.py
        environment_variables: {{OMP_NUM_THREADS: '1'}}
        resources: {{instance_count: 2}}
        distribution: {{type: tensorflow, worker_count: 2}}
        """,
    "dask": DASK_JOB,
    "tensorflow_ps": """\
        command: python train.py
        resources: {instance_count: 3}
        distribution: {type: tensorflow, worker_count: 2, parameter_server_count: 1,
                       chief_count: 1, evaluator_count: 1}
        """,
}


def _spec_file(folder: Path, kind: str, name: str = "job.yml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(JOBS[kind]))
    return path


def _sbatch(folder: Path, name: str, env: dict, timeout: float = 300):
    """`sbatch --wait NAME` from `folder`: (its exit code, the job's output)."""
    for old in folder.glob("slurm-*.out"):
        old.unlink()
    done = subprocess.run(
        ["sbatch", "--wait", name], cwd=folder, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    outputs = list(folder.glob("slurm-*.out"))
    assert len(outputs) == 1, done.stderr
    return done.returncode, outputs[0].read_text()


def _reports(output: str) -> list[dict]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in output.splitlines()
            if "RESULT {" in line]  # fmt: skip


@pytest.fixture
def cluster_env(slurm_cluster):
    """A submitter's environment: the cluster's SLURM_CONF, this venv's python first on
    PATH (sbatch hands the environment to the job, as on a cluster with a venv active).
    Afterwards, nothing of the job is left on a node."""
    bin_dir = str(Path(__import__("sys").executable).parent)
    env = {**slurm_cluster.env, "PATH": f"{bin_dir}:{slurm_cluster.env['PATH']}"}
    env.pop("SLURM_JOB_ID", None)
    yield env
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs() or any(slurm_cluster.pids(n) for n in slurm_cluster.nodes):
        assert time.monotonic() < deadline, "the exported job left something on the nodes"
        time.sleep(0.2)


# -- sbatch, run on the real cluster ---------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("kind", ["per_process", "torchrun"])
def test_an_exported_ddp_job_runs_under_sbatch_with_every_rank_on_its_node(
    kind, cluster_env, slurm_cluster, tmp_path
):
    spec = _spec_file(tmp_path, kind)
    done = run_cli("export", str(spec), "--to", "sbatch", "-o", f"{tmp_path}/out/")
    assert done.returncode == 0, done.stderr
    assert "run it with: sbatch --wait job.sbatch" in done.stderr
    code, output = _sbatch(tmp_path / "out", "job.sbatch", cluster_env)
    assert code == 0, output[-3000:]
    reports = {r["rank"]: r for r in _reports(output)}
    assert sorted(reports) == [0, 1, 2, 3]
    node0 = slurm_cluster.nodes[0].host
    for rank, report in reports.items():
        assert report["host"] == f"sln{rank // 2 + 1}"  # really on that node
        assert report["world_size"] == 4 and report["env"]["MASTER_ADDR"] == node0
        assert report["local_rank"] == rank % 2 and report["node_rank"] == rank // 2
        assert report["allreduce"] == 10.0  # 1 + 2 + 3 + 4: every rank took part
    prefix = "[node 1] [default1]:RESULT" if kind == "torchrun" else "[rank 3] RESULT"
    assert prefix in output


@pytest.mark.slurm
def test_an_exported_mpi_job_runs_mpirun_inside_the_allocation(
    cluster_env, slurm_cluster, tmp_path
):
    spec = _spec_file(tmp_path, "mpi")
    assert run_cli("export", str(spec), "--to", "sbatch", "-o", f"{tmp_path}/").returncode == 0
    code, output = _sbatch(tmp_path, "job.sbatch", cluster_env)
    assert code == 0, output[-3000:]
    reports = {r["rank"]: r for r in _reports(output)}
    assert sorted(reports) == [0, 1, 2, 3]
    node0, node1 = (n.host for n in slurm_cluster.nodes)
    for rank, report in reports.items():
        assert report["mpi_rank"] == rank and report["size"] == 4 and report["allreduce"] == 10
        assert report["host"] == f"sln{rank // 2 + 1}"
        assert report["master"] == [node0, 29500]
        assert report["hostfile"] == [f"{node0} slots=2", f"{node1} slots=2"]


@pytest.mark.slurm
@pytest.mark.tensorflow
def test_an_exported_tensorflow_job_gives_each_worker_its_tf_config(cluster_env, tmp_path):
    spec = _spec_file(tmp_path, "tensorflow")
    assert run_cli("export", str(spec), "--to", "sbatch", "-o", f"{tmp_path}/").returncode == 0
    code, output = _sbatch(tmp_path, "job.sbatch", cluster_env)
    assert code == 0, output[-3000:]
    reports = {r["rank"]: r for r in _reports(output)}
    assert [reports[i]["host"] for i in (0, 1)] == ["sln1", "sln2"]
    assert {r["allreduce"] for r in reports.values()} == {3.0}  # both replicas took part
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


@pytest.mark.slurm
@pytest.mark.dask
def test_an_exported_dask_job_stops_its_cluster_when_the_command_ends(cluster_env, tmp_path):
    spec = _spec_file(tmp_path, "dask")
    assert run_cli("export", str(spec), "--to", "sbatch", "-o", f"{tmp_path}/").returncode == 0
    code, output = _sbatch(tmp_path, "job.sbatch", cluster_env)
    assert code == 0, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("[client] ")]
    assert lines == ["[client] workers 4 on ['sln1', 'sln2']", "[client] total 328350"]


@pytest.mark.slurm
def test_the_first_failing_rank_ends_the_exported_job_with_its_code(cluster_env, tmp_path):
    """Fail-fast: rank 2 exits 3 after a second; the others would sleep for five minutes.
    A value full of shell syntax reaches every rank as it was written."""
    tricky = 'it\'s $HOME `id` "quoted" $(touch /tmp/distrun-export-pwned) \\ end'
    (tmp_path / "job.yml").write_text(
        "command: >-\n"
        '  echo "TRICKY=$TRICKY";\n'
        '  if [ "$RANK" = 2 ]; then sleep 1; echo "rank 2 gives up" >&2; exit 3; fi; sleep 300\n'
        f"environment_variables: {{TRICKY: {json.dumps(tricky)}}}\n"
        "resources: {instance_count: 2}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}\n"
    )
    assert run_cli("export", str(tmp_path / "job.yml"), "--to", "sbatch", "-o",
                   f"{tmp_path}/").returncode == 0  # fmt: skip
    started = time.monotonic()
    code, output = _sbatch(tmp_path, "job.sbatch", cluster_env)
    assert code == 3 and time.monotonic() - started < 120
    assert "[rank 2] rank 2 gives up" in output
    assert "jupyter-dist: rank 2 on sln2 exited with code 3" in output
    for rank in range(4):
        assert f"[rank {rank}] TRICKY={tricky}" in output
    assert not Path("/tmp/distrun-export-pwned").exists()


@pytest.mark.slurm
def test_a_cell_exported_from_the_notebook_runs_under_sbatch(cluster_env, tmp_path):
    nb = execute_notebook(
        f"%%distrun --export sbatch --export-to {tmp_path}/out/ --name hello --nodes 2 "
        "--procs-per-node 2 --env GREETING=hi\n"
        "import os, socket\n"
        "print(os.environ['GREETING'], 'from rank', os.environ['RANK'], 'of',\n"
        "      os.environ['WORLD_SIZE'], 'on', socket.gethostname())\n"
    )
    said = stream_text(nb.cells[1])
    assert f"Wrote hello.sbatch, hello.py in {tmp_path}/out" in said
    assert "Run it with: sbatch --wait hello.sbatch" in said and "#SBATCH --nodes=2" in said
    assert (tmp_path / "out" / "hello.py").read_text().endswith("socket.gethostname())\n")
    code, output = _sbatch(tmp_path / "out", "hello.sbatch", cluster_env)
    assert code == 0, output[-3000:]
    for rank in range(4):
        assert f"[rank {rank}] hi from rank {rank} of 4 on sln{rank // 2 + 1}" in output


# -- sbatch, the script itself -----------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(JOBS))
def test_every_sbatch_script_is_valid_bash_and_resolves_every_placeholder(kind, tmp_path):
    spec = load_spec(_spec_file(tmp_path, kind))
    exported = export(spec, "sbatch", ExportTarget.at(f"{tmp_path}/"))
    (path,) = write(exported)
    text = path.read_text()
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "@@distrun" not in text
    assert text.count("\ndistrun_step ") == len(_planned(spec))
    assert path.stat().st_mode & 0o111  # executable, as a script


def _planned(spec):
    from jupyter_dist.export.symbolic import symbolic_plan

    return symbolic_plan(spec, "python").processes


def test_sbatch_asks_slurm_for_what_the_slurm_backend_would(tmp_path):
    spec = parse_spec(
        "command: x\nname: big run\nresources: {instance_count: 2}\nlimits: {timeout: 90}\n"
        "distribution: {type: pytorch, process_count_per_instance: 4}\n"
        "backend: {type: slurm, partition: gpu, gpus_per_node: 4, account: ml}\n"
    )
    text = export(spec, "sbatch", ExportTarget.at(f"{tmp_path}/")).files["distrun_job.sbatch"]
    lines = [line.removeprefix("#SBATCH ") for line in text.splitlines() if "#SBATCH" in line]
    asked = salloc_argv(spec)[2:]
    assert lines == [
        *(a.replace("=jupyter-dist", "=big-run") for a in asked), "--time=2",
    ]  # fmt: skip
    assert "--partition=gpu" in lines and "--gpus-per-node=4" in lines


# -- Azure ML ----------------------------------------------------------------------------


AZURE_EXPRESSIBLE = {
    "pytorch": "distribution: {type: pytorch, process_count_per_instance: 4}\n",
    "tensorflow": "distribution: {type: tensorflow, worker_count: 2, parameter_server_count: 1}\n",
    "mpi": "distribution: {type: mpi, process_count_per_instance: 2}\n",
}


def _azure_check(path: Path) -> None:
    """Azure ML's own loader (azure-ai-ml): unknown keys, types and enums fail it. (Its
    schemas warn of their own deprecations by the hundred: not ours to see.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from azure.ai.ml import load_job

        load_job(source=path)


@pytest.mark.parametrize("kind", sorted(AZURE_EXPRESSIBLE))
def test_azureml_round_trips_every_job_type_through_our_loader_and_azures(kind, tmp_path):
    (tmp_path / "code").mkdir()
    spec = parse_spec(
        "code: code\ncommand: python train.py --lr ${{inputs.lr}}\ninputs: {lr: 0.1}\n"
        "environment_variables: {NCCL_DEBUG: INFO}\nresources: {instance_count: 2}\n"
        "limits: {timeout: 3600}\nname: my-run\n" + AZURE_EXPRESSIBLE[kind],
        base_dir=tmp_path,
    )
    exported = export(spec, "azureml", ExportTarget.at(f"{tmp_path}/", image="python:3.11"))
    (path,) = write(exported)
    _azure_check(path)
    again = load_spec(path)
    assert again.distribution == spec.distribution
    assert again.resources == spec.resources and again.limits == spec.limits
    assert again.resolved_command() == "python train.py --lr 0.1"
    assert again.environment_variables == spec.environment_variables
    assert again.code_dir() == spec.code_dir()
    assert again.display_name_or_default() == "my-run"
    assert again.environment == {"image": "python:3.11"}


def test_azures_own_example_job_comes_back_unchanged(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "job.yml").write_text(AZURE_JOB)
    spec = load_spec(tmp_path / "job.yml")
    (path,) = write(export(spec, "azureml", ExportTarget.at(tmp_path / "exported.yml")))
    _azure_check(path)
    again = load_spec(path).to_dict()
    assert again.pop("type") == "command"
    assert again == spec.to_dict()


def test_azures_loader_is_strict_so_a_typo_fails_it(tmp_path):
    spec = parse_spec("command: x\n" + AZURE_EXPRESSIBLE["pytorch"])
    (path,) = write(export(spec, "azureml", ExportTarget.at(f"{tmp_path}/", image="img")))
    _azure_check(path)
    path.write_text(path.read_text().replace("process_count_per_instance", "proces_count"))
    with pytest.raises(Exception, match="proces_count"):
        _azure_check(path)


def test_what_azure_ml_does_itself_is_left_out_and_listed(tmp_path):
    spec = parse_spec(
        "command: x\nnodes: [a, b]\nlimits: {stall_timeout: 60}\nbackend: {type: ssh}\n"
        "distribution: {type: pytorch, launcher: torchrun, master_port: 29600}\n"
    )
    (path,) = write(export(spec, "azureml", ExportTarget.at(f"{tmp_path}/", image="img")))
    _azure_check(path)
    header = path.read_text().split("$schema")[0]
    for left_out in ("distribution.launcher: torchrun", "distribution.master_port: 29600",
                     "nodes", "backend", "limits.stall_timeout"):  # fmt: skip
        assert left_out in header
    assert load_spec(path).distribution.launcher == "per_process"


# -- what cannot be exported -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "spec", "message"),
    [
        ("azureml", "distribution: {type: dask}\n",
         "azureml: distribution.type: dask cannot be exported: Azure ML has no such"),
        ("azureml", "distribution: {type: tensorflow, chief_count: 1}\n",
         "azureml: distribution.chief_count cannot be exported: Azure ML's TensorFlow jobs"),
        ("azureml", "distribution: {type: mpi, mpi_args: '--bind-to core'}\n",
         "azureml: distribution.mpi_args cannot be exported"),
        ("sbatch", "distribution: {type: mpi, launcher: horovodrun}\n",
         "sbatch: distribution.launcher: horovodrun cannot be exported"),
        ("sbatch", "backend: {type: slurm, partition: 'a b'}\n",
         "sbatch: partition 'a b' cannot be exported: an #SBATCH line cannot carry spaces"),
    ],
)  # fmt: skip
def test_what_a_format_cannot_say_is_one_line_naming_setting_and_format(
    fmt, spec, message, tmp_path
):
    path = tmp_path / "job.yml"
    path.write_text("command: x\n" + spec)
    done = run_cli("export", str(path), "--to", fmt, "--image", "img")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: " + message) and done.stderr.count("\n") == 1


def test_an_interactive_dask_cluster_and_a_missing_image_are_refused(tmp_path):
    with pytest.raises(ExportError, match="sbatch: a Dask job without a command cannot"):
        export(parse_spec("distribution: {type: dask}"), "sbatch", ExportTarget.at(tmp_path))
    with pytest.raises(ExportError, match="give --image IMAGE, or set environment:"):
        export(parse_spec("command: x"), "azureml", ExportTarget.at(tmp_path))


def test_a_file_export_did_not_write_is_never_replaced(tmp_path):
    spec = parse_spec("script: print(1)\n")
    mine = tmp_path / "distrun_job.py"
    mine.write_text("my own work\n")
    with pytest.raises(ExportError, match=r"distrun_job\.py exists and was not written by"):
        write(export(spec, "sbatch", ExportTarget.at(tmp_path)))
    assert mine.read_text() == "my own work\n"
    assert not (tmp_path / "distrun_job.sbatch").exists()  # nothing written at all
    mine.unlink()
    write(export(spec, "sbatch", ExportTarget.at(tmp_path)))
    again = parse_spec("script: print(2)\n")
    write(export(again, "sbatch", ExportTarget.at(tmp_path)))  # ours: replaced
    assert mine.read_text().endswith("print(2)\n")


def test_without_a_path_the_cli_prints_the_manifest(tmp_path):
    spec = _spec_file(tmp_path, "per_process")
    done = run_cli("export", str(spec), "--to", "sbatch", "--nodes", "3")
    assert done.returncode == 0 and done.stdout.startswith("#!/bin/bash\n#SBATCH --nodes=3\n")
    assert re.search(r"^# rank 5$", done.stdout, re.M) and list(tmp_path.iterdir()) == [spec]
