"""The arrows point one way: the engine never imports a view, and views do not import each
other's modules (the form and the magic share a typed options model instead). Read from the
sources, every import (function-level ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "jupyter_dist"
VIEWS = ("jupyter_dist.magics", "jupyter_dist.cli", "jupyter_dist.widgets", "jupyter_dist.server")
ENGINE = (
    "jupyter_dist.spec", "jupyter_dist.validation", "jupyter_dist.errors", "jupyter_dist.nodes",
    "jupyter_dist.options", "jupyter_dist.plan", "jupyter_dist.run", "jupyter_dist.store",
    "jupyter_dist.describe", "jupyter_dist.backends", "jupyter_dist.node_side",
    "jupyter_dist.export", "jupyter_dist.masking",
)  # fmt: skip


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


def test_the_engine_never_imports_a_view():
    wrong = {
        (module, name)
        for module, names in MODULES.items()
        if _under(module, ENGINE)
        for name in names
        if _under(name, VIEWS)
    }
    assert wrong == set()


def test_widgets_do_not_import_the_magic_or_the_cli():
    wrong = {
        (module, name)
        for module, names in MODULES.items()
        if _under(module, ("jupyter_dist.widgets",))
        for name in names
        if _under(name, ("jupyter_dist.magics", "jupyter_dist.cli"))
    }
    assert wrong == set()
    assert len(MODULES) > 20  # the sources were found


def test_node_side_scripts_import_nothing_of_ours():
    """They run on nodes that may not have jupyter_dist: every one is in node_side.NAMES,
    and none imports jupyter_dist."""
    from jupyter_dist import node_side

    scripts = {p.name for p in (PACKAGE / "node_side").glob("*.py")} - {"__init__.py"}
    assert scripts == set(node_side.NAMES)
    assert {name: MODULES[f"jupyter_dist.node_side.{name[:-3]}"] for name in scripts} == {
        name: set() for name in scripts
    }
