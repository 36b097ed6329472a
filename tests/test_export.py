"""Export: a job written for another scheduler. sbatch scripts run with `sbatch --wait` on
the real test cluster and give every rank what jupyter-dist gives it; Azure ML files pass
Azure ML's own loader (azure-ai-ml, strict) and our loader reads them back into the same
job; what a format cannot say is one line naming the setting and the format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import k8s_schema
import pytest
from helpers import AZURE_JOB, DASK_JOB, EXAMPLES, execute_notebook, run_cli, stream_text

from jupyter_dist.backends.slurm import allocation_options
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
    "horovod": f"""\
        code: {SRC}
        command: python horovod_train.py
        resources: {{instance_count: 2}}
        distribution: {{type: mpi, launcher: horovodrun, process_count_per_instance: 2,
                       mpi_args: [--gloo]}}
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


def _exported_and_run(folder: Path, kind: str, env: dict) -> str:
    """JOBS[kind] exported by the CLI into `folder` and run there with `sbatch --wait`,
    which must succeed; the job's output."""
    spec = _spec_file(folder, kind)
    assert run_cli("export", str(spec), "--to", "sbatch", "-o", f"{folder}/").returncode == 0
    code, output = _sbatch(folder, "job.sbatch", env)
    assert code == 0, output[-3000:]
    return output


def _reports(output: str) -> list[dict]:
    """Every rank's RESULT report. mpirun --tag-output tags fragments, not lines: a rank
    that wrote its report and its newline apart can have another rank's report follow its
    own on the same line, so every report on a line is read."""
    decode = json.JSONDecoder().raw_decode
    return [
        decode(line, found.end())[0]
        for line in output.splitlines()
        for found in re.finditer(r"RESULT (?=\{)", line)
    ]


@pytest.fixture
def cluster_env(slurm_cluster):
    """A submitter's environment: the cluster's SLURM_CONF, this venv's python first on
    PATH (sbatch hands the environment to the job, as on a cluster with a venv active).
    Afterwards, nothing of the job is left on a node."""
    bin_dir = str(Path(sys.executable).parent)
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
    output = _exported_and_run(tmp_path, "mpi", cluster_env)
    reports = {r["rank"]: r for r in _reports(output)}
    assert sorted(reports) == [0, 1, 2, 3]
    node0, node1 = (n.host for n in slurm_cluster.nodes)
    for rank, report in reports.items():
        assert report["mpi_rank"] == rank and report["size"] == 4 and report["allreduce"] == 10
        assert report["host"] == f"sln{rank // 2 + 1}"
        assert report["master"] == [node0, 29500]
        assert report["hostfile"] == [f"{node0} slots=2", f"{node1} slots=2"]


@pytest.mark.slurm
def test_an_exported_horovod_job_runs_horovodrun_inside_the_allocation(
    cluster_env, slurm_cluster, tmp_path
):
    """horovodrun --gloo reaches the other node through the script's srun-as-ssh."""
    output = _exported_and_run(tmp_path, "horovod", cluster_env)
    reports = {r["rank"]: r for r in _reports(output)}
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, report in reports.items():
        assert report["size"] == 4 and report["allreduce"] == 10.0
        assert report["host"] == f"sln{rank // 2 + 1}" and report["local_rank"] == rank % 2
        assert f"[horovodrun] [{rank}]<stdout>:RESULT " in output
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


@pytest.mark.slurm
@pytest.mark.tensorflow
def test_an_exported_tensorflow_job_gives_each_worker_its_tf_config(cluster_env, tmp_path):
    output = _exported_and_run(tmp_path, "tensorflow", cluster_env)
    reports = {r["rank"]: r for r in _reports(output)}
    assert [reports[i]["host"] for i in (0, 1)] == ["sln1", "sln2"]
    assert {r["allreduce"] for r in reports.values()} == {3.0}  # both replicas took part
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1


@pytest.mark.slurm
@pytest.mark.dask
def test_an_exported_dask_job_stops_its_cluster_when_the_command_ends(cluster_env, tmp_path):
    output = _exported_and_run(tmp_path, "dask", cluster_env)
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
    asked = allocation_options(spec)
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


@pytest.mark.slow
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


