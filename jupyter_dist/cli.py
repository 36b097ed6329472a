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
from collections.abc import Sequence
from pathlib import Path

from jupyter_dist import job_commands
from jupyter_dist.backends import declared_options
from jupyter_dist.describe import PLAN_COLUMNS, command_masker, format_commands, plan_rows
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import JobResult
from jupyter_dist.export import FORMATS, ExportTarget, export, write
from jupyter_dist.export.session import SPEC_FORMAT
from jupyter_dist.job_commands import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    TerminalPrinter,
    print_checks,
    print_table,
    wants_colour,
)
from jupyter_dist.masking import masked_plan
from jupyter_dist.nodes import load_inventory
from jupyter_dist.options import CLI_RUN, CLI_SPEC, LaunchOptions, add_to
from jupyter_dist.spec import LIMIT_KEYS, JobSpec, load_spec
from jupyter_dist.store import JobStore


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

    def spec_options(p: argparse.ArgumentParser, session: bool = False) -> None:
        if session:
            p.add_argument(
                "spec",
                metavar="SPEC.yml|SESSION",
                help="job spec (an Azure ML "
                "command job works), or a warm session's job id or name: its "
                "cells that worked, as one job",
            )
        else:
            p.add_argument(
                "spec", metavar="SPEC.yml", help="job spec (an Azure ML command job works)"
            )
        add_to(p, CLI_SPEC, declared_options())

    plan = sub.add_parser(
        "plan", parents=[common], help="show every process the job would start; runs nothing"
    )
    spec_options(plan)
    plan.add_argument("--json", action="store_true", help="a JSON list of processes")

    export = sub.add_parser(
        "export",
        parents=[common],
        help=f"write the job for another scheduler ({', '.join(FORMATS)}); runs nothing",
    )
    spec_options(export, session=True)
    export_options(export)

    run = sub.add_parser(
        "run", parents=[common], help="run a job with live output, prefixed by rank"
    )
    spec_options(run)
    add_to(run, CLI_RUN, declared_options())
    run.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour prefixes"
    )
    job_commands.add_parsers(sub, common)
    return parser


def export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--to",
        required=True,
        choices=(*FORMATS, SPEC_FORMAT),
        metavar="FORMAT",
        help=f"what to write: {', '.join(FORMATS)}; for a session, also {SPEC_FORMAT} "
        "(our job spec, for jupyter distrun run)",
    )
    p.add_argument(
        "--cells",
        metavar="CELLS",
        help="for a session: the cells to export, by the numbers the live view shows "
        "(e.g. 1,3-5; default: every cell that ended well on every rank)",
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
        "--code-in-image",
        metavar="PATH",
        help="kubeflow, jobset: the pods run the command in the image's own copy of the code "
        "folder, at PATH (default: the code folder travels in a ConfigMap, up to about 1 MiB)",
    )
    p.add_argument(
        "--accelerator",
        metavar="NAME",
        help="the GPU's name, where a format needs it with gpus_per_node (skypilot: e.g. A100)",
    )
    p.add_argument(
        "--python",
        default="python",
        metavar="PATH",
        help="the Python that per-node launchers (torchrun, dask) run with on the "
        "cluster (default: python, found on PATH)",
    )


def _load(args: argparse.Namespace) -> JobSpec:
    spec = load_spec(args.spec)
    overrides: dict[str, object] = {
        "instance_count": args.nodes,
        **{key: getattr(args, key, None) for key in LIMIT_KEYS},  # `run` offers them
        "network_check": False if getattr(args, "no_preflight", False) else None,
        "post_mortem": True if getattr(args, "post_mortem", False) else None,
        "name": getattr(args, "name", None),
        "preload": getattr(args, "preload", None),
        "metrics_pattern": getattr(args, "metrics_pattern", None) or None,
    }
    if args.procs_per_node is not None:
        if spec.job_type == "tensorflow":
            raise DistrunError(
                "--procs-per-node does not apply to tensorflow jobs; set "
                "distribution.worker_count (and parameter_server_count) instead"
            )
        overrides["process_count_per_instance"] = args.procs_per_node
    backend = LaunchOptions.take(args, declared_options()).backend_section()
    if backend:
        overrides["backend"] = backend
    return spec.with_overrides(**overrides)


