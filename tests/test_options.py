"""Every launch option is declared once (jupyter_dist/options.py): the CLI, the magic and
the form are built from the declaration, say the same thing, and the docs' table is it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import ROOT

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
from jupyter_dist.spec import JOB_TYPES, MAX_NODES, MAX_PROCS_PER_NODE


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
    shared = [o for o in OPTIONS if MAGIC in o.fronts and {CLI_SPEC, CLI_RUN} & o.fronts]
    assert len(shared) >= 12
    for option in shared:
        expected = _flat(option.full_help)
        assert expected in _flat(cli_help), option.flag
        assert expected in _flat(magic_help), option.flag
    # and the magic offers every declared option it should, the CLI every one of its own
    for option in offered(MAGIC):
        assert option.flag in magic_help
    for option in offered(CLI_SPEC) + offered(CLI_RUN):
        assert option.flag in cli_help


def test_the_declaration_is_the_options_model():
    """Every field of LaunchOptions is a declared option and the other way round; numbers
    carry the spec's own caps."""
    from dataclasses import fields

    assert {f.name for f in fields(LaunchOptions)} == {o.name for o in OPTIONS} - {"nodes_file"}
    bounds = {o.name: o.bounds for o in OPTIONS}
    assert bounds["nodes"] == (1, MAX_NODES)
    assert bounds["procs_per_node"] == (1, MAX_PROCS_PER_NODE)
    assert all(o.bounds for o in OPTIONS if o.kind == "int")
    assert len({o.flag for o in OPTIONS}) == len(OPTIONS)


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

    with pytest.raises(SpecError, match=re.escape(error)):
        LaunchOptions(**options).to_spec("print(1)", base_dir=ROOT)


def test_a_backends_option_alone_picks_its_backend():
    assert LaunchOptions(slurm_job="12").backend_section() == {"type": "slurm", "job": "12"}
    assert LaunchOptions(partition="gpu").backend_section() == {"type": "slurm", "partition": "gpu"}
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
    assert {o.name for o in offered(FORM)} == {o.name for o in OPTIONS} - {"nodes_file"}
    form.backend.value = "slurm"
    for job_type in JOB_TYPES:
        form.type.value = job_type
        for option in offered(FORM):
            control = form.controls[option.name]
            assert control.tooltip == option.full_help
            applies = not option.job_types or job_type in option.job_types
            visible = _shown(control, form) and not getattr(control, "disabled", False)
            assert visible == applies, (job_type, option.flag)
    form.type.value = "dask"
    form.controls["threads"].value = 3
    form.controls["partition"].value = " gpu "
    form.controls["on_stall"].value = "kill"
    form.controls["worker_count"].value = 2  # hidden for dask: it does not count
    chosen = form.options()
    assert (chosen.threads, chosen.partition, chosen.on_stall) == (3, "gpu", "kill")
    assert chosen.worker_count is None and chosen.stall_timeout is None
    form.backend.value = ""  # the slurm box hides: its values no longer count
    assert form.options().partition is None


def test_the_docs_table_is_the_declaration():
    """docs/options.md holds the table the declaration makes (scripts/docs.sh writes it),
    and the README points to it."""
    page = (ROOT / "docs" / "options.md").read_text()
    assert markdown_table() in page
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
