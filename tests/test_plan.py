"""The planner, table by table (DESIGN.md's environment contract), without starting anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from jupyter_dist.backends import backend_class
from jupyter_dist.errors import NodeError, SpecError
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.plan import plan, port_requests
from jupyter_dist.run.launch import make_plan
from jupyter_dist.spec import parse_spec

NODES = [
    Node(
        name=f"gpu{i}",
        host=f"10.0.0.{i + 5}",
        backend="ssh",
        python="/opt/venv/bin/python",
        workdir="/scratch/distrun",
    )
    for i in range(3)
]


def _plan(text: str, nodes=NODES, ports=None):
    spec = parse_spec(text)
    nodes = nodes[: spec.instance_count]
    wanted = {r.key: 40000 + i for i, r in enumerate(port_requests(spec, nodes))}
    hooks = backend_class(nodes[0].backend)()  # the nodes' backend's part of mpirun
    return plan(spec, nodes, "job1", ports if ports is not None else wanted, None, hooks.mpi_launch)


COMMON = {"DISTRUN_JOB_ID", "DISTRUN_NODE_RANK", "DISTRUN_NUM_NODES", "PYTHONUNBUFFERED"}


def test_pytorch_per_process_table():
    p = _plan(
        "command: python train.py\nresources: {instance_count: 2}\n"
        'environment_variables: {MY_FLAG: "on"}\n'
        "distribution: {type: pytorch, process_count_per_instance: 3}"
    )
    assert len(p.processes) == 6
    for proc in p.processes:
        n, local = proc.node_rank, proc.local_rank
        env = proc.env
        assert set(env) >= COMMON
        assert env["MASTER_ADDR"] == "10.0.0.5"  # node 0's address
        assert env["MASTER_PORT"] == "40000"
        assert env["WORLD_SIZE"] == "6"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == env["DISTRUN_NODE_RANK"] == str(n)
        assert env["RANK"] == str(n * 3 + local) == str(proc.rank)
        assert env["LOCAL_RANK"] == str(local)
        assert env["LOCAL_WORLD_SIZE"] == "3"
        assert env["DISTRUN_NUM_NODES"] == "2"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["MY_FLAG"] == "on"
        assert env["OMP_NUM_THREADS"] == "1"
        assert proc.argv == ["/bin/sh", "-c", "python train.py"]
        assert proc.host == NODES[n].host
        assert proc.cwd == "/scratch/distrun/job1"  # no code: the job's folder on the node
    assert [p.rank for p in p.processes] == list(range(6))
    assert [p.node for p in p.processes] == ["gpu0"] * 3 + ["gpu1"] * 3


def test_an_inline_script_runs_through_the_runner_shipped_beside_it():
    p = _plan("script: print('hi')\nresources: {instance_count: 2}")
    for proc in p.processes:
        assert proc.argv == ["/bin/sh", "-c", 'python3 "$DISTRUN_JOB_DIR/cell_runner.py"']
    files = {(f.node_rank, f.path.rsplit("/", 1)[1]): f.content for f in p.files}
    for node in (0, 1):
        assert files[node, "script.py"] == "print('hi')"
        assert "def finish(" in files[node, "cell_runner.py"]


def test_pytorch_fixed_master_port_is_checked_not_chosen():
    spec = parse_spec("command: x\ndistribution: {type: pytorch, master_port: 6105}")
    (request,) = port_requests(spec, NODES[:1])
    assert (request.fixed, request.setting) == (6105, "master_port")
    p = plan(spec, NODES[:1], "job1", {})
    assert p.processes[0].env["MASTER_PORT"] == "6105"
    # One process per node: no OMP_NUM_THREADS imposed.
    assert "OMP_NUM_THREADS" not in p.processes[0].env


def test_user_can_override_omp_threads():
    p = _plan(
        "command: x\nenvironment_variables: {OMP_NUM_THREADS: 4}\n"
        "distribution: {type: pytorch, process_count_per_instance: 2}"
    )
    assert {proc.env["OMP_NUM_THREADS"] for proc in p.processes} == {"4"}


def test_pytorch_torchrun_table():
    p = _plan(
        "command: python train.py --lr 0.1\nresources: {instance_count: 3}\n"
        "distribution: {type: pytorch, process_count_per_instance: 4, launcher: torchrun}"
    )
    assert [proc.name for proc in p.processes] == ["torchrun-0", "torchrun-1", "torchrun-2"]
    for n, proc in enumerate(p.processes):
        argv = proc.argv
        assert argv[:3] == ["/opt/venv/bin/python", "-m", "torch.distributed.run"]

        def flag(name, argv=argv):
            return argv[argv.index(name) + 1]

        assert flag("--nnodes") == "3"
        assert flag("--nproc-per-node") == "4"
        assert flag("--node-rank") == str(n)
        assert flag("--master-addr") == "10.0.0.5"
        assert flag("--master-port") == "40000"
        assert argv[-4:] == ["--no-python", "/bin/sh", "-c", "python train.py --lr 0.1"]
        # torchrun sets the rank variables; the node-level ones are still set on it.
        assert proc.env["NODE_RANK"] == str(n)
        assert proc.env["MASTER_ADDR"] == "10.0.0.5"
        assert proc.env["MASTER_PORT"] == "40000"
        assert "RANK" not in proc.env and "WORLD_SIZE" not in proc.env
        assert proc.ranks == tuple(range(n * 4, n * 4 + 4))
        assert proc.line_tags == "torchrun"
    assert p.world_size == 12


def test_tensorflow_table_with_every_role():
    p = _plan(
        "command: python tf.py\nresources: {instance_count: 2}\n"
        "distribution: {type: tensorflow, worker_count: 2, parameter_server_count: 1,"
        " chief_count: 1, evaluator_count: 1}"
    )
    names = [proc.name for proc in p.processes]
    assert names == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]
    # Round-robin over the two nodes, in that order.
    assert [proc.node_rank for proc in p.processes] == [0, 1, 0, 1, 0]
    configs = {proc.name: json.loads(proc.env["TF_CONFIG"]) for proc in p.processes}
    cluster = configs["chief-0"]["cluster"]
    assert set(cluster) == {"chief", "worker", "ps"}
    assert len(cluster["chief"]) == 1 and len(cluster["worker"]) == 2 and len(cluster["ps"]) == 1
    addresses = cluster["chief"] + cluster["worker"] + cluster["ps"]
    assert len(set(addresses)) == 4  # every task on its own address
    assert cluster["chief"][0].startswith("10.0.0.5:") and cluster["worker"][0].startswith(
        "10.0.0.6:"
    )
    for proc in p.processes:
        cfg = configs[proc.name]
        kind, index = proc.name.rsplit("-", 1)
        assert cfg["task"] == {"type": kind, "index": int(index)}
        assert cfg["environment"] == "cloud"
        assert proc.tf_config == cfg
        if kind != "evaluator":
            assert cfg["cluster"] == cluster  # everyone in training sees the same cluster
    evaluator = configs["evaluator-0"]
    assert list(evaluator["cluster"]) == ["evaluator"]  # it sees only itself
    assert evaluator["cluster"]["evaluator"][0] not in addresses


@pytest.mark.parametrize(
    ("roles", "serving"),
    [
        ("chief_count: 1, worker_count: 2, parameter_server_count: 1",
         {"worker-0", "worker-1", "ps-0"}),
        ("worker_count: 2, parameter_server_count: 1", {"ps-0"}),
        ("chief_count: 1, worker_count: 2", set()),
    ],
)  # fmt: skip
def test_tensorflow_tasks_that_serve_until_the_job_ends(roles, serving):
    """Parameter servers never exit; under ParameterServerStrategy (chief + ps) workers
    serve too, so the chief's end ends the job. MultiWorkerMirrored workers all exit."""
    p = _plan(f"command: x\nresources: {{instance_count: 2}}\n"
              f"distribution: {{type: tensorflow, {roles}, evaluator_count: 1}}")  # fmt: skip
    assert {proc.name for proc in p.processes if proc.service} == serving


