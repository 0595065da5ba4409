"""The monitoring listener: its own port, basic authentication, and the client port no
longer answering the monitoring paths; /stats carries the statistics windows."""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from migratory.config import Config, ConfigError
from migratory.protocol.http import Request
from migratory.server.monitor_listener import MAX_CONNECTIONS, basic_auth_ok


def monitoring_url(server: Any) -> str:
    line = server.proc.stdout.readline().decode()
    assert line.startswith(("monitoring http://", "monitoring https://")), line
    return line.split(" ", 1)[1].strip()


def get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_monitoring_port_with_basic_auth(start_server: Any) -> None:
    server = start_server(MonitorListen="127.0.0.1:0", MonitorUser="ops",
                          MonitorPassword="pa:ss word")
    base = monitoring_url(server)
    status, headers, _ = get(f"{base}/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert get(f"{base}/metrics", ("ops", "wrong"))[0] == 401
    assert get(f"{base}/metrics", ("other", "pa:ss word"))[0] == 401
    status, _, body = get(f"{base}/metrics", ("ops", "pa:ss word"))
    assert status == 200
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"migratory_connections_open", "migratory_deliveries"} <= names
    assert get(f"{base}/healthz", ("ops", "pa:ss word"))[0] == 200
    # a liveness probe has no password to send (deploy/k8s probes this port): "ok" only
    assert get(f"{base}/healthz")[0] == 200
    assert get(f"{base}/readyz")[0] == 401  # its reason names members: behind the password
    assert get(f"{base}/readyz", ("ops", "pa:ss word"))[0] == 200
    assert get(f"{base}/cluster", ("ops", "pa:ss word"))[0] == 404  # not a cluster member
    # the client port keeps /healthz but no longer answers the monitoring paths
    client = server.url.replace("ws://", "http://")
    assert get(f"{client}/healthz")[0] == 200
    for path in ("/metrics", "/stats", "/cluster"):
        status, _, body = get(f"{client}{path}")
        assert status == 404 and b"monitoring listener" in body


def test_stats_carry_the_statistics_windows(start_server: Any) -> None:
    server = start_server(MonitorListen="127.0.0.1:0")
    base = monitoring_url(server)
    status, _, body = get(f"{base}/stats")
    assert status == 200
    stats = json.loads(body)
    assert stats["connections_accepted"] >= 0
    windows = stats["windows"]["indicators"]
    assert set(windows["bytes_out_per_second"]) == {"1m", "5m", "15m", "1h", "1d"}
    assert set(windows["clients"]["1m"]) == {"samples", "max", "avg", "stddev"}


def test_basic_auth_header_parsing() -> None:
    def request(value: str | None) -> Request:
        headers = () if value is None else (("authorization", value),)
        return Request("GET", "/metrics", "/metrics", {}, headers)

    good = base64.b64encode(b"u:p:q").decode()
    assert basic_auth_ok(request(f"Basic {good}"), "u", "p:q")
    assert basic_auth_ok(request(f"basic {good}"), "u", "p:q")
    assert not basic_auth_ok(request(None), "u", "p:q")
    assert not basic_auth_ok(request(f"Bearer {good}"), "u", "p:q")
    assert not basic_auth_ok(request("Basic not-base64!"), "u", "p:q")
    assert not basic_auth_ok(request(f"Basic {good}"), "u", "p")


@pytest.mark.parametrize("settings, message", [
    ({"MonitorUser": "a"}, "MonitorPassword is required"),
    ({"MonitorUser": "a", "MonitorPassword": "b"}, "MonitorListen is empty"),
    ({"MonitorListen": "127.0.0.1:8800"}, "also a client listener"),
    ({"AuditAccess": "true"}, "AuditLogFile is required"),
    ({"AuditLogFile": "/tmp/x"}, "no audit category"),
    ({"MonitorPushInterval": "0"}, "MonitorPushInterval"),
    ({"LogFormat": "xml"}, "LogFormat"),
    ({"MonitorEncrypted": "true"}, "MonitorEncrypted.* is set: TlsCertificate is required"),
    ({"MonitorListen": "127.0.0.1:0", "MonitorEncrypted": "true"}, "TlsCertificate is required"),
    ({"MonitorTokens": "x"}, "did you mean 'MonitorToken'"),
])
def test_monitoring_keys_are_checked(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_mapping(settings)


def test_monitoring_keys_parse() -> None:
    config = Config.from_mapping({
        "MonitorListen": "0.0.0.0:8900", "MonitorUser": "u", "MonitorPassword": "p",
        "MonitorToken": "t", "MonitorPushInterval": "10", "LogFormat": "json",
        "AuditLogFile": "/var/log/audit.jsonl", "AuditMessage": "true",
    })
    assert config.monitor_listen == ("0.0.0.0", 8900)
    assert config.monitor_push_interval == 10
    assert config.audit_message and not config.audit_access
    assert Config.from_mapping(config.as_text()) == config


def test_the_monitoring_listener_speaks_tls_with_monitor_encrypted(
    start_server: Any, tmp_path: Any
) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    key_file, cert_file, ca_file = tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with pytest.raises(ConfigError, match=r"MonitorEncrypted.* is on but MonitorListen is empty"):
        Config.from_mapping({"MonitorEncrypted": "true", "TlsCertificate": str(cert_file),
                             "TlsKey": str(key_file)})
    server = start_server(MonitorListen="127.0.0.1:0", MonitorEncrypted="true",
                          TlsCertificate=str(cert_file), TlsKey=str(key_file),
                          MonitorUser="ops", MonitorPassword="pw")
    base = monitoring_url(server)
    assert base.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=str(ca_file))
    request = urllib.request.Request(f"{base}/metrics")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"ops:pw").decode())
    with urllib.request.urlopen(request, timeout=5, context=trusted) as reply:
        names = {f.name for f in text_string_to_metric_families(reply.read().decode())}
    assert "migratory_ready" in names
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: no answer
        urllib.request.urlopen(f"{base.replace('https', 'http')}/metrics", timeout=5)
    with pytest.raises(urllib.error.URLError):  # a client that does not trust the CA
        urllib.request.urlopen(f"{base}/metrics", timeout=5,
                               context=ssl.create_default_context())
    # the server is still up and serving after the failed handshakes
    with urllib.request.urlopen(request, timeout=5, context=trusted) as reply:
        assert reply.status == 200


def test_idle_monitoring_connections_are_capped(start_server: Any) -> None:
    """Connections to the monitoring port are not client connections (MaxConnections):
    beyond MAX_CONNECTIONS held at once, one more is answered 503 and closed, so idle
    ones cannot take the descriptors kept for Raft and the cluster links; once they
    leave, the port answers again."""
    server = start_server(MonitorListen="127.0.0.1:0")
    host, port = monitoring_url(server).removeprefix("http://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.2)
    extra = socket.create_connection((host, int(port)), timeout=5)
    answer = extra.recv(4096)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"too many monitoring" in answer
    assert extra.recv(4096) == b""  # and closed
    extra.close()
    for sock in idle:
        sock.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert get(f"http://{host}:{port}/healthz")[0] == 200
            break
        except (OSError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.05)
