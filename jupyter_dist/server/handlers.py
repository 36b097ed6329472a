"""REST handlers, every one authenticated. They read the same job store as the kernels and
the CLI, and do their file and network work in a thread pool, never on the event loop.

    GET  /distrun/nodes                    the inventory with each node's health
    GET  /distrun/nodes/usage              each node's CPU and memory of the last 2 minutes,
                                           over the running jobs' processes on it
    GET  /distrun/nodes/pools              each node's pools of pre-imported Python (--preload):
                                           modules, pid, ranks, memory, idle time
    GET  /distrun/jobs                     every job, newest first
    GET  /distrun/jobs/{id}                spec, plan, who is who and per-process status
    GET  /distrun/jobs/{id}/logs?rank=R    a range of one rank's (or process's) log:
         &offset=CURSOR&limit=N&tail=N     `offset` is the `next` of the previous reply
    POST /distrun/jobs/{id}/cancel         ask the job's owner to stop it
    POST /distrun/jobs/{id}/stacks         every rank's stack, read now by the job's owner
         ?method=auto|py-spy|faulthandler  (diagnose/stacks.py); the dump, with its text
    GET  /distrun/jobs/{id}/stacks         the last stacks taken
    GET  /distrun/jobs/{id}/debug          the ranks paused in the debugger, as `debug --list
                                           --json` lists them: {paused: [...], problems: [...]}
    POST /distrun/jobs/{id}/debug          {"command": "p x", "ranks": "0,2-3" | "all"}: one
                                           pdb command to each (debug --do --ranks); the reply
                                           is {answers: [{rank, answer, paused} | {rank, error}]}
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from jupyter_dist.backends import inventory_backend
from jupyter_dist.backends.node_pools import pools_for_jobs
from jupyter_dist.debug_console import OwnerLink, listed
from jupyter_dist.describe import inspect_rows, job_summary
from jupyter_dist.diagnose.meters import SERIES_POINTS, STORE_EVERY_S, node_series
from jupyter_dist.diagnose.stacks import StackDump
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import FINAL_STATES
from jupyter_dist.masking import masked_plan, masked_spec
from jupyter_dist.nodes import Inventory, load_inventory
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.rank_sets import parse_rank_set
from jupyter_dist.run.metrics import latest as latest_metrics
from jupyter_dist.run.requests import (
    SETTLED_STATES,
    copying_outputs,
    request_cancel,
    request_stacks,
)
from jupyter_dist.spec import dump_yaml
from jupyter_dist.store import JobStore, UnknownJob
from jupyter_dist.validation import YamlTooBig, load_yaml

MAX_LIMIT = 20000
MAX_RUNNING = 200  # the newest jobs looked at for the nodes' usage (running ones are new)
STACKS_TIMEOUT_S = 60.0  # how long a stacks request waits for the job's owner
DEBUG_TIMEOUT_S = 30.0  # how long a pdb command may run before its answer is given up on
HEALTH_TTL = 15.0  # seconds a node health check is reused (every open lab polls it)
POOLS_TTL = 5.0  # seconds a look at the nodes' pools is reused (one Python per node each)


class _Shared:
    """The last answer of `look(inventory)`, shared by all requests for `ttl` seconds (every
    open lab polls): the inventory is read each time (its file may have changed), and an
    answer for another one is never given."""

    def __init__(self, ttl: float, look: Callable[[Inventory], dict[str, Any]]) -> None:
        self._ttl, self._look = ttl, look
        self._lock = threading.Lock()
        self._value: tuple[float, str | None, dict[str, Any]] | None = None

    def get(self) -> dict[str, Any]:
        with self._lock:
            inventory = load_inventory(None)
            now = time.monotonic()
            if (
                self._value
                and self._value[1] == inventory.source
                and now - self._value[0] < self._ttl
            ):
                return self._value[2]
            value = self._look(inventory)
            self._value = (now, inventory.source, value)
            return value


def _health(inventory: Inventory) -> dict[str, Any]:
    if inventory.is_local:
        return {"source": None, "local": True, "nodes": []}
    checked = inventory_backend(inventory).health(list(inventory.nodes))
    return {"source": inventory.source, "local": False, "nodes": [h.to_dict() for h in checked]}


def _pools(inventory: Inventory) -> dict[str, Any]:
    answers = pools_for_jobs(inventory, "list")  # inside an allocation, its nodes
    return {"nodes": [{"node": a.node, "pools": a.pools, "problem": a.problem} for a in answers]}


class DistrunHandler(APIHandler):
    @property
    def store(self) -> JobStore:
        return self.settings["distrun_store"]

    async def blocking(self, func, *args):
        """Run `func` in the extension's thread pool; a DistrunError becomes a 4xx reply."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.settings["distrun_pool"], func, *args)
        except DistrunError as exc:
            raise web.HTTPError(404 if isinstance(exc, UnknownJob) else 400, str(exc)) from None

    def reply(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))

    def _int_argument(self, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        # ASCII digits only, and few: str.isdigit() takes "²", which int() refuses, and
        # int() refuses a string of thousands of digits too
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 12) or not low <= int(raw) <= high:
            raise web.HTTPError(400, f"{name}={raw!r} is not valid; give a number {low}-{high}")
        return int(raw)


