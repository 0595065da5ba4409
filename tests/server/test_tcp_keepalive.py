"""TCP keepalive on client sockets (ClientTcpKeepAlive, migratory/server/tcp_keepalive.py):
every accepted client socket -- a WebSocket, an HTTP/SSE request, TLS, MQTT, MQTT over
TLS -- has SO_KEEPALIVE with the configured idle, interval and probe count, and
TCP_USER_TIMEOUT bounding data left unacknowledged (keepalive never probes a connection
with data in flight), read back with getsockopt on the server's own socket. Before:
none had it, so a client whose path died without a FIN or RST (an MQTT client with
keep-alive 0, an idle subscriber, an SSE stream) held its connection and its outbox
until something was written to it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
import trustme
from tls_files import write_tls_files

from migratory.config import ConfigError, load_config
from migratory.server.app import Server


def keepalive_of(sock: socket.socket) -> tuple[int, int, int, int, int]:
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))


def accepted_sockets(tmp_path: Path, setting: str | None) -> dict[str, tuple[int, ...]]:
    """One client on each kind of port (and an SSE request on the plain one): the
    keepalive options of the socket the server accepted for each."""
    tls = write_tls_files(trustme.CA(), tmp_path)
    settings = {"Listen": "127.0.0.1:0", "ListenEncrypted": "127.0.0.1:0",
                "ListenMqtt": "127.0.0.1:0", "ListenMqttEncrypted": "127.0.0.1:0",
                "TlsCertificate": tls["TlsCertificate"], "TlsKey": tls["TlsKey"]}
    if setting is not None:
        settings["ClientTcpKeepAlive"] = setting
    found: dict[str, tuple[int, ...]] = {}

    async def main() -> None:
        server = Server(load_config(overrides=settings, environ={}))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            ports = {}
            for listener in server.listeners:
                kind = ("mqtt" if listener.mqtt_tcp else "native") + (
                    "+tls" if listener.encrypted else "")
                ports[kind] = listener.address[1]
            assert sorted(ports) == ["mqtt", "mqtt+tls", "native", "native+tls"]
            ports["sse"] = ports["native"]
            streams = []  # held open until every socket was read
            for kind, port in ports.items():
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                streams.append(stream)
                if kind == "sse":
                    await stream.send_all(b"GET /sse?subject=/a/b HTTP/1.1\r\n"
                                          b"Host: x\r\nAccept: text/event-stream\r\n\r\n")
                mine = stream.socket.getsockname()[1]
                for _ in range(500):  # bounded: until the server has accepted it
                    new = [c for c in server.connections if c.sock.getpeername()[1] == mine]
                    if new:
                        break
                    await trio.sleep(0.01)
                found[kind] = keepalive_of(new[0].sock)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return found


def test_every_kind_of_client_socket_gets_tcp_keepalive(tmp_path: Path) -> None:
    found = accepted_sockets(tmp_path, None)  # the default: 60,10,6
    assert found == dict.fromkeys(["native", "native+tls", "mqtt", "mqtt+tls", "sse"],
                                  (1, 60, 10, 6, 120_000)), found


def test_the_setting_is_applied_and_0_turns_it_off(tmp_path: Path) -> None:
    found = accepted_sockets(tmp_path, "30, 5, 3")
    assert set(found.values()) == {(1, 30, 5, 3, 45_000)}, found
    off = accepted_sockets(tmp_path, "0")
    assert {(value[0], value[4]) for value in off.values()} == {(0, 0)}, off


@pytest.mark.parametrize("text", ["60,10", "0,10,6", "60,10,0", "60,40000,6", "x"])
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="ClientTcpKeepAlive"):
        load_config(overrides={"ClientTcpKeepAlive": text}, environ={})
