"""SIGTERM drains (up to DrainTime); a SIGINT (Ctrl-C) during that drain stops the
server at once, as a SIGINT does before one (migratory/server/run.py). Before, it was
queued and nobody read it: the operator's Ctrl-C did nothing until the drain ended --
here ~5 s (the client, told to go, never closes: its close times out), DrainTime when
publishes cannot settle (a member cut off from its seeds)."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

import trustme
from httpclient import SseClient
from mqttclient import MqttRawClient
from rawclient import RawClient
from tls_files import write_tls_files

from migratory.model.message import Message
from migratory.protocol import close_codes, mqtt, mqtt_encode, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key


def test_a_sigint_during_the_drain_stops_the_server_at_once(start_server: Any) -> None:
    server = start_server(DrainTime="3600")
    client = RawClient(server.port)
    client.connect("stays")  # reads nothing more: it never leaves by itself
    try:
        server.proc.send_signal(signal.SIGTERM)
        server.wait_logged("draining 1 clients (DrainTime 3600 s)")
        server.proc.send_signal(signal.SIGTERM)  # a second one: logged, the drain goes on
        server.wait_logged("SIGTERM received: draining already")
        assert server.proc.poll() is None
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0  # (the 30 s a guard: before, an hour's drain)
    finally:
        client.sock.close()
    log = server.log()
    assert "SIGINT received while draining: stopping at once" in log
    assert "drained in" not in log  # cut short: before, it ran to its end (5.0 s here)
    assert "Traceback" not in log


def test_a_client_that_answered_the_close_has_left_without_closing_its_socket(
    start_server: Any,
) -> None:
    """A client told to go (4502) that answers with its close frame has read everything
    before it: the drain is done with it, whether its FIN comes or not. Before, the drain
    waited for the FIN (the connection's close linger, 5 s): a client behind a proxy that
    keeps the server's side open (the play's Service), or an SDK that shuts its socket
    later, held every pod's termination 5 s. DrainTime (2 s) is shorter than that linger:
    before, this client was cut at DrainTime."""
    server = start_server(DrainTime="2")
    answer_the_drain(server, RawClient(server.port, timeout=30))


def answer_the_drain(server: Any, client: RawClient) -> None:
    """Subscribe, then answer the 4502 with a close frame, the socket kept open (no FIN
    from this client): drained with the client gone as told."""
    client.connect("answers")
    client.subscribe("/Drain/Answer")
    client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    try:
        server.proc.send_signal(signal.SIGTERM)
        close = client.recv_close()
        assert close.code == close_codes.DRAINED.code
        client.send_raw(ws.encode_close(close.code, "", mask=os.urandom(4)))
        drained_as_told(server)
    finally:
        client.sock.close()


# The other front ends: a client that has everything the member queued for it, and the
# end, has left, whether its TCP end closes or not. Before, each of these was waited for
# until its FIN: with DrainTime (2 s) below the close linger (5 s), cut at DrainTime.

def drained_as_told(server: Any) -> None:
    assert server.proc.wait(30) == 0
    log = server.log()
    assert "of the 1 clients at the start 1 left as told, 0 on their own, 0 cut" in log, log
    assert "DrainTime reached" not in log


def test_a_wss_client_that_answered_the_close_has_left_without_closing_its_socket(
    start_server: Any, tmp_path: Path,
) -> None:
    """Over TLS the close frame comes in a record: read through the TLS link."""
    files = write_tls_files(trustme.CA(), tmp_path)
    server = start_server(listeners=2, ListenEncrypted="127.0.0.1:0", DrainTime="2",
                          TlsCertificate=files["TlsCertificate"], TlsKey=files["TlsKey"])
    tls = ssl.create_default_context(cafile=files["ca"])
    port = int(server.urls[1].rsplit(":", 1)[1])
    answer_the_drain(server, RawClient(port, timeout=30, tls=tls))  # (no close_notify)


def test_an_sse_stream_that_took_its_close_event_has_left_without_closing_its_socket(
    start_server: Any,
) -> None:
    """An SSE client answers nothing: it has what it needs once its TCP end acknowledged
    the close event and the end of the stream (the FIN)."""
    server = start_server(DrainTime="2")
    stream = SseClient(server.port, ["/Drain/Sse"], timeout=30)
    stream.events_until("subscribe")
    try:
        server.proc.send_signal(signal.SIGTERM)
        close = stream.events_until("close")[-1]
        assert close["data"]["code"] == close_codes.DRAINED.code
        assert stream.next_event() is None and stream.closed  # the stream's end came
        drained_as_told(server)  # (its socket stays open, never shut down)
    finally:
        stream.close()


def test_an_mqtt_client_that_took_its_puback_and_the_end_has_left_without_closing_its_socket(
    start_server: Any,
) -> None:
    """MQTT 3.1.1 has no server DISCONNECT: the member ends the connection; the client has
    what it needs once its TCP end acknowledged every byte (its PUBACKs) and the FIN."""
    server = start_server(DrainTime="2", ListenMqtt="127.0.0.1:0")
    client = MqttRawClient(server.mqtt_port, timeout=30)
    client.connect("lazy")
    client.subscribe("drain/mqtt")
    try:
        client.send(mqtt.Publish("drain/mqtt", b"x", qos=1, retain=False, packet_id=7))
        got = {type(client.recv()) for _ in range(2)}
        assert got == {mqtt.Puback, mqtt.Publish}
        server.proc.send_signal(signal.SIGTERM)
        assert client.closed_by_server(timeout=30)
        drained_as_told(server)  # (its socket stays open, never shut down)
    finally:
        client.close()


def test_an_mqtt_client_over_websocket_that_answered_the_close_has_left(
    start_server: Any,
) -> None:
    """MQTT over WebSocket ends with a close frame (4502) too: its answer says the client
    read every packet before it."""
    server = start_server(DrainTime="2")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        key = new_websocket_key()
        sock.sendall(handshake_request("127.0.0.1", "/mqtt", key, subprotocol="mqtt"))
        decoder = ws.FrameDecoder(client_frames=False)
        data = b""
        while (used := check_handshake_response(data, key, subprotocol="mqtt")) is None:
            data += sock.recv(4096)
        decoder.receive_data(data[used:])
        connect = mqtt_encode.encode_packet(mqtt.Connect("lazy-ws"))
        sock.sendall(ws.encode_masked_binary(connect, os.urandom(4)))
        events: list[ws.Event] = []
        while not events:  # the CONNACK
            events = decoder.events(sock.recv(4096))
        server.proc.send_signal(signal.SIGTERM)
        while not any(isinstance(e, ws.CloseReceived) for e in events):
            events = decoder.events(sock.recv(4096))
        close = next(e for e in events if isinstance(e, ws.CloseReceived))
        assert close.code == close_codes.DRAINED.code
        sock.sendall(ws.encode_close(close.code, "", mask=os.urandom(4)))
        drained_as_told(server)  # (its socket stays open until here)


def test_the_drain_names_the_client_that_held_it_and_where_it_was(start_server: Any) -> None:
    """A client that reads its 4502 but never answers it (nor closes): cut at DrainTime,
    and the drain's last line says which client and that it waited for its answer."""
    server = start_server(DrainTime="1")
    client = RawClient(server.port, timeout=30)
    client.connect("never-answers")
    try:
        server.proc.send_signal(signal.SIGTERM)
        assert client.recv_close().code == close_codes.DRAINED.code
        assert server.proc.wait(30) == 0
    finally:
        client.sock.close()
    log = server.log()
    assert "1 left as told" not in log and "0 left as told, 0 on their own, 1 cut" in log
    assert "; held by 1 websocket: client never-answers@127.0.0.1:" in log, log
    assert "(no close frame in answer)" in log


