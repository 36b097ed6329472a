"""The commands over the job store that both the terminal (`jupyter distrun COMMAND`) and
the notebook (`%distrun COMMAND`) offer: nodes, jobs, inspect, cancel, stacks, logs, attach,
and the rank-prefixed printing of a job's lines they share with `run`. Each
reads the store (and, for nodes, the inventory's backend) and prints; neither front owns
them, so neither calls the other.

    code = job_commands.main(["logs", "JOB", "--rank", "0"])   # as %distrun logs does

Exit codes: 0 done, 1 the job or a node is not well, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TextIO, TypeVar

from jupyter_dist import debug_console
from jupyter_dist.backends import backend_class, declared_options, inventory_backend
from jupyter_dist.backends.node_pools import ACTIONS as POOL_ACTIONS
from jupyter_dist.backends.node_pools import (
    NodePools,
    pools_for_jobs,
    pools_in_allocation,
    pools_on_nodes,
)
from jupyter_dist.describe import (
    INSPECT_COLUMNS,
    attempt_rows,
    attempts_ran,
    duration,
    inspect_rows,
    job_size,
    job_summary,
    paused_records,
    tf_configs,
    visible,
)
from jupyter_dist.diagnose.debug import PausedRank, by_rank
from jupyter_dist.diagnose.meters import mib, summarize
from jupyter_dist.diagnose.stacks import METHODS as STACK_METHODS
from jupyter_dist.diagnose.stacks import StackDump
from jupyter_dist.diagnose.stall import describe_stall
from jupyter_dist.errors import DamagedJob, DistrunError
from jupyter_dist.events import (
    FINAL_STATES,
    Attempt,
    JobListener,
    OutputLine,
    ProcessState,
    RootCause,
    exit_text,
)
from jupyter_dist.nodes import load_inventory, this_machines_gpus
from jupyter_dist.options import BY_NAME
from jupyter_dist.run.metrics import read_metrics, readable, summarize_metrics
from jupyter_dist.run.outputs import output_notes
from jupyter_dist.run.requests import (
    copying_outputs,
    effective_state,
    request_cancel,
    request_stacks,
    wait_until_ended,
)
from jupyter_dist.store import JobStore, natural_order
from jupyter_dist.terminal_text import last_state, plain

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
T = TypeVar("T")


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

    def _text(self, text: str) -> str:
        """A line as the terminal gets it: as printed, where colours are on; else without
        escape sequences or control characters (no colour, no retitled window, no moved
        cursor), a progress bar's last state only."""
        if self.colour:
            return text
        return plain(last_state(text))

    def on_lines(self, lines: list[OutputLine]) -> None:
        with self._lock:
            for stream in ("stdout", "stderr"):
                text = "".join(
                    f"{self._prefix(line.key, line.label)}{self._text(line.text)}\n"
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

    def on_attempt(self, number: int, of: int, previous: Attempt) -> None:
        with self._lock:
            rule = "\u2500\u2500"  # as the stored marker (store.attempt_marker), with its count
            self.err.write(f"{previous.summary()}\n{rule} attempt {number} of {of} {rule}\n")
            self.err.flush()


def seconds(text: str, zero: bool = False) -> float:
    """A wait in seconds, for argparse: a positive, finite number (-1, 0, nan and inf are
    refused in one line by the parser, naming the option); with `zero`, 0 too."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
        what = "a number of seconds, 0 or more" if zero else "a positive number of seconds"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def seconds_or_none(text: str) -> float:
    """As `seconds`, 0 allowed (no wait)."""
    return seconds(text, zero=True)


def wants_colour(choice: str, out: TextIO = sys.stdout) -> bool:
    """--color auto|always|never: auto is a terminal's, unless NO_COLOR is set."""
    if choice == "auto":
        return out.isatty() and not os.environ.get("NO_COLOR")
    return choice == "always"


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The job commands' parsers, under `sub`; `common` holds the options every command
    takes (--store)."""
    nodes = sub.add_parser("nodes", parents=[common], help="attached nodes and their health")
    nodes_file = BY_NAME["nodes_file"]
    nodes.add_argument(*nodes_file.flags(), **nodes_file.argparse_kwargs())
    nodes.add_argument("--trust", metavar="NAME", help="record NAME's host key in known_hosts")
    # A backend that reaches a cluster by itself lists that cluster's nodes (ray's), with
    # its own options (--ray-address).
    for option in (BY_NAME["backend"], *(o for o in declared_options() if o.backend)):
        nodes.add_argument(*option.flags(), **option.argparse_kwargs())

    pool = sub.add_parser(
        "pool",
        parents=[common],
        help="the nodes' pools of pre-imported Python (--preload): list them, or stop them",
    )
    pool.add_argument(
        "action",
        choices=POOL_ACTIONS,
        help="list: each node's pools; stop: "
        "end them (a pool with ranks running ends after its last)",
    )
    pool.add_argument("node", nargs="*", help="only these nodes (default: every node)")
    pool.add_argument(*nodes_file.flags(), **nodes_file.argparse_kwargs())
    # A Slurm allocation's nodes, where a job's pools are steps of their own; the
    # inventory's nodes otherwise (ssh, local).
    pool.add_argument(
        "--backend",
        choices=["slurm"],
        help="slurm: the nodes of a Slurm allocation (default: the node inventory's)",
    )
    pool.add_argument(
        "--slurm-job",
        metavar="ID",
        help="the Slurm allocation's job id (implies --backend slurm; default: SLURM_JOB_ID's)",
    )

    jobs = sub.add_parser("jobs", parents=[common], help="list jobs in the store, newest first")
    jobs.add_argument("--json", action="store_true", help="a JSON list of every job's status")

    inspect = sub.add_parser("inspect", parents=[common], help="who is who in a job")
    inspect.add_argument("job", help="job id (or a unique prefix)")

    attach = sub.add_parser(
        "attach",
        parents=[common],
        help="a job's recent lines, then its new ones as they come, until it ends; Ctrl-C "
        "detaches and leaves it running",
    )
    attach.add_argument("job", help="job id (or a unique prefix)")
    attach.add_argument(
        "--tail",
        type=int,
        default=200,
        metavar="N",
        help="how many of the lines already stored to show first (default 200)",
    )
    attach.add_argument(
        "--color", choices=("auto", "always", "never"), default="auto", help="colour prefixes"
    )

    cancel = sub.add_parser(
        "cancel", parents=[common], help="stop a running job on every node (from anywhere)"
    )
    cancel.add_argument("job", help="job id (or a unique prefix)")
    cancel.add_argument(
        "--wait",
        type=seconds_or_none,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for every process to stop (default 30; 0: do not wait)",
    )

    stacks = sub.add_parser(
        "stacks", parents=[common], help="every rank's Python stack, grouped (a hung job)"
    )
    stacks.add_argument("job", help="job id (or a unique prefix)")
    stacks.add_argument(
        "--method",
        choices=STACK_METHODS,
        default="auto",
        help="how stacks are read: py-spy where a node has it, else faulthandler (default: auto)",
    )
    stacks.add_argument(
        "--last", action="store_true", help="print the last stacks taken; ask nobody"
    )
    stacks.add_argument("--brief", action="store_true", help="one line per group of ranks")
    stacks.add_argument("--json", action="store_true", help="the dump as JSON")
    stacks.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the job's owner to answer (default 60)",
    )

    debug = sub.add_parser(
        "debug",
        parents=[common],
        help="a running job's paused ranks (breakpoint(), pdb.set_trace(), --post-mortem): "
        "a console to list them, attach to one and send pdb commands; or one command",
    )
    debug.add_argument("job", help="job id (or a unique prefix)")
    debug.add_argument("--list", action="store_true", help="one line per paused rank, then exit")
    debug.add_argument(
        "--json",
        action="store_true",
        help="the paused ranks as a JSON array: rank, node, file, line, function, reason, "
        "exception (with --do and --ranks: each rank's answer)",
    )
    debug.add_argument(
        "--rank",
        type=int,
        metavar="R",
        help="the rank --do talks to or --interrupt pauses; alone, the console attached to it",
    )
    debug.add_argument(
        "--ranks", metavar="SET", help="the ranks --do talks to: 0,2-3 or all (the paused ones)"
    )
    debug.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="with --rank: which of its paused processes --do talks to, where it has several "
        "(a forked child's; --list names them)",
    )
    debug.add_argument(
        "--interrupt",
        action="store_true",
        help="pause --rank R where it runs (a rank that hangs, or loops), as breakpoint() would",
    )
    debug.add_argument(
        "--do",
        metavar="COMMAND",
        help="one pdb command for --rank or --ranks ('p x', 'n', 'where', 'c'): prints "
        "pdb's answer",
    )
    debug.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the answer (default 30)",
    )

    metrics = sub.add_parser(
        "metrics",
        parents=[common],
        help="a job's metrics (report() calls, trainers' log lines, progress bars): each "
        "one's first, last, min and max; or every point",
    )
    metrics.add_argument("job", help="job id (or a unique prefix)")
    shape = metrics.add_mutually_exclusive_group()
    shape.add_argument(
        "--csv", action="store_true", help="every point as CSV: time, key, step, metric, value"
    )
    shape.add_argument("--json", action="store_true", help="every record as JSON lines")

    logs = sub.add_parser("logs", parents=[common], help="print a job's stored output")
    logs.add_argument("job", help="job id (or a unique prefix)")
    logs.add_argument("--rank", type=int, help="only this rank")
    logs.add_argument("--process", help="only this process or log key (worker-1, mpirun)")
    logs.add_argument("--stream", choices=("stdout", "stderr", "both"), default="both")
    logs.add_argument("--timestamps", action="store_true", help="show each line's time")
    logs.add_argument("--cell", type=int, help="a session's job: only this cell's output")
    logs.add_argument(
        "--attempt",
        type=int,
        metavar="K",
        help="a job that started again after a failure: only attempt K's output (the first is 1)",
    )
    logs.add_argument(
        "--tail",
        type=int,
        metavar="N",
        help="only the last N lines (0: every line, the terminal's default; "
        f"a notebook shows the last {NOTEBOOK_LOG_LINES:,} unless told)",
    )


# What `%distrun logs` prints unless --tail says otherwise: a cell holding a whole long log
# (millions of lines) would stall the notebook's page.
NOTEBOOK_LOG_LINES = 5000

METER_COLUMNS = ("rank", "cpu avg", "cpu peak", "memory avg", "memory peak")
# A table of its own (80 columns hold neither table's cells whole beside the other's), shown
# where nvidia-smi read any GPU memory held.
GPU_METER_COLUMNS = ("rank", "gpu avg", "gpu peak", "gpu memory peak")


def meter_rows(plan, samples: list[dict]) -> list[dict]:
    """The inspect table of what each rank used (diagnose/meters.py), in rank order; processes
    that carry no rank (TensorFlow tasks, a Dask scheduler) by their own label."""
    labels = {p.name: p.label for p in plan.processes}
    launchers = {p.name for p in plan.processes if len(p.ranks) > 1}
    rows = []
    for found in sorted(summarize(samples), key=lambda f: natural_order(f.key)):
        if found.key in launchers:
            continue  # its ranks have rows of their own
        label = labels.get(found.key) or found.key.replace("-", " ")
        rows.append(
            {
                "rank": label,
                "cpu avg": f"{found.cpu_avg:.0f}%",
                "cpu peak": f"{found.cpu_peak:.0f}%",
                "memory avg": mib(found.rss_avg),
                "memory peak": mib(found.rss_peak),
                "gpu avg": _percent(found.gpu_avg),
                "gpu peak": _percent(found.gpu_peak),
                "gpu memory peak": ""
                if found.gpu_memory_peak is None
                else mib(found.gpu_memory_peak),
            }
        )
    return rows


def _percent(share: float | None) -> str:
    return "" if share is None else f"{share:.0f}%"


def print_checks(plan) -> None:
    """What stands out in the plan (plan/parity.py), one line each."""
    from jupyter_dist.plan.parity import describe, parity_notes

    checks = describe(parity_notes(plan))
    if checks:
        print(checks)


def print_table(
    rows: list[dict],
    columns: Sequence[str],
    title: str = "",
    whole: Sequence[str] = (),
    console=None,
) -> None:
    """A table of the columns that have a value. Columns in `whole` are never wrapped (ids
    that must stay copyable); with them, the last column takes the width that is left and
    is cut short with an ellipsis. Other columns fold.

    Every text goes to rich as a `Text`, never as markup: a job's name, a node's, a root
    cause in gloo's words (`[/__w/.../pair.cc:553] Connection closed`) print as they are."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    shown = [c for c in columns if any(str(r.get(c, "")) for r in rows)]
    table = Table(title=Text(title) if title else None, expand=bool(whole))
    for column in shown:
        name = Text(column.replace("_", " "))
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
        table.add_row(*(Text(visible(str(row.get(c, "")))) for c in shown))
    (console or Console()).print(table)


# The first characters that make a spreadsheet read a cell as a formula (OWASP's list).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text: str) -> str:
    """A text cell of a CSV file as a spreadsheet shows it: one that would start a formula
    (`=cmd|' /C calc'!A0`, `+SUM(1,1)`, `@A1`) gets a leading `'`, as OWASP advises."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def cmd_nodes(args: argparse.Namespace, store: JobStore) -> int:
    if args.backend:
        return _cluster_nodes(args)
    inventory = load_inventory(args.nodes_file)
    if inventory.is_local:
        gpus = this_machines_gpus()
        has = "" if gpus is None else f", {gpus} GPU{'s' * (gpus != 1)}"
        print(f"no node inventory: jobs run on local nodes (this machine{has})", file=sys.stderr)
        _print_pools(pools_on_nodes(inventory, "list"))
        return EXIT_OK
    backend = inventory_backend(inventory)
    if args.trust:
        (node,) = inventory.select(1, [args.trust], workdir="")
        print(f"trusted {node.name} ({node.host}): {backend.trust(node)}")
        return EXIT_OK
    rows = [
        {
            "node": h.name,
            "host": h.host if h.port is None else f"{h.host}:{h.port}",
            "status": h.status,
            "latency": "" if h.latency_ms is None else f"{h.latency_ms:.0f} ms",
            "python": h.python or "",
            "hostname": h.hostname or "",
            "gpus": "" if h.gpus is None else str(h.gpus),
            "problem": h.problem or "",
        }
        for h in backend.health(list(inventory.nodes))
    ]
    print_table(rows, list(rows[0]), title=f"nodes in {inventory.source}")
    reached = [row["node"] for row in rows if row["status"] == "ok"]
    if reached:  # and their pools, where they have any
        _print_pools(pools_on_nodes(inventory, "list", reached))
    return EXIT_OK if all(r["status"] == "ok" for r in rows) else EXIT_FAILED


def cmd_pool(args: argparse.Namespace, store: JobStore) -> int:
    """`pool list|stop [NODE ...]`: each node's pools, as a table, or stopped."""
    if args.backend or args.slurm_job:  # --slurm-job alone says which backend too
        answers = pools_in_allocation(args.slurm_job or "", args.action, args.node or None)
    else:  # where jobs run by default: inside an allocation, its nodes
        answers = pools_for_jobs(load_inventory(args.nodes_file), args.action, args.node or None)
    for answer in answers:
        if answer.problem:
            print(f"{answer.node}: {answer.problem}", file=sys.stderr)
    if not _print_pools(answers, args.action) and not any(a.problem for a in answers):
        print("no pool on any node" if args.action == "list" else "no pool to stop")
    return EXIT_FAILED if any(answer.problem for answer in answers) else EXIT_OK


def _print_pools(answers: list[NodePools], action: str = "list") -> bool:
    """The pools the nodes answered with, as a table; whether there were any."""
    rows = [
        {
            "node": answer.node,
            "modules": ",".join(pool["modules"]),
            "pid": str(pool["pid"]),
            "ranks": str(pool["ranks"]),
            "memory": "" if pool["rss"] is None else mib(pool["rss"]),
            "idle": f"{pool['idle']:.0f} s of {pool['idle_limit']:.0f} s"
            if pool.get("idle_limit")
            else f"{pool['idle']:.0f} s",
            "started": f"{pool['age']:.0f} s ago",
        }
        for answer in answers
        for pool in answer.pools
    ]
    if rows:
        title = (
            "pools stopped (each ends after its running ranks)"
            if action == "stop"
            else "pools of pre-imported Python (--preload)"
        )
        print_table(rows, list(rows[0]), title=title)
    return bool(rows)


def _cluster_nodes(args: argparse.Namespace) -> int:
    """`nodes --backend NAME`: the nodes of the cluster that backend reaches, and what each
    has; a backend whose nodes come from the inventory says so."""
    options = {
        option.spec_key or option.name: getattr(args, option.name)
        for option in declared_options()
        if option.backend == args.backend and getattr(args, option.name, None) is not None
    }
    found = backend_class(args.backend)().cluster_nodes(options)
    if found is None:
        raise DistrunError(
            f"the {args.backend} backend lists no nodes of its own (its nodes "
            f"are the inventory's or an allocation's): jupyter distrun nodes "
            f"[--nodes-file FILE]"
        )
    rows = [
        {
            "node": h.name,
            "host": h.host,
            "status": h.status,
            "cpus": "" if h.cpus is None else f"{h.cpus:g}",
            "gpus": "" if h.gpus is None else str(h.gpus),
            "memory": "" if h.memory is None else f"{h.memory / 2**30:.1f} GiB",
            "problem": h.problem or "",
        }
        for h in found
    ]
    if not rows:
        print(f"the {args.backend} cluster has no nodes", file=sys.stderr)
        return EXIT_FAILED
    print_table(rows, list(rows[0]), title=f"{args.backend} nodes")
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
        state = job["state"]
        if job["paused"]:  # waiting for its user, not stuck
            state += f" · {len(job['paused'])} paused"
        row = {"job": job["job_id"], "name": job["name"], "state": state}
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
    print_table(rows, list(rows[0]), whole=("job",), console=console)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.plan import LaunchPlan

    record = store.get(args.job)
    plan = LaunchPlan.from_dict(record.plan())
    status = record.status()
    title = f"job {record.job_id} ({plan.job_type}, {effective_state(status)})"
    print_table(inspect_rows(plan, status), INSPECT_COLUMNS, title=title)
    cause = status.get("root_cause")
    if isinstance(cause, dict) and status.get("state") == "failed":  # where a user looks first
        with contextlib.suppress(TypeError):
            print("\n" + RootCause(**cause).format())
    elif status.get("message") and status.get("state") in ("failed", "timed_out"):
        print(f"\n{status['message']}")
    paused = [PausedRank.from_dict(p) for p in paused_records(status)]
    if paused and status.get("state") == "running":
        print(f"\nPaused in the debugger (jupyter distrun debug {record.job_id}):")
        print("\n".join(p.line_text() for p in sorted(paused, key=by_rank)))
    configs = tf_configs(plan)
    if configs:
        print(configs)
    print_checks(plan)
    outputs = output_notes(plan, record.path) + list(status.get("outputs_copied") or [])
    if outputs:
        print("\n" + "\n".join(f"Output: {line}" for line in outputs))
    attempts = attempt_rows(status)
    if attempts:
        print()
        print_table(attempts, list(attempts[0]), title="Attempts (limits.max_restarts)")
        if status.get("replaced"):
            print(
                "Spares taken for nodes that could not be reached: "
                + ", ".join(map(str, status["replaced"]))
            )
    metrics, notes = read_metrics(record)
    if metrics:
        print()
        print_metrics(metrics, notes)
    meters = meter_rows(plan, record.usage())
    if meters:
        print()
        print_table(meters, METER_COLUMNS, title="What each rank used (sampled every 5 s)")
    on_gpus = [row for row in meters if row["gpu memory peak"]]
    if on_gpus:
        print()
        print_table(on_gpus, GPU_METER_COLUMNS, title="What each rank used on GPUs")
    try:
        stacks = record.last_stacks()
        dump = StackDump.from_dict(stacks) if stacks else None
    except DamagedJob as exc:  # the rest of the job is still worth showing
        print(f"\n{exc}")
        dump = None
    if dump is not None:  # the latest dump, one line per group (all of it: `stacks --last`)
        print()
        print(dump.format(detail=False))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, store: JobStore) -> int:
    record = store.get(args.job)
    state = request_cancel(record, reason="cancelled from the command line")
    if state in FINAL_STATES and not copying_outputs(record):
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


