"""Imports go one way: the cluster composes the server, never the reverse.

``migratory/`` (model, protocol, server) must not import ``cluster`` (nor the chaos
runner or the Spark checker): the cluster package builds a server with what it
needs (:mod:`cluster.node`), as hypercorn's trio adapter wraps its protocol objects.
Any import counts: at the top, inside a function, or through ``importlib``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HIGHER = {"cluster", "chaos", "spark_analysis", "benchmarks"}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = getattr(func, "id", getattr(func, "attr", None))
            if name in {"__import__", "import_module", "run_module"}:
                names.add(str(node.args[0].value).split(".")[0])
    return names


SERVER_FILES = sorted((ROOT / "migratory").rglob("*.py"))


@pytest.mark.parametrize("path", SERVER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_under_migratory_imports_a_higher_layer(path: Path) -> None:
    assert not imported_top_levels(path) & HIGHER


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    """A planted import of each kind is caught (the test can fail)."""
    for line in (
        "import cluster.node",
        "from cluster.node import build_node",
        "def f():\n    from cluster import seed",
        "import importlib\nimportlib.import_module('cluster.node')",
    ):
        planted = tmp_path / "planted.py"
        planted.write_text(line + "\n")
        assert "cluster" in imported_top_levels(planted), line


def test_there_are_server_files_to_check() -> None:
    names = {p.name for p in SERVER_FILES}
    assert {"app.py", "hub.py", "config.py", "session.py"} <= names
