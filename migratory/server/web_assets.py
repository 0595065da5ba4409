"""The browser files the server serves: the JavaScript client at ``/client/migratory.js``
(on the client port) and the dashboard at ``/dashboard`` (on the monitoring listener).

They are built from ``clients/js`` (esbuild) into ``static/`` beside this module by
``make serve`` and ``make test``, not committed; a server without them answers 404
saying how to build them. Files are read per request (a few tens of kB, rarely asked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from migratory.protocol.http import response

__all__ = ["CLIENT_ASSETS", "DASHBOARD_ASSETS", "STATIC_DIR", "Asset", "serve_asset"]

STATIC_DIR = Path(__file__).with_name("static")
JAVASCRIPT = "text/javascript; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Asset:
    """One built file: where it is under ``static/``, its type, and whether pages of any
    origin may import it (a module script is fetched with CORS)."""

    file: str
    content_type: str
    cross_origin: bool = False


CLIENT_ASSETS: Mapping[str, Asset] = {
    "/client/migratory.js": Asset("client/migratory.js", JAVASCRIPT, cross_origin=True),
}
_DASHBOARD_PAGE = Asset("dashboard/index.html", "text/html; charset=utf-8")
DASHBOARD_ASSETS: Mapping[str, Asset] = {
    "/dashboard": _DASHBOARD_PAGE,
    "/dashboard/": _DASHBOARD_PAGE,
    "/dashboard/dashboard.js": Asset("dashboard/dashboard.js", JAVASCRIPT),
    "/dashboard/dashboard.css": Asset("dashboard/dashboard.css", "text/css; charset=utf-8"),
}


def serve_asset(
    assets: Mapping[str, Asset], path: str, static_dir: Path = STATIC_DIR
) -> bytes | None:
    """The HTTP response for ``path`` if it names one of ``assets``, else None."""
    asset = assets.get(path)
    if asset is None:
        return None
    try:
        body = (static_dir / asset.file).read_bytes()
    except FileNotFoundError:
        reason = f"{path}: the browser files are not built here; `make js` builds them"
        return response(404, (reason + " (clients/js: node >= 20, npm, esbuild)\n").encode())
    headers = [("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff")]
    if asset.cross_origin:
        headers.append(("Access-Control-Allow-Origin", "*"))
    return response(200, body, content_type=asset.content_type, headers=headers)
