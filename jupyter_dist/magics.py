"""`%%distrun` and `%distrun`: a thin view over the engine (spec -> launch -> store).

    %load_ext jupyter_dist

    %%distrun --type pytorch --nodes 2 --procs-per-node 2
    import torch.distributed as dist
    ...

The cell becomes the job's script; the options mirror the job spec. A failed job raises
`JobFailed` (so nbclient and papermill runs fail) whose message is the root cause; an
interrupt cancels every process on every node.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Int, Unicode

from jupyter_dist.backends import declared_options
from jupyter_dist.describe import PLAN_COLUMNS, format_commands, format_table, plan_rows
from jupyter_dist.diagnose.stall import DEFAULT_STALL_TIMEOUT_S, describe_stall
from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.events import JobListener, JobResult, OutputLine
from jupyter_dist.export import FORMATS, ExportTarget, export, write
from jupyter_dist.masking import masked_spec
from jupyter_dist.nodes import load_inventory
from jupyter_dist.options import MAGIC, LaunchOptions, has_code, offered
from jupyter_dist.plan.summary import launch_summary
from jupyter_dist.rank_sets import parse_rank_set
from jupyter_dist.run.cell_values import pack, unpack
from jupyter_dist.run.job import Job
from jupyter_dist.run.session import Session, SessionEnded, names_of
from jupyter_dist.spec import JobSpec, dump_yaml, load_spec, script_command, spec_from_dict
from jupyter_dist.store import JobStore

LINE_COMMANDS = (
    "jobs",
    "logs",
    "inspect",
    "stacks",
    "cancel",
    "attach",
    "metrics",
    "debug",
    "nodes",
    "run",
    "form",
    "dask",
    "session",
    "pool",
)
# JOB defaults to this kernel's latest job
JOB_COMMANDS = ("logs", "inspect", "stacks", "cancel", "attach", "metrics", "debug")


class JobFailed(DistrunError):
    """The job ran and failed (or timed out, or was cancelled): the message says why. Where
    the live view already shows the cause in full (`shown_above`), the cell's error is one
    short line pointing at it; elsewhere (nbclient, the text view) it is the whole text."""

    def __init__(self, result: JobResult, shown_above: bool = False):
        super().__init__(result.describe())
        self.result, self.shown_above = result, shown_above

    def _render_traceback_(self) -> list[str]:
        if self.shown_above:
            return [f"JobFailed: {self.short()} (details above)"]
        lines = str(self).splitlines()
        return [f"JobFailed: {lines[0]}", *lines[1:]]

    def short(self) -> str:
        """The cause in one line: "rank 3 on local1 (127.0.0.1) exited with code 1"."""
        cause = self.result.root_cause
        if cause is None:
            return str(self).splitlines()[0]
        said = cause.summary()
        return said if len(said) <= 160 else said[:159] + "…"


# Options a cell run in a session may carry (everything else launches a job).
_SESSION_CELL_OPTIONS = ("push", "out", "out_all", "ranks", "new")


class CellFailed(DistrunError):
    """A session's cell raised on some ranks (they live on): which, and each traceback."""

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines()
        return [f"CellFailed: {lines[0]}", *lines[1:]]


def _user_error(message: str) -> DistrunError:
    """Bad options, a bad spec, an unusable node: one line in the cell, no traceback."""
    return DistrunError(message)


@contextlib.contextmanager
def _one_line_errors():
    """Any DistrunError below becomes one `DistrunError` line; a failed job stays JobFailed
    (a session's failed cell CellFailed, its end SessionEnded: they carry tracebacks)."""
    try:
        yield
    except (JobFailed, CellFailed, SessionEnded):
        raise
    except DistrunError as exc:
        raise _user_error(str(exc)) from None


