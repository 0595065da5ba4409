"""TLS on the client listeners (ListenEncrypted): https, wss, SSE over TLS, mutual
TLS, minimum version, and the SDK and CLI with a CA file. Certificates by trustme."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
import trustme
from httpclient import HttpClient, SseClient
from prometheus_client.parser import text_string_to_metric_families
from tls_files import write_tls_files

from migratory.config import Config, ConfigError
from migratory.tls import server_context

SUBJECT = "/Stocks/NYSE/IBM"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> dict[str, str]:
    return write_tls_files(ca, tmp_path)


def start_tls(start_server: Any, files: dict[str, str], **settings: str) -> tuple[Any, int]:
    server = start_server(
        listeners=2, ListenEncrypted="127.0.0.1:0", TlsCertificate=files["TlsCertificate"],
        TlsKey=files["TlsKey"], **settings,
    )
    assert server.urls[1].startswith("wss://127.0.0.1:")
    return server, int(server.urls[1].rsplit(":", 1)[1])


def client_context(files: dict[str, str]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=files["ca"])


def test_https_publish_snapshot_and_sse_over_tls(
    start_server: Any, tls_files: dict[str, str]
) -> None:
    server, tls_port = start_tls(start_server, tls_files, BatchTime="0")
    tls = client_context(tls_files)
    stream = SseClient(tls_port, [SUBJECT], tls=tls)
    stream.events_until("subscribe")
    client = HttpClient(tls_port, tls=tls)
    for n in range(1, 4):
        status, body = client.publish(subject=SUBJECT, content=f"m{n}" * 3000, retained=True)
        assert status == 200 and body["seq"] == n
    response, data = client.request("GET", f"/snapshot?subject={SUBJECT}")
    assert response.status_code == 200 and data == b"m3" * 3000
    got = [stream.next_event() for _ in range(3)]
    assert [e["data"]["seq"] for e in got if e] == [1, 2, 3]
    plain = HttpClient(server.port)  # the plain listener serves the same hub
    response, data = plain.request("GET", f"/snapshot?subject={SUBJECT}")
    assert data == b"m3" * 3000
    # TLS writes are in the batch histogram too: one observation per socket write
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
        samples = {s.name: s.value for f in text_string_to_metric_families(reply.read().decode())
                   for s in f.samples if not s.labels or s.name.endswith("_count")}
    assert samples["migratory_write_batch_frames_count"] == samples[
        "migratory_socket_writes_total"]


def test_plain_bytes_on_the_tls_port_close_only_that_connection(
    start_server: Any, tls_files: dict[str, str]
) -> None:
    _server, tls_port = start_tls(start_server, tls_files)
    bystander = SseClient(tls_port, [SUBJECT], tls=client_context(tls_files))
    bystander.events_until("subscribe")
    raw = socket.create_connection(("127.0.0.1", tls_port), timeout=5)
    raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    while chunk := raw.recv(4096):  # at most a TLS alert, then the server closes
        received += chunk
    raw.close()
    assert b"HTTP/1.1" not in received and len(received) < 100
    HttpClient(tls_port, tls=client_context(tls_files)).publish(subject=SUBJECT, content="on")
    event = bystander.next_event()
    assert event and event["data"]["content"] == "on"
    _response, data = HttpClient(tls_port, tls=client_context(tls_files)).request("GET", "/healthz")
    assert data == b"ok\n"


def test_sdk_and_cli_take_a_ca_file(start_server: Any, tls_files: dict[str, str]) -> None:
    from migratory_client import connect

    _, tls_port = start_tls(start_server, tls_files)
    url = f"wss://localhost:{tls_port}"

    async def main() -> tuple[str, int]:
        with trio.fail_after(20):
            async with connect([url], ca_file=tls_files["ca"]) as client:
                result = await client.publish(SUBJECT, b"over wss", retained=True, timeout=10)
                return result.status.value, result.position.seq if result.position else -1

    assert trio.run(main) == ("PUBLISH_OK", 1)
    cli = [sys.executable, "-m", "cluster", "pub", SUBJECT, "via-cli", "--server", url,
           "--ca-file", tls_files["ca"]]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "PUBLISH_OK" in done.stdout, done.stderr
    untrusted = subprocess.run([*cli[:-2], "--timeout", "3"], capture_output=True, text=True,
                               timeout=60)
    assert untrusted.returncode != 0  # the system CAs do not know trustme's CA
    # one line saying why (before: "no server session within 3.0 s", and no reason)
    assert untrusted.stderr.endswith(
        "; last: cannot connect: TLS: the server's certificate is not trusted: unable to get "
        "local issuer certificate\n") and untrusted.stderr.count("\n") == 1, untrusted.stderr


def test_mutual_tls_needs_a_client_certificate(
    start_server: Any, tls_files: dict[str, str], ca: trustme.CA
) -> None:
    _, tls_port = start_tls(start_server, tls_files, TlsClientCa=tls_files["ca"])
    anonymous = client_context(tls_files)
    # TLS 1.3: the client's handshake ends before the server checks its certificate,
    # so the refusal shows as an alert or the connection closing before the response
    with pytest.raises((ssl.SSLError, ConnectionError, OSError, h11.RemoteProtocolError)):
        HttpClient(tls_port, tls=anonymous).request("GET", "/healthz")
    known = client_context(tls_files)
    ca.issue_cert("client@example").configure_cert(known)
    _response, data = HttpClient(tls_port, tls=known).request("GET", "/healthz")
    assert data == b"ok\n"


def test_minimum_version_refuses_older_clients(
    start_server: Any, tls_files: dict[str, str]
) -> None:
    _, tls_port = start_tls(start_server, tls_files, TlsMinimumVersion="1.3")
    old = client_context(tls_files)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionError, OSError, h11.RemoteProtocolError)):
        HttpClient(tls_port, tls=old).request("GET", "/healthz")
    response, _ = HttpClient(tls_port, tls=client_context(tls_files)).request("GET", "/healthz")
    assert response.status_code == 200


def test_tls_config_errors_name_the_key(tls_files: dict[str, str], tmp_path: Path) -> None:
    good = {"ListenEncrypted": "127.0.0.1:0", "TlsCertificate": tls_files["TlsCertificate"],
            "TlsKey": tls_files["TlsKey"]}
    assert Config.from_mapping(good).listen_encrypted == (("127.0.0.1", 0),)
    for changes, message in [
        ({"TlsKey": ""}, "TlsKey is required"),
        ({"TlsCertificate": str(tmp_path / "nope.pem")}, "TlsCertificate.*nope.pem"),
        ({"TlsKey": tls_files["ca"]}, "TlsKey.*: .* holds no PEM private key"),
        ({"TlsCiphers": "NOPE-CIPHER"}, "TlsCiphers.*: no usable cipher"),
        ({"TlsClientCa": str(tmp_path / "none.pem")}, "TlsClientCa.*none.pem"),
        ({"TlsMinimumVersion": "1.1"}, "TlsMinimumVersion: expected 1.2 or 1.3"),
        ({"ListenEncrypted": ""}, "TlsCertificate.* is set but ListenEncrypted is empty"),
        ({"ListenEncrypted": "127.0.0.1:8800"}, "in both Listen"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Config.from_mapping({**good, **changes})


def test_the_server_context_refuses_renegotiation(tls_files: dict[str, str]) -> None:
    """TLS 1.2 renegotiation asked by a client costs the server a handshake each time on
    one connection; OpenSSL 3 refuses it by default (openssl s_client's 'R' gets 'no
    renegotiation' and only that connection closes), 1.1.1 does not: the option says so
    whatever the OpenSSL."""
    config = Config.from_mapping({
        "ListenEncrypted": "127.0.0.1:0", "TlsCertificate": tls_files["TlsCertificate"],
        "TlsKey": tls_files["TlsKey"]})
    assert server_context(config).options & ssl.OP_NO_RENEGOTIATION


def test_a_close_notify_ends_a_stream_whose_client_keeps_the_tcp_connection(
    start_server: Any, tls_files: dict[str, str]
) -> None:
    """A TLS client's close_notify says it sends nothing more, as a TCP end does on a
    plain port: the server ends the connection (and the stream's subscription) instead
    of keeping it for as long as the client keeps the TCP connection open."""
    server, tls_port = start_tls(start_server, tls_files)
    stream = SseClient(tls_port, [SUBJECT], tls=client_context(tls_files))
    stream.events_until("subscribe")
    assert isinstance(stream.sock, ssl.SSLSocket)
    stream.sock.settimeout(5)
    with contextlib.suppress(OSError, ssl.SSLError):
        stream.sock.unwrap()  # close_notify; returns once the server closes its side
    deadline = time.monotonic() + 3
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/stats", timeout=5) as r:
            counters = json.loads(r.read())
        if counters["connections_open"] == 1 and counters["subscriptions"] == 0:
            break
        assert time.monotonic() < deadline, counters
        time.sleep(0.05)
    stream.close()