def test_tensorflow_defaults_to_one_worker_per_node_and_base_port():
    p = _plan(
        "command: x\nresources: {instance_count: 3}\n"
        "distribution: {type: tensorflow, base_port: 2222}"
    )
    cfg = json.loads(p.processes[0].env["TF_CONFIG"])
    assert cfg["cluster"] == {"worker": ["10.0.0.5:2222", "10.0.0.6:2222", "10.0.0.7:2222"]}
    # Two tasks on one node get consecutive ports.
    p = _plan(
        "command: x\nresources: {instance_count: 1}\n"
        "distribution: {type: tensorflow, worker_count: 2, base_port: 2222}"
    )
    cfg = json.loads(p.processes[0].env["TF_CONFIG"])
    assert cfg["cluster"]["worker"] == ["10.0.0.5:2222", "10.0.0.5:2223"]
    # Nodes on one machine (local nodes) share its ports: slots count per host.
    local = [Node(name=f"local{i}", host="127.0.0.1", backend="local") for i in range(2)]
    p = _plan(
        "command: x\nresources: {instance_count: 2}\n"
        "distribution: {type: tensorflow, worker_count: 3, parameter_server_count: 1, "
        "base_port: 2222}",
        nodes=local,
    )
    cfg = json.loads(p.processes[0].env["TF_CONFIG"])
    assert cfg["cluster"] == {
        "worker": ["127.0.0.1:2222", "127.0.0.1:2223", "127.0.0.1:2224"],
        "ps": ["127.0.0.1:2225"],
    }