def cmd_debug(args: argparse.Namespace, store: JobStore) -> int:
    from jupyter_dist.run.detached_session import RemoteSession, is_detached_session

    record = store.get(args.job)
    if is_detached_session(record) and record.status().get("state") == "running":
        # A detached session's failed cell has a post-mortem to be had, as in its kernel.
        return debug_console.debug_session(RemoteSession(record), args)
    return debug_console.cmd_debug(args, record)


def _last(items: Iterable[T], count: int) -> tuple[list[T], int]:
    """The last `count` of `items` (read once, holding no more than that), and how many
    came before them."""
    kept: collections.deque[T] = collections.deque(maxlen=count)
    seen = 0
    for item in items:
        kept.append(item)
        seen += 1
    return list(kept), seen - len(kept)


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
    if args.attempt is not None:
        ran = attempts_ran(record.status())
        if not 1 <= args.attempt <= ran:
            raise DistrunError(
                f"job {record.job_id} has no attempt {args.attempt} (it ran "
                + (f"attempts 1-{ran})" if ran > 1 else "once: attempt 1)")
            )
    if args.tail is not None and args.tail < 0:
        raise DistrunError(
            f"--tail: {args.tail} is not valid; expected a line count >= 0 (0: every line)"
        )
    streams = ("stdout", "stderr") if args.stream == "both" else (args.stream,)
    prefix_each = len(wanted) > 1
    out = []
    lines = record.read_logs(wanted, streams, cell=args.cell, attempt=args.attempt)
    if args.tail:
        lines, left_out = _last(lines, args.tail)
        if left_out:
            print(
                f"({left_out:,} earlier lines left out; --tail 0 shows every one)",
                file=sys.stderr,
                flush=True,
            )
    for ts, key, _stream, text in lines:
        stamp = f"{ts} " if args.timestamps else ""
        label = f"[{key}] " if prefix_each else ""
        text = last_state(text)
        out.append(f"{stamp}{label}{text}\n")
    sys.stdout.write("".join(out))
    return EXIT_OK


