"""The arrows point one way: the engine never imports a view, and views do not import each
other's modules (the form and the magic share a typed options model instead). Read from the
sources, every import (function-level ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "jupyter_dist"

# Every module's layer, lowest first: a module may import its own layer and those below,
# never one above. The engine is everything below "views"; views import the engine and the
# shared words of "presentation", never each other.
LAYERS = {
    "base": ("jupyter_dist.errors", "jupyter_dist.validation", "jupyter_dist.masking",
             "jupyter_dist.node_side", "jupyter_dist.code_folder", "jupyter_dist.env_names",
             "jupyter_dist.command_words", "jupyter_dist.cell_syntax",
             "jupyter_dist.rank_sets", "jupyter_dist.terminal_text"),
    "model": ("jupyter_dist.spec", "jupyter_dist.spec_dialect", "jupyter_dist.nodes",
              "jupyter_dist.options"),
    "plan": ("jupyter_dist.plan",),
    "record": ("jupyter_dist.store", "jupyter_dist.events"),
    "diagnose": ("jupyter_dist.diagnose",),
    "backends": ("jupyter_dist.backends",),
    "run": ("jupyter_dist.run",),
    "export": ("jupyter_dist.export",),
    "presentation": ("jupyter_dist.describe", "jupyter_dist.dask_cluster",
                     "jupyter_dist.job_commands", "jupyter_dist.debug_console"),
    "views": ("jupyter_dist.magics", "jupyter_dist.cli", "jupyter_dist.widgets",
              "jupyter_dist.server"),
}  # fmt: skip
ORDER = list(LAYERS)
VIEWS = LAYERS["views"]
# The package's own __init__ is the entry point Jupyter loads (%load_ext, the server
# extension): it names the magic's loader, above every layer.
ENTRY = "jupyter_dist"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("jupyter_dist")}


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = {_module(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str:
    found = [
        (len(prefix), name)
        for name, prefixes in LAYERS.items()
        for prefix in prefixes
        if _under(module, (prefix,))
    ]
    assert found, f"{module} is in no layer: add it to LAYERS"
    return max(found)[1]


def _ours(name: str) -> str | None:
    """The module an imported name refers to (`jupyter_dist.plan.model.ProcessPlan` is
    jupyter_dist.plan.model), or None for a name of no module of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges() -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, names in MODULES.items()
        if module != ENTRY
        for target in filter(None, map(_ours, names))
        if target != module and target != ENTRY
    }


def test_every_module_has_a_layer():
    assert len(MODULES) > 40  # the sources were found
    assert {module: _layer(module) for module in MODULES if module != ENTRY}


def test_no_import_runs_back_up_a_layer():
    upward = {
        (module, target)
        for module, target in _edges()
        if ORDER.index(_layer(target)) > ORDER.index(_layer(module))
    }
    assert upward == set()


# The one view that draws with another's pieces: the magic displays the widgets.
VIEW_USES = {("jupyter_dist.magics", "jupyter_dist.widgets")}


def test_views_do_not_import_each_other():
    """The magic, the CLI, the widgets and the server share the engine and the
    presentation layer, never one another's modules (the magic shows the widgets)."""

    def view(module: str) -> str:
        return next(v for v in VIEWS if _under(module, (v,)))

    crossing = {
        (module, target)
        for module, target in _edges()
        if _layer(module) == _layer(target) == "views"
        and view(module) != view(target)
        and (view(module), view(target)) not in VIEW_USES
    }
    assert crossing == set()


def test_no_import_circle():
    """Between modules, function-level imports included: a circle means two modules that
    are one, or a piece that belongs lower."""
    graph: dict[str, set[str]] = {}
    for module, target in _edges():
        graph.setdefault(module, set()).add(target)
    circles, done, path = [], set(), []

    def visit(module: str) -> None:
        if module in path:
            circles.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert circles == []


