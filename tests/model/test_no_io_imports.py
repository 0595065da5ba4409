"""The model and protocol layers are sans-I/O: they must not import I/O or thread modules."""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

FORBIDDEN = {"trio", "socket", "selectors", "asyncio", "threading", "trio_websocket"}
PACKAGES = ["migratory.model", "migratory.protocol"]


def source_files() -> list[Path]:
    files: list[Path] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        files.append(Path(package.__file__ or ""))
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None, info.name
            files.append(Path(spec.origin))
    return sorted(set(files))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in {"__import__", "import_module"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def test_walk_finds_the_model_modules() -> None:
    names = {path.stem for path in source_files()}
    assert {"subject", "message", "cache", "outbox"} <= names


@pytest.mark.parametrize("path", source_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_io_imports(path: Path) -> None:
    bad = {name for name in imported_modules(path) if name.split(".")[0] in FORBIDDEN}
    assert not bad, f"{path} imports {sorted(bad)}"
