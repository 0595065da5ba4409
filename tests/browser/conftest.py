"""Browser tests: a real headless Chromium runs the JavaScript client (clients/js, built
by ``make test`` into migratory/server/static/) against real server processes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))

from browser import Browser, open_browser

from migratory.server.web_assets import CLIENT_ASSETS, STATIC_DIR


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    bundle = STATIC_DIR / CLIENT_ASSETS["/client/migratory.js"].file
    if not bundle.exists():
        raise RuntimeError(f"{bundle} is not built: run `make js` (or `make test`)")
    yield from open_browser(tmp_path)
