"""The front ends (native WebSocket, HTTP, MQTT) outside the envelope, with combinations:
SIGTERM in the middle of a flood of malformed input on every front end, a valid publish
followed by garbage in the same TCP segment, HTTP pipelining with a bad request in the
middle, and connections that stop reading (never closing) while the server is full."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from mqttclient import MqttRawClient
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import close_codes, mqtt, mqtt_encode, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import HttpError, handshake_request, new_websocket_key

MASK = b"abcd"
SUBJECT = "/Front/Combined"


def masked(op: ops.ClientOp) -> bytes:
    return ws.encode_masked_binary(ops.encode_client_op(op), MASK)


def garbage_for(front: str, i: int) -> bytes:
    """A connection's worth of malformed input for one front end."""
    if front == "websocket":
        head = handshake_request("127.0.0.1", "/", new_websocket_key())
        return head + masked(ops.Connect(f"junk{i}")) + bytes([0xF2, 0x80 | 4]) + MASK * 40
    if front == "mqtt":
        return mqtt_encode.encode_packet(mqtt.Connect(f"junk{i}")) + b"\xf0\x00" * 100
    return b"GET /snapshot?subject=%ff HTTP/1.1\r\nContent-Length: -1\r\n\r\n" * 5


class Flood(threading.Thread):
    """Connections carrying malformed input to one port, one after the other, until
    stopped or ``limit`` connections (bounded)."""

    def __init__(self, port: int, front: str, limit: int = 5_000) -> None:
        super().__init__(daemon=True)
        self.port, self.front, self.limit = port, front, limit
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.stopping.is_set() and self.sent < self.limit:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                    sock.sendall(garbage_for(self.front, self.sent))
                    sock.settimeout(0.2)
                    while sock.recv(65536):
                        pass
            except OSError:
                pass  # refused once the server is gone, reset, silent: all fine
            self.sent += 1


class Publisher(threading.Thread):
    """Publishes with a closure each, reading statuses as they come, until the server
    closes the connection; the statuses by closure."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, timeout=30)
        self.client.connect("publisher")
        self.statuses: dict[str, list[ops.Status]] = {}
        self.sent = 0
        self.close_code: int | None = None

    def run(self) -> None:
        client = self.client
        try:
            while self.sent < 100_000:
                number = str(self.sent)
                client.send_op(ops.Publish(Message(SUBJECT, number.encode(), closure=number)))
                self.sent += 1
                while True:  # one status at a time: a publish in flight at most
                    event = client.recv_event()
                    if isinstance(event, ws.CloseReceived):
                        self.close_code = event.code
                        return
                    assert isinstance(event, ws.BinaryMessage)
                    op = ops.decode_server_op(event.data)
                    if isinstance(op, ops.PublishStatus):
                        self.statuses.setdefault(str(op.closure), []).append(op.status)
                        break
        except OSError:
            pass  # the close frame may be followed by a reset of what was not read


def received_until_close(client: RawClient) -> tuple[list[bytes], int | None]:
    """Every message delivered to ``client`` up to the server's close frame."""
    contents = []
    while True:
        try:
            event = client.recv_event()
        except (OSError, TimeoutError):
            return contents, None
        if isinstance(event, ws.CloseReceived):
            return contents, event.code
        op = ops.decode_server_op(event.data)  # type: ignore[union-attr]
        if isinstance(op, ops.Deliver):
            contents += [m.content for m in op.messages]


@pytest.mark.slow
def test_sigterm_during_a_flood_of_malformed_input_loses_nothing_acknowledged(
    start_server: Any,
) -> None:
    """A drain (SIGTERM) while three front ends are flooded with malformed input: the
    server exits 0 with no traceback, the publisher got exactly one status for each
    publish but its last (sent after its close frame: never read), and every publish
    acknowledged PUBLISH_OK reached the subscriber before its 4502."""
    server = start_server(ListenMqtt="127.0.0.1:0", DrainTime="10")
    subscriber = RawClient(server.port, timeout=30)
    subscriber.connect("subscriber")
    subscriber.subscribe(SUBJECT)
    assert isinstance(subscriber.recv_op(), ops.SubjectStatus)
    floods = [Flood(server.port, "websocket"), Flood(server.port, "http"),
              Flood(server.mqtt_port, "mqtt")]
    for flood in floods:
        flood.start()
    publisher = Publisher(server.port)
    publisher.start()
    for _ in range(1000):  # until the publisher is under way (bounded)
        if len(publisher.statuses) >= 50 or not publisher.is_alive():
            break
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    received, code = received_until_close(subscriber)
    publisher.join(30)
    assert server.proc.wait(30) == 0, server.log()
    for flood in floods:
        flood.stopping.set()
        flood.join(10)
    log = server.log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    assert code == close_codes.DRAINED.code and publisher.close_code == code
    assert all(len(s) == 1 for s in publisher.statuses.values()), publisher.statuses
    assert len(publisher.statuses) >= publisher.sent - 1  # the last: after the close
    acknowledged = {c for c, s in publisher.statuses.items() if s == [ops.Status.PUBLISH_OK]}
    assert acknowledged, publisher.statuses
    assert acknowledged <= {r.decode() for r in received}
    print("published", publisher.sent, "acknowledged", len(acknowledged), "received",
          len(received), "malformed connections", [f.sent for f in floods])
    assert min(f.sent for f in floods) > 0


