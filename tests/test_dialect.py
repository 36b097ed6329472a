"""The design proposal's shape of a job (`distributed:`, spec_dialect.py): each of its 8 jobs
(examples/proposal/, as seed 001 writes them) plans as the world it describes, with every
translation said; exports carry what it asks of the nodes; bad keys get one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import EXAMPLES, ROOT, run_cli

from jupyter_dist.errors import SpecError
from jupyter_dist.export import export
from jupyter_dist.export.target import ExportTarget
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.run.launch import dry_run
from jupyter_dist.spec import load_spec, parse_spec

PROPOSAL = EXAMPLES / "proposal"
SEEDS = ROOT.parent / "shared" / "seeds"  # beside the checkout, where the project has them

# Each job: its type, nodes, processes per node as planned, the world it describes, and
# the lines that say how it was read.
EXPECTED = {
    "mpi_horovodrun": ("mpi", 4, 16, [
        "read distributed.mpi.worker.count: 4 as resources.instance_count: 4",
        "read processes per node as 4 (the command's -np 16 over 4 workers: the hostfile's "
        "slots)",
        "read environment.docker.image: docker.io/pytorch as environment.image: "
        "docker.io/pytorch"]),
    "mpi_mpirun": ("mpi", 4, 16, [
        "read distributed.mpi.worker.slots_per: 4 as distribution.process_count_per_instance: 4"]),
    "mpi_launcher_as_worker": ("mpi", 4, 16, [
        "read processes per node as 4 (the command's -np 16 over 4 workers: the hostfile's "
        "slots)"]),
    "mpi_k8s": ("mpi", 4, 16, [
        "read distributed.mpi.worker.resources.limits.gpu: 4 as resources.gpus_per_node: 4",
        "read distributed.mpi.launcher.resources.limits.memory: 2Gi as "
        "distribution.launcher_limits.memory: 2Gi (an exported MPIJob's Launcher pod)"]),
    "pytorch_launch": ("pytorch", 4, 16, [
        "read processes per node as 1 (the command starts 4 processes on each node itself: "
        "--nproc_per_node 4, 16 ranks in all)"]),
    "pytorch_k8s": ("pytorch", 4, 16, [
        "read distributed.pytorch.resource_limits.gpu: 4 as resources.gpus_per_node: 4",
        "read processes per node as 4 (one process per GPU)"]),
    "tensorflow_mwms": ("tensorflow", 4, 4, [
        "read distributed.tensorflow.worker.count: 4 as distribution.worker_count: 4",
        "read compute.instance_count: 4 as resources.instance_count: 4"]),
    "tensorflow_ps": ("tensorflow", 2, 6, [
        "read distributed.tensorflow.worker.count: 2 as resources.instance_count: 2 (a node "
        "for each worker; the other tasks share them)",
        "read distributed.tensorflow.parameter_server.count: 4 as "
        "distribution.parameter_server_count: 4",
        "read distributed.tensorflow.parameter_server.environment_variables: {MAGIC: "
        "newnumber} as distribution.task_environment_variables.ps: {MAGIC: newnumber}",
        "kept distributed.tensorflow.parameter_server.environment.docker.image: "
        "docker.io/python as written (not acted on: a job runs in one image)"]),
}  # fmt: skip


def _ranks(plan: LaunchPlan, described: str) -> int:
    """The ranks a plan starts: its processes' own, or what their launchers start."""
    if described.startswith("read processes per node as 1 (the command starts"):
        each = int(re.search(r"starts (\d+) processes", described).group(1))
        return len(plan.processes) * each
    return sum(len(p.ranks) if p.ranks else 1 for p in plan.processes)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_job_of_the_proposal_plans_as_the_world_it_describes(name, store):
    kind, nodes, world, said = EXPECTED[name]
    spec = load_spec(PROPOSAL / f"{name}.yml")
    plan, _ = dry_run(spec, store=store)
    assert (plan.job_type, len(plan.nodes)) == (kind, nodes)
    assert _ranks(plan, next((n for n in spec.read_as if "the command starts" in n), "")) == world
    assert all(line in plan.read_as for line in said), plan.read_as
    assert store.jobs() == []


def test_the_parameter_servers_own_variables_and_the_roles(store):
    plan, _ = dry_run(load_spec(PROPOSAL / "tensorflow_ps.yml"), store=store)
    magic = {(p.role, p.env["MAGIC"]) for p in plan.processes}
    assert magic == {("worker", "number"), ("ps", "newnumber")}
    assert [p.role for p in plan.processes].count("ps") == 4


