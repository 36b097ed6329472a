"""`jupyter distrun ...`: plan, run, and read jobs from a terminal.

Exit codes: 0 the job succeeded, 1 it failed or timed out, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from jupyter_dist.backends import inventory_backend
from jupyter_dist.describe import (
    INSPECT_COLUMNS,
    PLAN_COLUMNS,
    duration,
    format_commands,
    inspect_rows,
    job_size,
    job_summary,
    masked_command,
    plan_rows,
    tf_configs,
)
from jupyter_dist.errors import DistrunError
from jupyter_dist.export import FORMATS, ExportTarget, export, write
from jupyter_dist.masking import masked_plan
from jupyter_dist.nodes import load_inventory
from jupyter_dist.options import LaunchOptions
from jupyter_dist.run.control import (
    effective_state,
    request_cancel,
    request_stacks,
    wait_until_ended,
)
from jupyter_dist.run.events import (
    FINAL_STATES,
    JobListener,
    JobResult,
    OutputLine,
    ProcessState,
    exit_text,
)
from jupyter_dist.run.meters import mib, summarize
from jupyter_dist.run.stacks import METHODS as STACK_METHODS
from jupyter_dist.run.stacks import StackDump
from jupyter_dist.run.stall import describe_stall
from jupyter_dist.spec import JobSpec, load_spec
from jupyter_dist.store import JobStore, natural_order

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")


class TerminalPrinter(JobListener):
    """Prints every line with its rank or role as prefix; colours on a terminal."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr, colour: bool = False):
        self.out, self.err, self.colour = out, err, colour
        self._colour_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def _prefix(self, key: str, label: str) -> str:
        if not self.colour:
            return f"[{label}] "
        code = self._colour_of.setdefault(key, _COLOURS[len(self._colour_of) % len(_COLOURS)])
        return f"\x1b[{code}m[{label}]\x1b[0m "

    def on_lines(self, lines: list[OutputLine]) -> None:
        with self._lock:
            for stream in ("stdout", "stderr"):
                text = "".join(
                    f"{self._prefix(line.key, line.label)}{line.text}\n"
                    for line in lines
                    if line.stream == stream
                )
                if text:
                    target = self.out if stream == "stdout" else self.err
                    target.write(text)
                    target.flush()

    def on_process(self, state: ProcessState) -> None:
        if state.state == "failed":
            with self._lock:
                how = exit_text(state.exit_code, state.signal)
                self.err.write(f"[{state.label}] failed: {how}\n")
                self.err.flush()

    def on_stall(self, notice: str | None, summary: list[str]) -> None:
        with self._lock:
            self.err.write(describe_stall(notice, summary))
            self.err.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter distrun",
        description="Run distributed jobs (PyTorch, TensorFlow, MPI, Dask) across nodes.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store", metavar="DIR", help="job store folder (default: $DISTRUN_HOME/jobs)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def nodes_file(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--nodes-file", metavar="FILE",
            help="node inventory (default: $DISTRUN_NODES_FILE, else the Jupyter config dir's "
            "distrun/nodes.yml; none means local nodes)",
        )  # fmt: skip

    def slurm_options(p: argparse.ArgumentParser) -> None:
        group = p.add_argument_group("slurm (an allocation asked for when none holds you)")
        group.add_argument("--slurm-job", metavar="ID", help="run in this allocation instead")
        group.add_argument("--partition", metavar="NAME")
        group.add_argument("--time", metavar="LIMIT", help="e.g. 01:00:00")
        group.add_argument("--gpus-per-node", type=int, metavar="N")
        group.add_argument("--account", metavar="NAME")
        group.add_argument("--qos", metavar="NAME")
        group.add_argument("--constraint", metavar="FEATURES")

    def spec_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="SPEC.yml", help="job spec (an Azure ML command job works)")
        nodes_file(p)
        p.add_argument("--nodes", type=int, metavar="N", help="number of nodes (instance_count)")
        p.add_argument(
            "--procs-per-node",
            type=int,
            metavar="P",
            help="processes per node (pytorch, mpi, dask)",
        )
        p.add_argument(
            "--backend", metavar="NAME",
            help="where the processes run: local, ssh, slurm or an installed one; default: "
            "the spec's backend, else slurm where SLURM_JOB_ID is set, ssh with a node "
            "inventory, local without",
        )  # fmt: skip
        slurm_options(p)

    plan = sub.add_parser(
        "plan", parents=[common], help="show every process the job would start; runs nothing"
    )
    spec_options(plan)
    plan.add_argument("--json", action="store_true", help="a JSON list of processes")

    export = sub.add_parser(
        "export", parents=[common],
        help=f"write the job for another scheduler ({', '.join(FORMATS)}); runs nothing",
    )  # fmt: skip
    spec_options(export)
    export_options(export)

    run = sub.add_parser(
        "run", parents=[common], help="run a job with live output, prefixed by rank"
    )
    spec_options(run)
    run.add_argument("--timeout", type=int, metavar="SECONDS", help="stop the job after this")
    run.add_argument(
        "--stall-timeout", type=int, metavar="SECONDS",
        help="flag the job as stuck (with every rank's stack) once no rank printed or used "
        "CPU for this long (default 300; 0: never)",
    )  # fmt: skip
    run.add_argument(
        "--on-stall", choices=("warn", "kill"),
        help="what a stall does: warn (the default: say so, with the stacks) or kill (stop "
        "the job too)",
    )  # fmt: skip
    run.add_argument(
        "--grace-period", type=int, metavar="SECONDS",
        help="how long a stopped process has between SIGTERM and SIGKILL, to save its work "
        "(default 5)",
    )  # fmt: skip
    run.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour prefixes"
    )

    nodes = sub.add_parser("nodes", parents=[common], help="attached nodes and their health")
    nodes_file(nodes)
    nodes.add_argument("--trust", metavar="NAME", help="record NAME's host key in known_hosts")

    jobs = sub.add_parser("jobs", parents=[common], help="list jobs in the store, newest first")
    jobs.add_argument("--json", action="store_true")

    inspect = sub.add_parser("inspect", parents=[common], help="who is who in a job")
    inspect.add_argument("job", help="job id (or a unique prefix)")

    cancel = sub.add_parser(
        "cancel", parents=[common], help="stop a running job on every node (from anywhere)"
    )
    cancel.add_argument("job", help="job id (or a unique prefix)")
    cancel.add_argument(
        "--wait", type=float, default=30.0, metavar="SECONDS",
        help="how long to wait for every process to stop (default 30; 0: do not wait)",
    )  # fmt: skip

    stacks = sub.add_parser(
        "stacks", parents=[common], help="every rank's Python stack, grouped (a hung job)"
    )
    stacks.add_argument("job", help="job id (or a unique prefix)")
    stacks.add_argument(
        "--method", choices=STACK_METHODS, default="auto",
        help="how stacks are read: py-spy where a node has it, else faulthandler (default: auto)",
    )  # fmt: skip
    stacks.add_argument(
        "--last", action="store_true", help="print the last stacks taken; ask nobody"
    )
    stacks.add_argument("--brief", action="store_true", help="one line per group of ranks")
    stacks.add_argument("--json", action="store_true", help="the dump as JSON")
    stacks.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS",
        help="how long to wait for the job's owner to answer (default 60)",
    )  # fmt: skip

    logs = sub.add_parser("logs", parents=[common], help="print a job's stored output")
    logs.add_argument("job", help="job id (or a unique prefix)")
    logs.add_argument("--rank", type=int, help="only this rank")
    logs.add_argument("--process", help="only this process or log key (worker-1, mpirun)")
    logs.add_argument("--stream", choices=("stdout", "stderr", "both"), default="both")
    logs.add_argument("--timestamps", action="store_true", help="show each line's time")
    logs.add_argument("--cell", type=int, help="a session's job: only this cell's output")
    return parser


