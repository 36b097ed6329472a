"""One line of advice under a root cause, for failures everybody hits, recognised by their
signature in the failed rank's last stderr lines or in how it ended:

    hint_for(cause) -> "Hint: ..." or None

Each hint names the evidence it matched, so a wrong guess is easy to see through.
"""

from __future__ import annotations

import re

from jupyter_dist.events import RootCause, ranges
from jupyter_dist.node_side.pool_protocol import POOL_ENDED

# A collective that gave up waiting: gloo's and NCCL's words for it.
_TIMED_OUT = re.compile(
    r"Timed out waiting \d+\s*ms|Watchdog caught collective operation timeout"
    r"|operation timed out|Socket Timeout",
    re.IGNORECASE,
)


# GPU signatures, in torch's and NCCL's words (tests/test_gpu.py makes a real GPU say the
# first three; tests/test_runner.py checks printed copies on the machines without one).
_CUDA_AFTER_FORK = re.compile(
    r"Cannot re-initialize CUDA in forked subprocess|CUDA error: initialization error"
)
_CUDA_OOM = re.compile(r"CUDA out of memory\.?(?: Tried to allocate [\d.]+ \w+)?")
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected[^\n]*")
_NCCL_NETWORK = re.compile(
    r"NCCL error[^\n]*(?:unhandled system error|remote process exited or there was a network "
    r"error)|ncclSystemError|ncclRemoteError",
    re.IGNORECASE,
)


# gloo told to connect to a loopback address: a peer advertised what its hostname resolves
# to, and that was 127.0.1.1 (Debian's /etc/hosts) or 127.0.0.1. Torch's gloo says
# "remote=[...]"; the gloo inside Horovod "connect [...]:PORT" or "Connect timeout [...]".
_GLOO_LOOPBACK = re.compile(r"(?:remote=|connect |Connect timeout )\[(127(?:\.\d{1,3}){3}|::1)\]")


def hint_for(cause: RootCause) -> str | None:
    """The advice for `cause`, or None where nothing is recognised."""
    tail = "\n".join(cause.stderr_tail).lower()
    gpu = _gpu_hint(cause, "\n".join(cause.stderr_tail))
    if gpu:
        return gpu
    loopback = _GLOO_LOOPBACK.search("\n".join(cause.stderr_tail))
    if loopback and "horovod" in tail:
        return (
            f"Hint: {cause.label} was sent to a loopback address to reach another rank "
            f'("{loopback.group(0)}"): Horovod\'s Gloo controller sets up its process sets '
            "on the address a node's hostname resolves to, whatever HOROVOD_GLOO_IFACE says, "
            f"and on that node it is {loopback.group(1)} (Debian and Ubuntu put the hostname "
            "on 127.0.1.1 in /etc/hosts). Use Horovod's MPI controller (leave out --gloo), or "
            "map the hostname to the node's own address; with the network check on "
            "(network_check: true, the default), such a job is refused before it starts."
        )
    if loopback:
        return (
            f"Hint: {cause.label} was sent to a loopback address to reach another rank "
            f'("{loopback.group(0)}"): gloo advertises what a node\'s hostname resolves to, '
            f"and on that node it is {loopback.group(1)} (Debian and Ubuntu put the hostname "
            "on 127.0.1.1 in /etc/hosts). Keep the network check on (network_check: true, "
            "the default) and jupyter-dist sets GLOO_SOCKET_IFNAME on such nodes; or name "
            "the interface that reaches the other nodes (--env GLOO_SOCKET_IFNAME=eth0), or "
            "map the hostname to the node's own address."
        )
    if "address already in use" in tail or "eaddrinuse" in tail:
        return (
            f'Hint: a port {cause.label} needed on {cause.node} was taken ("address already '
            'in use"). jupyter-dist gives MASTER_PORT a free port; a script that binds a '
            "fixed port, or a leftover process still holding one, causes this: stop it "
            "(jupyter distrun jobs) or let the port come from MASTER_PORT."
        )
    timed_out = _TIMED_OUT.search("\n".join(cause.stderr_tail))  # its own words, as printed
    if timed_out:
        waited = (
            f"; {ranges(cause.stopped)} still ran when it gave up: the likely one(s) that never "
            "arrived"
            if cause.stopped
            else ""
        )
        return (
            f'Hint: a collective timed out on {cause.label} ("{timed_out.group(0)}"): another '
            f"rank never joined it{waited}. On a hung job, `jupyter distrun stacks JOB` (or the "
            "Stacks button) shows where each rank waits; --stall-timeout takes them for you."
        )
    if "terminate called without an active exception" in tail and cause.signal == "SIGABRT":
        return (
            f'Hint: {cause.label} aborted as C++ threads were torn down ("terminate called '
            "without an active exception\"): with torch, gloo's threads dying with the "
            "interpreter while a DDP model or process group still lives. Call "
            "dist.barrier(), delete the model, then dist.destroy_process_group() at the end "
            "(notebook cells run by jupyter-dist already leave without that teardown)."
        )
    if cause.signal == "SIGKILL" and cause.oom:
        return _oom_hint(cause, cause.oom)
    if cause.signal == "SIGKILL" and any(line.startswith(POOL_ENDED) for line in cause.stderr_tail):
        return (
            f"Hint: {cause.label} was forked from its node's pool (--preload), and the pool "
            f"ended under it, taking its ranks: see `jupyter distrun pool list` on {cause.node}; "
            "the next job starts a new pool, or run with --preload none to start cold."
        )
    if cause.signal == "SIGKILL" and not cause.note:
        return (
            f"Hint: {cause.label} got SIGKILL from outside (not from jupyter-dist): on "
            "Linux that is most often the out-of-memory killer (see `dmesg` or `journalctl "
            f"-k` on {cause.node}, or the memory limit of the Slurm job or container)."
        )
    return None