def test_node_side_scripts_import_nothing_of_ours():
    """They run on nodes that may not have jupyter_dist: every one is in node_side.NAMES,
    and none imports jupyter_dist."""
    from jupyter_dist import node_side

    scripts = {p.name for p in (PACKAGE / "node_side").glob("*.py")} - {"__init__.py"}
    assert scripts == set(node_side.NAMES)
    assert {name: MODULES[f"jupyter_dist.node_side.{name[:-3]}"] for name in scripts} == {
        name: set() for name in scripts
    }


# What the repository's root holds; anything else there is a stray (a shell's redirect, a
# tool's output) committed by accident.
ROOT_ENTRIES = {
    ".ci", ".gitignore", "LICENSE", "README.md", "bench", "docs", "examples", "install.json",
    "jupyter-config", "jupyter_dist", "labextension", "mkdocs.yml", "package-lock.json",
    "package.json",
    "pyproject.toml", "scripts", "style", "tests", "tsconfig.json", "tsconfig.test.json",
}  # fmt: skip


def test_the_repository_root_holds_only_what_it_should():
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    entries = {path.split("/", 1)[0] for path in tracked.split("\0") if path}
    assert entries - ROOT_ENTRIES == set(), "unexpected files at the repository root"
    assert "jupyter_dist" in entries  # git answered for this checkout


def test_the_quick_loop_leaves_out_what_conftest_says():
    """scripts/test.sh --quick selects with the expression the quick loop's report knows."""
    from conftest import QUICK_EXPRESSION

    assert f'-m "{QUICK_EXPRESSION}"' in (ROOT / "scripts" / "test.sh").read_text()


def test_the_job_reaches_the_debugger_through_its_relay_alone():
    """run/job.py is the job's state machine: the debugger's owner side is run/debug_relay.py,
    which the job holds; the job imports none of the debugger's modules itself."""
    debugger_modules = ("jupyter_dist.diagnose.debug", "jupyter_dist.node_side.debugger",
                        "jupyter_dist.debug_console")  # fmt: skip
    from_job = {target for module, target in _edges() if module == "jupyter_dist.run.job"}
    assert {target for target in from_job if _under(target, debugger_modules)} == set()
    assert "jupyter_dist.run.debug_relay" in from_job


def _body(function) -> str:
    """A function's code as a tree, its docstring left out (copies say whose copy they are)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    first = tree.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        tree.body = tree.body[1:]
    tree.name = "_"
    return ast.dump(tree)


def test_each_copy_of_what_the_stand_alone_node_files_share_agrees_with_its_source():
    """The node side's files are shipped alone (standard library only; the pool's programs
    import only their protocol, by its shipped name), so what they share is copied: the
    machine tag and the signals of the stack hook, the names things are shipped under
    (node_side.SHIPPED). One source each; every copy is held to it here."""
    from helpers import pool_programs

    from jupyter_dist import node_side
    from jupyter_dist.node_side import agent, debugger, stack_hook, stacks

    pool_protocol, _, pool_front, _ = pool_programs()

    for copy in (debugger.machine_tag, stacks.machine_tag, agent.machine_tag):
        assert _body(copy) == _body(stack_hook.machine_tag), copy.__module__
    assert debugger.PAUSE_SIGNAL == stack_hook.PAUSE_SIGNAL != stack_hook.STACK_SIGNAL
    assert {stack_hook.STACK_SIGNAL, stack_hook.PAUSE_SIGNAL} <= set(pool_front.IGNORED)
    shipped = node_side.SHIPPED
    assert agent.HOOK_FOLDER == node_side.HOOK_FOLDER
    names = (shipped["stack_hook.py"], shipped["debugger.py"], shipped["pool_agent.py"])
    assert names == (agent.STACK_HOOK_NAME, agent.DEBUGGER_NAME, agent.POOL_NAME)
    assert {name: shipped[name] for name in node_side.POOL_FILES} == pool_protocol.SHIPPED
    assert "/" + node_side.shipped_path("pool_server.py") == stacks.POOL_FILE
    assert debugger.OUR_MODULES[-1] + ".py" == shipped["pool_server.py"]
    assert agent.TOKEN_VAR == pool_front.TOKEN_VAR
    assert set(shipped) <= set(node_side.NAMES)