def test_half_open_subscribers_at_the_connection_limit_are_cut_off_not_waited_for(
    start_server: Any,
) -> None:
    """The server full (MaxConnections) of subscribers that stopped reading and never
    close: a publisher's every publish is acknowledged once, the readers that stopped
    are cut off as slow consumers (not waited for), which frees their places for
    newcomers (once their close frames gave up: CLOSE_LINGER_SECONDS); a native, an MQTT
    and an SSE one alike."""
    server = start_server(ListenMqtt="127.0.0.1:0", MaxConnections="8",
                          ClientMaxPendingBytes="262144", MaxMessageSize="65536")
    stuck: list[socket.socket] = []
    for i in range(3):
        client = RawClient(server.port)
        client.connect(f"stuck{i}")
        client.subscribe(SUBJECT)
        assert isinstance(client.recv_op(), ops.SubjectStatus)
        stuck.append(client.sock)
    for i in range(3):
        mqtt_client = MqttRawClient(server.mqtt_port)
        mqtt_client.connect(f"stuck-mqtt{i}")
        mqtt_client.subscribe("Front/Combined")
        stuck.append(mqtt_client.sock)
    sse = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sse.sendall(b"GET /events?subject=%s HTTP/1.1\r\nHost: x\r\n\r\n" % SUBJECT.encode())
    assert sse.recv(65536).startswith(b"HTTP/1.1 200 ")
    stuck.append(sse)
    for sock in stuck:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read again
    publisher = RawClient(server.port, timeout=30)  # the 8th: the server is full
    publisher.connect("publisher")
    refused = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    assert refused.recv(4096).startswith(b"HTTP/1.1 503 ")
    statuses = [publisher.publish(Message(SUBJECT, b"x" * 60_000, closure=str(i))).status
                for i in range(200)]  # 12 MB for each subscriber: more than the kernel holds
    assert statuses == [ops.Status.PUBLISH_OK] * 200
    newcomer = None  # a place freed by a cut-off: once its close frame gave up waiting for
    for _ in range(60):  # the reader (CLOSE_LINGER_SECONDS), a newcomer gets in
        try:
            newcomer = RawClient(server.port, timeout=10)
            break
        except HttpError as exc:
            assert exc.status == 503, exc
            time.sleep(0.5)
    assert newcomer is not None, "the half-open clients kept their places"
    newcomer.connect("newcomer")
    newcomer.close()
    publisher.close()
    body = stats_of(server.port)
    assert body["slow_consumers"] == 7, body
    for sock in stuck:
        sock.close()
    assert "Traceback" not in server.log()


def stats_of(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


class HttpResponses:
    """Reads responses off one keep-alive connection, framed by their Content-Length: a
    test reads exactly the responses it expects, then asks whether the server closed
    the connection or still serves it, never waits for an idle close."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self._buffer += chunk
        return bool(chunk)

    def read(self) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names), body."""
        while b"\r\n\r\n" not in self._buffer:
            assert self._fill(), f"closed before a response: {self._buffer!r}"
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(rest) < length:
            assert self._fill(), "closed in a response body"
            rest = self._buffer.partition(b"\r\n\r\n")[2]
        self._buffer = rest[length:]
        return int(lines[0].split(" ", 2)[1]), headers, rest[:length]

    def closed(self) -> bool:
        """True at the server's close (nothing more after the responses read)."""
        assert not self._buffer, f"bytes after the responses: {self._buffer!r}"
        return not self._fill()


@pytest.mark.parametrize(("bad", "framed", "status"), [
    (b"BAD REQUEST\r\n\r\n", False, 400),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n", False, 400),
    (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{{{", True, 400),
    (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", True, 404),
], ids=["request-line", "content-length", "publish-body", "unknown-path"])
def test_http_pipelining_with_a_bad_request_in_the_middle(
    start_server: Any, bad: bytes, framed: bool, status: int
) -> None:
    """A publish, a bad request, a publish, pipelined in one segment: the first is
    answered and published, the bad one answered 400 (404) once; after a request whose
    framing is broken the 400 says ``Connection: close`` and the server closes at once
    (the third is neither answered nor published); after a well-framed one with a bad
    body (or path) the connection stays open: the third is served, and a fourth sent after.
    HandshakeTimeout is an hour, so a close seen here is never the idle close (the
    test once read until that close, 10 s, with a 10 s timeout: a race on a busy box)."""
    server = start_server(HandshakeTimeout="3600")
    reader = RawClient(server.port)
    reader.connect("reader")
    reader.subscribe(SUBJECT)
    assert isinstance(reader.recv_op(), ops.SubjectStatus)

    def publish(content: str) -> bytes:
        body = json.dumps({"subject": SUBJECT, "content": content}).encode()
        return (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                % len(body)) + body

    http = HttpResponses(server.port)
    http.sock.sendall(publish("first") + bad + publish("third"))
    first, refused = http.read(), http.read()
    assert first[0] == 200 and json.loads(first[2])["status"] == "PUBLISH_OK", first
    assert refused[0] == status, refused
    assert (refused[1].get("connection") == "close") is not framed, refused
    if framed:
        third = http.read()
        assert third[0] == 200 and json.loads(third[2])["status"] == "PUBLISH_OK", third
        http.sock.sendall(publish("fourth"))  # the connection still serves
        fourth = http.read()
        assert fourth[0] == 200 and json.loads(fourth[2])["status"] == "PUBLISH_OK", fourth
    else:
        assert http.closed()
    http.sock.close()
    reader.send_op(ops.Ping(7))  # everything published before the pong is delivered first
    delivered = []
    while not isinstance(op := reader.recv_op(), ops.Pong):
        assert isinstance(op, ops.Deliver), op
        delivered += [m.content for m in op.messages]
    assert delivered == [b"first"] + [b"third", b"fourth"] * framed
    assert stats_of(server.port)["messages_published"] == 1 + 2 * framed