class NodesHandler(DistrunHandler):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.settings["distrun_health"].get))


class NodeUsageHandler(DistrunHandler):
    @web.authenticated
    async def get(self) -> None:
        def usage():
            jobs, now = [], time.time()
            # the window, and a sample before it (the first bucket's CPU share needs one)
            since = now - STORE_EVERY_S * (SERIES_POINTS + 2)
            for record in self.store.jobs()[:MAX_RUNNING]:
                try:
                    if record.status().get("state") != "running":
                        continue
                    plan = record.plan()
                    node_of = {p["name"]: p["node"] for p in plan.get("processes", [])}
                    jobs.append((record.usage(since=since), node_of))
                except (DistrunError, OSError, ValueError, KeyError, TypeError):
                    continue  # a damaged or vanishing job shows no usage
            return {"bucket": STORE_EVERY_S, "nodes": node_series(jobs, now)}

        self.reply(await self.blocking(usage))


class PoolsHandler(DistrunHandler):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.settings["distrun_pools"].get))


class JobsHandler(DistrunHandler):
    @web.authenticated
    async def get(self) -> None:
        limit = self._int_argument("limit", None, 1, MAX_LIMIT)

        def jobs():
            # Only the jobs asked for are read: a store holds a job for every cell ever run.
            found = []
            for record in self.store.jobs()[:limit]:
                summary = job_summary(record.status())
                if summary["state"] not in SETTLED_STATES:  # their metrics as they come
                    summary.update(latest_metrics(record))
                found.append(summary)
            return found

        self.reply(await self.blocking(jobs))


class JobHandler(DistrunHandler):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        def detail():
            record = self.store.get(job_id)
            status, plan = record.status(), record.plan()
            processes = inspect_rows(LaunchPlan.from_dict(plan), status)
            return {  # secret values masked (masking.py): the browser needs none of them
                **job_summary(status),
                "spec": _masked_spec_yaml(record.spec_yaml()),
                "plan": masked_plan(plan),
                "processes": processes,
                "log_keys": record.log_keys(),
                "store_path": str(record.path),
            }

        self.reply(await self.blocking(detail))


def _masked_spec_yaml(text: str) -> str:
    """The stored spec, masked; empty where it is not a spec (damaged, or an alias bomb:
    the same bounded reader as every spec file)."""
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, YamlTooBig):
        return ""
    return dump_yaml(masked_spec(data)) if isinstance(data, dict) else ""


class LogsHandler(DistrunHandler):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        rank = self.get_query_argument("rank", None)
        offset = self.get_query_argument("offset", "0.0")
        limit = self._int_argument("limit", 5000, 1, MAX_LIMIT)
        tail = self._int_argument("tail", None, 0, MAX_LIMIT)

        def read():
            record = self.store.get(job_id)
            keys = record.log_keys()
            if rank is None:
                raise DistrunError(f"give rank=R or a log name; logs: {', '.join(keys) or 'none'}")
            key = f"rank-{rank}" if rank.isdigit() else rank
            if key not in keys:
                raise DistrunError(
                    f"job {record.job_id} has no log {key!r}; logs: {', '.join(keys) or 'none'}"
                )
            lines, cursor = record.read_range(key, offset, limit=limit, tail=tail)
            state = job_summary(record.status())["state"]
            return {"key": key, "lines": lines, "next": cursor, "state": state}

        self.reply(await self.blocking(read))


