"""Launch overhead: `jupyter distrun run` vs torchrun by hand, and planning time.

    .venv/bin/python bench/launch.py [--runs 5] [--plan-only | --ray-only | --launch-only]

1. A trivial 4-rank gloo job (bench/trivial_gloo.py) started by `jupyter distrun run`
   (1 local node x 4 processes, per_process; `--preload none`: cold) and by
   `torchrun --standalone --nproc-per-node 4` on the same script, alternating, wall time
   from command start to exit; and with `--preload torch` (docs/pool.md): the first job,
   which starts the node's pool (after a `pool stop`), and the next, which forks from it.
   Prints each median ratio against torchrun. Goals: <= 1.0; with the pool, <= 1.1 for
   the first and <= 0.2 warm.
   And a preload that cannot be imported (`--preload nosuchmod_xyz`, 2 local nodes x 2
   ranks), then the next job that names none, each against the same job cold, alternating:
   a failed preload says so and starts cold at once, and is not taken by later jobs. Goal:
   <= 1.1 for both (`--preload-failure-only` runs this part alone).
2. Planning a 128-node x 8-rank pytorch job (pure, no I/O): median of many runs.
   Goal: < 50 ms.
3. `jupyter distrun plan --json` of 1,024 and 16,384 processes (the spec's cap), every
   command masked, against planning alone. Goal: < 1 s and < 10 s.
4. The network check before launch (diagnose/network.py) of a 2-node job on two sshd test
   nodes (tests/sshnodes.py, warm connections): its cost alone, median of `--runs`, and
   against the whole warm launch of the same trivial job without it. Goal: < 0.3 s.
5. The same trivial gloo job, 2 nodes x 2 ranks on a 2-node Ray cluster (tests/raynodes.py,
   reached over Ray Client), by `--backend ray` (in this process: `run`) and by hand with
   Ray's own `ray.util` (a STRICT_SPREAD placement group, an actor per bundle starting its
   node's ranks, then the actors killed and the group removed), alternating: median wall
   time of each, and the ratio. Goal: <= 1.2. And the same job by `jupyter distrun run`
   over Ray Client from this machine against a driver beside the head (the head's network,
   its own address), alternating, each a new process. Goal: <= 1.5.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "trivial_gloo.py"
BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return took


def bench_launch(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "trivial.yml"
        spec.write_text(
            f"command: python {SCRIPT}\n"
            "environment_variables: {OMP_NUM_THREADS: '1'}\n"
            "distribution: {type: pytorch, process_count_per_instance: 4}\n"
        )
        env = {**os.environ, "DISTRUN_HOME": tmp, "OMP_NUM_THREADS": "1"}
        # `jupyter distrun`, or where jupyter_core put no `jupyter` (a GPU machine's Python
        # with the package on PYTHONPATH) the same CLI as a module
        front = [str(BIN / "jupyter"), "distrun"] if (BIN / "jupyter").exists() else [
            sys.executable, "-m", "jupyter_dist.cli"]  # fmt: skip
        ours_argv = [*front, "run", str(spec), "--color", "never"]
        torchrun_argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            str(SCRIPT),
        ]
        pooled_argv = [*ours_argv, "--preload", "torch"]
        # Cold: a job after a preloaded one takes its preload too (run/preload_memory.py).
        ours_argv = [*ours_argv, "--preload", "none"]
        stop_argv = [*front, "pool", "stop"]
        env["TMPDIR"] = tmp  # the bench's own pools, stopped at its end
        timed(ours_argv, env)  # warm the page cache for both before measuring
        timed(torchrun_argv, env)
        ours, theirs, first, warm = [], [], [], []
        try:
            for _ in range(runs):
                ours.append(timed(ours_argv, env))
                theirs.append(timed(torchrun_argv, env))
                timed(stop_argv, env)
                first.append(timed(pooled_argv, env))  # starts the node's pool
                warm.append(timed(pooled_argv, env))  # finds it running
        finally:
            subprocess.run(stop_argv, env=env, capture_output=True)
    median = statistics.median
    print(
        f"launch, 4 ranks gloo: jupyter distrun median {median(ours):.2f} s, torchrun "
        f"median {median(theirs):.2f} s, --preload torch: first (starts the pool) "
        f"{median(first):.2f} s, then {median(warm):.2f} s; over {runs} alternating runs"
    )
    for name, times, goal in (("ours", ours, 1.0), ("--preload, first", first, 1.1),
                              ("--preload, warm pool", warm, 0.2)):  # fmt: skip
        ratio = median(o / t for o, t in zip(times, theirs, strict=True))
        print(f"launch ratio ({name} / torchrun, median of pairs): {ratio:.2f}  (goal <= {goal})")


def bench_failed_preload(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "trivial.yml"
        spec.write_text(
            f"command: python {SCRIPT}\n"
            "environment_variables: {OMP_NUM_THREADS: '1'}\n"
            "resources: {instance_count: 2}\n"
            "distribution: {type: pytorch, process_count_per_instance: 2}\n"
        )
        env = {**os.environ, "DISTRUN_HOME": tmp, "OMP_NUM_THREADS": "1", "TMPDIR": tmp}
        run_argv = [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--color", "never"]
        cold_argv = [*run_argv, "--preload", "none"]
        failing_argv = [*run_argv, "--preload", "nosuchmod_xyz"]
        timed(cold_argv, env)  # the page cache, warm for both
        cold, failing, after = [], [], []
        for _ in range(runs):
            cold.append(timed(cold_argv, env))
            failing.append(timed(failing_argv, env))
            after.append(timed(run_argv, env))  # names none: takes no failed preload
    median = statistics.median
    print(
        f"a preload that fails, 2 nodes x 2 ranks: cold {median(cold):.2f} s, --preload "
        f"nosuchmod_xyz {median(failing):.2f} s, the next job {median(after):.2f} s; over "
        f"{runs} alternating runs"
    )
    for name, times in (("failing preload", failing), ("the job after it", after)):
        ratio = median(o / t for o, t in zip(times, cold, strict=True))
        print(f"launch ratio ({name} / cold, median of pairs): {ratio:.2f}  (goal <= 1.1)")


def bench_planning(repeats: int = 30) -> None:
    from jupyter_dist.nodes import Node
    from jupyter_dist.plan import plan
    from jupyter_dist.spec import parse_spec

    nodes = [Node(name=f"n{i}", host=f"10.1.{i // 250}.{i % 250}") for i in range(128)]
    spec = parse_spec(
        "command: python train.py\nresources: {instance_count: 128}\n"
        "distribution: {type: pytorch, process_count_per_instance: 8}"
    )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan(spec, nodes, "bench", {"master": 29500})
        times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1000
    print(f"planning 128 nodes x 8 ranks: median {ms:.1f} ms over {repeats} runs (goal < 50 ms)")


def bench_plan_command(counts: tuple[int, ...] = (1024, 16384)) -> None:
    """`jupyter distrun plan --json` for a job of N processes on local nodes (8 a node, a
    secret among the variables, so every command is masked), against planning the same job
    alone, in this process. The dry run was quadratic (every command masked with every
    process's secrets): 1,024 took 70 s."""
    from jupyter_dist.nodes import Node
    from jupyter_dist.plan import plan
    from jupyter_dist.spec import parse_spec

    for count in counts:
        text = (
            "command: python train.py\nenvironment_variables: {HF_TOKEN: hf_abcdef123}\n"
            f"resources: {{instance_count: {count // 8}}}\n"
            "distribution: {type: pytorch, process_count_per_instance: 8}\n"
        )
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "job.yml")
            path.write_text(text)
            nodes = [Node(name=f"n{i}", host="127.0.0.1") for i in range(count // 8)]
            start = time.perf_counter()
            plan(parse_spec(text), nodes, "bench", {"master": 29500})
            planning = time.perf_counter() - start
            env = {**os.environ, "DISTRUN_HOME": folder}
            env.pop("DISTRUN_NODES_FILE", None)
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "jupyter_dist.cli", "plan", str(path), "--json"],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            whole = time.perf_counter() - start
        if done.returncode != 0 or "hf_abcdef123" in done.stdout:
            raise SystemExit(f"plan --json of {count} processes failed: {done.stderr[-500:]}")
        goal = 1.0 if count <= 1024 else 10.0
        print(
            f"plan --json, {count} processes: {whole:.2f} s (goal < {goal:g} s); planning "
            f"alone {planning:.2f} s; ratio {whole / planning:.1f}"
        )


def bench_network_check(runs: int) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import sshnodes

    from jupyter_dist.backends.ssh import CONNECTIONS
    from jupyter_dist.diagnose.network import check_network
    from jupyter_dist.nodes import load_inventory
    from jupyter_dist.run.launch import make_plan, run
    from jupyter_dist.spec import parse_spec
    from jupyter_dist.store import JobStore

    with tempfile.TemporaryDirectory() as tmp:
        cluster = sshnodes.start(2, Path(tmp) / "nodes")
        try:
            store = JobStore(Path(tmp) / "jobs")
            inventory = load_inventory(cluster.inventory)
            spec = parse_spec("command: 'true'\nresources: {instance_count: 2}\n"
                              "network_check: false\n")  # fmt: skip
            run(spec, inventory=inventory, store=store)  # the connections are warm from here
            checks, launches = [], []
            for _ in range(runs):
                plan, nodes, backend = make_plan(spec, inventory=inventory, store=store)
                try:
                    start = time.perf_counter()
                    check_network(backend.run_on_node, plan, nodes)
                    checks.append(time.perf_counter() - start)
                finally:
                    backend.release()
                start = time.perf_counter()
                if not run(spec, inventory=inventory, store=store).ok:
                    raise SystemExit("the trivial 2-node job failed")
                launches.append(time.perf_counter() - start)
        finally:
            CONNECTIONS.close_all()
            sshnodes.stop(cluster)
    check, launch = statistics.median(checks), statistics.median(launches)
    print(f"network check, 2 sshd nodes: {check:.3f} s (goal < 0.3 s); the launch it "
          f"precedes {launch:.3f} s; ratio check / launch {check / launch:.2f}")  # fmt: skip


# By hand with Ray's own API: what a user without jupyter-dist would write.
class _HandRanks:
    def free_port(self) -> int:
        import socket

        with socket.socket() as probe:
            probe.bind(("", 0))
            return probe.getsockname()[1]

    def address(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def run(self, script: str, ranks: list[int], world: int, master: str, port: int) -> list:
        import os
        import subprocess
        import sys

        procs = [
            subprocess.Popen([sys.executable, script], env={
                **os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK":
                str(i), "MASTER_ADDR": master, "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
            for i, rank in enumerate(ranks)
        ]  # fmt: skip
        return [proc.wait() for proc in procs]


def _by_hand(ray, nodes: int, per_node: int) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": per_node}] * nodes, strategy="STRICT_SPREAD")
    ray.get(group.ready())
    ranks_class = ray.remote(_HandRanks)
    actors = [
        ranks_class.options(num_cpus=per_node, scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=i)).remote()
        for i in range(nodes)
    ]  # fmt: skip
    master = ray.get(actors[0].address.remote())
    port = ray.get(actors[0].free_port.remote())
    codes = ray.get([
        actor.run.remote(str(SCRIPT), list(range(i * per_node, (i + 1) * per_node)),
                         nodes * per_node, master, port)
        for i, actor in enumerate(actors)
    ])  # fmt: skip
    for actor in actors:
        ray.kill(actor)
    remove_placement_group(group)
    if any(code for node in codes for code in node):
        raise SystemExit(f"the hand-made Ray job failed: {codes}")


def bench_ray(runs: int) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import raynodes

    from jupyter_dist.backends.ray import connect
    from jupyter_dist.run.launch import run
    from jupyter_dist.spec import parse_spec
    from jupyter_dist.store import JobStore

    with tempfile.TemporaryDirectory() as tmp:
        cluster = raynodes.start(2, Path(tmp) / "ray")
        try:
            ray = connect(cluster.client_address)
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
            store = JobStore(Path(tmp) / "jobs")
            spec = parse_spec(
                f"command: python {SCRIPT}\nresources: {{instance_count: 2}}\n"
                "environment_variables: {OMP_NUM_THREADS: '1'}\n"
                "distribution: {type: pytorch, process_count_per_instance: 2}\n"
                f"backend: {{type: ray, address: '{cluster.client_address}'}}\n"
            )
            ours, hand = [], []
            for i in range(runs + 1):  # the first of each warms Ray's worker pool: not counted
                start = time.perf_counter()
                if not run(spec, store=store).ok:
                    raise SystemExit("the trivial job on Ray failed")
                took = time.perf_counter() - start
                start = time.perf_counter()
                _by_hand(ray, 2, 2)
                if i:
                    ours.append(took)
                    hand.append(time.perf_counter() - start)
        finally:
            with contextlib.suppress(Exception):
                ray.shutdown()  # before its cluster goes: no complaint from a dead channel
            raynodes.stop(cluster)
    mine, theirs = statistics.median(ours), statistics.median(hand)
    print(f"ray, 2 nodes x 2 ranks over Ray Client: --backend ray {mine:.2f} s, by hand with "
          f"ray.util {theirs:.2f} s; ratio {mine / theirs:.2f} (goal <= 1.2)")  # fmt: skip


def bench_ray_client(runs: int) -> None:
    """The same trivial job by `jupyter distrun run --backend ray`, over Ray Client from this
    machine (`ray://HEAD:10001`) and from a driver beside the head (in its network, the
    head's own address), alternating: each a new process, as a terminal's run is."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    import raynodes

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "trivial.yml"
        spec.write_text(
            f"command: python {SCRIPT}\nresources: {{instance_count: 2}}\n"
            "environment_variables: {OMP_NUM_THREADS: '1'}\n"
            "distribution: {type: pytorch, process_count_per_instance: 2}\n"
        )
        env = {**os.environ, "DISTRUN_HOME": tmp}
        run_argv = [sys.executable, "-m", "jupyter_dist.cli", "run", str(spec), "--backend",
                    "ray", "--color", "never", "--ray-address"]  # fmt: skip
        cluster = raynodes.start(2, Path(tmp) / "ray")
        try:
            client = [*run_argv, cluster.client_address]
            beside = [*cluster.inside(), *run_argv, cluster.head_address]
            timed(client, env)  # the first of each warms Ray's worker pool: not counted
            timed(beside, env)
            far, near = [], []
            for _ in range(runs):
                far.append(timed(client, env))
                near.append(timed(beside, env))
        finally:
            raynodes.stop(cluster)
    median = statistics.median
    ratio = median(f / n for f, n in zip(far, near, strict=True))
    print(f"ray, 2 nodes x 2 ranks, `jupyter distrun run`: over Ray Client {median(far):.2f} s, "
          f"from a driver beside the head {median(near):.2f} s; ratio (median of pairs) "
          f"{ratio:.2f} (goal <= 1.5)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plan-only", action="store_true", help="only the planning benches")
    parser.add_argument("--ray-only", action="store_true", help="only the Ray benches")
    parser.add_argument(
        "--launch-only", action="store_true", help="only the launch against torchrun"
    )
    parser.add_argument(
        "--preload-failure-only", action="store_true", help="only a preload that fails"
    )
    args = parser.parse_args()
    if args.preload_failure_only:
        bench_failed_preload(args.runs)
        return
    if args.ray_only:
        bench_ray(args.runs)
        bench_ray_client(args.runs)
        return
    if args.launch_only:
        bench_launch(args.runs)
        return
    bench_planning()
    bench_plan_command()
    if not args.plan_only:
        bench_launch(args.runs)
        bench_failed_preload(args.runs)
        bench_network_check(args.runs)
        bench_ray(args.runs)
        bench_ray_client(args.runs)


if __name__ == "__main__":
    main()