@pytest.mark.slow  # Azure ML's loader: seconds to import
def test_azures_own_example_job_comes_back_unchanged(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "job.yml").write_text(AZURE_JOB)
    spec = load_spec(tmp_path / "job.yml")
    (path,) = write(export(spec, "azureml", ExportTarget.at(tmp_path / "exported.yml")))
    _azure_check(path)
    again = load_spec(path).to_dict()
    assert again.pop("type") == "command"
    assert again == spec.to_dict()


@pytest.mark.slow  # Azure ML's loader: seconds to import
def test_azures_loader_is_strict_so_a_typo_fails_it(tmp_path):
    spec = parse_spec("command: x\n" + AZURE_EXPRESSIBLE["pytorch"])
    (path,) = write(export(spec, "azureml", ExportTarget.at(f"{tmp_path}/", image="img")))
    _azure_check(path)
    path.write_text(path.read_text().replace("process_count_per_instance", "proces_count"))
    with pytest.raises(Exception, match="proces_count"):
        _azure_check(path)


@pytest.mark.slow  # Azure ML's loader: seconds to import
def test_what_azure_ml_does_itself_is_left_out_and_listed(tmp_path):
    spec = parse_spec(
        "command: x\nnodes: [a, b]\nlimits: {stall_timeout: 60}\nbackend: {type: ssh}\n"
        "distribution: {type: pytorch, launcher: torchrun, master_port: 29600}\n"
        "network_check: false\n"  # ours, before launch: nothing of Azure's
    )
    (path,) = write(export(spec, "azureml", ExportTarget.at(f"{tmp_path}/", image="img")))
    _azure_check(path)
    header = path.read_text().split("$schema")[0]
    for left_out in ("distribution.launcher: torchrun", "distribution.master_port: 29600",
                     "nodes", "backend", "limits.stall_timeout"):  # fmt: skip
        assert left_out in header
    assert load_spec(path).distribution.launcher == "per_process"


@pytest.mark.slow
def test_restarts_go_to_jobsets_failure_policy_and_elsewhere_are_said_to_be_left_out(tmp_path):
    """A JobSet starts the whole job again, as our restarts do: it carries the count. The
    formats that run a job once say so, and Azure's YAML stays loadable by its own loader."""
    spec = parse_spec(
        "command: python train.py\nresources: {instance_count: 2}\n"
        "distribution: {type: pytorch}\nlimits: {max_restarts: 3, restart_delay: 5}\n"
    )
    (jobset,) = _documents(tmp_path / "js", spec, "jobset")
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert not [n for n in export(spec, "jobset", ExportTarget.at(tmp_path, image="i")).notes()
                if "max_restarts" in n]  # fmt: skip
    for fmt in ("kubeflow", "skypilot", "sbatch", "azureml"):
        image = {"image": "img"} if fmt != "sbatch" else {}
        exported = export(spec, fmt, ExportTarget.at(f"{tmp_path}/{fmt}/", **image))
        assert (
            f"Not carried: limits.max_restarts: 3 ({fmt} runs the job once; jobset starts the "
            "whole job again)"
        ) in exported.notes()
    (path,) = write(export(spec, "azureml", ExportTarget.at(f"{tmp_path}/az/", image="img")))
    _azure_check(path)
    header = path.read_text().split("$schema")[0]
    assert "limits.max_restarts" in header and "limits.restart_delay" in header
    done = run_cli("export", str(_write(tmp_path / "r.yml", spec.to_yaml())), "--to", "kubeflow",
                   "--image", "img", "-o", str(tmp_path / "cli/"))  # fmt: skip
    assert done.returncode == 0 and "Not carried: limits.max_restarts: 3" in done.stderr


