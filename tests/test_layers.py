"""Imports go one way: the cluster composes the server, never the reverse.

``migratory/`` (model, protocol, server) must not import ``cluster`` (nor the chaos
runner or the Spark checker): the cluster package builds a server with what it
needs (:mod:`cluster.node`), as hypercorn's trio adapter wraps its protocol objects.
Any import counts: at the top, inside a function, or through ``importlib``.

Nor do the project's modules import each other in a circle (any import counts there
too, one under ``if TYPE_CHECKING:`` as well): the circles broken stay broken, and the
few left in the server are listed, to shrink.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
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


# --- no import circles ------------------------------------------------------------------
# A module that imports one that imports it back (through any number of others) is a
# circle: neither can be read, tested or moved alone. The circles that were broken stay
# broken; the ones left are listed and may only shrink (STYLE.md: imports go one way).

PACKAGES = ("migratory", "cluster", "chaos", "spark_analysis")
PROJECT_MODULES = {
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
    for package in PACKAGES
    for path in sorted((ROOT / package).rglob("*.py"))
}

CIRCLES_LEFT = {
    # the MQTT session's parts (subscriptions, resume, expiry) are handed their session
    frozenset({
        "migratory.server.mqtt_delivery", "migratory.server.mqtt_expiry",
        "migratory.server.mqtt_input", "migratory.server.mqtt_publishing",
        "migratory.server.mqtt_resume", "migratory.server.mqtt_saving",
        "migratory.server.mqtt_session", "migratory.server.mqtt_subscriptions",
        "migratory.server.mqtt_takeover",
    }),
    # the connections and what accepts them are handed the Server that built them
    frozenset({
        "migratory.server.app", "migratory.server.client_accept", "migratory.server.connection",
        "migratory.server.connection_linger", "migratory.server.connection_writes",
        "migratory.server.mqtt_connection", "migratory.server.rebalance",
    }),
}

BROKEN: tuple[frozenset[str], ...] = (
    # RequestParser, built on HttpServer, lives in http_server (http: the pieces below it)
    frozenset({"migratory.protocol.http", "migratory.protocol.http_server"}),
    # what every entitlement shares is in entitlement_decisions, below all three
    frozenset({"migratory.entitlement", "migratory.entitlement_custom"}),
    frozenset({"migratory.entitlement", "migratory.entitlement_token"}),
    # cluster.monitoring names what it reads of a member; each member passes itself
    frozenset({"cluster.monitoring", "cluster.node"}),
    frozenset({"cluster.monitoring", "cluster.standard"}),
    # the runner hands the nemesis its scenarios (chaos.scenario_faults)
    frozenset({"chaos.combos", "chaos.nemesis"}),
    frozenset({"chaos.nemesis", "chaos.restarts"}),
    frozenset({"chaos.nemesis", "chaos.scenarios"}),
    # the keys' modules read ConfigFields; the config builds Config on it and composes them
    frozenset({"migratory.config", "migratory.config_cluster"}),
    frozenset({"migratory.config", "migratory.config_listeners"}),
    frozenset({"migratory.config", "migratory.tls"}),
    # ServerContext names what it holds by what is asked of it, the monitor its server; the
    # sessions' Link is in session_link
    frozenset({"migratory.server.app", "migratory.server.context"}),
    frozenset({"migratory.server.app", "migratory.server.monitor"}),
    frozenset({"migratory.server.mqtt_session", "migratory.server.session"}),
    frozenset({"migratory.server.app", "migratory.server.mqtt_session"}),
    # the HTTP front names what it asks of its session (HttpSession); the session passes itself
    frozenset({"migratory.server.http_front", "migratory.server.session"}),
)


def imported_modules(path: Path, module: str, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports: at the top, in a function, or
    under ``if TYPE_CHECKING:`` (a type-only import ties the two modules as much)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # from package import module
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(module)
    return found


def import_circles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected sets of two modules or more (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    circles.add(frozenset(members))
    return circles


@functools.cache
def project_circles() -> set[frozenset[str]]:
    graph = {
        module: imported_modules(path, module, PROJECT_MODULES)
        for module, path in PROJECT_MODULES.items()
    }
    return import_circles(graph)


def test_no_import_circle_but_those_left() -> None:
    circles = project_circles()
    new = [sorted(c) for c in circles if not any(c <= left for left in CIRCLES_LEFT)]
    assert not new, f"import circles (each module imports the next, the last the first): {new}"
    assert circles == CIRCLES_LEFT, (
        "a circle left shrank or is gone: list what remains in CIRCLES_LEFT "
        f"{sorted(sorted(c) for c in circles)}"
    )


def test_the_circle_check_sees_type_only_and_late_imports(tmp_path: Path) -> None:
    """A planted circle of each kind is found (the test can fail)."""
    for late in (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "def f():\n    from pkg import b\n",
        "import pkg.b\n",
    ):
        package = tmp_path / "pkg"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "a.py").write_text(late)
        (package / "b.py").write_text("from pkg.a import f\n")
        known = {
            "pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"
        }
        graph = {name: imported_modules(path, name, known) for name, path in known.items()}
        assert import_circles(graph) == {frozenset({"pkg.a", "pkg.b"})}, late


def test_the_circles_that_were_broken_stay_broken() -> None:
    """Each by name: the message says which came back."""
    circles = project_circles()
    for pair in BROKEN:
        assert not any(pair <= c for c in circles), f"{sorted(pair)} import each other again"