def test_mpi_table():
    p = _plan(
        "command: python hvd.py\nresources: {instance_count: 2}\n"
        "distribution: {type: mpi, process_count_per_instance: 4, mpi_args: '--bind-to none'}"
    )
    (proc,) = p.processes
    assert proc.node == "gpu0" and proc.role == "mpirun"
    argv = proc.argv
    assert argv[:5] == ["mpirun", "-np", "8", "--hostfile", "/scratch/distrun/job1/hostfile"]
    assert "--tag-output" in argv
    assert argv[-5:] == ["--bind-to", "none", "/bin/sh", "-c", "python hvd.py"]
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {
        "MASTER_ADDR",
        "MASTER_PORT",
        "AZ_BATCH_MASTER_NODE",
        "DISTRUN_MPI_HOSTFILE",
        "AZUREML_MPI_HOSTFILE",
        "DISTRUN_JOB_ID",
        "PYTHONUNBUFFERED",
    } <= forwarded
    env = proc.env
    assert env["MASTER_ADDR"] == "10.0.0.5"
    assert env["AZ_BATCH_MASTER_NODE"] == f"10.0.0.5:{env['MASTER_PORT']}"
    assert env["DISTRUN_MPI_HOSTFILE"] == env["AZUREML_MPI_HOSTFILE"]
    hostfile, config = p.files
    assert hostfile.node_rank == 0 and hostfile.path == env["DISTRUN_MPI_HOSTFILE"]
    assert hostfile.content == "10.0.0.5 slots=4\n10.0.0.6 slots=4\n"
    # mpirun on node 0 reaches node 1 with the inventory's SSH settings.
    assert config.path == "/scratch/distrun/job1/ssh_config"
    assert (
        "Host 10.0.0.6\n  Port 22\n  BatchMode yes\n  StrictHostKeyChecking yes" in config.content
    )
    assert argv[argv.index("plm_rsh_agent") + 1] == f"ssh -F {config.path}"
    assert "PATH" in forwarded
    assert proc.ranks == tuple(range(8))


