"""sbatch: a batch script that runs the job under Slurm as the slurm backend does, with no
jupyter-dist on the cluster: every process of the plan is one job step (`srun --overlap`
on its node, in its folder, with its environment), its lines prefixed with its name; the
first process that fails ends the script with its exit code, and Slurm then stops every
step still running (so does the end of the job's own processes, for the services: Dask's
scheduler and workers, TensorFlow's parameter servers).

Node names and addresses, the job id and the folder the script was written to (`here`)
are shell variables that the script sets at run time; every other value is quoted. Like
the slurm backend, it needs the nodes to share the folder (a cluster's filesystem).
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex

from jupyter_dist.backends.slurm import allocation_options, mpi_launch
from jupyter_dist.code_folder import CodeFolder
from jupyter_dist.export.symbolic import placeholders_in, shell_word, symbolic_plan
from jupyter_dist.export.target import MARKER, ExportTarget, path_from, unsupported
from jupyter_dist.node_side.agent import PATH_FIRST_VAR
from jupyter_dist.plan.model import LaunchPlan, ProcessPlan
from jupyter_dist.plan.summary import launch_summary
from jupyter_dist.spec import JobSpec

SUFFIX = ".sbatch"
HOW_TO_RUN = "sbatch --wait {name}"
FORMAT = "sbatch"
_SBATCH_VALUE = re.compile(r"[^\s'\"\\]+\Z")  # what an #SBATCH line can carry as it is
_HEREDOC_END = "DISTRUN_EOF"

# Runs one process of the plan as a job step, and says so when it fails.
_FUNCTIONS = r"""
# One process: a job step on NODE in folder CWD with the variables given, its stdout and
# stderr lines prefixed with LABEL; a line says so when it fails.
distrun_step() {  # LABEL NODE CWD NAME=VALUE... -- ARGV...
  local label=$1 node=$2 cwd=$3 vars=() code
  shift 3
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  { srun --nodes=1 --ntasks=1 --nodelist="$node" --chdir="$cwd" --overlap \
      --kill-on-bad-exit=1 env "${vars[@]}" "$@" 2>&1 1>&3 3>&- \
      | sed -u "s/^/[$label] /" >&2; } 3>&1 | sed -u "s/^/[$label] /"
  code=$?
  [ "$code" = 0 ] || echo "jupyter-dist: $label on $node exited with code $code" >&2
  return "$code"
}
""".strip()

# Waits for every process but the services; the first failure ends the script (and Slurm
# then stops what still runs). Polls, so that it works with any bash from 4 on.
_WAIT = r"""
status=0
while [ "$status" = 0 ]; do
  alive=() running=0
  for pid in "${watched[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      alive+=("$pid")
      case " ${services[*]} " in *" $pid "*) ;; *) running=1 ;; esac
    else
      wait "$pid" || { status=$?; break; }
    fi
  done
  watched=("${alive[@]}")
  [ "$running" = 1 ] || break
  sleep 1