def export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to",
        required=True,
        choices=tuple(FORMATS),
        metavar="FORMAT",
        help=f"what to write: {', '.join(FORMATS)}",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE|DIR",
        help="where: a file, or a folder (ending in /) for FORMAT's default name; "
        "default: print the manifest",
    )
    p.add_argument(
        "--image",
        metavar="IMAGE",
        help="the container image the job runs in (kubeflow, jobset, skypilot, azureml; "
        "unless the spec names one in environment)",
    )
    p.add_argument(
        "--accelerator",
        metavar="NAME",
        help="the GPU's name, where a format needs it with gpus_per_node (skypilot: e.g. A100)",
    )
    p.add_argument("--python", default="python", metavar="PATH",
                   help="the Python that per-node launchers (torchrun, dask) run with on the "
                   "cluster (default: python, found on PATH)")  # fmt: skip


def _load(args: argparse.Namespace) -> JobSpec:
    spec = load_spec(args.spec)
    overrides: dict[str, object] = {
        "instance_count": args.nodes,
        "timeout": getattr(args, "timeout", None),
        "stall_timeout": getattr(args, "stall_timeout", None),
        "grace_period": getattr(args, "grace_period", None),
        "on_stall": getattr(args, "on_stall", None),
    }
    if args.procs_per_node is not None:
        if spec.job_type == "tensorflow":
            raise DistrunError(
                "--procs-per-node does not apply to tensorflow jobs; set "
                "distribution.worker_count (and parameter_server_count) instead"
            )
        overrides["process_count_per_instance"] = args.procs_per_node
    backend = LaunchOptions.take(args).backend_section()
    if backend:
        overrides["backend"] = backend
    return spec.with_overrides(**overrides)