class QueuedPrinter(JobListener):
    """Collects lines from the job's reader threads; the cell's own thread prints them,
    in batches, so the output lands in the running cell."""

    def __init__(self) -> None:
        self._lines: list[OutputLine] = []
        self._news: list[str] = []  # stall notices, printed with the next batch
        self._lock = threading.Lock()

    @classmethod
    def of(cls, job: Job) -> QueuedPrinter:
        """The text view of a job about to start (run_in_view's): its header line printed,
        its lines printed on each tick."""
        printer = cls()
        job.add_listener(printer)
        print(f"job {job.job_id}: {job.summary}", flush=True)
        return printer

    def tick(self) -> None:
        self.flush()

    def ended(self) -> None:
        self.flush()

    def on_lines(self, lines: list[OutputLine]) -> None:
        with self._lock:
            self._lines.extend(lines)

    def on_stall(self, notice: str | None, summary: list[str]) -> None:
        with self._lock:
            self._news.append(describe_stall(notice, summary))

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
            news, self._news = self._news, []
        if news:
            sys.stderr.write("".join(news))
            sys.stderr.flush()
        out = "".join(f"[{l.label}] {l.text}\n" for l in lines if l.stream == "stdout")  # noqa: E741
        err = "".join(f"[{l.label}] {l.text}\n" for l in lines if l.stream == "stderr")  # noqa: E741
        if out:
            sys.stdout.write(out)
            sys.stdout.flush()
        if err:
            sys.stderr.write(err)
            sys.stderr.flush()


