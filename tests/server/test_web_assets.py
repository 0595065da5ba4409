"""The browser files: /client/migratory.js on the client port (importable from any
origin), a clear 404 when they are not built, nothing else answered from static/."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from migratory.server.web_assets import (
    CLIENT_ASSETS,
    DASHBOARD_ASSETS,
    STATIC_DIR,
    serve_asset,
)


def split(response: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_a_built_client_is_served_with_cors_and_javascript_type(tmp_path: Path) -> None:
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "migratory.js").write_bytes(b"export const x = 1;\n")
    answer = serve_asset(CLIENT_ASSETS, "/client/migratory.js", tmp_path)
    assert answer is not None
    status, headers, body = split(answer)
    assert status == "HTTP/1.1 200 OK"
    assert body == b"export const x = 1;\n"
    assert headers["content-type"] == "text/javascript; charset=utf-8"
    assert headers["access-control-allow-origin"] == "*"
    assert headers["cache-control"] == "no-cache"


def test_the_dashboard_is_not_importable_cross_origin(tmp_path: Path) -> None:
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "dashboard" / "index.html").write_text("<!doctype html>")
    for path in ("/dashboard", "/dashboard/"):
        answer = serve_asset(DASHBOARD_ASSETS, path, tmp_path)
        assert answer is not None
        status, headers, _ = split(answer)
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"] == "text/html; charset=utf-8"
        assert "access-control-allow-origin" not in headers


def test_unbuilt_files_answer_404_saying_how_to_build(tmp_path: Path) -> None:
    answer = serve_asset(CLIENT_ASSETS, "/client/migratory.js", tmp_path)
    assert answer is not None
    status, _, body = split(answer)
    assert status == "HTTP/1.1 404 Not Found"
    assert b"`make js` builds them" in body


@pytest.mark.parametrize(
    "path", ["/client/", "/client/../pyproject.toml", "/client/migratory.js.map", "/dashboard"]
)
def test_only_the_listed_files_are_client_assets(path: str) -> None:
    assert serve_asset(CLIENT_ASSETS, path) is None


def test_the_server_serves_the_built_client(start_server: Any) -> None:
    built = STATIC_DIR / CLIENT_ASSETS["/client/migratory.js"].file
    if not built.exists():
        raise RuntimeError(f"{built} is not built: run `make js` (make test does)")
    server = start_server()
    url = f"http://127.0.0.1:{server.port}/client/migratory.js"
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert reply.read() == built.read_bytes()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/client/other.js", timeout=5)
    assert missing.value.code == 404
