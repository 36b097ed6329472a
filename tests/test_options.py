"""Every launch option is declared once (jupyter_dist/options.py): the CLI, the magic and
the form are built from the declaration, say the same thing, and the docs' table is it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT

from jupyter_dist.backends import backend_class, declared_options
from jupyter_dist.options import (
    CLI_RUN,
    CLI_SPEC,
    FORM,
    MAGIC,
    OPTIONS,
    LaunchOptions,
    markdown_table,
    offered,
)
from jupyter_dist.spec import JOB_TYPES, MAX_NODES, MAX_PROCS_PER_NODE, SALLOC_KEYS

DECLARED = declared_options()
SLURM = {option.name: option for option in backend_class("slurm").options}
RAY = {option.name: option for option in backend_class("ray").options}


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _help_of(help_text: str, flag: str) -> str:
    """The help argparse printed for `flag`: the words after its flag (and metavar) up to
    the next option, whitespace folded."""
    flat = _flat(help_text)
    found = re.search(re.escape(flag) + r"(?: [A-Z=,|{}a-z.]+)? (.*?)(?= -{1,2}[a-z]|$)", flat)
    assert found, f"{flag} is not in the help"
    return found.group(1).strip()


def test_the_cli_and_the_magic_say_the_same_of_every_option():
    """`jupyter distrun run --help` and `%%distrun?` (the magic's docstring) print each
    option they share with the declared help, word for word."""
    from jupyter_dist.magics import DistrunMagics

    cli_help = subprocess.run(
        [sys.executable, "-m", "jupyter_dist.cli", "run", "--help"],
        capture_output=True, text=True, check=True, env={"COLUMNS": "100", "PATH": ""},
    ).stdout  # fmt: skip
    magic_help = DistrunMagics.distrun.__doc__
    shared = [o for o in DECLARED if MAGIC in o.fronts and {CLI_SPEC, CLI_RUN} & o.fronts]
    assert len(shared) >= 12 and "--partition" in {o.flag for o in shared}
    for option in shared:
        expected = _flat(option.full_help)
        assert expected in _flat(cli_help), option.flag
        assert expected in _flat(magic_help), option.flag
    # and the magic offers every declared option it should, the CLI every one of its own
    for option in offered(MAGIC, DECLARED):
        assert option.flag in magic_help
    for option in offered(CLI_SPEC, DECLARED) + offered(CLI_RUN, DECLARED):
        assert option.flag in cli_help


def test_the_declaration_is_the_options_model():
    """Every field of LaunchOptions is an option every job has, and the other way round;
    a backend's own options are its class's, each a key of the spec's backend section;
    numbers carry the spec's own caps; no flag is declared twice."""
    from dataclasses import fields

    generic = {o.name for o in OPTIONS} - {"nodes_file"} | {"backend_options"}
    assert {f.name for f in fields(LaunchOptions)} == generic
    assert not any(o.backend for o in OPTIONS)
    assert {o.spec_key or o.name for o in SLURM.values()} == {"job", *SALLOC_KEYS}
    ray_keys = {"address", "gpus_per_node", "cpus_per_node", "autoscaling"}
    assert {o.spec_key or o.name for o in RAY.values()} == ray_keys
    assert [o for o in DECLARED if o.backend] == [*SLURM.values(), *RAY.values()]
    bounds = {o.name: o.bounds for o in DECLARED}
    assert bounds["nodes"] == (1, MAX_NODES)
    assert bounds["procs_per_node"] == (1, MAX_PROCS_PER_NODE)
    assert all(o.bounds for o in DECLARED if o.kind == "int")
    assert len({o.flag for o in DECLARED}) == len(DECLARED)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"type": "pytorch", "worker_count": 2}, "--worker-count applies to tensorflow jobs only"),
        ({"type": "mpi", "threads": 2}, "--threads applies to dask jobs only (this is mpi)"),
        ({"type": "dask", "launcher": "torchrun"}, "--launcher applies to pytorch and mpi jobs"),
        ({"backend": "ssh", "qos": "high"}, "--qos applies to the slurm backend only"),
    ],
)
def test_to_spec_checks_what_the_declaration_says(options, error):
    from jupyter_dist.errors import SpecError

    own = {SLURM[name]: options.pop(name) for name in list(options) if name in SLURM}
    with pytest.raises(SpecError, match=re.escape(error)):
        LaunchOptions(**options, backend_options=own).to_spec("print(1)", base_dir=ROOT)