def cmd_attach(args: argparse.Namespace, store: JobStore) -> int:
    """Follow a job from the store (run/follow.py): its last lines, then the new ones, as
    `run` prints them; the job's outcome and exit code at its end. An interrupt detaches."""
    from jupyter_dist.run.follow import Follower, attempts_of

    record = store.get(args.job)
    follower = Follower(record, history=checked_tail(args.tail))
    printer = TerminalPrinter(colour=wants_colour(args.color))
    status = record.status()
    if follower.ended(status):
        said = f"its last {args.tail} lines"
    else:
        said = "following it; Ctrl-C detaches and leaves it running"
    print(f"job {record.job_id} ({follower.state(status)}): {said}", file=sys.stderr)
    earlier = attempts_of(status)
    if earlier:
        print(f"attempt {len(earlier) + 1}; earlier:", file=sys.stderr)
        for attempt in earlier:
            print(f"  {attempt.summary()}", file=sys.stderr)
    try:
        printer.on_lines(follower.history())
        while True:
            status = record.status()
            ended = follower.ended(status)  # before the read: what it wrote last is then read
            lines = follower.new_lines()
            printer.on_lines(lines)
            for restart in follower.new_attempts(status):
                printer.on_attempt(*restart)
            if ended:
                break
            if not lines:
                time.sleep(ATTACH_POLL_S)
    except KeyboardInterrupt:
        print(
            f"\ndetached from job {record.job_id}; it runs on (stop it: jupyter distrun "
            f"cancel {record.job_id})",
            file=sys.stderr,
        )
        return EXIT_OK
    result = follower.result()
    print(result.describe(), file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILED


def checked_tail(tail: int) -> int:
    """attach's --tail, or a one-line DistrunError for a count no log has."""
    if tail < 0:
        raise DistrunError(f"--tail {tail}: give a number of lines, 0 or more")
    return tail


ATTACH_POLL_S = 0.2  # how often an attached front looks for new lines when there were none


def cmd_metrics(args: argparse.Namespace, store: JobStore) -> int:
    """A job's metrics (run/metrics.py): a summary table; every point with --csv or --json."""
    record = store.get(args.job)
    records, notes = read_metrics(record)
    if args.json:  # one object a line, in words (run/metrics.readable)
        sys.stdout.write("".join(json.dumps(readable(r)) + "\n" for r in records))
        return EXIT_OK
    if args.csv:
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["time", "key", "step", "metric", "value"])
        for entry in records:  # progress is a metric here: the steps done
            values = entry.get("m") or {"progress": (entry.get("p") or [None])[0]}
            for name, value in values.items():
                step = entry.get("s")
                writer.writerow(
                    [
                        entry.get("t"),
                        csv_text(entry["k"]),
                        "" if step is None else step,
                        csv_text(name),
                        value,
                    ]
                )
        return EXIT_OK
    if not records:
        print(
            f"job {record.job_id} reported no metrics (report(), a trainer's log lines or "
            "a progress bar)",
            file=sys.stderr,
        )
        return EXIT_OK
    print_metrics(records, notes)
    return EXIT_OK


