"""Bad input never gets past as a traceback from our internals: property-based fuzzing
(hypothesis, derandomized: the same cases every run) of the spec loader and the planner, the
inventory loader and the magic's line parser, and the cases an adversarial pass found.
Whatever the input, the answer is a valid job or one line of DistrunError."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import execute_notebook, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_dist.errors import DistrunError
from jupyter_dist.nodes import load_inventory, local_nodes
from jupyter_dist.options import LaunchOptions
from jupyter_dist.plan import plan, port_requests
from jupyter_dist.spec import parse_spec

FUZZ = settings(
    max_examples=300, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip

BASES = [
    {"command": "python train.py", "resources": {"instance_count": 2},
     "distribution": {"type": "pytorch", "process_count_per_instance": 2}},
    {"command": "python tf.py", "resources": {"instance_count": 2},
     "distribution": {"type": "tensorflow", "worker_count": 2, "parameter_server_count": 1,
                      "chief_count": 1, "base_port": 2222}},
    {"command": "python mpi.py", "distribution": {"type": "mpi", "mpi_args": "--bind-to core"}},
    {"command": "python c.py", "resources": {"instance_count": 2},
     "distribution": {"type": "dask", "threads_per_process": 2, "scheduler_port": 8786}},
    {"command": "python t.py --lr ${{inputs.lr}}", "inputs": {"lr": 0.1},
     "environment_variables": {"A": "1"}, "limits": {"timeout": 60, "grace_period": 3},
     "nodes": ["local0"], "backend": {"type": "local"}, "code": "."},
    # The design proposal's shape (spec_dialect.py), and outputs.
    {"command": "horovodrun -np 4 python t.py", "compute": {"instance_count": 2},
     "distributed": {"mpi": {"worker": {"count": 2, "resources": {"limits": {"gpu": 2}}},
                             "launcher": {"resources": {"limits": {"cpu": 1}}}}},
     "environment": {"docker": {"image": "img"}}},
    {"command": "python t.py", "distributed": {"tensorflow": {
        "worker": {"count": 2}, "parameter_server": {"count": 1,
                                                     "environment_variables": {"A": "1"}}}}},
    {"command": "python t.py --out ${{outputs.m}} ${{outputs.f}}",
     "outputs": {"m": {"type": "uri_folder"}, "f": {"type": "uri_file", "path": "/tmp/f"}}},
]  # fmt: skip
# Values that broke something once (or are next to a limit), drawn half of the time.
SPECIAL = st.sampled_from(
    [
        "\x00",
        "a\x00b",
        "\ud800",
        "~nosuchuser/x",
        "x" * 5000,
        "${{inputs.nope}}",
        "PyTorch",
        "torchrun",
        "horovodrun",
        "65536",
        "1e20",
        "-1",
        "0",
        10**8,
        100_000,
        2**63,
        65535,
        65536,
        1025,
        4097,
        0,
        -1,
        True,
        2.5,
        None,
        [],
        {},
    ]
)
ODD = st.one_of(
    SPECIAL, st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                          max_size=3),
)  # fmt: skip


def _paths(data, prefix=()):
    """Every key path of a nested mapping."""
    for key, value in data.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


@st.composite
def mutated_specs(draw):
    """A valid spec with a few keys changed to odd values, dropped, or added."""
    data = json.loads(json.dumps(draw(st.sampled_from(BASES))))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths)) if paths else ("command",)
        parent = data
        for key in path[:-1]:
            parent = parent[key] if isinstance(parent.get(key), dict) else {}
        action = draw(st.sampled_from(["set", "drop", "add"]))
        if action == "set":
            parent[path[-1]] = draw(SPECIAL) if draw(st.booleans()) else draw(ODD)
        elif action == "drop":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.text(min_size=1, max_size=8))] = draw(ODD)
    return data


def _one_line(exc: BaseException) -> None:
    assert isinstance(exc, DistrunError), f"{type(exc).__name__}: {exc}"
    assert "\n" not in str(exc) and str(exc), repr(str(exc))


def _with_nul(data) -> bool:
    if isinstance(data, str):
        return "\x00" in data
    if isinstance(data, dict):
        return any(_with_nul(k) or _with_nul(v) for k, v in data.items())
    return isinstance(data, list) and any(_with_nul(v) for v in data)


def _planned_or_refused(text: str, tmp_path) -> None:
    try:
        spec = parse_spec(text, base_dir=tmp_path)
        assert not _with_nul(spec.to_dict())  # accepted: every value can reach a process
        nodes = local_nodes(spec.instance_count, tmp_path)
        ports = {r.key: r.fixed or 20000 + i for i, r in enumerate(port_requests(spec, nodes))}
        plan(spec, nodes, "job", ports)
    except Exception as exc:
        _one_line(exc)


@pytest.mark.slow
@FUZZ
@given(data=mutated_specs())
def test_mutated_specs_are_planned_or_refused_in_one_line(data, tmp_path):
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return  # not YAML a user could write
    _planned_or_refused(text, tmp_path)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list("ab: -[]{}&*!|>'\"\n\t#%@`,?0123\x00")),
                    max_size=80))  # fmt: skip
def test_arbitrary_text_is_a_spec_or_one_line(text, tmp_path):
    _planned_or_refused(text, tmp_path)


@pytest.mark.slow
@FUZZ
@given(entries=st.lists(st.dictionaries(
    st.sampled_from(["name", "host", "port", "user", "key_file", "python", "workdir", "gpus",
                     "extra"]), ODD, max_size=5), max_size=3))  # fmt: skip
def test_inventories_load_or_are_refused_in_one_line(entries, tmp_path):
    path = tmp_path / "nodes.yml"
    try:
        path.write_text(yaml.safe_dump({"nodes": entries}, allow_unicode=True))
    except (yaml.YAMLError, UnicodeEncodeError):
        return
    try:
        load_inventory(path)
    except Exception as exc:
        _one_line(exc)


WORDS = [
    "--type", "pytorch", "tensorflow", "dask", "mpi", "bogus", "--nodes", "-n", "2", "0",
    "99999999999", "-1", "x", "--procs-per-node", "--env", "A=1", "'A=b c'", "=x", "B",
    "--launcher", "torchrun", "--timeout", "1e20", "--code", "/nonexistent", "--ps-count",
    "--chief", "--threads", "--scheduler-port", "70000", "--backend", "slurm", "--partition",
    "--gpus-per-node", "--name", "--grace-period", '"', "'", "--export", "sbatch", "--help",
]  # fmt: skip


@pytest.fixture(scope="module")
def magics():
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_dist.magics import DistrunMagics

    return DistrunMagics(InteractiveShell.instance())


@FUZZ
@given(words=st.lists(st.sampled_from(WORDS), max_size=8))
def test_magic_lines_become_a_spec_or_one_line(words, magics, tmp_path):
    line = " ".join(words)
    try:
        args = magics._parse(line)
        magics._configured_defaults(args)
        LaunchOptions.take(args).to_spec("print(1)", base_dir=tmp_path)
    except SystemExit as exc:  # --help prints and exits 0, as argparse does
        assert exc.code in (0, None), line
    except Exception as exc:
        _one_line(exc)


# -- the cases an adversarial pass found ---------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BOMB, "values once its aliases are expanded"),
        ("&a [*a]", "a cycle"),
        ("[" * 1000 + "]" * 1000, "nested deeper than 64 levels"),
        ("command: \"a\\0b\"\n", "holds a NUL byte"),
        ("command: x\nresources: {instance_count: 100000000}\n", "from 1 to 4096"),
        ("command: x\ndistribution: {type: mpi, process_count_per_instance: 100000}\n",
         "from 1 to 1024"),
        ("command: x\nresources: {instance_count: 64}\n"
         "distribution: {type: pytorch, process_count_per_instance: 1000}\n",
         "64000 processes in one job; at most 16384"),
        ("command: x\ndistribution: {type: tensorflow, worker_count: 100000}\n", "from 1 to 4096"),
        ("command: x\nlimits: {timeout: 100000000000000000000}\n", "from 1 to 2678400"),
        ("command: x\ncode: ~nosuchuser/x\n", "code: '~nosuchuser/x' cannot be used"),
        ("command: x\ncode: " + "a" * 5000 + "\n", "cannot be used (File name too long)"),
        ("command: x\nresources: {instance_count: 1}\n"
         "distribution: {type: tensorflow, base_port: 65535, worker_count: 3}\n",
         "base_port: 65535 leaves too few ports"),
        ("#" * 100 + "\n" + "# comment\n" * 500_000, "more than 4 MiB of YAML"),
        ("command: !!binary aGVsbG8=\n", "command: b'hello' is not valid; expected a string"),
        ("script: 42\n", "script: 42 is not valid; expected a string"),
    ],
)  # fmt: skip
def test_each_case_found_is_one_line_from_the_cli(text, message, tmp_path):
    path = tmp_path / "job.yml"
    path.write_text(text)
    done = run_cli("plan", str(path), "--store", str(tmp_path / "jobs"), timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-500:]
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_an_endless_file_is_refused_at_once_not_read_whole(tmp_path):
    """`plan /dev/zero` read the whole file before its size check (it never ends): a spec
    is read no further than the cap; a node inventory must be a file."""
    store = str(tmp_path / "jobs")
    plan = run_cli("plan", "/dev/zero", "--store", store, timeout=60)
    nodes = run_cli("nodes", "--nodes-file", "/dev/zero", "--store", store, timeout=60)
    for done in (plan, nodes):
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-500:]
    assert "/dev/zero: more than 4 MiB of YAML" in plan.stderr
    assert "node inventory /dev/zero (from --nodes-file) is not a file" in nodes.stderr


@pytest.mark.slow
def test_the_kernel_gets_one_line_for_each_bad_line(kernel_env, tmp_path):
    nb = execute_notebook(
        f"%%distrun --save {tmp_path}/missing/folder/job.yml\nprint(1)",
        "%%distrun --save /\nprint(1)",
        '%distrun logs "x',
        "%distrun jobs --help",
        "%distrun logs somejob --stream sideways",
        "%%distrun --dry-run --env 'GREETING=hello world'\nprint(1)",
        "%%distrun --save ''\nprint(1)",
        "%distrun dask start --type pytorch --nodes 1",
        allow_errors=True,
    )
    errors = [
        next((o for o in cell.outputs if o.output_type == "error"), None) for cell in nb.cells[1:]
    ]
    for error in errors[:3] + errors[4:5]:
        assert error is not None and error.ename == "DistrunError", error
        assert len(error.traceback) == 1 and "\n" not in error.evalue, error.traceback
    assert "--save" in errors[0].evalue and "cannot write the spec" in errors[1].evalue
    assert "No closing quotation" in errors[2].evalue
    assert errors[3] is None  # --help: the usage, printed; no error
    assert "usage: %distrun jobs" in "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert errors[5] is None
    shown = "".join(o.get("text", "") for o in nb.cells[6].outputs)
    assert "GREETING: hello world" in shown  # the space travelled inside its quotes
    # An empty --save was ignored; --type pytorch in `dask start` ran a pytorch job.
    for error, said in zip(errors[6:], ("--save: give the file", "leave --type out"), strict=True):
        assert error is not None and said in error.evalue and len(error.traceback) == 1, error