def test_a_backends_option_alone_picks_its_backend():
    """--slurm-job is the spec's `job`; a Slurm option without --backend means slurm."""
    job = LaunchOptions(backend_options={SLURM["slurm_job"]: "12"})
    assert job.backend_section() == {"type": "slurm", "job": "12"}
    asked = LaunchOptions(backend_options={SLURM["partition"]: "gpu"})
    assert asked.backend_section() == {"type": "slurm", "partition": "gpu"}
    assert LaunchOptions().backend_section() == {}


def _shown(widget, root) -> bool:
    """Whether `widget` is in `root`'s tree with no hidden box above it."""

    def walk(node, path):
        if node is widget:
            return all(getattr(n.layout, "display", None) != "none" for n in [*path, node])
        return any(walk(child, [*path, node]) for child in getattr(node, "children", ()))

    return walk(root, [])


def test_the_form_offers_every_option_that_applies():
    """For each job type and the slurm backend: every declared option that applies has a
    visible control with the declared help as its tooltip, and what the controls hold
    becomes the options (and the options only those that apply)."""
    pytest.importorskip("ipywidgets")
    from jupyter_dist.widgets.form import SubmitForm

    form = SubmitForm()
    assert {o.name for o in offered(FORM, DECLARED)} == {o.name for o in DECLARED} - {"nodes_file"}
    form.backend.value = "slurm"
    for job_type in JOB_TYPES:
        form.type.value = job_type
        for option in offered(FORM, DECLARED):
            control = form.controls[option.name]
            assert control.tooltip == option.full_help
            applies = (not option.job_types or job_type in option.job_types) and (
                option.backend in (None, "slurm")
            )
            visible = _shown(control, form) and not getattr(control, "disabled", False)
            assert visible == applies, (job_type, option.flag)
    form.type.value = "dask"
    form.controls["threads"].value = 3
    form.controls["partition"].value = " gpu "
    form.controls["on_stall"].value = "kill"
    form.controls["worker_count"].value = 2  # hidden for dask: it does not count
    chosen = form.options()
    assert (chosen.threads, chosen.on_stall) == (3, "kill")
    assert chosen.backend_options == {SLURM["partition"]: "gpu"}
    assert chosen.worker_count is None and chosen.stall_timeout is None
    form.backend.value = ""  # the slurm box hides: its values no longer count
    assert form.options().backend_options == {}
    assert not _shown(form.controls["partition"], form)
    form.backend.value = "ray"  # a backend's box is its own options
    assert _shown(form.controls["ray_address"], form)
    assert not _shown(form.controls["partition"], form)
    form.controls["ray_address"].value = "ray://head:10001"
    assert form.options().backend_options == {RAY["ray_address"]: "ray://head:10001"}
    form.controls["ray_autoscaling"].value = True  # a flag: ticked, it is given
    assert form.options().backend_section() == {
        "type": "ray",
        "address": "ray://head:10001",
        "autoscaling": True,
    }


def test_the_docs_table_is_the_declaration():
    """docs/options.md holds the table the declaration makes (scripts/docs.sh writes it),
    and the README points to it."""
    page = (ROOT / "docs" / "options.md").read_text()
    assert markdown_table(DECLARED) in page
    assert "](docs/options.md)" in (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_its_links_lead_somewhere():
    """A newcomer's page: at most about 200 lines, every relative link to a file that is
    there (the docs site checks its own links and anchors when it builds)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 15
    assert [link for link in local if not (ROOT / link).exists()] == []
