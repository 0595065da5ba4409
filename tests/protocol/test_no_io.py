"""Every module under migratory/protocol/ is sans-I/O: no trio, sockets or ssl."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOL = Path(__file__).resolve().parents[2] / "migratory" / "protocol"
IO_MODULES = {"trio", "socket", "asyncio", "selectors", "ssl", "trio_websocket"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(PROTOCOL.glob("*.py")), ids=lambda p: p.name)
def test_protocol_module_does_no_io(path: Path) -> None:
    assert not imported(path) & IO_MODULES


def test_the_check_catches_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import h11\nfrom trio import lowlevel\n")
    assert imported(planted) & IO_MODULES == {"trio"}


def test_the_new_protocol_modules_are_covered() -> None:
    names = {p.name for p in PROTOCOL.glob("*.py")}
    assert {"http_server.py", "http_api.py", "sse.py"} <= names
