"""The one path from a spec to a running job, used by every view (CLI, magics, form, server)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from jupyter_dist import node_side
from jupyter_dist.backends import Backend, check_section, choose_backend
from jupyter_dist.code_folder import read_code_folder
from jupyter_dist.diagnose import network
from jupyter_dist.diagnose.stall import DEFAULT_STALL_TIMEOUT_S
from jupyter_dist.errors import NodeError, SpecError
from jupyter_dist.events import JobListener, JobResult
from jupyter_dist.nodes import Inventory, Node
from jupyter_dist.plan import LaunchPlan, plan, port_requests
from jupyter_dist.run import preload_memory
from jupyter_dist.run.claims import PortClaims, ReleaseClaims, Wanted
from jupyter_dist.run.interrupts import interrupts_deferred
from jupyter_dist.run.job import GRACE_PERIOD_S, RESTART_DELAY_S, Job, Restarts
from jupyter_dist.spec import JobSpec
from jupyter_dist.store import JobStore


def _gpus_as_default(spec: JobSpec, nodes: list[Node]) -> JobSpec:
    """Nodes that say how many GPUs they have set processes per node, unless the spec does."""
    dist = spec.distribution
    gpus = [n.gpus for n in nodes]
    if (
        spec.job_type in ("pytorch", "mpi")
        and "process_count_per_instance" not in dist.model_fields_set
        and all(g for g in gpus)
    ):
        return spec.with_overrides(process_count_per_instance=min(gpus))
    return spec


def make_plan(
    spec: JobSpec,
    *,
    inventory: Inventory | None = None,
    store: JobStore | None = None,
    job_id: str | None = None,
    cwd: Path | str | None = None,
    extra_files: Mapping[str, str] | None = None,
    stdin: bool = False,
    hold_ports: Callable[[str, list[Wanted]], None] | None = None,
    check_network: bool = False,
    remembered: list[str] | None = None,
) -> tuple[LaunchPlan, list[Node], Backend]:
    """Choose the backend (the spec's `backend:` section names it, else `choose_backend`
    decides), take the job's nodes from it, check them, find free ports on them, and plan
    the job; with `check_network` (and the spec's network_check), check that the nodes
    reach where the ranks will meet (diagnose/network.py). `remembered`: the lines saying
    what the spec took from earlier jobs (preload_memory.taken). On a failure, what the
    backend acquired is released."""
    store = store or JobStore()
    inventory = inventory or Inventory()
    if spec.backend:
        check_section(spec.backend)
    chosen = choose_backend(inventory, spec.backend.type if spec.backend else None)
    nodes = chosen.acquire(spec, inventory, str(store.root), str(cwd or os.getcwd()))
    try:
        spec = _gpus_as_default(spec, nodes)
        nodes = chosen.preflight(nodes)  # every node reachable, python found
        job_id = job_id or store.new_job_id()
        if hold_ports is not None:  # before they are checked: a holder is named, not a bind
            hold_ports(job_id, _fixed_ports(spec, nodes))
        launch_plan = _plan_attempt(spec, nodes, chosen, job_id, extra_files, stdin)
        if remembered:
            launch_plan = dataclasses.replace(launch_plan, remembered=list(remembered))
        if check_network and spec.network_check:
            network.check_network(chosen.run_on_node, launch_plan, nodes)
        return launch_plan, nodes, chosen
    except BaseException:
        chosen.release()
        raise


def _plan_attempt(
    spec: JobSpec,
    nodes: list[Node],
    chosen: Backend,
    job_id: str,
    extra_files: Mapping[str, str] | None = None,
    stdin: bool = False,
    restart_count: int = 0,
) -> LaunchPlan:
    """One attempt's plan on checked nodes: free ports found now, the stack hook added,
    DISTRUN_RESTART_COUNT set (`make_plan` gives the first; a restart asks again)."""
    ports = chosen.choose_ports(port_requests(spec, nodes), nodes)
    # Every node gets the startup hook that lets any Python of the job dump its stacks.
    # (node_side.SHIPPED: the stack hook, report(), the debugger; the pool where the job
    # preloads modules.)
    shipped = [n for n in node_side.SHIPPED if n not in node_side.POOL_FILES or spec.preload_env()]
    files = {
        **(extra_files or {}),
        **{node_side.shipped_path(name): node_side.source(name) for name in shipped},
    }
    launch_plan = plan(spec, nodes, job_id, ports, files, chosen.mpi_launch, restart_count)
    if spec.network_check:  # gloo's interface where a hostname would mislead it
        launch_plan = network.gloo_interfaces(chosen.run_on_node, launch_plan, nodes)
    if stdin:  # every process reads what the job feeds it (a warm session's ranks)
        procs = [dataclasses.replace(p, stdin=True) for p in launch_plan.processes]
        launch_plan = dataclasses.replace(launch_plan, processes=procs)
    code = spec.code_dir()
    if code is not None and not all(node.shares_files for node in nodes):
        # Said with the plan: what the nodes' copies of the code folder will lack.
        left_out = read_code_folder(code, ignore_files=False).left_out()
        launch_plan = dataclasses.replace(launch_plan, code_left_out=left_out)
    return launch_plan


def _replan(
    spec: JobSpec,
    chosen: Backend,
    inventory: Inventory,
    job_id: str,
    extra_files: Mapping[str, str] | None,
    nodes: list[Node],
    restart_count: int,
) -> tuple[LaunchPlan, list[Node]]:
    """A later attempt's plan and nodes: the nodes checked again, one that cannot be
    reached replaced by a spare (`_replace_lost`)."""
    nodes = chosen.preflight(_replace_lost(spec, chosen, inventory, nodes))
    launch_plan = _plan_attempt(
        spec, nodes, chosen, job_id, extra_files, restart_count=restart_count
    )
    if spec.network_check:
        network.check_network(chosen.run_on_node, launch_plan, nodes)
    return launch_plan, nodes


def _replace_lost(
    spec: JobSpec, chosen: Backend, inventory: Inventory, nodes: list[Node]
) -> list[Node]:
    """`nodes`, each that cannot be reached now replaced, in its place (its node rank), by
    a healthy spare of the backend's (Backend.spares) that the job does not use. NodeError
    saying which node and why where the job names its nodes, or too few spares answer."""
    health = chosen.health(nodes)
    lost = [index for index, found in enumerate(health) if found.status != "ok"]
    if not lost:
        return nodes
    placed = chosen.place_again(spec, nodes)
    if placed is not None:
        return placed
    said = "; ".join(f"{health[i].name}: {health[i].problem or 'unreachable'}" for i in lost)
    if spec.nodes:
        raise NodeError(
            f"a node cannot be reached ({said}), and the job names its nodes, so no spare "
            "may take its place; bring it back, or ask for nodes by count"
        )
    in_use = {node.name for node in nodes}
    candidates = [node for node in chosen.spares(inventory) if node.name not in in_use]
    found = chosen.health(candidates) if candidates else []
    healthy = [node for node, h in zip(candidates, found, strict=True) if h.status == "ok"]
    if len(healthy) < len(lost):
        tried = f" (tried: {', '.join(node.name for node in candidates)})" if candidates else ""
        raise NodeError(
            f"a node cannot be reached ({said}), and no healthy spare is left in the "
            f"inventory to take its place{tried}"
        )
    replaced = list(nodes)
    for index, spare in zip(lost, healthy, strict=False):
        replaced[index] = spare
    return replaced


def dry_run(
    spec: JobSpec, *, inventory: Inventory | None = None, store: JobStore | None = None
) -> tuple[LaunchPlan, dict[str, str]]:
    """What the job would run, without running it: the nodes are checked, nothing starts.

    Args:
        spec: The job.
        inventory: The nodes it may run on (default: none given, local nodes on demand).
        store: Where its preload memory is read (default: `JobStore()`).

    Returns:
        The plan, and the exact command line each process would be started with (process
        name -> command), as its backend would run it.

    Raises:
        DistrunError: It could not be planned.
    """
    spec, remembered = preload_memory.taken(spec, store or JobStore())
    launch_plan, nodes, chosen = make_plan(
        spec, inventory=inventory, store=store, job_id="dry-run", remembered=remembered
    )
    try:
        by_name = {node.name: node for node in nodes}
        commands = {
            proc.name: chosen.command_line(proc, by_name[proc.node], GRACE_PERIOD_S)
            for proc in launch_plan.processes
        }
    finally:
        chosen.release()
    return launch_plan, commands


def prepare_job(
    spec: JobSpec,
    *,
    listeners: Iterable[JobListener] = (),
    inventory: Inventory | None = None,
    store: JobStore | None = None,
    cwd: Path | str | None = None,
    grace_period: float | None = None,
    extra_files: Mapping[str, str] | None = None,
    messages: tuple[str, Callable] | None = None,
) -> Job:
    """Plan the job and record it in the store; nothing is started yet.

    Args:
        spec: The job.
        listeners: Told of its lines, processes, stalls, attempts and end (events.JobListener).
        inventory: The nodes it may run on (default: none given, local nodes on demand).
        store: Where it is recorded (default: `JobStore()`, store.default_root).
        cwd: Where a relative path of the spec is read from (default: the working folder).
        grace_period: Seconds between SIGTERM and SIGKILL when it is stopped (default: the
            spec's `limits.grace_period`, else 5).
        extra_files: Files to put in the job's folder on every node (path -> text).
        messages: (mark, handler): every process reads stdin, and its lines holding `mark`
            go to `handler(proc, line)` instead of the output (a warm session).

    Returns:
        The job, ready for `start()`; its ports are held until it ends.

    Raises:
        DistrunError: It could not be planned; nothing is left held.
    """
    store = store or JobStore()
    _check_restarts(spec, messages is not None)
    named, (spec, remembered) = spec, preload_memory.taken(spec, store)
    claims = PortClaims(store)
    job_id = store.new_job_id()
    try:  # its fixed ports are held until it ends: no other job of ours can join it
        launch_plan, nodes, chosen = make_plan(
            spec,
            inventory=inventory,
            store=store,
            job_id=job_id,
            cwd=cwd,
            extra_files=extra_files,
            stdin=messages is not None,
            hold_ports=claims.claim,
            check_network=True,
            remembered=remembered,
        )
    except BaseException:
        claims.release(job_id)
        raise
    try:
        record = store.create(launch_plan.job_id, spec.to_yaml(), launch_plan.to_dict())
    except BaseException:
        claims.release(job_id)
        chosen.release()
        raise
    job = Job(
        launch_plan,
        nodes,
        chosen,
        record,
        name=spec.display_name_or_default(),
        timeout=spec.timeout,
        grace_period=_first(grace_period, spec.grace_period, GRACE_PERIOD_S),
        messages=messages,
        on_stall=spec.on_stall or "warn",
        metrics_patterns=spec.metric_patterns(),
        stall_timeout=_first(spec.stall_timeout, DEFAULT_STALL_TIMEOUT_S),
        restarts=Restarts(
            spec.max_restarts,
            _first(spec.restart_delay, RESTART_DELAY_S),
            functools.partial(
                _replan,
                _gpus_as_default(spec, nodes),
                chosen,
                inventory or Inventory(),
                launch_plan.job_id,
                extra_files,
            ),
        )
        if spec.max_restarts
        else None,
    )
    job.add_listener(ReleaseClaims(claims, job.job_id))
    preload_memory.keep(named, store, job.job_id)
    if spec.preload is not None and spec.preload.modules:
        modules = list(spec.preload.modules)
        job.on_preload_failed = lambda _line: preload_memory.forget_if(store, modules)
    for listener in listeners:
        job.add_listener(listener)
    return job


def _check_restarts(spec: JobSpec, session: bool) -> None:
    """SpecError where restarts cannot keep what the job serves: a warm session's
    variables, an interactive Dask cluster's connected Client."""
    if not spec.max_restarts:
        return
    if session:
        raise SpecError(
            "limits.max_restarts does not apply to a warm session: a new attempt would lose "
            "the ranks' variables; restart the session instead"
        )
    if spec.job_type == "dask" and spec.resolved_command() is None:
        raise SpecError(
            "limits.max_restarts does not apply to an interactive Dask cluster: its Client "
            "would lose the scheduler; give the job a command, or leave restarts out"
        )


def _fixed_ports(spec: JobSpec, nodes: list[Node]) -> list[Wanted]:
    """The ports the spec fixed (master_port, base_port, Dask's), where they are used."""
    return [
        Wanted(nodes[r.node_rank].host, nodes[r.node_rank].name, r.fixed, r.setting)
        for r in port_requests(spec, nodes)
        if r.fixed is not None
    ]


def _first(*values):
    """The first value that is not None."""
    return next(value for value in values if value is not None)


def launch(spec: JobSpec, **kwargs) -> Job:
    """Plan, record and start the job; returns at once.

    Args:
        spec: The job (spec.load_spec, parse_spec).
        **kwargs: As for `prepare_job`.

    Returns:
        The running job: `wait()` for its result, `cancel()` to stop it. Stopping the
        process that called this does not stop the job's ranks by itself: cancel it.

    Raises:
        DistrunError: The job could not be planned (no node, a port taken, a wrong
            option) or started (a node refused it); what was started is stopped.
    """
    return prepare_job(spec, **kwargs).start()


def run(spec: JobSpec, **kwargs) -> JobResult:
    """Plan, record and start the job, and wait for its end (blocking).

    Args:
        spec: The job (spec.load_spec, parse_spec).
        **kwargs: As for `prepare_job`.

    Returns:
        Its result, whether it succeeded or not (`result.ok`, `result.describe()`).

    Raises:
        DistrunError: As for `launch`.
        KeyboardInterrupt: Ctrl-C, once every process of the job has been stopped.
    """
    return start_and_wait(prepare_job(spec, **kwargs))


class JobView(Protocol):
    """What shows a job while `run_in_view` runs it (a cell's text, its live view)."""

    def tick(self) -> None:
        """About ten times a second while the job runs, in the thread that runs it."""

    def ended(self) -> None:
        """Once, when the job ended or an interrupt stopped it: the last of it shown."""


def run_in_view(
    spec: JobSpec, view_of: Callable[[Job], JobView], **kwargs
) -> tuple[Job, JobResult, JobView]:
    """The one launch sequence of the notebook's views: prepare the job, show it, start it
    and wait, the view ticked in this thread (blocking).

    Args:
        spec: The job.
        view_of: Makes the job's view, once the job is prepared and before it starts (so
            it misses none of the job's events).
        **kwargs: As for `prepare_job`.

    Returns:
        The job, its result and its view.

    Raises:
        DistrunError: As for `launch`.
        KeyboardInterrupt: As for `start_and_wait`, once the view has `ended`.
    """
    job = prepare_job(spec, **kwargs)
    view = view_of(job)
    try:
        result = start_and_wait(job, on_tick=view.tick)
    finally:
        view.ended()
    return job, result, view


def start_and_wait(job: Job, on_tick: Callable[[], None] | None = None) -> JobResult:
    """Start a prepared job and wait for its end (blocking).

    Args:
        job: From `prepare_job`, not started yet.
        on_tick: Run in the calling thread about ten times a second while the job runs
            (a view's chance to draw).

    Returns:
        Its result.

    Raises:
        KeyboardInterrupt: At any point, start-up included, once every process of the job
            has been cancelled.
    """
    try:
        with interrupts_deferred():
            job.start()
        while True:
            result = job.wait(0.1)  # short waits keep KeyboardInterrupt deliverable
            if on_tick is not None:
                on_tick()
            if result is not None:
                return result
    except KeyboardInterrupt:
        job.cancel("interrupted")
        job.wait()
        raise