def print_metrics(records: list[dict], notes: list[str]) -> None:
    """Each metric's first, last, min and max, the progress reached, and the notes."""
    rows, reached = summarize_metrics(records)
    if rows:
        print_table(rows, list(rows[0]), title="Metrics (first, last, min and max over every rank)")
    if reached:
        print(f"Progress reached: {reached} (the slowest rank's)")
    for note in notes:
        print(f"Downsampled: {note}")


COMMANDS = {
    "nodes": cmd_nodes,
    "jobs": cmd_jobs,
    "logs": cmd_logs,
    "inspect": cmd_inspect,
    "cancel": cmd_cancel,
    "stacks": cmd_stacks,
    "attach": cmd_attach,
    "metrics": cmd_metrics,
    "debug": cmd_debug,
    "pool": cmd_pool,
}


Command = Callable[[argparse.Namespace, JobStore], int]


def export_session_now(args: argparse.Namespace, store: JobStore, which: str) -> int:
    """Write the session `which` names (a job id or name) as a job (export/session.py), as
    `jupyter distrun export SESSION` and `%distrun session export` do: `args.to`,
    `args.output`, `args.cells` and the export formats' options. Says on stderr what it
    wrote, each cell left out and how to run it."""
    from jupyter_dist.export.session import export_session
    from jupyter_dist.run.session_history import find_session

    record = find_session(store, which)
    options = {key: getattr(args, key, None) for key in ("image", "accelerator", "code_in_image")}
    if getattr(args, "python", "python") != "python":
        options["python"] = args.python
    written, said = export_session(record, args.to, args.output, args.cells, **options)
    print(f"wrote {', '.join(str(path) for path in written)}", file=sys.stderr)
    for line in said:
        print(line, file=sys.stderr)
    return EXIT_OK