@pytest.mark.slow
def test_a_pool_and_the_debugger_are_said_to_be_left_out_of_every_export(tmp_path):
    """`preload` and `debug: {post_mortem}` act through jupyter-dist's node agent, which no
    export ships: every format says it leaves them out, none carries their variables or
    keys (Azure's own loader takes the YAML), and the job is otherwise the same."""
    text = ("command: python train.py\nresources: {instance_count: 2}\n"
            "distribution: {type: pytorch}\n")  # fmt: skip
    plain = parse_spec(text)
    spec = parse_spec(text + "preload: [torch, numpy]\ndebug: {post_mortem: true}\n")
    for fmt in ("kubeflow", "jobset", "skypilot", "sbatch", "azureml"):
        image = {"image": "img"} if fmt != "sbatch" else {}
        exported = export(spec, fmt, ExportTarget.at(f"{tmp_path}/{fmt}/", **image))
        notes = [n for n in exported.notes() if n.startswith("Not carried")]
        assert notes == [
            "Not carried: preload: torch, numpy (the ranks start cold: a node's pool is "
            "jupyter-dist's own)",
            "Not carried: debug: {post_mortem: true} (a failed rank exits at once: the "
            "debugger is jupyter-dist's own)",
        ], (fmt, notes)
        manifest = exported.files[exported.manifest]
        for word in ("DISTRUN_PRELOAD", "DISTRUN_POOL_IDLE", "DISTRUN_POST_MORTEM", "preload"):
            assert word not in manifest, (fmt, word)
        same = export(plain, fmt, ExportTarget.at(f"{tmp_path}/{fmt}/", **image))
        assert same.files[same.manifest] == manifest, fmt
        if fmt == "azureml":
            (path,) = write(exported)
            _azure_check(path)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


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
        ("kubeflow", "distribution: {type: mpi, launcher: horovodrun}\n",
         "kubeflow: distribution.launcher: horovodrun cannot be exported"),
        ("sbatch", "backend: {type: slurm, partition: 'a b'}\n",
         "sbatch: partition 'a b' cannot be exported: an #SBATCH line cannot carry spaces"),
        ("kubeflow", "distribution: {type: dask}\n",
         "kubeflow: distribution.type: dask cannot be exported: Kubeflow Training runs"),
        ("jobset", "distribution: {type: tensorflow}\n",
         "jobset: distribution.type: tensorflow cannot be exported: the jobset format writes"),
        ("skypilot", "distribution: {type: dask}\n",
         "skypilot: distribution.type: dask cannot be exported"),
        ("skypilot", "resources: {instance_count: 2}\ndistribution: {type: tensorflow, "
         "parameter_server_count: 1}\n",
         "skypilot: a tensorflow job of 3 processes cannot be exported: SkyPilot runs one"),
    ],
)  # fmt: skip
def test_what_a_format_cannot_say_is_one_line_naming_setting_and_format(
    fmt, spec, message, tmp_path
):
    path = tmp_path / "job.yml"
    path.write_text("command: x\n" + spec)
    image = ["--image", "img"] if fmt != "sbatch" else []
    done = run_cli("export", str(path), "--to", fmt, *image)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: " + message) and done.stderr.count("\n") == 1


def test_an_interactive_dask_cluster_and_a_missing_image_are_refused(tmp_path):
    with pytest.raises(ExportError, match="sbatch: a Dask job without a command cannot"):
        export(parse_spec("distribution: {type: dask}"), "sbatch", ExportTarget.at(tmp_path))
    with pytest.raises(ExportError, match="give --image IMAGE, or set environment:"):
        export(parse_spec("command: x"), "azureml", ExportTarget.at(tmp_path))
    with pytest.raises(ExportError, match="kubeflow: a job without an image cannot be"):
        export(parse_spec("command: x"), "kubeflow", ExportTarget.at(tmp_path))
    with pytest.raises(ExportError, match=r"--image applies to kubeflow, jobset, skypilot, "
                       r"azureml only \(not sbatch\)"):  # fmt: skip
        export(parse_spec("command: x"), "sbatch", ExportTarget.at(tmp_path, image="img"))


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


# -- Kubernetes: Kubeflow's kinds and JobSet ----------------------------------------------

RANK_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "DISTRUN_NODE_RANK", "DISTRUN_NUM_NODES", "GREETING",
)  # fmt: skip
RANK_ENV = (
    "python -c \"import json, os; print('RANKENV ' + json.dumps({k: os.environ.get(k) for k in "
    f'{RANK_KEYS!r}}}))"'
)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pytorch_spec(port: int, nodes: int = 2, per_node: int = 2, launcher: str = "per_process"):
    return parse_spec(
        f"command: {json.dumps(RANK_ENV)}\nname: ddp\n"
        "environment_variables: {GREETING: hi, OMP_NUM_THREADS: '1'}\n"
        f"resources: {{instance_count: {nodes}}}\n"
        f"distribution: {{type: pytorch, process_count_per_instance: {per_node}, "
        f"launcher: {launcher}, master_port: {port}}}\n"
    )


def _documents(tmp_path: Path, spec, fmt: str, **options) -> list[dict]:
    import yaml

    exported = export(spec, fmt, ExportTarget.at(f"{tmp_path}/", image="img:1", **options))
    (path, *_) = write(exported)
    documents = list(yaml.safe_load_all(path.read_text()))
    for document in documents:
        k8s_schema.check(document)  # strictly, as the operators' own models say
    return documents


