"""Property-based fuzzing of the HTTP path of a live server (the h11 parser, the
routes, /publish bodies, /events queries and Last-Event-ID) while bystanders --
an SSE stream and a native WebSocket subscriber -- keep receiving every message."""

from __future__ import annotations

import json
import socket
from typing import Any

from httpclient import HttpClient, SseClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

SUBJECT = "/Fuzz/Bystander"

tokens = st.sampled_from(
    ["GET", "POST", "OPTIONS", "HEAD", "PUT", "G\x00T", "/publish", "/events", "/snapshot",
     "/healthz", "?subject=/a/b", "&subject=", "%ff", "%", " ", "HTTP/1.1", "HTTP/1.0",
     "HTTP/2.0", "\r\n", "\n", "Host: x", "Content-Length: ", "Transfer-Encoding: chunked",
     "Last-Event-ID: ", "1:2,-", "Upgrade: websocket", "Connection: upgrade, close",
     "Expect: 100-continue", "Origin: https://a", "{", '"subject"', ":", '"/a/b"', "}",
     "0\r\n\r\n", "ffffffff\r\n", "\r\n\r\n", "Sec-WebSocket-Version: 13"]
)
requests = st.one_of(
    st.lists(tokens, max_size=30).map(lambda parts: "".join(parts).encode("latin-1")),
    st.binary(max_size=400),
    st.builds(
        lambda body: (f"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                      "\r\n\r\n").encode() + body,
        st.one_of(st.binary(max_size=200),
                  st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                               lambda c: st.lists(c, max_size=3)
                               | st.dictionaries(st.text(max_size=8), c, max_size=4),
                               max_leaves=10).map(lambda v: json.dumps(v).encode())),
    ),
)


def fire(port: int, data: bytes, pieces: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        step = max(1, len(data) // pieces)
        try:
            for i in range(0, len(data), step):
                sock.sendall(data[i : i + step])
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(1.0)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # reset or timeout: the server chose to close or wait, both fine


def test_http_fuzz_with_bystanders(start_server: Any) -> None:
    # every input on a new connection from 127.0.0.1, far past 100 a second
    server = start_server(BatchTime="0", HandshakeTimeout="1", MaxConnectionRatePerAddress="0")
    port = server.port
    native = RawClient(port)
    native.connect()
    native.subscribe(SUBJECT)
    native.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    stream = SseClient(port, [SUBJECT])
    stream.events_until("subscribe")
    sent = 0

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(requests, st.integers(1, 5))
    def fuzz(data: bytes, pieces: int) -> None:
        nonlocal sent
        fire(port, data, pieces)
        sent += 1
        # a new connection each time: HandshakeTimeout=1 closes a keep-alive connection
        # idle for 1 s, and an example (or the machine) can take longer than that
        publisher = HttpClient(port)
        status, body = publisher.publish(subject=SUBJECT, content=f"after {sent}")
        publisher.close()
        assert status == 200, body
        [message] = native.recv_messages(1)
        assert message.content == f"after {sent}".encode()
        event = stream.next_event()
        assert event and event["data"]["content"] == f"after {sent}"

    fuzz()
    assert server.proc.poll() is None, server.log()
    assert "Traceback" not in server.log(), server.log()
    other = RawClient(port)
    other.connect()
    assert other.publish(Message(SUBJECT, b"end", closure="e")).status is ops.Status.PUBLISH_OK
    assert [m.content for m in native.recv_messages(1)] == [b"end"]