def test_mpi_local_nodes_share_one_host_line(tmp_path):
    spec = parse_spec(
        "command: x\nresources: {instance_count: 2}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    nodes = Inventory().select(2, None, workdir=tmp_path)
    p = plan(spec, nodes, "job1", {"master": 1234})
    assert p.files[0].content == "127.0.0.1 slots=4\n"


@pytest.mark.parametrize(
    ("cpus", "spec_env", "told"),
    [(2, "", "1"), (4, "", None), (8, "", None), (2, "OMPI_MCA_mpi_yield_when_idle: '0'", "0")],
)
def test_mpi_ranks_yield_where_a_host_has_more_ranks_than_cores(cpus, spec_env, told, tmp_path):
    """4 ranks on local nodes (one machine): told to yield when waiting where it has fewer
    cores, as Open MPI does itself for a host it knows is oversubscribed; never where the
    cores are not known (inventory nodes), and never over the spec's own value."""
    from dataclasses import replace

    spec = parse_spec(
        "command: x\nresources: {instance_count: 2}\n"
        f"environment_variables: {{{spec_env}}}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    nodes = [replace(n, cpus=cpus) for n in Inventory().select(2, None, workdir=tmp_path)]
    (proc,) = plan(spec, nodes, "job1", {"master": 1234}).processes
    assert proc.env.get("OMPI_MCA_mpi_yield_when_idle") == told
    # Local nodes know this machine's cores; the inventory's are not known.
    assert Inventory().select(1, None, workdir=tmp_path)[0].cpus == len(os.sched_getaffinity(0))
    inventory = _plan("command: x\nresources: {instance_count: 2}\n"
                      "distribution: {type: mpi, process_count_per_instance: 64}")  # fmt: skip
    assert "OMPI_MCA_mpi_yield_when_idle" not in inventory.processes[0].env


@pytest.mark.parametrize(
    ("command", "launcher", "world"),
    [
        ("horovodrun -np 3 --hostfile $AZUREML_MPI_HOSTFILE python hvd.py", "horovodrun", 3),
        ("NCCL_DEBUG=INFO /usr/bin/mpirun -n 2 python x.py", "mpirun", 2),
        ("mpiexec python x.py", "mpiexec", 4),  # no -np: the spec's count
    ],
)
def test_a_command_that_is_a_launcher_runs_once_on_node_0(command, launcher, world):
    p = _plan(
        f"command: {command}\nresources: {{instance_count: 2}}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    (proc,) = p.processes
    assert (proc.name, proc.node_rank, proc.ranks) == (launcher, 0, tuple(range(world)))
    assert proc.argv == ["/bin/sh", "-c", command] and proc.line_tags == "mpi"
    assert proc.env["AZUREML_MPI_HOSTFILE"] == "/scratch/distrun/job1/hostfile"
    assert p.files[0].content == "10.0.0.5 slots=2\n10.0.0.6 slots=2\n"
    # It calls `ssh` itself: the job's own, which uses the job's ssh_config, comes first.
    assert proc.env["DISTRUN_PATH_FIRST"] == "/scratch/distrun/job1/bin"
    (program,) = [f for f in p.files if f.executable]
    assert program.path == "/scratch/distrun/job1/bin/ssh"
    assert "exec ssh -F /scratch/distrun/job1/ssh_config " in program.content


def test_a_plain_mpi_job_gets_no_ssh_program_of_its_own():
    p = _plan(
        "command: python x.py\nresources: {instance_count: 2}\n"
        "distribution: {type: mpi, process_count_per_instance: 2}"
    )
    assert not [f for f in p.files if f.executable]
    assert "DISTRUN_PATH_FIRST" not in p.processes[0].env


def test_horovodrun_launcher():
    p = _plan(
        "command: python hvd.py\nresources: {instance_count: 2}\n"
        "distribution: {type: mpi, process_count_per_instance: 2, launcher: horovodrun}"
    )
    assert p.processes[0].argv[:5] == [
        "horovodrun",
        "-np",
        "4",
        "--hostfile",
        "/scratch/distrun/job1/hostfile",
    ]


def test_dask_table():
    p = _plan(
        "command: python analyse.py\nresources: {instance_count: 2}\n"
        "distribution: {type: dask, process_count_per_instance: 2, threads_per_process: 3}"
    )
    names = [proc.name for proc in p.processes]
    assert names == [
        "scheduler",
        "dask-worker-0",
        "dask-worker-1",
        "dask-worker-2",
        "dask-worker-3",
        "client",
    ]
    sched, *workers, client = p.processes
    port = sched.argv[sched.argv.index("--port") + 1]
    address = f"tcp://10.0.0.5:{port}"
    assert sched.node == "gpu0" and sched.service
    assert [w.node for w in workers] == ["gpu0", "gpu0", "gpu1", "gpu1"]
    for w in workers:
        assert w.service and address in w.argv
        assert w.argv[w.argv.index("--nthreads") + 1] == "3"
    assert client.node == "gpu0" and not client.service
    assert client.env["DASK_SCHEDULER_ADDRESS"] == address
    # The command runs once every worker has registered (dask_wait.py, shipped to node 0).
    wait = "/scratch/distrun/job1/dask_wait.py"
    assert client.argv == ["/bin/sh", "-c", f"{NODES[0].python} {wait} && python analyse.py"]
    assert client.env["DISTRUN_DASK_WORKER_NAMES"] == "gpu0-0,gpu0-1,gpu1-0,gpu1-1"
    assert [f.path for f in p.files if f.node_rank == 0] == [wait]
    # Two worker processes a node: each gets half of its memory, not all of it.
    assert {w.argv[w.argv.index("--memory-limit") + 1] for w in workers} == {"0.5000"}


def test_dask_without_command_is_an_interactive_cluster():
    p = _plan("distribution: {type: dask}")
    assert [proc.name for proc in p.processes] == ["scheduler", "dask-worker-0"]
    assert all(proc.service for proc in p.processes)


def test_planning_is_pure_and_deterministic():
    text = (
        "command: x\nresources: {instance_count: 2}\n"
        "distribution: {type: tensorflow, worker_count: 3, parameter_server_count: 1}"
    )
    assert _plan(text).to_dict() == _plan(text).to_dict()


def test_plan_serialises_and_loads_back():
    from jupyter_dist.plan import LaunchPlan

    p = _plan("command: x\nresources: {instance_count: 2}\ndistribution: {type: mpi}")
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_code_folder_is_the_working_directory(tmp_path):
    (tmp_path / "src").mkdir()
    spec = parse_spec("command: x\ncode: src\nresources: {instance_count: 2}", base_dir=tmp_path)
    local = Inventory().select(2, None, workdir=tmp_path / "w", cwd=tmp_path)
    p = plan(spec, local, "job1", {"master": 1})
    assert {proc.cwd for proc in p.processes} == {str(tmp_path / "src")}
    remote = plan(spec, NODES[:2], "job1", {"master": 1})  # shipped into the job's folder
    assert {proc.cwd for proc in remote.processes} == {"/scratch/distrun/job1/code"}


def test_missing_ports_and_node_count_mismatch_are_errors():
    spec = parse_spec("command: x\nresources: {instance_count: 2}")
    with pytest.raises(ValueError, match="ports not chosen for: master"):
        plan(spec, NODES[:2], "job1", {})
    with pytest.raises(SpecError, match="instance_count is 2 but 3 node"):
        plan(spec, NODES, "job1", {"master": 1})


def test_node_selection(tmp_path):
    inventory = Inventory(nodes=tuple(NODES), source="nodes.yml")
    assert [n.name for n in inventory.select(2, None, tmp_path)] == ["gpu0", "gpu1"]
    assert [n.name for n in inventory.select(2, ["gpu2", "gpu0"], tmp_path)] == ["gpu2", "gpu0"]
    with pytest.raises(NodeError, match=r"node 'gpu9' is not in nodes.yml \(nodes: gpu0, gpu1"):
        inventory.select(1, ["gpu9"], tmp_path)
    with pytest.raises(NodeError, match=r"asks for 4 nodes but nodes\.yml has 3"):
        inventory.select(4, None, tmp_path)
    local = Inventory().select(3, None, tmp_path)
    assert [(n.name, n.host) for n in local] == [(f"local{i}", "127.0.0.1") for i in range(3)]


def test_free_ports_differ_between_jobs(store):
    """Two jobs planned at once on local nodes never share a port."""
    spec = parse_spec(
        "command: x\nresources: {instance_count: 2}\n"
        "distribution: {type: tensorflow, worker_count: 3, parameter_server_count: 2}"
    )
    seen = []
    for _ in range(5):
        p, _, _ = make_plan(spec, store=store)
        for proc in p.processes:
            seen.append(proc.tf_config["cluster"][proc.role][proc.tf_config["task"]["index"]])
    assert len(seen) == 25 and len(set(seen)) == 25


def test_planning_128_nodes_is_fast():
    """Not a timing assertion (see bench/launch.py); it must just work at that size."""
    nodes = [Node(name=f"n{i}", host=f"10.1.{i // 250}.{i % 250}") for i in range(128)]
    spec = parse_spec(
        "command: x\nresources: {instance_count: 128}\n"
        "distribution: {type: pytorch, process_count_per_instance: 8}"
    )
    start = time.perf_counter()
    p = plan(spec, nodes, "big", {"master": 29500})
    assert len(p.processes) == 1024 and p.processes[-1].env["RANK"] == "1023"
    assert time.perf_counter() - start < 30  # only a hang guard


@pytest.mark.parametrize(
    ("distribution", "nodes", "said"),
    [
        ("{type: pytorch, process_count_per_instance: 2}", 2, "4 ranks on 2 nodes"),
        ("{type: pytorch, process_count_per_instance: 1}", 1, "1 rank on 1 node"),
        (
            "{type: pytorch, process_count_per_instance: 2, launcher: torchrun}",
            2,
            "4 ranks in 2 torchrun processes on 2 nodes",
        ),
        ("{type: mpi, process_count_per_instance: 2}", 2, "4 ranks in 1 mpirun process on 2 nodes"),
        (
            "{type: tensorflow, worker_count: 2, parameter_server_count: 1, chief_count: 1}",
            2,
            "4 tasks (1 chief, 2 workers, 1 ps) on 2 nodes",
        ),
        (
            "{type: dask, process_count_per_instance: 2}",
            2,
            "1 scheduler, 4 workers and 1 client on 2 nodes",
        ),
    ],
)
def test_launch_summary_counts_ranks_and_processes(distribution, nodes, said):
    from jupyter_dist.plan.summary import launch_summary

    p = _plan(f"command: x\nresources: {{instance_count: {nodes}}}\ndistribution: {distribution}")
    assert launch_summary(p) == said


def test_parity_notes_more_ranks_than_a_nodes_gpus(store):
    """The GPU count of an inventory node (`gpus:`) is in the plan; more ranks than GPUs
    on a node is a note (the CLI path of the other notes is in test_cli)."""
    from jupyter_dist.plan.parity import parity_notes

    spec = parse_spec("command: x\ndistribution: {type: pytorch, process_count_per_instance: 2}")
    launch_plan, _, chosen = make_plan(spec, store=store)
    chosen.release()
    assert [n["gpus"] for n in launch_plan.nodes] == [None] and parity_notes(launch_plan) == []
    launch_plan.nodes[0]["gpus"] = 1
    assert parity_notes(launch_plan) == [
        "local0 has 1 GPU for 2 ranks: ranks using CUDA would share one (NCCL refuses that); "
        "use --procs-per-node 1"
    ]
    launch_plan.nodes[0]["gpus"] = 2
    assert parity_notes(launch_plan) == []


@pytest.fixture
def listed_gpus(tmp_path, monkeypatch):
    """A stand-in `nvidia-smi` first on PATH that lists as many GPUs as the returned
    function is given (a negative count: it fails as without a driver)."""
    from jupyter_dist.nodes import this_machines_gpus

    programs = tmp_path / "bin"
    programs.mkdir()
    monkeypatch.setenv("PATH", f"{programs}:{os.environ['PATH']}")

    def listing(count: int) -> None:
        lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(count))
        body = lines if count >= 0 else "echo 'NVIDIA-SMI has failed' >&2; exit 9\n"
        smi = programs / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 2\n{body}')
        smi.chmod(0o755)
        this_machines_gpus.cache_clear()

    yield listing
    this_machines_gpus.cache_clear()


@pytest.mark.slow
def test_local_nodes_have_this_machines_gpus_and_their_ranks_share_them(store, listed_gpus):
    """Local nodes carry the GPUs nvidia-smi lists here; the ranks of all of them are
    counted against those (they are one machine), ranks on one node as on any node."""
    from jupyter_dist.nodes import this_machines_gpus
    from jupyter_dist.plan.parity import parity_notes

    def notes(nodes: int, per_node: int) -> list[str]:
        spec = parse_spec(
            f"command: x\nresources: {{instance_count: {nodes}}}\nenvironment_variables: "
            f"{{OMP_NUM_THREADS: '1'}}\ndistribution: {{type: pytorch, "
            f"process_count_per_instance: {per_node}}}"
        )
        launch_plan, _, chosen = make_plan(spec, store=store)
        chosen.release()
        return parity_notes(launch_plan)

    listed_gpus(1)
    assert this_machines_gpus() == 1
    assert notes(1, 2) == [
        "local0 has 1 GPU for 2 ranks: ranks using CUDA would share one (NCCL refuses that); "
        "use --procs-per-node 1"
    ]
    assert notes(2, 1) == [
        "this machine has 1 GPU for the 2 ranks of its local nodes (local0, local1): ranks "
        "using CUDA would share one (NCCL refuses that); run at most 1 in all (--nodes times "
        "--procs-per-node)"
    ]
    assert notes(1, 1) == []
    listed_gpus(2)
    assert notes(2, 1) == [] and notes(1, 2) == []
    assert notes(2, 2)[0].startswith("this machine has 2 GPUs for the 4 ranks of its local")
    listed_gpus(-1)  # no driver: nothing known, nothing said
    assert this_machines_gpus() is None and notes(2, 2) == []
    listed_gpus(3)  # `nodes` says them too
    shown = subprocess.run(
        [sys.executable, "-m", "jupyter_dist.cli", "nodes", "--store", str(store.root)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "DISTRUN_NODES_FILE": ""},
    )  # fmt: skip
    assert shown.stderr == "no node inventory: jobs run on local nodes (this machine, 3 GPUs)\n"


def test_parity_notes_what_differs_between_nodes():
    """What the nodes' preflights read (Node.software): Python and torch versions, and
    NCCL_*/GLOO_* variables of their environments that the job does not set itself (the
    SSH path that reads them is in test_ssh)."""
    from jupyter_dist.plan.parity import parity_notes

    p = _plan(
        "command: x\nresources: {instance_count: 2}\nenvironment_variables: {NCCL_DEBUG: INFO}\n"
        "distribution: {type: pytorch}"
    )
    same = {"python": "3.11.7", "torch": "2.13.0", "comm_env": {"NCCL_DEBUG": "WARN"}}
    for node in p.nodes:
        node["software"] = same
    assert parity_notes(p) == []  # alike (NCCL_DEBUG differs from the job's: the job's wins)
    p.nodes[1]["software"] = {
        "python": "3.10.12", "torch": None, "comm_env": {"GLOO_SOCKET_IFNAME": "eth1"},
    }  # fmt: skip
    assert parity_notes(p) == [
        "Python differs between nodes (3.11.7 on gpu0; 3.10.12 on gpu1): cells, pushed "
        "variables and whatever ranks pickle for each other can fail; use one Python version "
        "everywhere (the inventory's python:)",
        "torch differs between nodes (2.13.0 on gpu0; not installed on gpu1): ranks of "
        "different versions can fail or hang in their first collective; install one version "
        "everywhere",
        "GLOO_SOCKET_IFNAME differs between nodes (unset on gpu0; eth1 on gpu1), as their "
        "environments set it: NCCL and gloo must reach every node alike; set it for the job "
        "(--env GLOO_SOCKET_IFNAME=...) or alike on every node",
    ]
    del p.nodes[1]["software"]  # a node not probed (local nodes) compares with nothing
    assert parity_notes(p) == []


def test_the_network_check_looks_where_each_job_types_ranks_meet():
    """diagnose/network.meeting_points: the master for pytorch and MPI, every TensorFlow
    task's address, the Dask scheduler (and the master port it is given too)."""
    from jupyter_dist.diagnose.network import meeting_points
    from jupyter_dist.plan import plan, port_requests

    nodes = [Node(f"n{i}", f"10.0.0.{i + 1}", "ssh", "python", "/w") for i in range(2)]

    def points(body: str) -> set[tuple[str, str, int]]:
        spec = parse_spec(f"command: x\nresources: {{instance_count: 2}}\n{body}")
        ports = {r.key: 3000 + i for i, r in enumerate(port_requests(spec, nodes))}
        return {(p.what, p.host, p.port) for p in meeting_points(plan(spec, nodes, "j", ports))}

    assert points("distribution: {type: pytorch, master_port: 29500}") == {
        ("master", "10.0.0.1", 29500)
    }
    assert points("distribution: {type: mpi, process_count_per_instance: 2}") == {
        ("master", "10.0.0.1", 3000)
    }
    tf = points("distribution: {type: tensorflow, parameter_server_count: 1, base_port: 2222}")
    assert {what for what, _, _ in tf} == {"TensorFlow worker 0", "TensorFlow worker 1",
                                            "TensorFlow ps 0"}  # fmt: skip
    assert {host for _, host, _ in tf} == {"10.0.0.1", "10.0.0.2"}
    dask = points("distribution: {type: dask}")
    assert ("Dask scheduler", "10.0.0.1", 3000) in dask
