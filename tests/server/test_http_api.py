"""The HTTP API on a real server: POST /publish, GET /snapshot with fields,
keep-alive, CORS, listener roles, and delivery across front ends."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.request
from typing import Any

import pytest
from httpclient import HttpClient, SseClient, header
from listen_ports import listen_port
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol.http import HttpError

SUBJECT = "/Stocks/NYSE/IBM"


def free_port() -> int:
    return listen_port()  # below the ephemeral range: tests/listen_ports.py


def test_publish_answers_with_the_position_and_the_snapshot_has_the_fields(
    start_server: Any,
) -> None:
    server = start_server()
    client = HttpClient(server.port)
    status, body = client.publish(subject=SUBJECT, content="193", fields={"volume": "6.62M"},
                                  retained=True)
    assert status == 200 and body["status"] == "PUBLISH_OK" and body["seq"] == 1
    status, second = client.publish(subject=SUBJECT, content_base64="MTk0",
                                    fields={"bid": "194"}, retained=True)
    assert status == 200 and second["seq"] == 2 and second["epoch"] == body["epoch"]
    response, data = client.request("GET", f"/snapshot?subject={SUBJECT}&format=json")
    assert response.status_code == 200  # same connection: keep-alive
    snapshot = json.loads(data)
    assert snapshot["content"] == "194" and snapshot["seq"] == 2
    assert snapshot["fields"] == {"volume": "6.62M", "bid": "194"}
    response, data = client.request("GET", f"/snapshot?subject={SUBJECT}")
    assert data == b"194"
    assert json.loads(header(response, "X-Migratory-Fields") or "") == snapshot["fields"]
    client.close()


def test_bad_publishes_get_a_status_and_the_connection_lives_on(start_server: Any) -> None:
    server = start_server(MaxMessageSize="100")
    client = HttpClient(server.port)
    response, data = client.request("POST", "/publish", b"{not json")
    assert response.status_code == 400 and b"JSON" in data
    status, body = client.publish(subject="no/slash", content="x")
    assert status == 400 and body["status"] == "PUBLISH_FAILED"
    status, body = client.publish(subject=SUBJECT, content="x" * 200)
    assert status == 413 and body["status"] == "MESSAGE_SIZE_LIMIT_EXCEEDED"
    response, _ = client.request("GET", "/publish")
    assert response.status_code == 405 and header(response, "Allow") == "POST"
    status, body = client.publish(subject=SUBJECT, content="fine")
    assert status == 200
    client.close()


def test_pipelined_requests_are_answered_in_order(start_server: Any) -> None:
    server = start_server()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    body = json.dumps({"subject": SUBJECT, "content": "x"}).encode()
    post = (f"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)
    sock.sendall(post * 3 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    seqs = [int(seq) for seq in re.findall(rb'"seq": (\d+)', data)]
    assert seqs == [1, 2, 3]
    assert data.count(b"HTTP/1.1 200") == 4 and data.endswith(b"ok\n")


def test_cors_allows_only_the_configured_origins(start_server: Any) -> None:
    server = start_server(HttpCorsOrigins="https://app.example")
    client = HttpClient(server.port)
    response, _ = client.request("GET", "/healthz", headers=[("Origin", "https://app.example")])
    assert header(response, "Access-Control-Allow-Origin") == "https://app.example"
    response, _ = client.request("GET", "/healthz", headers=[("Origin", "https://evil.example")])
    assert header(response, "Access-Control-Allow-Origin") is None
    response, _ = client.request("OPTIONS", "/publish", headers=[
        ("Origin", "https://app.example"), ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "content-type")])
    assert response.status_code == 204
    assert "POST" in (header(response, "Access-Control-Allow-Methods") or "")
    assert header(response, "Access-Control-Allow-Headers") == "content-type"
    client.close()


def test_listener_roles_refuse_publishes_and_protocols(start_server: Any) -> None:
    public, lan, api_only = free_port(), free_port(), free_port()
    server = start_server(
        listeners=3,
        Listen=f"127.0.0.1:{public}, 127.0.0.1:{lan}, 127.0.0.1:{api_only}",
        ListenerRoles=f"127.0.0.1:{public} subscribe; 127.0.0.1:{lan} publish native; "
                      f"127.0.0.1:{api_only} publish http",
    )
    assert server.urls == [f"ws://127.0.0.1:{p}" for p in (public, lan, api_only)]
    subscriber = RawClient(public)
    subscriber.connect()
    subscriber.subscribe(SUBJECT)
    subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    refused = subscriber.publish(Message(SUBJECT, b"no", closure="1"))
    assert refused.status is ops.Status.PUBLISH_DENIED and "ListenerRoles" in (refused.reason or "")
    status, body = HttpClient(public).publish(subject=SUBJECT, content="no")
    assert (status, body["status"]) == (403, "PUBLISH_DENIED")
    assert "ListenerRoles" in body["reason"]
    publisher = RawClient(lan)
    publisher.connect()
    assert publisher.publish(Message(SUBJECT, b"yes", closure="2")).status is ops.Status.PUBLISH_OK
    [message] = subscriber.recv_messages(1)
    assert message.content == b"yes"
    response, _ = HttpClient(lan).request("POST", "/publish", b"{}")
    assert response.status_code == 404  # the LAN port speaks only the native protocol
    status, body = HttpClient(api_only).publish(subject=SUBJECT, content="api")
    assert status == 200 and body["seq"] == 2
    with pytest.raises(HttpError) as refused_upgrade:
        RawClient(api_only)
    assert refused_upgrade.value.status == 404


def test_a_message_published_anywhere_reaches_every_front_end(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    native = RawClient(server.port)
    native.connect()
    native.subscribe(SUBJECT)
    native.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    stream = SseClient(server.port, [SUBJECT])
    assert stream.next_event()["event"] == "subscribe"  # type: ignore[index]
    publisher = RawClient(server.port)
    publisher.connect()
    publisher.publish(Message(SUBJECT, b"native", closure="1"))
    HttpClient(server.port).publish(subject=SUBJECT, content="http")
    with urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{server.port}/publish", method="POST",
        data=json.dumps({"subject": SUBJECT, "content": "urllib"}).encode()), timeout=5) as r:
        assert json.loads(r.read())["seq"] == 3
    got = [(m.content, m.seq) for m in native.recv_messages(3)]
    assert got == [(b"native", 1), (b"http", 2), (b"urllib", 3)]
    events = [stream.next_event() for _ in range(3)]
    assert [(e["data"]["content"], e["data"]["seq"]) for e in events if e] == [
        ("native", 1), ("http", 2), ("urllib", 3)]
    epoch = got[0][1] and events[0]["data"]["epoch"]  # type: ignore[index]
    assert [e["id"] for e in events if e] == [f"{epoch}:{n}" for n in (1, 2, 3)]


@pytest.mark.parametrize("fields", [{"\ud800": "v"}, {"k": "a\udfff"}])
def test_a_field_utf8_cannot_encode_is_refused_and_the_subjects_clients_carry_on(
    start_server: Any, fields: dict[str, str]
) -> None:
    """JSON's ``"\\ud800"`` is a lone surrogate, which no UTF-8 frame can carry. Before:
    taken and numbered, then the hub's encoding raised -- the POST answered 500, the
    message never reached the SSE stream (it got seq 2 next: a silent gap), and the
    native subscriber was closed with 1011 INTERNAL_ERROR, again at every resume."""
    server = start_server(BatchTime="0")
    native = RawClient(server.port)
    native.connect()
    native.subscribe(SUBJECT)
    native.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    stream = SseClient(server.port, [SUBJECT])
    assert stream.next_event()["event"] == "subscribe"  # type: ignore[index]
    client = HttpClient(server.port)
    body = json.dumps({"subject": SUBJECT, "content": "x", "fields": fields, "retained": True})
    response, data = client.request("POST", "/publish", body.encode())
    answer = json.loads(data)
    assert (response.status_code, answer["status"]) == (400, "PUBLISH_FAILED"), data
    assert "lone surrogate" in answer["reason"]
    status, after = client.publish(subject=SUBJECT, content="after")
    assert (status, after["seq"]) == (200, 1)
    assert [(m.content, m.seq) for m in native.recv_messages(1)] == [(b"after", 1)]
    event = stream.next_event()
    assert event is not None and (event["data"]["content"], event["data"]["seq"]) == ("after", 1)
    client.close()


def test_pipelined_requests_whose_answers_are_not_read_are_cut_off(start_server: Any) -> None:
    server = start_server(ClientMaxPendingBytes="65536", MaxMessageSize="32768")
    flood = socket.socket()
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    flood.connect(("127.0.0.1", server.port))
    flood.settimeout(10)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # answers pile up unread
    try:
        for _ in range(20_000):
            flood.sendall(request * 10)
    except OSError:
        pass  # reset: the server dropped the connection
    flood.close()
    deadline = time.monotonic() + 5.0  # (a busy machine: the cut-off may still be due)
    while True:  # the server is fine and counted the cut-off; /stats answers with
        client = HttpClient(server.port)  # Connection: close: a new connection each time
        _, data = client.request("GET", "/stats")
        client.close()
        if json.loads(data)["slow_consumers"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert json.loads(data)["slow_consumers"] == 1
    assert "HTTP responses not read" in server.log()


def _read_answer(sock: socket.socket) -> bytes:
    """What the server writes until it closes (or 5 s pass)."""
    sock.settimeout(5)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_request_bodies_count_in_the_incomplete_frame_budget(start_server: Any) -> None:
    """Unfinished POST /publish bodies are held like incomplete WebSocket frames: the
    request that would pass IncompleteFrameBudget gets 503 naming it, the one already
    held goes on, and what a finished body held is free again."""
    server = start_server(IncompleteFrameBudget="1048576")
    head = b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
    body = json.dumps({"subject": SUBJECT, "content": "x" * 999_950}).encode()
    body += b" " * (1_000_000 - len(body))
    holding = socket.create_connection(("127.0.0.1", server.port))
    holding.sendall(head + body[:700_000])
    time.sleep(0.2)
    over = socket.create_connection(("127.0.0.1", server.port))
    over.sendall(head + body[:700_000])
    answer = _read_answer(over)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"IncompleteFrameBudget" in answer
    holding.sendall(body[700_000:])  # the held request goes on: too large to publish
    holding.settimeout(5)
    assert holding.recv(65536).startswith(b"HTTP/1.1 413 ")
    again = socket.create_connection(("127.0.0.1", server.port))  # the budget is free
    again.sendall(head + body[:700_000])
    time.sleep(0.2)
    again.sendall(body[700_000:])
    again.settimeout(5)
    assert again.recv(65536).startswith(b"HTTP/1.1 413 ")
    for sock in (holding, over, again):
        sock.close()


def test_keep_alive_connections_of_the_http_api_leave_the_handshake_count(
    start_server: Any,
) -> None:
    """MaxHandshakesPerAddress bounds connections that have not shown they are clients;
    a keep-alive connection whose request was answered (an HTTP publisher's pool) no
    longer counts: it held its slot for as long as it stayed open, and the address's
    next connection got 503."""
    server = start_server(MaxHandshakesPerAddress="3")
    pool = [HttpClient(server.port) for _ in range(3)]
    for client in pool:
        assert client.publish(subject=SUBJECT, content="pooled")[0] == 200
    another = HttpClient(server.port)
    assert another.publish(subject=SUBJECT, content="one more")[0] == 200
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    refused = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    assert refused.recv(4096).startswith(b"HTTP/1.1 503 ")  # idle ones still count
    for sock in (*idle, refused):
        sock.close()
    for client in (*pool, another):
        client.close()


def test_oversized_heads_are_431_naming_the_limit_and_a_stream_carries_on(
    start_server: Any,
) -> None:
    """A 1 MB header, and a ``GET /events`` with 10,000 ``subject=`` (a URL far past the
    head limit): each answered 431 with the limit, nothing echoed, the connection closed;
    an open stream keeps receiving. (h11's 'Receive buffer too long' before.)"""
    from migratory.protocol.http_server import MAX_HEAD_BYTES

    server = start_server(BatchTime="0")
    stream = SseClient(server.port, [SUBJECT])
    assert stream.next_event()["event"] == "subscribe"  # type: ignore[index]
    subjects = "&".join(f"subject=/s/{i}" for i in range(10_000))
    for head in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
                 f"GET /events?{subjects} HTTP/1.1\r\nHost: x\r\n\r\n".encode()):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                raw.sendall(head)  # (refused before all of it was sent: answered still)
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert answer.endswith(f"request head larger than {MAX_HEAD_BYTES} bytes\n".encode())
    HttpClient(server.port).publish(subject=SUBJECT, content="after")
    event = stream.next_event()
    assert event is not None and event["data"]["content"] == "after"


def test_an_unknown_query_parameter_or_format_is_400_naming_it(start_server: Any) -> None:
    """GET /snapshot?format=xml answered the raw form, and a misspelt parameter
    (``?subjct=``, ``?tokne=``: a client that believes it sent its token) was ignored on
    /snapshot, /events and /publish. Each is 400 naming the parameter or the value, as an
    unknown key of a publish's body is; the connection serves the requests after it."""
    server = start_server(BatchTime="0")
    client = HttpClient(server.port)
    status, _ = client.publish(subject=SUBJECT, content="193", retained=True)
    assert status == 200
    refused = {
        f"/snapshot?subject={SUBJECT}&format=xml": b"'format'",
        f"/snapshot?subject={SUBJECT}&tokne=t": b"'tokne'",
        f"/snapshot?subject={SUBJECT}&subject=/a/b": b"'subject'",
        f"/snapshot?subject={SUBJECT}&format=json&format=raw": b"'format'",
        f"/events?subject={SUBJECT}&lastEventID=1:1": b"'lastEventID'",
        f"/events?subject={SUBJECT}&client=a&client=b": b"'client'",
    }
    for target, named in refused.items():
        response, data = client.request("GET", target)
        assert response.status_code == 400 and named in data, (target, data)
    body = json.dumps({"subject": SUBJECT, "content": "x"}).encode()
    response, data = client.request("POST", "/publish?token=t", body)
    assert response.status_code == 400 and b"'token'" in data
    response, data = client.request("GET", f"/snapshot?subject={SUBJECT}&format=json&token=")
    assert response.status_code == 200 and json.loads(data)["content"] == "193"
    response, data = client.request("GET", f"/snapshot?subject={SUBJECT}")
    assert response.status_code == 200 and data == b"193"
    client.close()
    stream = SseClient(server.port, [SUBJECT], extra="&client=c&token=&lastEventId=x")
    assert stream.events_until("resync")[-1]["event"] == "resync"  # the id could not be read
    stream.close()