@pytest.mark.slow
def test_plan_says_how_the_file_was_read_and_inspect_keeps_it(store, tmp_path):
    done = run_cli("plan", str(PROPOSAL / "pytorch_k8s.yml"), store=store)
    assert done.returncode == 0, done.stderr
    checks = [line for line in done.stdout.splitlines() if line.startswith("Check: read")]
    assert checks == [
        "Check: read distributed.pytorch.worker.count: 4 as resources.instance_count: 4",
        "Check: read distributed.pytorch.resource_limits.gpu: 4 as resources.gpus_per_node: 4",
        "Check: read processes per node as 4 (one process per GPU)",
        "Check: read environment.docker.image: docker.io/pytorch as environment.image: "
        "docker.io/pytorch",
    ]
    job = tmp_path / "job.yml"
    job.write_text("command: echo hi $RANK\ndistributed: {pytorch: {worker: {count: 2}}}\n")
    ran = run_cli("run", str(job), store=store)
    assert ran.returncode == 0, ran.stderr
    (record,) = store.jobs()
    shown = run_cli("inspect", record.job_id, store=store)
    assert ("Check: read distributed.pytorch.worker.count: 2 as resources.instance_count: 2"
            in shown.stdout), shown.stdout  # fmt: skip
    assert "read processes per node as 1" in shown.stdout


def test_exports_carry_the_image_the_gpus_and_each_tasks_variables(tmp_path):
    spec = load_spec(PROPOSAL / "pytorch_k8s.yml")
    manifest = export(spec, "kubeflow", ExportTarget.at(tmp_path / "out/"))
    manifest = manifest.files[manifest.manifest]
    assert "image: docker.io/pytorch" in manifest
    assert "nvidia.com/gpu: '4'" in manifest
    tf = export(load_spec(PROPOSAL / "tensorflow_ps.yml"), "kubeflow",
                ExportTarget.at(tmp_path / "tf/"))  # fmt: skip
    tf = tf.files[tf.manifest]
    assert re.search(r"name: MAGIC\n\s+value: newnumber", tf)
    assert re.search(r"name: MAGIC\n\s+value: number", tf)
    mpi = export(load_spec(PROPOSAL / "mpi_k8s.yml"), "kubeflow",
                 ExportTarget.at(tmp_path / "mpi/"))  # fmt: skip
    launcher = mpi.files[mpi.manifest].split("Launcher:")[1].split("Worker:")[0]
    assert re.search(r"limits:\n\s+cpu: '1'\n\s+memory: 2Gi", launcher), launcher


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed documents are not beside this checkout")
def test_the_examples_are_the_seeds_jobs_as_written():
    """Every YAML block of the seed documents: a job is one of examples/proposal/ (the
    same text) and loads; anything else (a conda environment) is refused in one line."""
    examples = {p.read_text().split("\n", 2)[2] for p in PROPOSAL.glob("*.yml")}
    jobs = 0
    for document in sorted(SEEDS.glob("*.txt")):
        for block in re.findall(r"```ya?ml\n(.*?)```", document.read_text(), re.S):
            if "command:" in block:
                jobs += 1
                assert block in examples, block
            else:
                with pytest.raises(SpecError, match=r"^unknown key 'channels'"):
                    parse_spec(block)
    assert jobs == len(EXPECTED)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("distributed: {mpi: {worker: {cont: 4}}}",
         "distributed.mpi.worker: unknown key 'cont' (did you mean 'count'?); valid keys: "
         "count, slots_per, resources, resource_limits, environment, environment_variables"),
        ("distributed: {pytroch: {worker: {count: 4}}}",
         "distributed: unknown key 'pytroch' (did you mean 'pytorch'?); valid keys: mpi, "
         "pytorch, tensorflow"),
        ("distributed: {mpi: {worker: {count: 4}}}\ndistribution: {type: mpi}",
         "distributed: and distribution: are two shapes of the same setting (the design "
         "proposal's and Azure ML's); keep one"),
        ("distributed: {pytorch: {parameter_server: {count: 4}}}",
         "distributed.pytorch.parameter_server: a pytorch job has no such role; its roles: "
         "worker"),
        ("distributed: {pytorch: {worker: {count: 4}}}\ncompute: {instance_count: 2}",
         "distributed.pytorch.worker.count is 4 but compute.instance_count is 2; make them "
         "agree (both count the job's nodes)"),
        ("distributed: {pytorch: {worker: {count: 2, resources: {limits: {gpus: 2}}}}}",
         "distributed.pytorch.worker.resources.limits: unknown key 'gpus' (did you mean "
         "'gpu'?); valid keys: gpu, cpu, memory"),
        ("distributed: {pytorch: {worker: {count: 2, environment_variables: {A: b}}}}",
         "distributed.pytorch.worker.environment_variables: a pytorch job's ranks share one "
         "environment; use the job's environment_variables"),
        ("distributed: {tensorflow: {parameter_server: {count: 1, environment_variables: "
         "{RANK: 3}}}}",
         "distributed.tensorflow.parameter_server.environment_variables: RANK cannot be set "
         "here: set by jupyter-dist for every rank"),
        ("distributed: {pytorch: {worker: {count: 2}}}\nresources: 5",
         "resources: expected a mapping of keys to values"),
        ("distributed: {mpi: {}}\ncompute: {instance_count: two}",
         "compute.instance_count: 'two' is not valid; expected a whole number >= 1"),
        ("distributed: pytorch",
         "distributed: expected one of mpi, pytorch, tensorflow, as distributed: {pytorch: "
         "{worker: {count: 2}}}"),
    ],
)  # fmt: skip
def test_a_bad_key_of_the_proposals_shape_is_one_line(text, message, tmp_path):
    with pytest.raises(SpecError) as info:
        parse_spec(f"command: python x.py\n{text}", base_dir=tmp_path, source="job.yml")
    assert str(info.value) == f"job.yml: {message}"