def _options(func: Callable) -> Callable:
    """The magic's arguments: every declared launch option (backends.declared_options)
    that the magic offers, then the notebook's own (what moves values in and out of a cell,
    dry runs, sessions, exports)."""
    declared = offered(MAGIC, declared_options())
    decorators = [argument(*o.flags(), **o.argparse_kwargs()) for o in declared]
    decorators += [
        argument(
            "--client-name",
            metavar="NAME",
            help="interactive dask cluster: the notebook variable for its Client (default: client)",
        ),
        argument(
            "--start-timeout",
            type=float,
            metavar="SECONDS",
            help="interactive dask cluster: how long to wait for every worker (default: 60)",
        ),
        argument(
            "-i",
            "--push",
            metavar="NAMES",
            help="notebook variables sent to every process (comma-separated)",
        ),
        argument(
            "-o",
            "--out",
            metavar="NAMES",
            help="variables brought back from rank 0 after the cell (comma-separated)",
        ),
        argument(
            "--out-all",
            action="store_true",
            help="with --out: bring back a list of every rank's value",
        ),
        argument("--dry-run", action="store_true", help="show the spec and the plan; run nothing"),
        argument(
            "--new",
            action="store_true",
            help="while a session is open: run this cell as a job of its own",
        ),
        argument(
            "--ranks",
            metavar="SET",
            help="in a session: run the cell on these ranks only (e.g. 0,2-3)",
        ),
        argument("--save", metavar="FILE", help="also write the job spec to FILE"),
        argument(
            "--export",
            metavar="FORMAT",
            choices=tuple(FORMATS),
            help=f"write the job for another scheduler ({', '.join(FORMATS)}) with the "
            "cell's code beside it; runs nothing",
        ),
        argument(
            "--export-to",
            metavar="FILE|DIR",
            help="with --export: where (a file, or a folder ending in /; default: this folder)",
        ),
        argument(
            "--image", metavar="IMAGE", help="with --export: the container image the job runs in"
        ),
        argument(
            "--accelerator",
            metavar="NAME",
            help="with --export skypilot and --gpus-per-node: the GPU's name (e.g. A100)",
        ),
        argument(
            "--code-in-image",
            metavar="PATH",
            help="with --export kubeflow or jobset: the image's own copy of the code "
            "folder, where the pods run the command",
        ),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return magic_arguments()(func)


@magics_class
class DistrunMagics(Magics):
    """Defaults are settable with %config, e.g. `%config DistrunMagics.nodes = 2`."""

    type = Unicode("pytorch", help="default job type").tag(config=True)
    nodes = Int(1, help="default number of nodes").tag(config=True)
    stall_timeout = Int(
        DEFAULT_STALL_TIMEOUT_S,
        help="seconds without output or CPU use after which a job looks stuck (0: never)",
    ).tag(config=True)
    procs_per_node = Int(0, help="default processes per node (0: the spec's default)").tag(
        config=True
    )
    nodes_file = Unicode("", help="default node inventory").tag(config=True)
    view = Unicode(
        "auto",
        help="how a job shows in the cell: 'widget' (live view), 'text' (prefixed lines), or "
        "'auto': the widget under a Jupyter server or VS Code, text elsewhere "
        "(nbconvert, papermill, terminal IPython)",
    ).tag(config=True)
    last_job_id: str | None = None  # the latest job this kernel started

    @_options
    @line_cell_magic
    def distrun(self, line: str, cell: str | None = None) -> None:
        """Run the cell as a distributed job on every rank, with live per-rank output.

        As a line magic: `%distrun jobs`, `%distrun logs [JOB] [--rank R]`,
        `%distrun inspect [JOB]`, `%distrun stacks [JOB]` (every rank's Python stack, of a
        running job or session), `%distrun cancel JOB`, `%distrun attach [JOB]` (follow a
        job from anywhere; an interrupt detaches), `%distrun nodes`,
        `%distrun run SPEC.yml`, `%distrun form`, `%distrun dask start|stop`,
        `%distrun session start|stop|attach|export` (warm ranks; `--detach`: they outlive
        the kernel, and `attach` reaches them from a new one; `export`: the cells that
        worked, as one job).

        `--export FORMAT` writes the cell and its options for another scheduler (sbatch,
        kubeflow, jobset, skypilot, azureml) instead of running it.

        An empty `%%distrun --type dask` cell starts an interactive Dask cluster and puts
        its `distributed.Client` in the notebook (`--client-name`)."""
        if cell is None:
            return self._line_command(line)
        args = self._parse(line)
        if args.export or args.export_to or args.image or args.accelerator:
            return self._export(cell, args)
        ended = [s for s in self.sessions.values() if not s.alive]
        for gone in ended:  # said once, by the next cell that would have run in it
            del self.sessions[gone.name]
        session = self._open_session()
        launch = sorted(
            k
            for k, v in vars(args).items()
            if k not in _SESSION_CELL_OPTIONS and v not in (None, False)
        )
        if ended and session is None and not launch and not args.new:
            raise SessionEnded(ended[-1].ended_message())
        if session is not None and not args.new:
            if launch:
                flag = "--" + launch[0].replace("_", "-")
                raise _user_error(
                    f"session {session.name} is open: a %%distrun cell runs in it, with "
                    f"-i/-o/--out-all/--ranks only ({flag} is a launch option); add --new to "
                    "run this one as a job of its own (or %distrun session stop)"
                )
            with _one_line_errors():
                return self._run_in_session(session, cell, args)
        if args.ranks:
            raise _user_error("--ranks applies to a cell run in a session (none is open)")
        self._configured_defaults(args)
        with _one_line_errors():
            interactive = args.type == "dask" and not has_code(cell)
            if not interactive:
                for flag, value in (
                    ("--client-name", args.client_name),
                    ("--start-timeout", args.start_timeout),
                ):
                    if value is not None:
                        raise SpecError(
                            f"{flag} applies to an interactive Dask cluster only (an empty "
                            "`%%distrun --type dask` cell, or `%distrun dask start`)"
                        )
            elif args.push or args.out:
                raise SpecError("--push and --out need code in the cell (this cell is empty)")
            outs = _outs(args)
            pushed = pack(self.shell.user_ns, _names(args.push, "--push"))
            spec = LaunchOptions.take(args, declared_options()).to_spec(cell, base_dir=os.getcwd())
            extra: dict[str, str] = {}
            if outs:  # the runner that runs the cell also saves the values asked for
                spec = spec_from_dict(
                    {**spec.to_dict(), "command": script_command(outs)},
                    base_dir=os.getcwd(),
                    source="%%distrun",
                )
            if pushed is not None:  # the runner starts the cell with these globals
                extra["push.b64"] = pushed
            if args.save is not None:
                _save(args.save, spec)
            inventory = load_inventory(args.nodes_file or self.nodes_file or None)
            if args.dry_run:
                self._dry_run(spec, inventory)
                return
            if interactive:
                if args.detach:
                    raise SpecError(
                        "--detach applies to a job; an interactive Dask cluster serves this "
                        "kernel's client (it stops with it)"
                    )
                self._start_dask(spec, inventory, args)
                return
            if args.detach:
                if outs:
                    raise SpecError(
                        "--out needs the cell to wait for the job's end; with --detach, have "
                        "the ranks save what you need to files"
                    )
                self._detach(spec, args.nodes_file or self.nodes_file or None, extra)
                return
            job = self._run(spec, inventory, extra)
            if outs:
                self.shell.user_ns.update(unpack(job, outs, args.out_all))

    def _parse(self, line: str) -> Any:
        """The options of a %%distrun line (or of `%distrun session start`)."""
        # Split as a POSIX shell would (IPython's own split keeps quotes: --env 'A=b c'
        # would not carry its space), then parse as IPython does.
        words = _words(line, "%%distrun")
        try:
            return self.distrun.parser.parse_args(words)
        except Exception as exc:  # argparse's UsageError: already one line
            raise _user_error(str(exc).strip()) from None

    def _configured_defaults(self, args: Any) -> None:
        """Type, nodes and processes per node from the kernel's %config where the line
        gives none."""
        args.type = args.type or self.type
        if args.stall_timeout is None and self.stall_timeout != DEFAULT_STALL_TIMEOUT_S:
            args.stall_timeout = self.stall_timeout
        args.nodes = args.nodes if args.nodes is not None else self.nodes
        if args.procs_per_node is None and self.procs_per_node:
            args.procs_per_node = self.procs_per_node

    # -- warm sessions (run/session.py) ---------------------------------------------------

    sessions: ClassVar[dict[str, Session]] = {}  # this kernel's, by name, the latest last
    last_session_job_id: ClassVar[str | None] = None  # the latest, stopped or not: an export's

    def _open_session(self) -> Session | None:
        """The session a bare %%distrun runs in: the latest that is still alive."""
        alive = [s for s in self.sessions.values() if s.alive]
        return alive[-1] if alive else None

    def _session_command(self, words: list[str]) -> None:
        """`%distrun session start [OPTIONS]`, `%distrun session stop [NAME]`,
        `%distrun session attach [NAME|JOB]` (a detached session, from any kernel),
        `%distrun session` (what is open)."""
        action, rest = (words[0], words[1:]) if words else ("status", [])
        if action == "start":
            self._start_session(" ".join(map(shlex.quote, rest)))
            return
        if action == "status" and not rest:
            self._print_sessions()
            return
        if action == "attach" and len(rest) <= 1:
            self._attach_session(rest[0] if rest else None)
            return
        if action == "export":
            self._export_session(rest)
            return
        if action != "stop" or len(rest) > 1:
            raise _user_error(
                "%distrun session: use `%distrun session start [OPTIONS]`, `%distrun session "
                "stop [NAME]`, `%distrun session attach [NAME]`, `%distrun session export "
                "[NAME] [--cells C] [--to FORMAT] [-o PATH]` or `%distrun session` (what is "
                "open)"
            )
        alive = {name: s for name, s in self.sessions.items() if s.alive}
        if rest and rest[0] not in alive:
            raise _user_error(
                f"%distrun session stop: no open session named {rest[0]!r} "
                f"(open: {names_of(alive.values())})"
            )
        chosen = [alive[rest[0]]] if rest else list(alive.values())
        if not chosen:
            print("No session is open.")
        for session in chosen:
            result = session.stop()
            del self.sessions[session.name]
            print(
                f"Session {session.name} stopped (job {result.job_id}): "
                f"{launch_summary(session.job.plan)} ended."
            )

    def _start_session(self, line: str) -> None:
        args = self._parse(line)
        name = args.name or "session"
        if name in self.sessions and self.sessions[name].alive:
            raise SpecError(f"session {name} is already open; stop it first or give --name")
        for flag, value in (
            ("--out", args.out),
            ("--out-all", args.out_all),
            ("--push", args.push),
            ("--ranks", args.ranks),
            ("--dry-run", args.dry_run),
            ("--new", args.new),
        ):
            if value:
                raise SpecError(f"{flag} applies to a cell, not to %distrun session start")
        self._configured_defaults(args)
        spec = LaunchOptions.take(args, declared_options()).to_spec("", base_dir=os.getcwd())
        if args.detach:
            self._start_detached_session(spec, name, args.nodes_file or self.nodes_file or None)
            return
        inventory = load_inventory(args.nodes_file or self.nodes_file or None)
        printer = QueuedPrinter()
        started = time.monotonic()
        session = Session.start(spec, name=name, inventory=inventory, listeners=[printer])
        printer.flush()
        self.sessions[name] = session
        DistrunMagics.last_job_id = DistrunMagics.last_session_job_id = session.job.job_id
        print(
            f"Session {name} ready in {time.monotonic() - started:.1f} s (job "
            f"{session.job.job_id}): {session.job.summary}; a bare %%distrun cell runs "
            "in it.",
            flush=True,
        )

    def _start_detached_session(self, spec: JobSpec, name: str, nodes_file: str | None) -> None:
        """A session whose ranks outlive this kernel: a supervisor holds it
        (run/detached_session.py); this kernel, or a later one, sends it cells."""
        from jupyter_dist.run.detached_session import RemoteSession
        from jupyter_dist.run.supervisor import detach

        started = time.monotonic()
        store = JobStore()
        detached = detach(spec, store=store, cwd=os.getcwd(), nodes_file=nodes_file, session=name)
        session = self.sessions[name] = RemoteSession(store.get(detached.job_id))
        DistrunMagics.last_job_id = DistrunMagics.last_session_job_id = detached.job_id
        print(
            f"Session {name} ready in {time.monotonic() - started:.1f} s (job "
            f"{detached.job_id}): {detached.summary}; a bare %%distrun cell runs in it. "
            f"Detached: its ranks outlive this kernel; from a new one, %distrun session "
            f"attach {session.name}.",
            flush=True,
        )

    def _attach_session(self, which: str | None) -> None:
        """`%distrun session attach [NAME|JOB]`: a detached session, open in this kernel."""
        from jupyter_dist.run.detached_session import RemoteSession

        session = RemoteSession.find(JobStore(), which)
        self.sessions.pop(session.name, None)
        self.sessions[session.name] = session  # the latest: bare cells run in it
        DistrunMagics.last_job_id = DistrunMagics.last_session_job_id = session.record.job_id
        print(
            f"Session {session.name} attached (job {session.record.job_id}): "
            f"{session.job.summary}, {session.cells_run} cells run; a bare %%distrun cell "
            "runs in it."
        )

    def _export_session(self, words: list[str]) -> None:
        """`%distrun session export [NAME|JOB] [--cells C] [--to FORMAT] [-o PATH]`: the
        session's cells that worked as one job (this kernel's latest session without NAME)."""
        from jupyter_dist import job_commands

        parser = job_commands.session_export_parser("%distrun session export")
        try:
            args = parser.parse_args(words)
        except SystemExit as exc:  # argparse: --help (0), or a bad option, said above (2)
            if exc.code in (0, None):
                return
            raise _user_error("%distrun session export: bad arguments (see above)") from None
        which = args.session or self.last_session_job_id
        if which is None:
            raise _user_error(
                "%distrun session export: no session has run in this kernel; "
                "give a session's name or job id"
            )
        job_commands.export_session_now(args, JobStore(), which)

    def _print_sessions(self) -> None:
        alive = [s for s in self.sessions.values() if s.alive]
        if not alive:
            print("No session is open (start one with %distrun session start).")
        for session in alive:
            up = time.time() - session.started
            detached = ", detached" if getattr(session, "detached", False) else ""
            print(
                f"{session.name}: {session.job.summary}, job {session.job.job_id}, "
                f"up {up:.0f} s, {session.cells_run} cells run{detached}"
            )
            print(f"  memory (each rank's, after its last cell): {session.memory_text()}")

    def _run_in_session(self, session: Session, cell: str, args: Any) -> None:
        """The cell on the session's ranks (all, or --ranks), its lines printed as they
        come, with -i values set first and -o values brought back."""
        outs = _outs(args)
        if outs and getattr(session, "detached", False):
            from jupyter_dist.run.detached_session import OUT_REFUSED

            raise SpecError(OUT_REFUSED)  # before its view shows
        ranks = parse_rank_set(args.ranks) if args.ranks else None
        chosen = session.chosen(ranks)  # a rank it does not have: one line, nothing runs
        pushed = pack(self.shell.user_ns, _names(args.push, "--push"))
        if self._view_mode() == "widget":
            from jupyter_dist.widgets.session_view import run_cell_with_view

            result = run_cell_with_view(session, cell, chosen, pushed, outs)
        else:
            printer = QueuedPrinter()
            session.job.add_listener(printer)
            try:
                ranks = [p.rank for p in chosen]
                result = session.run_cell(cell, printer.flush, ranks, pushed, outs)
            finally:
                session.job.remove_listener(printer)
                printer.flush()
        if not result.ok:
            raise CellFailed(result.describe())
        if outs:
            self.shell.user_ns.update(
                unpack(session.job, outs, args.out_all, Session.out_folder(result))
            )

    def _run(self, spec: JobSpec, inventory, extra: dict[str, str]) -> Job:
        """Run the job in the cell; JobFailed unless it succeeded."""
        in_view = self._view_mode() == "widget"
        if in_view:
            from jupyter_dist.widgets.live import run_with_view

            job, result, _ = run_with_view(spec, inventory, extra_files=extra)
        else:
            job, result = run_in_cell(spec, inventory, extra_files=extra)
        DistrunMagics.last_job_id = job.job_id
        if not result.ok:  # the live view shows the cause in full: the error points at it
            raise JobFailed(result, shown_above=in_view)
        return job

    def _detach(self, spec: JobSpec, nodes_file: str | None, extra: dict[str, str]) -> None:
        """Start the job under a supervisor of its own (run/supervisor.py): the cell returns
        once every rank runs, and the job outlives this kernel."""
        from jupyter_dist.run.supervisor import detach

        detached = detach(
            spec, store=JobStore(), cwd=os.getcwd(), nodes_file=nodes_file, extra_files=extra
        )
        DistrunMagics.last_job_id = detached.job_id
        print(
            f"job {detached.job_id}: {detached.summary}; every rank runs, detached: it runs "
            f"on if this kernel stops.\nFollow it: %distrun attach {detached.job_id} (or "
            f"jupyter distrun attach {detached.job_id}); stop it: %distrun cancel "
            f"{detached.job_id}"
        )
        if self._view_mode() == "widget":  # followed from the store; the kernel is free
            from jupyter_dist.widgets.live import follow_in_view

            follow_in_view(JobStore().get(detached.job_id))

    def _attach_view(self, args: Any) -> None:
        """`%distrun attach [JOB] [--tail N]` under the live view (its arguments parsed as
        the terminal's): the job's view, followed from the store while the kernel is free
        (stop it with %distrun cancel)."""
        from jupyter_dist import job_commands
        from jupyter_dist.widgets.live import follow_in_view

        store = JobStore(args.store) if args.store else JobStore()
        follow_in_view(store.get(args.job), history=job_commands.checked_tail(args.tail))

    def _view_mode(self) -> str:
        """`widget` or `text`: as configured, else what the front end surely renders."""
        return self.view if self.view in ("widget", "text") else _default_view(self.shell)

    def _start_dask(self, spec: JobSpec, inventory, args: Any) -> None:
        """Start an interactive Dask cluster; its client goes into the notebook."""
        from IPython.display import display

        from jupyter_dist.dask_cluster import DaskCluster
        from jupyter_dist.run.launch import prepare_job

        name = args.client_name or "client"
        if not name.isidentifier():
            raise SpecError(f"--client-name: {name!r} is not a Python variable name")
        job = prepare_job(spec, inventory=inventory)
        print(
            f"Starting a Dask cluster (job {job.job_id}): {launch_summary(job.plan)}, "
            f"the scheduler on {job.plan.processes[0].node}...",
            flush=True,
        )
        cluster = DaskCluster(job, client_name=name).start(
            timeout=args.start_timeout or DaskCluster.default_timeout
        )
        self.shell.user_ns[name] = cluster.client
        display(cluster)

    def _dask_command(self, words: list[str]) -> None:
        """`%distrun dask start [OPTIONS]`, `%distrun dask stop [NAME]`, `%distrun dask`."""
        from IPython.display import display

        from jupyter_dist.dask_cluster import running_clusters

        action, rest = (words[0], words[1:]) if words else ("status", [])
        if action == "start":
            if any(word in ("-t", "--type") or word.startswith(("-t", "--type=")) for word in rest):
                raise _user_error(
                    "%distrun dask start starts a Dask cluster: leave --type out (a job of "
                    "another type is a %%distrun cell)"
                )
            self.distrun(" ".join(["--type", "dask", *map(shlex.quote, rest)]), "")
            return
        clusters = running_clusters()
        if action == "status" and not rest:
            for cluster in clusters.values():
                display(cluster)
            if not clusters:
                print("No Dask cluster is running (start one with %distrun dask start).")
            return
        if action != "stop" or len(rest) > 1:
            raise _user_error(
                "%distrun dask: use `%distrun dask start [OPTIONS]`, `%distrun dask stop "
                "[CLIENT_NAME]` or `%distrun dask` (what runs)"
            )
        if rest and rest[0] not in clusters:
            known = ", ".join(clusters) or "none is running"
            raise _user_error(f"%distrun dask stop: no Dask cluster named {rest[0]!r} ({known})")
        chosen = [clusters[rest[0]]] if rest else list(clusters.values())
        if not chosen:
            print("No Dask cluster is running.")
        for cluster in chosen:
            result = cluster.stop("stopped with %distrun dask stop")
            if self.shell.user_ns.get(cluster.client_name) is cluster.client:
                del self.shell.user_ns[cluster.client_name]
            print(
                f"Dask cluster {result.job_id} stopped: {launch_summary(cluster.job.plan)} ended."
            )

    def _line_command(self, line: str) -> None:
        words = _words(line, "%distrun")
        if not words or words[0] not in LINE_COMMANDS:
            raise _user_error(
                f"%distrun: unknown command {words[0] if words else ''!r}; "
                f"valid: {', '.join(LINE_COMMANDS)} (or use %%distrun on a cell)"
            )
        if words[0] == "form":
            from IPython.display import display

            from jupyter_dist.widgets.form import SubmitForm

            display(SubmitForm(nodes_file=self.nodes_file or None))
            return
        if words[0] == "dask":
            with _one_line_errors():
                self._dask_command(words[1:])
            return
        if words[0] == "session":
            with _one_line_errors():
                self._session_command(words[1:])
            return
        if words[0] == "run":
            if len(words) != 2:
                raise _user_error("%distrun run: give one job spec file: %distrun run job.yml")
            with _one_line_errors():
                self._run(load_spec(words[1]), load_inventory(self.nodes_file or None), {})
            return
        from jupyter_dist import job_commands  # the same commands as the terminal's

        session = None  # the open session a bare `%distrun debug` means
        if words[0] in JOB_COMMANDS and (len(words) == 1 or words[1].startswith("-")):
            session = self._open_session() if words[0] == "debug" else None
            if session is not None:  # its ranks are where a debugger is wanted first
                words.insert(1, session.job.job_id)
            elif not self.last_job_id:  # no JOB given: the latest job of this kernel
                raise _user_error(
                    f"%distrun {words[0]}: no job has run in this kernel yet; give a job id "
                    "(%distrun jobs lists them)"
                )
            else:
                words.insert(1, self.last_job_id)
        if words[0] == "logs" and not any(w == "--tail" or w.startswith("--tail=") for w in words):
            words += ["--tail", str(job_commands.NOTEBOOK_LOG_LINES)]  # a cell holds so much
        try:
            args = job_commands.parse(words)
        except SystemExit as exc:  # argparse: --help (0), or a bad option, said above (2)
            if exc.code in (0, None):
                return
            raise _user_error(f"%distrun {words[0]}: bad arguments (see above)") from None
        if args.command == "attach" and self._view_mode() == "widget":
            with _one_line_errors():
                self._attach_view(args)
            return
        if args.command == "debug" and session is not None:
            from jupyter_dist.debug_console import debug_session  # a failed cell's post-mortem

            with _one_line_errors():
                debug_session(session, args)
            return
        code = job_commands.run_command(args)
        if code == job_commands.EXIT_USAGE:
            raise _user_error(f"%distrun {words[0]} failed (see above)")

    def _export(self, cell: str, args: Any) -> None:
        """The cell and its options written for another scheduler (`--export`); nothing
        runs. The files go beside each other; a file export did not write is never
        replaced."""
        if not args.export:
            given = [
                ("--export-to", args.export_to),
                ("--image", args.image),
                ("--accelerator", args.accelerator),
                ("--code-in-image", args.code_in_image),
            ]
            flag = next(name for name, value in given if value)
            raise _user_error(f"{flag} applies with --export FORMAT only")
        self._configured_defaults(args)
        with _one_line_errors():
            if args.push or args.out:
                raise SpecError("--push and --out do not apply to an export (nothing runs here)")
            spec = LaunchOptions.take(args, declared_options()).to_spec(cell, base_dir=os.getcwd())
            target = ExportTarget.at(
                args.export_to,
                stem=args.name,
                image=args.image,
                accelerator=args.accelerator,
                code_in_image=args.code_in_image,
                source="a notebook cell",
            )
            exported = export(spec, args.export, target)
            written = write(exported)
        names = ", ".join(path.name for path in written)
        print(f"Wrote {names} in {exported.folder}")
        for note in exported.notes():
            print(note)
        print(f"Run it with: {exported.how_to_run()}\n")
        print(exported.files[exported.manifest], end="")

    def _dry_run(self, spec: JobSpec, inventory) -> None:
        from jupyter_dist.plan.parity import describe, parity_notes
        from jupyter_dist.run.launch import dry_run

        plan, commands = dry_run(spec, inventory=inventory)
        print(_spec_yaml(spec))
        print(format_table(plan_rows(plan), PLAN_COLUMNS))
        print(format_commands(plan, commands))
        for proc in plan.processes:
            if proc.tf_config:
                import json

                print(f"\nTF_CONFIG of {proc.label}:\n{json.dumps(proc.tf_config, indent=2)}")
        checks = describe(parity_notes(plan))
        if checks:
            print(checks)


def _words(line: str, magic: str) -> list[str]:
    """A magic's line split as a POSIX shell splits it; one line if it cannot be."""
    try:
        return shlex.split(line)
    except ValueError as exc:  # an unbalanced quote
        raise _user_error(f"{magic}: {exc} in {line.strip()!r}") from None


def _save(path: str, spec: JobSpec) -> None:
    """--save: the spec as YAML in `path` (SpecError in one line if it cannot be written)."""
    if not path.strip():
        raise SpecError("--save: give the file to write the spec to (it was empty)")
    try:
        Path(path).expanduser().write_text(spec.to_yaml())
    except (OSError, RuntimeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"--save {path}: cannot write the spec there ({reason})") from None


def _spec_yaml(spec: JobSpec) -> str:
    """The spec as the dry run shows it: secret values masked (masking.py)."""
    return dump_yaml(masked_spec(spec.to_dict()))


def _default_view(shell) -> str:
    """The widget where a front end surely renders it; plain text elsewhere. (A kernel
    cannot ask the front end while a cell runs: its replies wait behind the cell.)"""
    if getattr(shell, "kernel", None) is None:
        return "text"  # terminal IPython
    front_end = ("JPY_SESSION_NAME", "VSCODE_PID", "VSCODE_CWD")
    return "widget" if any(name in os.environ for name in front_end) else "text"


def _outs(args: Any) -> list[str]:
    """The --out names; --out-all without them is a SpecError."""
    outs = _names(args.out, "--out")
    if args.out_all and not outs:
        raise SpecError("--out-all needs --out NAMES")
    return outs


def _names(text: str | None, flag: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise SpecError(f"{flag}: {bad[0]!r} is not a Python variable name")
    return names


def run_in_cell(
    spec: JobSpec, inventory, store: JobStore | None = None, extra_files=None
) -> tuple[Job, JobResult]:
    """Run a job from the cell's thread, printing its lines there as they come."""
    from jupyter_dist.run.launch import run_in_view

    job, result, _ = run_in_view(
        spec, QueuedPrinter.of, inventory=inventory, store=store, extra_files=extra_files
    )
    if result.ok:  # a failure is told by the JobFailed the cell raises
        print(result.describe(), flush=True)
    return job, result


def keep_empty_distrun_cells(lines: list[str]) -> list[str]:
    """IPython refuses a cell magic whose body is empty before the magic is called; an
    empty `%%distrun --type dask` cell starts an interactive cluster, so it gets a blank
    body instead (an input transformer, run before IPython reads cell magics)."""
    if lines and lines[0].startswith("%%distrun") and not "".join(lines[1:]).strip():
        return [lines[0].rstrip("\n") + "\n", "\n"]
    return lines


def load(ipython) -> None:
    ipython.register_magics(DistrunMagics)
    if keep_empty_distrun_cells not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(keep_empty_distrun_cells)


__all__ = ["DistrunMagics", "JobFailed", "load", "run_in_cell"]
