"""Live resource meters: each rank's CPU share and resident memory, from the usage reports
of the node agents (node_side/agent.py `--usage`: cumulative CPU seconds and resident bytes,
per rank, about once a second; where the node has nvidia-smi, the utilisation of the GPUs a
rank uses and the memory it holds on them).

`Meters.update(process, sample)` turns a report into the rank's latest reading (CPU as a
share of one core since its previous report), keyed by log key (`rank-3`; a process that
carries no rank, such as a TensorFlow task, under its own name). `summarize(samples)` gives
each key's average and peak over a job, from the samples the job stored (JobRecord's
usage.jsonl), for `jupyter distrun inspect`. `node_series(jobs, now)` gives each node's
recent CPU and memory, summed over the running jobs' processes on it (the sidebar's
sparklines).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from jupyter_dist.plan.model import rank_key

STORE_EVERY_S = 5.0  # how often a process's report is also written to the job's store


def mib(size: int) -> str:
    """Resident memory as the reports say it: "212 MiB"."""
    return f"{size / 2**20:.0f} MiB"


Gpu = tuple[float | None, int]  # (utilisation percent of its devices, bytes held on them)


@dataclass(frozen=True)
class Reading:
    cpu: float  # percent of one core since the previous report
    rss: int  # resident bytes
    gpu: Gpu | None = None  # None where no GPU memory is held (or no nvidia-smi)


def keyed(process: str, sample: dict[str, Any]) -> dict[str, tuple[float, int, Gpu | None]]:
    """A report's (CPU seconds, resident bytes, GPU) by key: the process's whole tree under
    its name (a launcher's row in the inspector), each rank under its log key (its chip)."""
    gpus = sample.get("gpus") or {}
    found = {
        process: (float(sample.get("cpu", 0.0)), int(sample.get("rss", 0)), _gpu(sample.get("gpu")))
    }
    for rank, (cpu, rss) in (sample.get("ranks") or {}).items():
        found[rank_key(int(rank))[0]] = (float(cpu), int(rss), _gpu(gpus.get(rank)))
    return found


def _gpu(reported: list | None) -> Gpu | None:
    if not reported:
        return None
    percent, held = reported
    return (None if percent is None else float(percent), int(held))


class Meters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, float]] = {}  # key -> (when, CPU seconds)
        self.latest: dict[str, Reading] = {}

    def update(
        self, process: str, sample: dict[str, Any], now: float | None = None
    ) -> dict[str, Reading]:
        """Take a report of `process`'s agent; the readings it gave, by key (none for a key
        whose first report this is: that sets its baseline)."""
        now = time.monotonic() if now is None else now
        fresh: dict[str, Reading] = {}
        with self._lock:
            for key, (cpu, rss, gpu) in keyed(process, sample).items():
                before = self._last.get(key)
                self._last[key] = (now, cpu)
                if before is None or now <= before[0]:
                    continue  # a first report sets the baseline
                share = max(0.0, cpu - before[1]) / (now - before[0]) * 100
                fresh[key] = self.latest[key] = Reading(round(share, 1), rss, gpu)
        return fresh

    def snapshot(self) -> dict[str, Reading]:
        with self._lock:
            return dict(self.latest)


@dataclass(frozen=True)
class Summary:
    key: str
    cpu_avg: float  # percent of a core over the samples' span
    cpu_peak: float  # the highest share between two samples
    rss_avg: int
    rss_peak: int
    # over the samples in which it held GPU memory; None where it never did
    gpu_avg: float | None = None  # utilisation percent of its devices
    gpu_peak: float | None = None
    gpu_memory_peak: int | None = None


def summarize(samples: Iterable[dict[str, Any]]) -> list[Summary]:
    """Each key's averages and peaks over stored samples ({"t", "p", "cpu", "rss", "ranks",
    and where GPUs were read "gpu", "gpus"})."""
    series: dict[str, list[tuple[float, float, int]]] = {}
    gpu: dict[str, list[Gpu]] = {}
    for sample in samples:
        for key, (cpu, rss, used) in keyed(sample["p"], sample).items():
            series.setdefault(key, []).append((float(sample["t"]), cpu, rss))
            if used is not None:
                gpu.setdefault(key, []).append(used)
    found = []
    for key, points in series.items():
        points.sort()
        shares = [
            max(0.0, c1 - c0) / (t1 - t0) * 100
            for (t0, c0, _), (t1, c1, _) in pairwise(points)
            if t1 > t0
        ]
        span = points[-1][0] - points[0][0]
        average = max(0.0, points[-1][1] - points[0][1]) / span * 100 if span > 0 else 0.0
        memory = [rss for _, _, rss in points]
        used = gpu.get(key, [])
        busy = [percent for percent, _ in used if percent is not None]
        found.append(
            Summary(
                key,
                round(average, 1),
                round(max(shares, default=0.0), 1),
                sum(memory) // len(memory),
                max(memory),
                round(sum(busy) / len(busy), 1) if busy else None,
                max(busy, default=None),
                max((held for _, held in used), default=None),
            )
        )
    return found


SERIES_POINTS = 24  # the sidebar's sparklines: 2 minutes of STORE_EVERY_S buckets


def node_series(
    jobs: Iterable[tuple[list[dict[str, Any]], Mapping[str, str]]],
    now: float,
    bucket: float = STORE_EVERY_S,
    points: int = SERIES_POINTS,
) -> dict[str, dict[str, list]]:
    """Each node's CPU (percent of one core) and resident bytes over the last `points`
    buckets of `bucket` seconds, oldest first, summed over the processes of `jobs` on it:
    {node: {"cpu": [...], "rss": [...]}}, None in a bucket no report fell in, and "gpu"
    (bytes held on GPUs) where any process held GPU memory. `jobs`: each job's stored
    samples ({"t", "p", "cpu", "rss", "gpu"}: a process's whole tree) with the node of each
    process name. A node with no report in the window is left out."""
    start = now - bucket * points
    # (node, bucket) -> (job, process) -> (CPU share, rss, GPU bytes): one reading of each
    # process a bucket, its latest (two stored 5.00 s apart can share one), then summed.
    latest: dict[tuple[str, int], dict[tuple[int, str], tuple[float, int, int | None]]] = {}
    for job, (samples, node_of) in enumerate(jobs):
        series: dict[str, list[tuple[float, float, int, int | None]]] = {}
        for sample in samples:
            gpu = _gpu(sample.get("gpu"))
            series.setdefault(sample["p"], []).append(
                (
                    float(sample["t"]),
                    float(sample.get("cpu", 0.0)),
                    int(sample.get("rss", 0)),
                    None if gpu is None else gpu[1],
                )
            )
        for process, readings in series.items():
            node = node_of.get(process)
            if node is None:
                continue
            readings.sort()
            for (t0, c0, _, _), (t1, c1, rss, held) in pairwise(readings):
                if not start < t1 <= now or t1 <= t0:
                    continue
                at = min(int((t1 - start) // bucket), points - 1)
                share = max(0.0, c1 - c0) / (t1 - t0) * 100
                latest.setdefault((node, at), {})[job, process] = (share, rss, held)
    found: dict[str, dict[str, list]] = {}
    for (node, at), readings in latest.items():
        lines = found.setdefault(node, {"cpu": [None] * points, "rss": [None] * points})
        lines["cpu"][at] = round(sum(share for share, _, _ in readings.values()), 1)
        lines["rss"][at] = sum(rss for _, rss, _ in readings.values())
        held = [gpu for _, _, gpu in readings.values() if gpu is not None]
        if held:
            lines.setdefault("gpu", [None] * points)[at] = sum(held)
    return found