def test_mpirun_asking_more_ranks_than_the_slots_hold_is_one_line():
    with pytest.raises(SpecError) as info:
        parse_spec("command: mpirun -np 16 python x.py\n"
                   "distributed: {mpi: {worker: {count: 2, slots_per: 4}}}")  # fmt: skip
    assert str(info.value) == (
        "command: -np 16 is more ranks than 2 workers with slots_per: 4 hold (8); raise one "
        "or lower -np"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("command: mpirun -np 16 python x.py\ndistributed: {mpi: {worker: {count: 0}}}",
         "distributed.mpi.worker.count: 0 is not valid; expected a whole number >= 1 (the "
         "job's nodes)"),
        ("command: python x.py\ndistributed: {pytorch: {}}\nresources: {instance_count: 2}\n"
         "compute: {instance_count: 3}",
         "compute.instance_count is 3 but resources.instance_count is 2; make them agree, or "
         "write one (both count the job's nodes)"),
        ("command: torchrun --nproc_per_node 99999999999 x.py\n"
         "distributed: {pytorch: {worker: {count: 2}}}",
         "command: --nproc_per_node 99999999999 is more processes than a node runs (at most "
         "1024)"),
    ],
)  # fmt: skip
def test_counts_the_proposals_shape_cannot_hold_are_one_line(text, message):
    """Each was a traceback (ZeroDivisionError), a silent choice of one count over the
    other, or a plan of 199999999998 ranks."""
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert str(info.value) == message


def test_a_canonical_spec_is_read_as_it_is():
    assert parse_spec("command: x\nresources: {instance_count: 2}").read_as == []


def test_overrides_keep_how_the_file_was_read():
    spec = parse_spec("command: x\ndistributed: {pytorch: {worker: {count: 4}}}")
    smaller = spec.with_overrides(instance_count=2)
    assert smaller.instance_count == 2 and smaller.read_as == spec.read_as != []


def test_the_proposals_examples_are_packaged_with_their_code():
    assert (PROPOSAL / "src").resolve() == (EXAMPLES / "src").resolve()
    assert Path(PROPOSAL / "src" / "train.py").is_file()


def test_the_gpus_of_resources_reach_slurm_and_are_left_out_for_azure(tmp_path):
    """resources.gpus_per_node is what Slurm is asked for (a backend's own wins); Azure ML
    has no such key (its instance type has the GPUs): left out, and said so."""
    from jupyter_dist.backends.slurm import allocation_options

    spec = load_spec(PROPOSAL / "pytorch_k8s.yml")
    assert "--gpus-per-node=4" in allocation_options(spec)
    own = spec.with_overrides(backend={"type": "slurm", "gpus_per_node": 2})
    assert "--gpus-per-node=2" in allocation_options(own)
    azure = export(spec, "azureml", ExportTarget.at(tmp_path / "az/"))
    header, _, body = azure.files[azure.manifest].partition("\n$schema")
    assert "resources.gpus_per_node" in header and "gpus_per_node" not in body


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "changes", "ranks"),
    [
        # 4 nodes of 4 GPUs each in the file: 2 nodes of 1 rank here (--nodes, --procs-per-node)
        pytest.param("pytorch_k8s", {"instance_count": 2, "process_count_per_instance": 1}, 2,
                     marks=pytest.mark.torch),
        # 4 workers in the file: 2 here (a TensorFlow job's count is its worker_count)
        pytest.param("tensorflow_mwms", {"instance_count": 2, "worker_count": 2}, 2,
                     marks=pytest.mark.tensorflow),
        # `horovodrun -np 16` over 4 workers in the file: the command fixes its ranks, so its
        # counts are changed in its text, `-np 4` over 2 workers (2 slots each, read from it)
        pytest.param("mpi_horovodrun", {"-np 16": "-np 4", "count: 4": "count: 2"}, 4,
                     marks=pytest.mark.horovod),
    ],
)  # fmt: skip
def test_one_job_of_each_type_of_the_proposal_runs_on_local_nodes(name, changes, ranks, store):
    """As written but for its counts, from examples/proposal/: `python train.py` there
    runs the example of the job's kind (examples/src/train.py). The counts are changed as
    options change them, or, where the command itself fixes them, in the file's text."""
    from helpers import result_reports

    from jupyter_dist.run.launch import run

    path = PROPOSAL / f"{name}.yml"
    text = path.read_text()
    in_text = {written: ours for written, ours in changes.items() if isinstance(ours, str)}
    for written, ours in in_text.items():
        assert written in text, written
        text = text.replace(written, ours)
    spec = parse_spec(text, base_dir=PROPOSAL, source=str(path))
    spec = spec.with_overrides(**{k: v for k, v in changes.items() if k not in in_text})
    assert spec.instance_count * spec.processes_per_node() == ranks
    result = run(spec, store=store)
    assert result.ok, result.describe()
    reports = result_reports(store, result.job_id)
    assert len(reports) == ranks, sorted(reports)
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1  # trained as one
