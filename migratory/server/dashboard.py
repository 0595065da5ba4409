"""The live dashboard on the monitoring listener: the static page (``/dashboard``, built
from clients/js/dashboard) and ``/dashboard/config.json``, which tells the page where to
subscribe and with which token.

The page subscribes with the JavaScript client to the meta-subjects (docs/monitoring.md)
on this server's own client port. It needs ``MonitorToken`` to do so, and gets it from
``config.json``: whoever may read the monitoring listener (which ``MonitorUser`` /
``MonitorPassword`` protect) may read the figures the token gives access to anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from migratory.protocol.http import response
from migratory.server.web_assets import DASHBOARD_ASSETS, serve_asset

__all__ = ["CONFIG_PATH", "DashboardConfig", "answer_dashboard"]

CONFIG_PATH = "/dashboard/config.json"
_ANY_HOST = ("", "0.0.0.0", "::")


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """What the page needs: the client listeners speaking the native protocol, as bound
    (host, port, encrypted), the monitoring token, the push interval, and the member name
    its stats are pushed under."""

    client_listeners: Sequence[tuple[str, int, bool]]
    token: str
    push_interval: int
    member: str

    def servers(self, page_host: str) -> list[str]:
        """WebSocket URLs of the client listeners (``wss`` when encrypted); a wildcard
        address is reached on the host the page itself was loaded from."""
        urls = []
        for host, port, encrypted in self.client_listeners:
            shown = page_host if host in _ANY_HOST else host
            if ":" in shown and not shown.startswith("["):
                shown = f"[{shown}]"
            urls.append(f"{'wss' if encrypted else 'ws'}://{shown}:{port}")
        return urls


def _page_host(host_header: str | None) -> str:
    """The host part of a ``Host`` header (``h``, ``h:p``, ``[v6]:p``); 127.0.0.1 if none."""
    if not host_header:
        return "127.0.0.1"
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def answer_dashboard(path: str, config: DashboardConfig, host_header: str | None) -> bytes | None:
    """The response to a dashboard path, or None for any other path."""
    if path == CONFIG_PATH:
        body = {
            "servers": config.servers(_page_host(host_header)),
            "token": config.token or None,
            "push_interval": config.push_interval,
            "member": config.member,
        }
        data = json.dumps(body, sort_keys=True).encode() + b"\n"
        return response(
            200, data, content_type="application/json", headers=(("Cache-Control", "no-store"),)
        )
    return serve_asset(DASHBOARD_ASSETS, path)
