"""/dashboard/config.json: where the dashboard page subscribes, and with which token."""

from __future__ import annotations

import json
from typing import Any

from test_http_api import free_port
from test_monitor_listener import get, monitoring_url

from migratory.server.dashboard import CONFIG_PATH, DashboardConfig, answer_dashboard


def config_json(config: DashboardConfig, host: str | None) -> dict[str, object]:
    answer = answer_dashboard(CONFIG_PATH, config, host)
    assert answer is not None
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Type: application/json" in head
    assert b"Cache-Control: no-store" in head
    result: dict[str, object] = json.loads(body)
    return result


def test_the_page_gets_the_bound_client_addresses_token_and_member() -> None:
    config = DashboardConfig(
        client_listeners=[("127.0.0.1", 28800, False), ("10.0.0.5", 28801, True)],
        token="dash",
        push_interval=1,
        member="127.0.0.1:29800",
    )
    assert config_json(config, "127.0.0.1:9100") == {
        "servers": ["ws://127.0.0.1:28800", "wss://10.0.0.5:28801"],
        "token": "dash",
        "push_interval": 1,
        "member": "127.0.0.1:29800",
    }


def test_a_wildcard_listener_is_reached_on_the_page_host() -> None:
    config = DashboardConfig([("0.0.0.0", 8800, False), ("::", 8801, False)], "", 5, "m")
    got = config_json(config, "monitor.example:9100")
    assert got["servers"] == ["ws://monitor.example:8800", "ws://monitor.example:8801"]
    assert got["token"] is None
    assert config_json(config, "[::1]:9100")["servers"] == ["ws://[::1]:8800", "ws://[::1]:8801"]
    assert config_json(config, None)["servers"] == ["ws://127.0.0.1:8800", "ws://127.0.0.1:8801"]


def test_other_paths_are_not_the_dashboard_s() -> None:
    config = DashboardConfig([("127.0.0.1", 1, False)], "", 5, "m")
    assert answer_dashboard("/metrics", config, None) is None
    assert answer_dashboard("/dashboard/other.js", config, None) is None
    page = answer_dashboard("/dashboard", config, None)  # built by make test
    assert page is not None and page.startswith(b"HTTP/1.1 200 OK")
    assert b'src="/dashboard/dashboard.js"' in page


def test_the_monitoring_listener_serves_the_dashboard_behind_its_basic_auth(
    start_server: Any,
) -> None:
    server = start_server(
        MonitorListen="127.0.0.1:0", MonitorUser="ops", MonitorPassword="pw",
        MonitorToken="dash", MonitorPushInterval="2", ServerName="solo",
    )
    base = monitoring_url(server)
    for path in ("/dashboard", CONFIG_PATH, "/dashboard/dashboard.js"):
        assert get(f"{base}{path}")[0] == 401, path
    status, headers, page = get(f"{base}/dashboard", ("ops", "pw"))
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'src="/dashboard/dashboard.js"' in page
    status, headers, script = get(f"{base}/dashboard/dashboard.js", ("ops", "pw"))
    assert status == 200 and headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert len(script) > 10_000  # the client, uPlot and the page's code, bundled
    status, _, body = get(f"{base}{CONFIG_PATH}", ("ops", "pw"))
    assert status == 200
    assert json.loads(body) == {
        "servers": [server.url], "token": "dash", "push_interval": 2, "member": "solo",
    }
    client = server.url.replace("ws://", "http://")
    assert get(f"{client}/dashboard")[0] == 404  # only on the monitoring listener


def test_the_page_is_sent_to_the_listeners_that_speak_the_native_protocol(
    start_server: Any,
) -> None:
    native, http_only = free_port(), free_port()
    server = start_server(
        listeners=2,
        Listen=f"127.0.0.1:{native}, 127.0.0.1:{http_only}",
        ListenerRoles=f"127.0.0.1:{http_only} publish http",
        MonitorListen="127.0.0.1:0", MonitorToken="dash",
    )
    status, _, body = get(f"{monitoring_url(server)}{CONFIG_PATH}")
    assert status == 200
    assert json.loads(body)["servers"] == [f"ws://127.0.0.1:{native}"]