def test_a_client_that_does_not_answer_the_close_is_logged_with_what_it_had_not_taken(
    start_server: Any,
) -> None:
    """A subscriber that stopped reading (or a path to it that stopped: a proxy) holds its
    member's drain for the close linger (5 s) and then loses what was queued for it,
    the close frame too. The member says so, with the bytes the client had not taken:
    queued in its outbox and in the kernel, written but not acknowledged. Before, the
    drain's summary said only "1 left as told" -- nothing told a client that stopped
    reading from one that left (the Kubernetes play's subscriber on the Raft leader that
    got nothing for 12 s)."""
    server = start_server(ClientMaxPendingBytes=str(64 << 20))
    stalled = RawClient(server.port, timeout=30)
    stalled.connect("stalled")
    stalled.subscribe("/Drain/Stalled")
    stalled.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads no more
    publisher = RawClient(server.port, timeout=30)
    publisher.connect("publisher")
    content = b"x" * 100_000
    try:
        for n in range(80):  # 8 MB: more than the kernel buffers hold on either side
            status = publisher.publish(Message("/Drain/Stalled", content, closure=f"c{n}"))
            assert status.status is ops.Status.PUBLISH_OK, status
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
    finally:
        stalled.close()
        publisher.close()
    lines = [x for x in server.log().splitlines()
             if "its last bytes not all written within" in x and "client stalled@" in x]
    assert len(lines) == 1, server.log()  # before: none
    # both clients held the drain to the end of the close linger (the publisher answers
    # no close frame either): closed by the member, not "left as told" (before: 2 were)
    assert ("of the 2 clients at the start 0 left as told, 2 dropped at the close linger, "
            "0 on their own, 0 cut") in server.log(), server.log()
    line = lines[0]
    found = re.search(r"within 5 s: (\d+) frames \((\d+) bytes\) not written, (\d+) bytes "
                      r"written and not acknowledged, (\d+) acknowledged in all", line)
    assert found, line
    frames, queued, unacknowledged, acknowledged = map(int, found.groups())
    assert frames > 0 and queued > 0, line  # (the close frame among them)
    assert unacknowledged > 0 and acknowledged > 0, line