done
exit "$status"
""".strip()


def render(
    spec: JobSpec, target: ExportTarget, cell: str | None = None, code: CodeFolder | None = None
) -> str:
    """The manifest (a cell's code is the file beside it: `cell` is not needed)."""
    _check(spec, target)
    code = spec.code_dir()
    code_from = path_from(target.folder, code) if code else None
    planned = symbolic_plan(spec, target.python, code_from, mpi_launch=mpi_launch)
    variables = {"here": "here", "job": "job"}
    for n in range(spec.instance_count):
        variables |= {f"node{n}": f"node_{n}", f"addr{n}": f"addr_{n}"}

    def word(text: str) -> str:
        return shell_word(text, variables)

    lines = ["#!/bin/bash", *_sbatch_lines(spec, target)]
    lines += [
        f"# {MARKER}{' from ' + target.source if target.source else ''}: a {spec.job_type} "
        f"job, {launch_summary(planned)}.",
        "# Run it with: " + HOW_TO_RUN.format(name=shlex.quote(target.name(SUFFIX))),
        "# Each process runs as a job step on its node (srun), as jupyter-dist's slurm backend",
        "# runs it; the first that fails ends the job. The nodes must share this folder.",
        "set -o pipefail",
        "",
        f"here={shlex.quote(str(target.folder))}  # the folder this script was written to",
        'job="slurm-$SLURM_JOB_ID"',
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        f'if [ "${{#nodes[@]}}" -lt {spec.instance_count} ]; then',
        f'  echo "jupyter-dist: this job needs {spec.instance_count} nodes; Slurm gave'
        ' ${#nodes[@]}" >&2',
        "  exit 1",
        "fi",
        "# The address each node is reached at (Slurm's NodeAddr), as the slurm backend uses.",
        "distrun_addr() {",
        "  local addr",
        '  addr=$(scontrol show node -o "$1" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        '  echo "${addr:-$1}"',
        "}",
    ]
    for n in range(spec.instance_count):
        lines.append(f'node_{n}=${{nodes[{n}]}} addr_{n}=$(distrun_addr "${{nodes[{n}]}}")')
    files = _files(planned, word)
    lines += ["", *files] if files else []
    common = _common_env(planned)
    lines += ["", _FUNCTIONS, "", "# What every process gets.", "common=("]
    lines += [f"  {name}={word(value)}" for name, value in common.items()]
    lines += [")", "watched=() services=()"]
    for proc in planned.processes:
        lines += ["", *_step(proc, word, common)]
    lines += [
        "",
        "# Wait for every process but the services; the first that fails ends the job, and",
        "# Slurm then stops every step still running.",
        _WAIT,
        "",
    ]
    return "\n".join(lines)


def _common_env(planned: LaunchPlan) -> dict[str, str]:
    """The variables every process gets with the same value."""
    first, *others = (proc.env for proc in planned.processes)
    return {k: v for k, v in first.items() if all(env.get(k) == v for env in others)}


def _check(spec: JobSpec, target: ExportTarget) -> None:
    if spec.job_type == "dask" and spec.command is None:
        raise unsupported(
            FORMAT,
            "a Dask job without a command",
            "it keeps a cluster for the notebook; a batch job needs a command to run",
        )
    if any(c in str(target.folder) for c in "'\n"):
        raise unsupported(
            FORMAT,
            f"the folder {str(target.folder)!r}",
            "its name holds a quote or a line break; write the script elsewhere",
        )


def _sbatch_lines(spec: JobSpec, target: ExportTarget) -> list[str]:
    """The allocation as #SBATCH lines: what the slurm backend would ask salloc for."""
    options = allocation_options(spec, name=target.job_name(spec, allowed="A-Za-z0-9_.-"))
    backend = spec.backend
    if spec.timeout and not (backend and backend.time):
        options.append(f"--time={math.ceil(spec.timeout / 60)}")  # minutes
    if spec.nodes and backend and backend.type == "slurm":
        options.append(f"--nodelist={','.join(spec.nodes)}")
    for option in options:
        if not _SBATCH_VALUE.match(option):
            key = option.split("=", 1)[0].lstrip("-").replace("-", "_")
            raise unsupported(
                FORMAT,
                f"{key} {option.split('=', 1)[-1]!r}",
                "an #SBATCH line cannot carry spaces, quotes or backslashes",
            )
    return [f"#SBATCH {option}" for option in options]


def _files(planned: LaunchPlan, word) -> list[str]:
    """The files the plan writes before anything starts (a hostfile, Dask's readiness
    check), once each: the nodes share the folder."""
    lines, seen = [], set()
    folders = sorted({posixpath.dirname(f.path) for f in planned.files})
    if folders:
        lines.append("mkdir -p " + " ".join(word(folder) for folder in folders))
    for planned_file in planned.files:
        if planned_file.path in seen:
            continue
        seen.add(planned_file.path)
        content = planned_file.content
        if (
            not placeholders_in(content)
            and content.endswith("\n")
            and _HEREDOC_END not in content.splitlines()
        ):
            lines += [f"cat > {word(planned_file.path)} <<'{_HEREDOC_END}'", content.rstrip("\n")]
            lines.append(_HEREDOC_END)
        else:
            lines.append(f"printf %s {word(content)} > {word(planned_file.path)}")
        if planned_file.executable:  # a program a launcher runs (horovodrun's `ssh`)
            lines.append(f"chmod +x {word(planned_file.path)}")
    return lines


def _step(proc: ProcessPlan, word, common: dict[str, str]) -> list[str]:
    what = "a service: it runs until the job's other processes end" if proc.service else ""
    head = f"# {proc.label}" + (f" ({what})" if what else "")
    first = proc.env.get(PATH_FIRST_VAR)  # the job's own programs (horovodrun's `ssh`)
    return [
        head,
        f'distrun_step {word(proc.label)} {word(proc.node)} {word(proc.cwd)} "${{common[@]}}" \\',
        *(f"  {name}={word(value)} \\" for name, value in proc.env.items() if name not in common),
        *([f'  PATH={word(first)}:"$PATH" \\'] if first else []),
        "  -- " + " ".join(word(arg) for arg in proc.argv) + " &",
        "watched+=($!)" + (" services+=($!)" if proc.service else ""),
    ]