def _gpu_hint(cause: RootCause, tail: str) -> str | None:
    """The advice for what CUDA and NCCL say when ranks share a GPU, run out of its memory,
    touch CUDA before a fork, or cannot reach each other."""
    found = _CUDA_AFTER_FORK.search(tail)
    if found:
        return (
            f'Hint: {cause.label} used CUDA in a forked process ("{found.group(0)}"): CUDA '
            "cannot be used in a child forked after its parent initialised it (a DataLoader "
            "worker or multiprocessing.Process, after the parent touched the GPU). Keep CUDA "
            "out of the parent until the workers exist, or start them with "
            "multiprocessing_context='spawn' (torch.multiprocessing.set_start_method('spawn'))."
        )
    found = _DUPLICATE_GPU.search(tail)
    if found:
        return (
            f'Hint: ranks share a GPU on {cause.node} ("{found.group(0).strip()}"): NCCL '
            "needs one device per rank. Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) "
            "before init_process_group (or give each rank its own CUDA_VISIBLE_DEVICES)."
        )
    found = _CUDA_OOM.search(tail)
    if found:
        return (
            f'Hint: {cause.label} ran out of GPU memory on {cause.node} ("{found.group(0)}"). '
            "Where every rank of a node allocates on cuda:0 (no torch.cuda.set_device("
            "LOCAL_RANK)), they share one GPU's memory; otherwise use a smaller batch per "
            "rank, and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where memory is "
            "fragmented. `jupyter distrun inspect JOB` shows each rank's GPU memory peak."
        )
    found = _NCCL_NETWORK.search(tail)
    if found:
        return (
            f'Hint: NCCL on {cause.label} lost a connection ("{found.group(0)}"): a peer '
            "died first (see the other ranks), or the nodes reach each other on a different "
            "interface than NCCL picked. Run with NCCL_DEBUG=INFO, and set NCCL_SOCKET_IFNAME "
            "to the interface the nodes share (the plan's checks say where nodes differ)."
        )
    return None


def _oom_hint(cause: RootCause, oom: dict) -> str:
    """The OOM killer's doing, with what the node's agent read: where the limit is, what
    it is, how high memory got."""
    limit, peak = oom.get("limit"), oom.get("peak")
    numbers = []
    if limit:
        numbers.append(f"limit {_mib(limit)}")
    if peak:
        numbers.append(f"peak {_mib(peak)}")
    kills = oom.get("kills", 1)
    killed = f"{kills} process{'es' if kills != 1 else ''}"
    return (
        f"Hint: the kernel's out-of-memory killer ended {cause.label}: under the memory limit "
        f"of cgroup {oom.get('cgroup')} on {cause.node}"
        + (f" ({', '.join(numbers)})" if numbers else "")
        + f", it killed {killed} while the job ran. Use less memory per rank (a smaller "
        "batch, fewer --procs-per-node) or ask for more (the container's or Slurm job's "
        "memory)."
    )


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.0f} MiB"