def session_export_parser(prog: str) -> argparse.ArgumentParser:
    """`%distrun session export [NAME|JOB] [--cells C] [--to FORMAT] [-o PATH]`."""
    from jupyter_dist.export import FORMATS
    from jupyter_dist.export.session import SPEC_FORMAT

    parser = argparse.ArgumentParser(prog=prog, add_help=True)
    parser.add_argument(
        "session",
        nargs="?",
        help="the session's name or job id (default: this kernel's open or last session)",
    )
    parser.add_argument(
        "--cells",
        metavar="CELLS",
        help="the cells to export, by the numbers the live view shows "
        "(e.g. 1,3-5; default: every cell that ended well)",
    )
    parser.add_argument(
        "--to",
        default=SPEC_FORMAT,
        choices=(SPEC_FORMAT, *FORMATS),
        metavar="FORMAT",
        help=f"what to write: {SPEC_FORMAT} (a job spec for "
        f"jupyter distrun run; the default), {', '.join(FORMATS)}",
    )
    parser.add_argument(
        "-o",
        "--export-to",
        dest="output",
        metavar="FILE|DIR",
        help="where: a file, or a folder (ending in /); default: this folder",
    )
    for flag in ("--image", "--accelerator", "--code-in-image"):
        parser.add_argument(flag, metavar="VALUE", help="as for an export (see --to)")
    return parser