def cmd_export(args: argparse.Namespace, store: JobStore) -> int:
    spec = _load(args)
    target = ExportTarget.at(
        args.output, stem=Path(args.spec).stem, image=args.image, python=args.python,
        accelerator=args.accelerator, source=Path(args.spec).name,
    )  # fmt: skip
    exported = export(spec, args.to, target)
    if args.output is None:
        if len(exported.files) > 1:
            raise DistrunError("this export writes several files; say where with -o DIR/")
        print(exported.files[exported.manifest], end="")
        return EXIT_OK
    written = write(exported)
    print(f"wrote {', '.join(str(path) for path in written)}", file=sys.stderr)
    print(f"run it with: {exported.how_to_run()} (from {exported.folder})", file=sys.stderr)
    return EXIT_OK


def cmd_plan(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.run.launch import dry_run

    spec = _load(args)
    inventory = load_inventory(args.nodes_file)
    launch_plan, commands = dry_run(spec, inventory=inventory, store=store)
    if args.json:
        keys = ("name", "node", "host", "argv", "env", "role", "rank", "local_rank", "cwd")
        masked = masked_plan(launch_plan.to_dict())["processes"]  # secret values: ****
        procs = [
            {**{k: shown[k] for k in keys},
             "command": masked_command(launch_plan, commands[p.name])}
            for p, shown in zip(launch_plan.processes, masked, strict=True)
        ]  # fmt: skip
        print(json.dumps(procs, indent=1))
        return EXIT_OK
    _print_table(plan_rows(launch_plan), PLAN_COLUMNS, title=f"{spec.job_type} job plan")
    print(format_commands(launch_plan, commands))
    _print_checks(launch_plan)
    return EXIT_OK


METER_COLUMNS = ("rank", "cpu avg", "cpu peak", "memory avg", "memory peak")
# A table of its own (80 columns hold neither table's cells whole beside the other's), shown
# where nvidia-smi read any GPU memory held.
GPU_METER_COLUMNS = ("rank", "gpu avg", "gpu peak", "gpu memory peak")


def meter_rows(plan, samples: list[dict]) -> list[dict]:
    """The inspect table of what each rank used (run/meters.py), in rank order; processes
    that carry no rank (TensorFlow tasks, a Dask scheduler) by their own label."""
    labels = {p.name: p.label for p in plan.processes}
    launchers = {p.name for p in plan.processes if len(p.ranks) > 1}
    rows = []
    for found in sorted(summarize(samples), key=lambda f: natural_order(f.key)):
        if found.key in launchers:
            continue  # its ranks have rows of their own
        label = labels.get(found.key) or found.key.replace("-", " ")
        rows.append({
            "rank": label, "cpu avg": f"{found.cpu_avg:.0f}%", "cpu peak": f"{found.cpu_peak:.0f}%",
            "memory avg": mib(found.rss_avg), "memory peak": mib(found.rss_peak),
            "gpu avg": _percent(found.gpu_avg), "gpu peak": _percent(found.gpu_peak),
            "gpu memory peak": "" if found.gpu_memory_peak is None else mib(found.gpu_memory_peak),
        })  # fmt: skip
    return rows


def _percent(share: float | None) -> str:
    return "" if share is None else f"{share:.0f}%"


def _print_checks(plan) -> None:
    """What stands out in the plan (plan/parity.py), one line each."""
    from jupyter_dist.plan.parity import describe, parity_notes

    checks = describe(parity_notes(plan))
    if checks:
        print(checks)


def _print_table(
    rows: list[dict],
    columns: Sequence[str],
    title: str = "",
    whole: Sequence[str] = (),
    console=None,
) -> None:
    """A table of the columns that have a value. Columns in `whole` are never wrapped (ids
    that must stay copyable); with them, the last column takes the width that is left and
    is cut short with an ellipsis. Other columns fold."""
    from rich.console import Console
    from rich.table import Table

    shown = [c for c in columns if any(str(r.get(c, "")) for r in rows)]
    table = Table(title=title or None, expand=bool(whole))
    for column in shown:
        name = column.replace("_", " ")
        if column in whole:
            width = max(len(str(r.get(column, ""))) for r in rows)
            table.add_column(name, no_wrap=True, min_width=width)
        elif whole and column == shown[-1]:
            table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=1, min_width=8)
        elif whole:
            table.add_column(name, no_wrap=True, overflow="ellipsis")
        else:
            table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in shown))
    (console or Console()).print(table)