def cmd_export(args: argparse.Namespace, store: JobStore) -> int:
    if not Path(args.spec).exists() and not args.spec.endswith((".yml", ".yaml")):
        # A warm session's history, by its job id or name: as %distrun session export.
        given = [
            flag
            for flag, value in (("--nodes", args.nodes), ("--procs-per-node", args.procs_per_node))
            if value is not None
        ]
        if given:
            raise DistrunError(
                f"{given[0]} applies to a spec file; a session's export has "
                "the session's own nodes and ranks"
            )
        return job_commands.export_session_now(args, store, args.spec)
    if args.to == SPEC_FORMAT or args.cells:
        flag = "--to yaml" if args.to == SPEC_FORMAT else "--cells"
        raise DistrunError(
            f"{flag} applies to a session's export (a session's job id or "
            f"name), not to a spec file such as {args.spec}"
        )
    spec = _load(args)
    target = ExportTarget.at(
        args.output,
        stem=Path(args.spec).stem,
        image=args.image,
        python=args.python,
        accelerator=args.accelerator,
        code_in_image=args.code_in_image,
        source=Path(args.spec).name,
    )
    exported = export(spec, args.to, target)
    if args.output is None:
        if len(exported.files) > 1:
            raise DistrunError("this export writes several files; say where with -o DIR/")
        print(exported.files[exported.manifest], end="")
        return EXIT_OK
    written = write(exported)
    print(f"wrote {', '.join(str(path) for path in written)}", file=sys.stderr)
    for note in exported.notes():
        print(note, file=sys.stderr)
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
        mask = command_masker(launch_plan)
        procs = [
            {**{k: shown[k] for k in keys}, "command": mask(commands[p.name])}
            for p, shown in zip(launch_plan.processes, masked, strict=True)
        ]
        print(json.dumps(procs, indent=1))
        return EXIT_OK
    print_table(plan_rows(launch_plan), PLAN_COLUMNS, title=f"{spec.job_type} job plan")
    print(format_commands(launch_plan, commands))
    print_checks(launch_plan)
    return EXIT_OK


def cmd_run(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.run.launch import prepare_job, start_and_wait

    spec = _load(args)
    if args.detach:
        return _run_detached(args, spec, store)
    printer = TerminalPrinter(colour=wants_colour(args.color))
    inventory = load_inventory(args.nodes_file)
    # From here on `kill` is Ctrl-C: whoever saw the job's line below may send it at once.
    _interrupt_on(signal.SIGTERM, signal.SIGHUP)
    job = prepare_job(spec, listeners=[printer], store=store, inventory=inventory)
    try:
        print(f"job {job.job_id}: {job.summary}; logs in {job.record.path}", file=sys.stderr)
        result = start_and_wait(job)
    except KeyboardInterrupt:
        job.cancel("interrupted")  # where start_and_wait did not get to (a no-op where it did)
        job.wait()
        print(f"job {job.job_id} cancelled: every process was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    return _report(result)


def _run_detached(args: argparse.Namespace, spec: JobSpec, store: JobStore) -> int:
    from jupyter_dist.run.supervisor import detach

    load_inventory(args.nodes_file)  # a bad inventory is said here, before anything starts
    detached = detach(spec, store=store, cwd=os.getcwd(), nodes_file=args.nodes_file)
    print(
        f"job {detached.job_id}: {detached.summary}; every rank runs, detached (its "
        f"supervisor is pid {detached.supervisor_pid}). Follow it: jupyter distrun attach "
        f"{detached.job_id}; stop it: jupyter distrun cancel {detached.job_id}",
        file=sys.stderr,
    )
    print(detached.job_id)
    return EXIT_OK


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


COMMANDS = {"plan": cmd_plan, "export": cmd_export, "run": cmd_run}


def main(argv: Sequence[str] | None = None) -> int:
    args = job_commands.parse_words(_parser(), argv)
    return job_commands.run_command(args, {**COMMANDS, **job_commands.COMMANDS})


if __name__ == "__main__":
    sys.exit(main())