def _run_pods(commands: list[tuple[list[str], dict[str, str]]], cwd: Path) -> list[dict]:
    """Each (argv, env) at once, as the pods of one job would run, with this venv's python
    first on PATH (as an image's); every rank's RANKENV."""
    import os

    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    procs = [
        subprocess.Popen(argv, env={**os.environ, **env, "PATH": path}, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for argv, env in commands
    ]  # fmt: skip
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(outputs)[-3000:]
    found = [
        json.loads(line.split("RANKENV ", 1)[1])
        for out in outputs for line in out.splitlines() if "RANKENV " in line
    ]  # fmt: skip
    return sorted(found, key=lambda env: int(env["RANK"]))


def _container_env(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def _as_operator_runs(fmt: str, container: dict, port: int, nodes: int, per_node: int):
    """Each node's pod command (argv, env) with what its operator sets in it, here: the
    training operator's index as RANK, its master Service as MASTER_ADDR and the port named
    pytorchjob-port as MASTER_PORT; JobSet's JOB_COMPLETION_INDEX, with node 0's DNS name
    made this machine."""
    env = _container_env(container)
    if fmt == "kubeflow":
        return [
            (container["command"],
             {**env, "RANK": str(pod), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
              "WORLD_SIZE": str(nodes * per_node), "PET_NPROC_PER_NODE": str(per_node),
              "PET_NODE_RANK": str(pod), "PET_NNODES": str(nodes),
              "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
            for pod in range(nodes)
        ]  # fmt: skip
    master = env["MASTER_ADDR"]  # <jobset>-<replicated job>-<job index>-<pod index>.<jobset>
    here = [c.replace(master, "127.0.0.1") for c in container["command"]]
    env["MASTER_ADDR"] = "127.0.0.1"
    return [(here, {**env, "JOB_COMPLETION_INDEX": str(pod)}) for pod in range(nodes)]


def _pod_spec(fmt: str, job: dict) -> dict:
    if fmt == "kubeflow":
        return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _mounted(config_map: dict, volume: dict, folder: Path) -> None:
    """The ConfigMap's files laid out in `folder` as Kubernetes mounts them: each item's key
    at its path (every key at its own name without items), with its mode."""
    import base64

    contents = {k: v.encode() for k, v in config_map.get("data", {}).items()}
    contents |= {k: base64.b64decode(v) for k, v in config_map.get("binaryData", {}).items()}
    items = volume.get("items") or [{"key": key, "path": key} for key in contents]
    for item in items:
        path = folder / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(contents[item["key"]])
        path.chmod(item.get("mode", 0o644))


def _assert_ranks(ranks: list[dict], nodes: int, per_node: int, port: int) -> None:
    """Every rank got jupyter-dist's variables, as a rank of this job on its node."""
    assert [int(r["RANK"]) for r in ranks] == list(range(nodes * per_node))
    for rank, env in enumerate(ranks):
        assert env["WORLD_SIZE"] == str(nodes * per_node)
        assert env["LOCAL_RANK"] == str(rank % per_node)
        assert env["LOCAL_WORLD_SIZE"] == str(per_node)
        assert env["NODE_RANK"] == env["GROUP_RANK"] == env["DISTRUN_NODE_RANK"]
        assert env["NODE_RANK"] == str(rank // per_node)
        assert env["DISTRUN_NUM_NODES"] == str(nodes) and env["GREETING"] == "hi"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(port)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("launcher", ["per_process", "torchrun"])
def test_a_pytorchjob_gives_every_rank_our_variables_from_what_the_operator_sets(
    launcher, tmp_path
):
    """The PyTorchJob passes Kubeflow's own models; then each pod's command runs here with
    what the training operator sets in a pod (its index as RANK, the master Service as
    MASTER_ADDR, the port named pytorchjob-port as MASTER_PORT), and every rank gets the
    variables jupyter-dist gives it."""
    port = _free_port()
    (job,) = _documents(tmp_path, _pytorch_spec(port, launcher=launcher), "kubeflow")
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == (
        "kubeflow.org/v1", "PyTorchJob", "ddp",
    )  # fmt: skip
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {"Master": 1, "Worker": 1}
    assert job["spec"]["nprocPerNode"] == "2"
    (container,) = replicas["Master"]["template"]["spec"]["containers"]
    assert container == replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["image"] == "img:1"
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": port}]
    env = _container_env(container)
    assert not {"RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"} & set(env)  # the operator's
    ranks = _run_pods(_as_operator_runs("kubeflow", container, port, 2, 2), tmp_path)
    _assert_ranks(ranks, nodes=2, per_node=2, port=port)


@pytest.mark.slow
@pytest.mark.torch
def test_a_jobset_runs_one_indexed_pod_per_node_reaching_node_0_by_its_dns_name(tmp_path):
    port = _free_port()
    (jobset,) = _documents(tmp_path, _pytorch_spec(port, nodes=3, per_node=1), "jobset")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert (replicated["name"], replicated["replicas"]) == ("node", 1)
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (3, 3, "Indexed")
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    (container,) = job["template"]["spec"]["containers"]
    script = container["command"][2]
    master = "ddp-node-0-0.ddp"  # <jobset>-<replicated job>-<job index>-<pod index>.<jobset>
    assert (
        f"--master-addr {master} " in script and '--node-rank "${JOB_COMPLETION_INDEX}"' in script
    )
    env = _container_env(container)
    assert env["MASTER_ADDR"] == master and env["MASTER_PORT"] == str(port)
    pods = _as_operator_runs("jobset", container, port, 3, 1)
    _assert_ranks(_run_pods(pods, tmp_path), nodes=3, per_node=1, port=port)


def test_a_tfjob_has_a_replica_type_per_role_at_the_ports_of_our_tf_config(tmp_path):
    spec = load_spec(_spec_file(tmp_path, "tensorflow_ps"))
    (job,) = _documents(tmp_path, spec, "kubeflow")
    replicas = job["spec"]["tfReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {
        "Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1,
    }  # fmt: skip
    planned = {p.role: p for p in _planned(spec)}
    for role, replica_type in (("chief", "Chief"), ("worker", "Worker"), ("ps", "PS")):
        (container,) = replicas[replica_type]["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert container["command"] == ["/bin/sh", "-c", "python train.py"]
        assert "TF_CONFIG" not in _container_env(container)  # the operator writes it
        task = planned[role].tf_config["task"]
        own = planned[role].tf_config["cluster"][task["type"]][task["index"]]
        assert container["ports"] == [{"name": "tfjob-port", "containerPort": int(own[-4:])}]
    assert "successPolicy" not in job["spec"]  # with a chief: done when the chief is


def test_an_mpijob_runs_our_mpirun_in_its_launcher_on_the_operators_hostfile(tmp_path):
    spec = parse_spec(
        "command: python mpi.py\nenvironment_variables: {A: '1'}\n"
        "resources: {instance_count: 3}\ndistribution: {type: mpi, process_count_per_instance: 2}\n"
        "backend: {type: slurm, gpus_per_node: 2}\n"
    )
    (job,) = _documents(tmp_path, spec, "kubeflow")
    body = job["spec"]
    assert body["slotsPerWorker"] == 2
    replicas = body["mpiReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {"Launcher": 1, "Worker": 3}
    (launcher,) = replicas["Launcher"]["template"]["spec"]["containers"]
    (worker,) = replicas["Worker"]["template"]["spec"]["containers"]
    argv = launcher["command"]
    assert argv[:3] == ["mpirun", "-np", "6"] and argv[-3:] == ["/bin/sh", "-c", "python mpi.py"]
    assert "--hostfile" not in argv and "MASTER_ADDR" not in argv  # the operator's hostfile
    env = _container_env(launcher)
    assert env["DISTRUN_MPI_HOSTFILE"] == env["AZUREML_MPI_HOSTFILE"] == "/etc/mpi/hostfile"
    assert env["A"] == "1" and argv[argv.index("A") - 1] == "-x"  # reaches every rank
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": "2"}} and "command" not in worker
    assert "resources" not in launcher


def test_a_cell_reaches_the_pods_in_a_configmap(tmp_path):
    spec = parse_spec("script: print('hello from a pod')\nname: cell\n"
                      "distribution: {type: pytorch}\n")  # fmt: skip
    config_map, job = _documents(tmp_path, spec, "kubeflow")
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "cell-code"
    assert config_map["data"]["distrun_job.py"].endswith("print('hello from a pod')\n")
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "distrun-code", "configMap": {"name": "cell-code"}}]
    (container,) = pod["containers"]
    assert container["workingDir"] == "/distrun/code"
    assert "'python distrun_job.py'" in container["command"][2]


# The seed's code folder: a script that imports a module of a subfolder, and what an
# .amlignore leaves out (its .gitignore is not followed: the .amlignore wins).
SEED_CODE = {
    "train.py": "import argparse\nfrom lib import ranks\n"
                "parser = argparse.ArgumentParser()\n"
                "parser.add_argument('--epochs'); parser.add_argument('--lr')\n"
                "ranks.report(parser.parse_args())\n",
    "lib/__init__.py": "",
    "lib/ranks.py": "import json, os\n"
                    f"KEYS = {RANK_KEYS!r}\n"
                    "def report(args):\n"
                    "    env = {k: os.environ.get(k) for k in KEYS}\n"
                    "    print('RANKENV ' + json.dumps({**env, 'args': [args.epochs, args.lr]}))\n",
    ".amlignore": "data/\n*.ckpt\n",
    ".gitignore": "*.py\n",
    "data/train.csv": "1,2\n",
}  # fmt: skip


def _seed_job(tmp_path: Path) -> Path:
    for path, text in SEED_CODE.items():
        (tmp_path / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / path).write_text(text)
    (tmp_path / "src" / "model.ckpt").write_bytes(b"\x00\xff" * 100)
    (tmp_path / "job.yml").write_text(
        AZURE_JOB + "environment_variables: {GREETING: hi, OMP_NUM_THREADS: '1'}\n"
    )
    return tmp_path / "job.yml"


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("fmt", ["kubeflow", "jobset"])
def test_the_seeds_example_job_ships_its_code_folder_in_a_configmap_and_runs(fmt, tmp_path):
    """Azure ML's own example (`code: src` beside `python train.py ...`) exports as written:
    the folder's files in a ConfigMap (what its .amlignore leaves out named, in the header
    and by the CLI), mounted where the command runs. The manifests pass the operators'
    models; the mount laid out here as Kubernetes lays it out, each pod's command gives 4
    correct ranks, each with the job's inputs."""
    import yaml

    job_file = _seed_job(tmp_path)
    done = run_cli("export", str(job_file), "--to", fmt, "--image", "img:1",
                   "-o", f"{tmp_path}/out/")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Not carried from the code folder: data/, model.ckpt (left out by .amlignore)\n" in (
        done.stderr
    )
    port = _free_port()
    spec = load_spec(job_file).with_overrides(master_port=port)
    config_map, job = _documents(tmp_path / "k8s", spec, fmt)
    manifest = next((tmp_path / "k8s").iterdir()).read_text()
    assert "# Not carried from it: data/, model.ckpt (left out by .amlignore).\n" in manifest
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == (
        "pytorch-cifar-distributed-example-code"
    )
    pod = _pod_spec(fmt, job)
    (volume,) = pod["volumes"]
    paths = sorted(item["path"] for item in volume["configMap"]["items"])
    assert paths == [".amlignore", ".gitignore", "lib/__init__.py", "lib/ranks.py", "train.py"]
    (container,) = pod["containers"]
    assert container["workingDir"] == "/distrun/code"
    assert container["volumeMounts"] == [{"name": "distrun-code", "mountPath": "/distrun/code"}]
    mount = tmp_path / "mount"
    _mounted(config_map, volume["configMap"], mount)
    ranks = _run_pods(_as_operator_runs(fmt, container, port, 2, 2), mount)
    _assert_ranks(ranks, nodes=2, per_node=2, port=port)
    assert all(rank["args"] == ["10", "0.01"] for rank in ranks)
    assert yaml.safe_load(done.stdout or "null") is None  # written, not printed


@pytest.mark.slow
def test_a_code_folder_too_big_for_a_configmap_points_at_the_image_in_one_line(tmp_path):
    job_file = _seed_job(tmp_path)
    (tmp_path / "src" / "vocab.txt").write_text("word\n" * 300_000)  # 1.4 MiB
    done = run_cli("export", str(job_file), "--to", "kubeflow", "--image", "img:1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"error: kubeflow: code: {tmp_path / 'src'} cannot be exported: its files hold 1.4 MiB "
        "and a ConfigMap about 1 MiB; build the folder into the image and give --code-in-image "
        "PATH"
    )
    # The image's copy: no ConfigMap, the command runs where the image has the folder.
    (job,) = _documents(tmp_path, load_spec(job_file), "jobset", code_in_image="/app/src")
    pod = _pod_spec("jobset", job)
    (container,) = pod["containers"]
    assert container["workingDir"] == "/app/src" and "volumes" not in pod
    assert "volumeMounts" not in container
    refused = run_cli("export", str(job_file), "--to", "sbatch", "--code-in-image", "/app")
    assert refused.stderr == (
        "error: --code-in-image applies to kubeflow, jobset only (not sbatch)\n"
    )


def test_a_cell_exported_with_the_images_code_is_mounted_into_that_folder(tmp_path):
    """A cell beside a code folder built into the image: the cell's file alone travels in
    the ConfigMap, mounted into the image's folder where the command runs."""
    spec = parse_spec("script: import helper\nname: cell\ncode: .\n"
                      "distribution: {type: pytorch}\n")  # fmt: skip
    config_map, job = _documents(tmp_path, spec, "kubeflow", code_in_image="/app")
    assert list(config_map["data"]) == ["distrun_job.py"]
    pod = _pod_spec("kubeflow", job)
    (container,) = pod["containers"]
    assert container["workingDir"] == "/app"
    assert container["volumeMounts"] == [
        {"name": "distrun-code", "subPath": "distrun_job.py", "mountPath": "/app/distrun_job.py"}
    ]
    assert "'python distrun_job.py'" in container["command"][2]
    assert pod["volumes"] == [{"name": "distrun-code", "configMap": {"name": "cell-code"}}]


def test_a_cell_and_a_code_folder_share_the_configmap_with_binary_files_and_modes(tmp_path):
    code = tmp_path / "code"
    (code / "a b").mkdir(parents=True)
    (code / "a b" / "x.py").write_text("X = 1\n")
    (code / "a.b").mkdir()
    (code / "a.b" / "x.py").write_text("X = 2\n")  # its key would be the same: made unique
    (code / "weights.bin").write_bytes(bytes(range(256)))
    (code / "run.sh").write_text("#!/bin/sh\n")
    (code / "run.sh").chmod(0o755)
    spec = parse_spec(f"script: print(1)\nname: cell\ncode: {code}\n"
                      "distribution: {type: pytorch}\n")  # fmt: skip
    config_map, job = _documents(tmp_path / "out", spec, "kubeflow")
    items = _pod_spec("kubeflow", job)["volumes"][0]["configMap"]["items"]
    mount = tmp_path / "mount"
    _mounted(config_map, {"items": items}, mount)
    assert (mount / "weights.bin").read_bytes() == bytes(range(256))
    assert (mount / "a b" / "x.py").read_text() == "X = 1\n"
    assert (mount / "a.b" / "x.py").read_text() == "X = 2\n"
    assert (mount / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (mount / "distrun_job.py").read_text().endswith("print(1)\n")
    (code / "distrun_job.py").write_text("")  # where the cell's file goes
    with pytest.raises(ExportError, match=r"it holds a distrun_job\.py of its own"):
        export(spec, "kubeflow", ExportTarget.at(f"{tmp_path}/", image="img:1"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replica=1),
         "unknown field 'replica'"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(restartPolicy="Sometimes"),
         "'Sometimes' is not one of"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas="1"),
         "expected an integer"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
         .pop("name"), "`name`, must not be `None`"),
        (lambda d: d["spec"]["pytorchReplicaSpecs"].update(Chief={}), "unknown replica type"),
    ],
)  # fmt: skip
def test_the_schema_check_fails_a_manifest_with_a_typo(change, message, tmp_path):
    (job,) = _documents(tmp_path, _pytorch_spec(29500), "kubeflow")
    change(job)
    with pytest.raises(k8s_schema.Invalid, match=re.escape(message)):
        k8s_schema.check(job)


@pytest.mark.slow
def test_a_jobset_with_a_typo_fails_the_check(tmp_path):
    (jobset,) = _documents(tmp_path, _pytorch_spec(29500), "jobset")
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] = 3
    with pytest.raises(k8s_schema.Invalid, match="completionMode"):
        k8s_schema.check(jobset)
    jobset["spec"]["replicatedJobs"][0]["replica"] = 1
    with pytest.raises(k8s_schema.Invalid, match="unknown field 'replica'"):
        k8s_schema.check(jobset)


# -- SkyPilot ------------------------------------------------------------------------------

SKYPILOT = Path(__file__).resolve().parents[1] / ".venv-skypilot" / "bin" / "python"


def _sky_check(path: Path) -> subprocess.CompletedProcess:
    """SkyPilot's own loader (sky.Task.from_yaml), in the venv scripts/setup.sh --test made
    for it."""
    assert SKYPILOT.exists(), "no .venv-skypilot: run scripts/setup.sh --test"
    return subprocess.run(
        [str(SKYPILOT), "-c", "import sys, sky; sky.Task.from_yaml(sys.argv[1])", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.torch
def test_a_skypilot_task_passes_skypilots_loader_and_its_run_gives_every_rank_our_variables(
    tmp_path,
):
    import yaml

    port = _free_port()
    spec = _pytorch_spec(port)
    (path,) = write(export(spec, "skypilot", ExportTarget.at(f"{tmp_path}/")))
    done = _sky_check(path)
    assert done.returncode == 0, done.stderr[-2000:]
    task = yaml.safe_load(path.read_text())
    assert (task["num_nodes"], task["workdir"], task["name"]) == (2, ".", "ddp")
    assert task["envs"] == {"GREETING": "hi", "OMP_NUM_THREADS": "1"}
    # Each node runs `run` with what SkyPilot sets there; both nodes are this machine.
    sky = {"SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_TASK_ID": "sky-test", "HOME": str(tmp_path)}  # fmt: skip
    nodes = [(["bash", "-c", task["run"]], {**task["envs"], **sky, "SKYPILOT_NODE_RANK": str(n)})
             for n in range(2)]  # fmt: skip
    _assert_ranks(_run_pods(nodes, tmp_path), nodes=2, per_node=2, port=port)


@pytest.mark.slow
def test_skypilots_loader_refuses_a_typo_and_takes_gpus_and_an_image(tmp_path):
    spec = parse_spec(
        "command: python train.py\nresources: {instance_count: 2}\n"
        "distribution: {type: tensorflow}\nbackend: {type: slurm, gpus_per_node: 4}\n"
    )
    with pytest.raises(ExportError, match="give --accelerator NAME"):
        export(spec, "skypilot", ExportTarget.at(f"{tmp_path}/"))
    target = ExportTarget.at(f"{tmp_path}/", image="img:1", accelerator="A100")
    (path,) = write(export(spec, "skypilot", target))
    assert _sky_check(path).returncode == 0
    text = path.read_text()
    assert "accelerators: A100:4" in text and "image_id: docker:img:1" in text
    assert '"index": \'"${SKYPILOT_NODE_RANK}"\'}' in text  # each node's own TF_CONFIG
    path.write_text(text.replace("num_nodes", "num_node"))
    refused = _sky_check(path)
    assert refused.returncode != 0 and "num_node" in refused.stderr


@pytest.mark.slow
def test_an_export_holding_secrets_is_written_private_and_says_so(tmp_path):
    """The manifest is the job: it holds the secrets' values (a k8s env, an sbatch export
    line), so it is written 0600 (a script 0700), and the CLI says why; without secrets,
    as before (0644 manifests, a 0755 script)."""
    import stat

    secret = tmp_path / "secret.yml"
    secret.write_text(
        "command: echo hi\nenvironment_variables: {HF_TOKEN: hf_abcdef123, MY_VAR: x}\n"
    )
    done = run_cli("export", str(secret), "--to", "sbatch", "-o", f"{tmp_path}/out/")
    assert done.returncode == 0, done.stderr
    assert "Kept readable by you alone (0600): they hold HF_TOKEN's values" in done.stderr
    script = tmp_path / "out" / "secret.sbatch"
    assert "hf_abcdef123" in script.read_text()  # the job needs it
    assert stat.S_IMODE(script.stat().st_mode) == 0o700  # a script: its owner's alone
    done = run_cli(
        "export", str(secret), "--to", "azureml", "--image", "img", "-o", f"{tmp_path}/aml/"
    )
    (manifest,) = (tmp_path / "aml").iterdir()
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o600, done.stderr
    plain = tmp_path / "plain.yml"
    plain.write_text("command: echo hi\nenvironment_variables: {MY_VAR: x}\n")
    done = run_cli("export", str(plain), "--to", "sbatch", "-o", f"{tmp_path}/plain/")
    assert done.returncode == 0 and "0600" not in done.stderr
    assert stat.S_IMODE((tmp_path / "plain" / "plain.sbatch").stat().st_mode) == 0o755