def cmd_run(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.run.launch import prepare_job, start_and_wait

    spec = _load(args)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if os.environ.get("NO_COLOR") and args.color == "auto":
        colour = False
    printer = TerminalPrinter(colour=colour)
    inventory = load_inventory(args.nodes_file)
    job = prepare_job(spec, listeners=[printer], store=store, inventory=inventory)
    print(
        f"job {job.job_id}: {job.summary}; logs in {job.record.path}",
        file=sys.stderr,
    )
    try:
        _interrupt_on(signal.SIGTERM, signal.SIGHUP)
        result = start_and_wait(job)
    except KeyboardInterrupt:
        print(f"job {job.job_id} cancelled: every process was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report(result)


def _interrupt_on(*signals: signal.Signals) -> None:
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) stops a job as Ctrl-C does: every
    process stopped and the job marked cancelled, not left for its agents to notice."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            signal.signal(sig, interrupt)


def _report(result: JobResult) -> int:
    print(result.describe(), file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_nodes(args: argparse.Namespace, store: JobStore) -> int:
    inventory = load_inventory(args.nodes_file)
    if inventory.is_local:
        print("no node inventory: jobs run on local nodes (this machine)", file=sys.stderr)
        return EXIT_OK
    backend = inventory_backend(inventory)
    if args.trust:
        (node,) = inventory.select(1, [args.trust], workdir="")
        print(f"trusted {node.name} ({node.host}): {backend.trust(node)}")
        return EXIT_OK
    rows = [
        {
            "node": h.name, "host": h.host if h.port is None else f"{h.host}:{h.port}",
            "status": h.status,
            "latency": "" if h.latency_ms is None else f"{h.latency_ms:.0f} ms",
            "python": h.python or "", "hostname": h.hostname or "",
            "gpus": "" if h.gpus is None else str(h.gpus), "problem": h.problem or "",
        }
        for h in backend.health(list(inventory.nodes))
    ]  # fmt: skip
    _print_table(rows, list(rows[0]), title=f"nodes in {inventory.source}")
    return EXIT_OK if all(r["status"] == "ok" for r in rows) else EXIT_FAILED


def cmd_jobs(args: argparse.Namespace, store: JobStore) -> int:
    statuses = [record.status() for record in store.jobs()]
    if args.json:
        for st in statuses:
            st["state"] = effective_state(st)
        print(json.dumps(statuses, indent=1))
        return EXIT_OK
    from rich.console import Console

    console = Console()
    # Narrow terminals get the columns that matter most; ids are never wrapped.
    medium, wide = console.width >= 120, console.width >= 160
    now = time.time()
    rows = []
    for job in map(job_summary, statuses):
        started = job["started"]
        row = {"job": job["job_id"], "name": job["name"], "state": job["state"]}
        if medium:
            row |= {"type": job["type"], "size": job_size(job)}
        if wide:
            row |= {
                "nodes": ",".join(job["nodes"]),
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
                if started
                else "",
            }
        row |= {"took": duration(started, job["ended"], now), "root cause": job["root_cause"] or ""}
        rows.append(row)
    if not rows:
        print(f"no jobs in {store.root}", file=sys.stderr)
        return EXIT_OK
    _print_table(rows, list(rows[0]), whole=("job",), console=console)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.plan import LaunchPlan

    record = store.get(args.job)
    plan = LaunchPlan.from_dict(record.plan())
    status = record.status()
    title = f"job {record.job_id} ({plan.job_type}, {effective_state(status)})"
    _print_table(inspect_rows(plan, status), INSPECT_COLUMNS, title=title)
    configs = tf_configs(plan)
    if configs:
        print(configs)
    _print_checks(plan)
    meters = meter_rows(plan, record.usage())
    if meters:
        print()
        _print_table(meters, METER_COLUMNS, title="What each rank used (sampled every 5 s)")
    on_gpus = [row for row in meters if row["gpu memory peak"]]
    if on_gpus:
        print()
        _print_table(on_gpus, GPU_METER_COLUMNS, title="What each rank used on GPUs")
    stacks = record.last_stacks()
    if stacks:  # the latest dump, one line per group (all of it: `stacks --last`)
        print()
        print(StackDump.from_dict(stacks).format(detail=False))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, store: JobStore) -> int:
    record = store.get(args.job)
    state = request_cancel(record, reason="cancelled from the command line")
    if state in FINAL_STATES:
        print(f"job {record.job_id} already ended: {state}", file=sys.stderr)
        return EXIT_OK
    if args.wait <= 0:
        print(f"asked job {record.job_id} to stop", file=sys.stderr)
        return EXIT_OK
    state = wait_until_ended(record, args.wait)
    if state not in FINAL_STATES:
        print(
            f"job {record.job_id} is still {state} after {args.wait:g} s; "
            "its owner has been asked to stop it",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(f"job {record.job_id}: {state}", file=sys.stderr)
    return EXIT_OK


def cmd_stacks(args: argparse.Namespace, store: JobStore) -> int:
    record = store.get(args.job)
    if args.last:
        dump = record.last_stacks()
        if dump is None:
            raise DistrunError(f"no stacks were taken of job {record.job_id}")
    else:
        dump = request_stacks(record, args.method, args.timeout)
    if args.json:
        print(json.dumps(dump, indent=1))
    else:
        print(StackDump.from_dict(dump).format(detail=not args.brief))
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, store: JobStore) -> int:
    record = store.get(args.job)
    keys = record.log_keys()
    if args.rank is not None:
        wanted = [f"rank-{args.rank}"]
    elif args.process:
        wanted = [args.process]
    else:
        wanted = keys
    unknown = [k for k in wanted if k not in keys]
    if unknown:
        raise DistrunError(
            f"job {record.job_id} has no log for {unknown[0]!r} (logs: {', '.join(keys) or 'none'})"
        )
    if args.cell is not None:
        cells = sorted({cell for key in wanted for cell in record.cells(key)})
        if args.cell not in cells:
            raise DistrunError(
                f"job {record.job_id} has no cell {args.cell} ("
                + (f"its cells: {cells[0]}-{cells[-1]})" if cells else "it is not a session)")
            )
    streams = ("stdout", "stderr") if args.stream == "both" else (args.stream,)
    prefix_each = len(wanted) > 1
    out = []
    for ts, key, _stream, text in record.read_logs(wanted, streams, cell=args.cell):
        stamp = f"{ts} " if args.timestamps else ""
        label = f"[{key}] " if prefix_each else ""
        if "\r" in text:  # a progress bar: its last state, as a terminal shows it
            text = text.rstrip("\r").rsplit("\r", 1)[-1]
        out.append(f"{stamp}{label}{text}\n")
    sys.stdout.write("".join(out))
    return EXIT_OK


COMMANDS = {
    "plan": cmd_plan, "export": cmd_export, "run": cmd_run, "nodes": cmd_nodes,
    "jobs": cmd_jobs, "logs": cmd_logs, "inspect": cmd_inspect, "cancel": cmd_cancel,
    "stacks": cmd_stacks,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    store = JobStore(args.store) if args.store else JobStore()
    try:
        return COMMANDS[args.command](args, store)
    except DistrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