class CancelHandler(DistrunHandler):
    @web.authenticated
    async def post(self, job_id: str) -> None:
        def cancel():
            record = self.store.get(job_id)
            try:
                state = request_cancel(record, reason="cancelled from JupyterLab")
            except DistrunError as exc:
                return 409, {"job_id": record.job_id, "state": "lost", "message": str(exc)}
            if state not in FINAL_STATES:
                return 202, {"job_id": record.job_id, "state": state, "message": "asked to stop"}
            if copying_outputs(record):  # ended, its outputs still coming: that copy stops
                message = "asked to stop copying its outputs"
                return 202, {"job_id": record.job_id, "state": state, "message": message}
            return 200, {"job_id": record.job_id, "state": state, "message": "already ended"}

        status, body = await self.blocking(cancel)
        self.reply(body, status)


class StacksHandler(DistrunHandler):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        def last():
            record = self.store.get(job_id)
            dump = record.last_stacks()
            if dump is None:
                raise web.HTTPError(404, f"no stacks were taken of job {record.job_id}")
            return _readable(dump)

        self.reply(await self.blocking(last))

    @web.authenticated
    async def post(self, job_id: str) -> None:
        method = self.get_query_argument("method", "auto")

        def take():
            dump = request_stacks(self.store.get(job_id), method, STACKS_TIMEOUT_S)
            return _readable(dump)

        self.reply(await self.blocking(take))


class DebugHandler(DistrunHandler):
    """The live view's debugger console (diagnose/debug.py, debug_console.OwnerLink): the
    job's owner reaches each paused rank's pdb, as for `jupyter distrun debug`."""

    @web.authenticated
    async def get(self, job_id: str) -> None:
        def paused():
            found, problems = OwnerLink(self.store.get(job_id), DEBUG_TIMEOUT_S).paused()
            return {"paused": [listed(p) for p in found], "problems": problems}

        self.reply(await self.blocking(paused))

    @web.authenticated
    async def post(self, job_id: str) -> None:
        try:  # bytes: json reads UTF-8 itself, and refuses other bytes as a ValueError
            body = json.loads(self.request.body or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise web.HTTPError(400, 'give a JSON object: {"command": "p x", "ranks": "0,2-3"}')
        command, ranks = body.get("command"), body.get("ranks", "all")
        if not isinstance(command, str) or not isinstance(ranks, str):
            raise web.HTTPError(
                400, '"command" (a pdb command) and "ranks" (3, 0,2-3 or all) are strings'
            )

        def cast():
            chosen = parse_rank_set(ranks, "ranks")
            answers = OwnerLink(self.store.get(job_id), DEBUG_TIMEOUT_S).cast(chosen, command)
            return {"answers": answers}

        self.reply(await self.blocking(cast))


def _readable(dump: dict[str, Any]) -> dict[str, Any]:
    """A stored dump with what a view shows of it: one summary line per group (the odd ones
    first) and the whole text."""
    stacks = StackDump.from_dict(dump)
    summary = [group.summary() for group in stacks.groups()]
    return {**dump, "heading": stacks.heading(), "summary": summary, "text": stacks.format()}


def setup_handlers(web_app: Any, store: JobStore | None = None) -> None:
    web_app.settings.setdefault("distrun_store", store or JobStore())
    web_app.settings.setdefault("distrun_pool", ThreadPoolExecutor(4, "distrun-api"))
    web_app.settings.setdefault("distrun_health", _Shared(HEALTH_TTL, _health))
    web_app.settings.setdefault("distrun_pools", _Shared(POOLS_TTL, _pools))
    base = url_path_join(web_app.settings["base_url"], "distrun")
    job = r"/jobs/(?P<job_id>[\w.-]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "nodes"), NodesHandler),
            (url_path_join(base, "nodes", "usage"), NodeUsageHandler),
            (url_path_join(base, "nodes", "pools"), PoolsHandler),
            (url_path_join(base, "jobs"), JobsHandler),
            (base + job, JobHandler),
            (base + job + "/logs", LogsHandler),
            (base + job + "/cancel", CancelHandler),
            (base + job + "/stacks", StacksHandler),
            (base + job + "/debug", DebugHandler),
        ],
    )