def run_command(args: argparse.Namespace, commands: Mapping[str, Command] = COMMANDS) -> int:
    """Run the parsed command `args.command` (one of `commands`) on the store `args.store`
    names (else the default one): its exit code, with a DistrunError printed as one line
    (2), an interrupt as 130 and a closed pipe (`| head`) as 0."""
    store = JobStore(args.store) if args.store else JobStore()
    try:
        return commands[args.command](args, store)
    except DistrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


def main(argv: Sequence[str], prog: str = "%distrun") -> int:
    """One job command, parsed from `argv` (argparse's SystemExit on --help or bad
    arguments, as a terminal's would)."""
    return run_command(parse(argv, prog))


def parse(argv: Sequence[str], prog: str = "%distrun") -> argparse.Namespace:
    """A job command's arguments (argparse's SystemExit on --help or bad arguments)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store", metavar="DIR", help="job store folder (default: $DISTRUN_HOME/jobs)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_parsers(sub, common)
    return parse_words(parser, argv)


def parse_words(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but a command's NODE words after its options are still
    its nodes (`pool stop --slurm-job 12 sln2`): argparse takes a positional's words from
    one run between options only."""
    args, extra = parser.parse_known_args(argv)
    nodes = getattr(args, "node", None)
    if extra and isinstance(nodes, list) and not any(word.startswith("-") for word in extra):
        args.node = [*nodes, *extra]
        return args
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args
