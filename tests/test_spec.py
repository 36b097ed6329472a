"""The job spec: Azure ML files load unchanged; every bad spec gets one clear line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import AZURE_JOB, run_cli

from jupyter_dist.errors import SpecError
from jupyter_dist.spec import load_spec, parse_spec


@pytest.fixture
def azure_file(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    path = tmp_path / "job.yml"
    path.write_text(AZURE_JOB)
    return path


def test_azure_ml_job_loads_unchanged(azure_file: Path):
    spec = load_spec(azure_file)
    assert spec.job_type == "pytorch"
    assert spec.distribution.process_count_per_instance == 2
    assert spec.instance_count == 2
    assert spec.resolved_command() == "python train.py --epochs 10 --lr 0.01"
    assert spec.code_dir() == azure_file.parent / "src"  # relative to the YAML's folder
    dumped = spec.to_dict()
    # Azure-only keys are kept as they were.
    assert dumped["$schema"].endswith("commandJob.schema.json")
    assert dumped["environment"] == "azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest"
    assert dumped["compute"] == "azureml:gpu-cluster"
    assert dumped["experiment_name"] == "pytorch-cifar-distributed-example"
    assert dumped["command"].startswith("python train.py --epochs ${{inputs.epochs}}")


def test_dump_round_trips(azure_file: Path):
    spec = load_spec(azure_file)
    again = parse_spec(spec.to_yaml(), base_dir=azure_file.parent)
    assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize("name", ["pytorch", "PyTorch", "PYTORCH"])
def test_type_is_case_insensitive(name: str):
    assert parse_spec(f"command: x\ndistribution: {{type: {name}}}").job_type == "pytorch"


def test_azure_resource_keys_are_kept():
    spec = parse_spec(
        D + "resources:\n  instance_count: 2\n  instance_type: Standard_NC24\n"
        "  shm_size: 8g\n  docker_args: --ipc=host\n  properties: {a: 1}\n"
        "  locations: [westeurope]\nlimits: {timeout: 60}\n"
    )
    assert spec.instance_count == 2 and spec.timeout == 60
    kept = spec.to_dict()["resources"]
    assert kept["instance_type"] == "Standard_NC24" and kept["shm_size"] == "8g"
    assert kept["locations"] == ["westeurope"] and kept["properties"] == {"a": 1}


def test_defaults():
    spec = parse_spec("command: python x.py")
    assert spec.job_type == "pytorch"
    assert spec.instance_count == 1
    assert spec.distribution.process_count_per_instance == 1
    assert spec.distribution.launcher == "per_process"
    tf = parse_spec("command: x\ndistribution: {type: tensorflow}")
    assert (tf.distribution.parameter_server_count, tf.distribution.chief_count) == (0, 0)
    dask = parse_spec("distribution: {type: dask}")  # an interactive cluster needs no command
    assert dask.command is None


def test_nodes_set_the_instance_count():
    spec = parse_spec("command: x\nnodes: [gpu1, gpu2, gpu3]")
    assert spec.instance_count == 3


def test_inputs_forms():
    spec = parse_spec(
        "command: run ${{inputs.a}} ${{ inputs.b }} ${{inputs.c}} ${{inputs.d}}\n"
        "inputs: {a: 1, b: true, c: {type: uri_folder, path: ./data},"
        " d: {type: integer, default: 5}}"
    )
    assert spec.resolved_command() == "run 1 true ./data 5"


def test_mpi_args_string_or_list():
    a = parse_spec("command: x\ndistribution: {type: mpi, mpi_args: '--bind-to none -x A'}")
    b = parse_spec("command: x\ndistribution: {type: mpi, mpi_args: [--bind-to, none, -x, A]}")
    assert a.distribution.mpi_args == b.distribution.mpi_args == ["--bind-to", "none", "-x", "A"]


def test_environment_numbers_become_strings():
    spec = parse_spec("command: x\nenvironment_variables: {OMP_NUM_THREADS: 4, NCCL_DEBUG: INFO}")
    assert spec.environment_variables == {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO"}


def test_overrides_revalidate():
    spec = parse_spec("command: x\ndistribution: {type: pytorch}")
    changed = spec.with_overrides(instance_count=3, process_count_per_instance=4)
    assert (changed.instance_count, changed.distribution.process_count_per_instance) == (3, 4)
    with pytest.raises(SpecError, match=r"resources.instance_count: 0 is not valid"):
        spec.with_overrides(instance_count=0)


D = "command: python x.py\n"
# (spec text, a fragment the one-line error must contain)
MALFORMED = [
    ("command: x\n  bad: : y", "not valid YAML: line 2"),
    ("command: [unclosed", "not valid YAML"),
    ("- a\n- b", "must be a mapping of keys (found list)"),
    ("", "must be a mapping of keys (found nothing)"),
    ("just a string", "must be a mapping of keys (found str)"),
    ("comand: python x.py", "unknown key 'comand' (did you mean 'command'?)"),
    ("distribution: {type: pytorch}", "command: missing"),
    ("command: '   '", "command: empty"),
    ("command: [a, b]", "command: ['a', 'b'] is not valid; expected a string"),
    ("command: x\nnetwork_check: 'no'", "network_check: 'no' is not valid; expected true or false"),
    (
        "command: x\nlimits: {max_restarts: 1001}",
        "limits.max_restarts: 1001 is not valid; expected a whole number from 0 to 1000",
    ),
    (D + "distribution: {type: pytorchh}", "unknown type 'pytorchh'; valid types: pytorch"),
    (D + "distribution: {type: 3}", "unknown type 3"),
    (D + "distribution: {process_count_per_instance: 2}", "missing 'type'"),
    (D + "distribution: pytorch", "expected a mapping with a 'type' key"),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: two}",
        "distribution.process_count_per_instance: 'two' is not valid; expected a whole number "
        "from 1 to 1024",
    ),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: -2}",
        "process_count_per_instance: -2 is not valid",
    ),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: 0}",
        "process_count_per_instance: 0 is not valid",
    ),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: true}",
        "process_count_per_instance: True is not valid",
    ),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: 2.5}",
        "process_count_per_instance: 2.5 is not valid",
    ),
    (
        D + "distribution: {type: pytorch, process_count_per_instance: '2'}",
        "process_count_per_instance: '2' is not valid",
    ),
    (
        D + "distribution: {type: pytorch, launcher: mpirun}",
        "distribution.launcher: 'mpirun' is not valid; expected per_process or torchrun",
    ),
    (D + "distribution: {type: pytorch, worker_count: 2}", "unknown key 'worker_count'"),
    (
        D + "distribution: {type: pytorch, master_port: 70000}",
        "master_port: 70000 is not valid; expected a whole number from 1 to 65535",
    ),
    (D + "distribution: {type: tensorflow, worker_count: 0}", "worker_count: 0 is not valid"),
    (
        D + "distribution: {type: tensorflow, chief_count: 2}",
        "chief_count: 2 is not valid; expected 0 or 1",
    ),
    (
        D + "distribution: {type: tensorflow, evaluator_count: -1}",
        "evaluator_count: -1 is not valid; expected 0 or 1",
    ),
    (
        D + "distribution: {type: tensorflow, parameter_server_count: -1}",
        "parameter_server_count: -1 is not valid; expected a whole number from 0 to 1024",
    ),
    (
        D + "distribution: {type: tensorflow, parameter_server_count: yes}",
        "parameter_server_count: True is not valid",
    ),
    (
        D + "distribution: {type: tensorflow, process_count_per_instance: 2}",
        "unknown key 'process_count_per_instance'",
    ),
    (D + "distribution: {type: mpi, launcher: srun}", "expected mpirun or horovodrun"),
    (D + "distribution: {type: mpi, mpi_args: 'a \"b'}", "not valid shell words"),
    (D + "distribution: {type: mpi, mpi_args: {a: 1}}", "expected a string or a list of strings"),
    (D + "distribution: {type: dask, threads_per_process: 0}", "threads_per_process: 0 is not"),
    (D + "distribution: {type: dask, scheduler_port: 0}", "scheduler_port: 0 is not valid"),
    (D + "resources: {instance_count: 0}", "resources.instance_count: 0 is not valid"),
    (D + "resources: {instance_count: many}", "resources.instance_count: 'many' is not valid"),
    (D + "resources: 4", "resources: 4 is not valid; expected a mapping"),
    ("command: python x.py ${{inputs.epochs}}", "${{inputs.epochs}} is not defined in inputs"),
    ("command: python x.py ${{inputs.epochs}}\ninputs: {lr: 1}", "(inputs defined: lr)"),
    ("command: python x.py ${{outputs.model}}", "${{outputs.model}} is not defined in outputs"),
    ("command: x ${{outputs.m}}\noutputs: {m: {path: out/model}}", "'out/model' is not absolute"),
    ("command: x\noutputs: {m: {type: table}}", "outputs.m.type: 'table' is not valid"),
    ("command: x\noutputs: {1m: {}}", "'1m' cannot name an output"),
    (
        "command: x\noutputs: {" + "m" * 101 + ": {}}",
        "cannot name an output (letters, digits, _ and -, at most 100",
    ),
    ("command: x ${{secrets.k}}", "${{secrets.k}} is not supported; only ${{inputs.NAME}} and"),
    (D + "inputs: {a: null}", "input 'a' has no usable value"),
    (D + "inputs: {a: {type: uri_folder}}", "input 'a' needs a 'path', 'value' or 'default'"),
    (D + "inputs: [a]", "expected a mapping of input names"),
    (D + "environment_variables: {RANK: '3'}", "RANK cannot be set here"),
    (D + "environment_variables: {MASTER_PORT: '3'}", "use distribution.master_port"),
    (D + "environment_variables: {TF_CONFIG: '{}'}", "TF_CONFIG cannot be set here"),
    (D + "environment_variables: {DISTRUN_FOO: x}", "DISTRUN_FOO cannot be set here"),
    (D + "environment_variables: {OMPI_COMM_WORLD_RANK: '1'}", "cannot be set here"),
    (D + "environment_variables: {'1X': a}", "'1X' is not a valid variable name"),
    (D + "environment_variables: {A-B: a}", "'A-B' is not a valid variable name"),
    (D + "environment_variables: {A: [1, 2]}", "A=[1, 2]: expected a string value"),
    (D + "environment_variables: {A: true}", "A=True: expected a string value"),
    (D + "environment_variables: [A]", "expected a mapping of variable names"),
    (D + "code: does-not-exist", "is not a folder"),
    (D + "code: azureml:my-code:1", "an Azure ML asset cannot be shipped"),
    (D + "code: 5", "expected a folder path"),
    (D + "nodes: [a, a]", "a node is listed twice"),
    (D + "nodes: []", "expected a non-empty list of node names"),
    (D + "nodes: [a]\nresources: {instance_count: 2}", "lists 1 node(s) but"),
    (D + "limits: {timeout: 0}", "limits.timeout: 0 is not valid"),
    (
        D + "resources: {instance_cont: 2}",
        "resources: unknown key 'instance_cont' (did you mean 'instance_count'?)",
    ),
    (D + "resources: {instance_typ: x}", "(did you mean 'instance_type'?)"),
    (D + "limits: {timout: 60}", "limits: unknown key 'timout' (did you mean 'timeout'?)"),
    (D + "limits: {max_trials: 3}", "limits: unknown key 'max_trials'; valid keys: timeout"),
    (D + "backend: {partition: gpu}", "backend.type: missing"),
    (D + "backend: {type: slurm, gpus_per_node: -1}", "backend.gpus_per_node: -1 is not valid"),
    (
        D + "backend: {type: slurm, job: last}",
        "backend.job: 'last' is not valid; expected a Slurm job id (its number, e.g. 1234)",
    ),
    (
        D + "backend: {type: slurm, job: 7, time: '1:00'}",
        "backend: time applies to an allocation jupyter-dist asks for; "
        "job: 7 names one that exists",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_spec_gets_one_clear_line(text: str, fragment: str, tmp_path: Path):
    with pytest.raises(SpecError) as info:
        parse_spec(text, base_dir=tmp_path, source="job.yml")
    message = str(info.value)
    assert fragment in message
    assert message.startswith("job.yml: ")
    assert "\n" not in message
    assert "Traceback" not in message and "pydantic" not in message.lower()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("{type: slurm, partiton: gpu}", "backend: 'partiton' is not an option of the slurm "
         "backend (did you mean 'partition'?); its options: job, partition, time, "
         "gpus_per_node, account, qos, constraint"),
        ("{type: ssh, partition: gpu}", "backend: 'partition' is not an option of the ssh "
         "backend; its options: none"),
        ("{type: ray, address: 7}", "backend: address: expected a string (--ray-address)"),
        ("{type: ray, address: [a]}", "job.yml: backend: address: expected a string or a number"),
    ],
)  # fmt: skip
def test_a_backends_own_keys_are_its_declared_options(section, message, tmp_path):
    """The backend: section keeps any key; the backend it names checks them against the
    options it declares when the job is planned (or exported)."""
    from jupyter_dist.backends import check_section

    with pytest.raises(SpecError) as info:
        check_section(parse_spec(D + f"backend: {section}", source="job.yml").backend)
    assert str(info.value) == message


def test_corpus_is_large_enough():
    assert len(MALFORMED) >= 30


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 6, 13, 36, 43])
def test_cli_exit_code_2_and_one_line_for_bad_specs(index: int, tmp_path: Path):
    text, fragment = MALFORMED[index]
    path = tmp_path / "job.yml"
    path.write_text(text)
    for command in ("plan", "run"):
        result = run_cli(command, str(path), store=None, cwd=tmp_path, env=_env(tmp_path))
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert fragment in lines[0]


def test_cli_missing_file(tmp_path: Path):
    result = run_cli("run", str(tmp_path / "nope.yml"), env=_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'nope.yml'}: no such file"


@pytest.mark.slow
def test_cli_bad_override(tmp_path: Path):
    path = tmp_path / "job.yml"
    path.write_text(
        textwrap.dedent("""\
        command: x
        distribution: {type: tensorflow}
    """)
    )
    result = run_cli("plan", str(path), "--procs-per-node", "2", env=_env(tmp_path))
    assert result.returncode == 2
    assert "--procs-per-node does not apply to tensorflow jobs" in result.stderr
    result = run_cli("plan", str(path), "--nodes", "0", env=_env(tmp_path))
    assert result.returncode == 2
    assert "resources.instance_count: 0 is not valid" in result.stderr


def _env(tmp_path: Path) -> dict:
    import os

    return {**os.environ, "DISTRUN_HOME": str(tmp_path / "home")}


def _yaml_script(cell: str) -> str:
    """A spec whose `script` is `cell`, as the magic writes one."""
    return "script: |\n" + textwrap.indent(cell, "  ")


def test_a_script_that_is_not_python_is_refused_at_once():
    """A notebook cell (`script`) is parsed here: IPython syntax or a syntax error is one
    line naming the line, never the whole cell; valid Python passes as it is."""
    cell = "import os\n" + "x = 1\n" * 500 + "!pip install torch\n"
    with pytest.raises(SpecError) as info:
        parse_spec(_yaml_script(cell))
    assert str(info.value) == (
        "script: line 502, '!pip install torch', is IPython syntax, not Python: the ranks "
        "run the cell as a Python script (run a shell command with subprocess.run, and a "
        "magic in a cell of its own)"
    )
    with pytest.raises(SpecError, match=r"^script: line 2, 'print\(x': '\(' was never closed"):
        parse_spec(_yaml_script("x = 1\nprint(x\n"))
    assert parse_spec(_yaml_script("print('fine')\n")).script == "print('fine')\n"
