"""Bad input closes only the offending connection, with the documented code."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from typing import Any

import cbor2
import pytest
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws

SUBJECT = "/Stocks/NYSE/IBM"


def _bystander(port: int) -> RawClient:
    client = RawClient(port)
    client.connect("bystander")
    client.subscribe(SUBJECT)
    allow = client.recv_op()
    assert isinstance(allow, ops.SubjectStatus)
    return client


def _still_served(bystander: RawClient, port: int, content: bytes) -> None:
    publisher = RawClient(port)
    publisher.connect("publisher")
    status = publisher.publish(Message(SUBJECT, content, closure="c"))
    assert status.status is ops.Status.PUBLISH_OK
    (message,) = bystander.recv_messages(1)
    assert message.content == content


MASK = b"\x01\x02\x03\x04"


@pytest.mark.parametrize(
    ("bad_input", "code"),
    [
        (bytes([0x82, 0x05]) + b"hello", close_codes.PROTOCOL_ERROR.code),  # unmasked
        (bytes([0xC2, 0x80]) + MASK, close_codes.PROTOCOL_ERROR.code),  # RSV1 set
        (ws.encode_frame(ws.TEXT, b"{}", mask=MASK), close_codes.UNSUPPORTED_DATA.code),
        (ws.encode_masked_binary(b"\xff\xfe", MASK), close_codes.INVALID_PAYLOAD.code),
        (ws.encode_masked_binary(cbor2.dumps([1, 2]), MASK), close_codes.BAD_OPERATION.code),
        (
            ws.encode_masked_binary(cbor2.dumps({"op": "publish", "subject": 5}), MASK),
            close_codes.BAD_OPERATION.code,
        ),
        (
            ws.encode_masked_binary(cbor2.dumps({"op": "connect"}), MASK),
            close_codes.NOT_CONNECTED.code,
        ),
        (bytes([0x82, 0xFF]) + (1 << 40).to_bytes(8, "big") + MASK, 1009),
    ],
    ids=[
        "unmasked",
        "rsv-bit",
        "text-frame",
        "not-cbor",
        "not-a-map",
        "bad-key-type",
        "second-connect",
        "too-big",
    ],
)
def test_malformed_input_closes_only_that_connection(
    start_server: Any, bad_input: bytes, code: int
) -> None:
    server = start_server(BatchTime="0")
    bystander = _bystander(server.port)
    offender = RawClient(server.port)
    offender.connect("offender")
    offender.send_raw(bad_input)
    close = offender.recv_close()
    assert close.code == code
    assert close.reason  # every close says why
    _still_served(bystander, server.port, b"after " + str(code).encode())


def test_bad_operation_reason_names_the_key(start_server: Any) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.connect()
    client.send_payload(cbor2.dumps({"op": "publish", "subject": SUBJECT, "content": "text"}))
    close = client.recv_close()
    assert close.code == close_codes.BAD_OPERATION.code
    assert "'content'" in close.reason


def test_operation_before_connect_is_refused(start_server: Any) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT),)))
    assert client.recv_close().code == close_codes.NOT_CONNECTED.code


def test_no_connect_in_time_is_closed(start_server: Any) -> None:
    server = start_server(HandshakeTimeout="1")
    client = RawClient(server.port)
    assert client.recv_close(timeout=5).code == close_codes.CONNECT_TIMEOUT.code


def test_garbage_instead_of_http_gets_400_and_server_carries_on(start_server: Any) -> None:
    server = start_server()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    _still_served(_bystander(server.port), server.port, b"ok")


def test_invalid_subjects_are_statuses_not_closes(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    client = RawClient(server.port)
    client.connect()
    client.subscribe("/Stocks")
    deny = client.recv_op()
    assert isinstance(deny, ops.SubjectStatus) and deny.status is ops.Status.SUBSCRIBE_DENY
    assert deny.reason is not None and "one segment" in deny.reason
    status = client.publish(Message("Stocks/IBM", b"x", closure="c1"))
    assert (status.status, status.closure) == (ops.Status.PUBLISH_FAILED, "c1")
    assert status.reason is not None and "'/'" in status.reason


def test_message_size_limit(start_server: Any) -> None:
    server = start_server(MaxMessageSize="1000")
    client = RawClient(server.port)
    client.connect()
    status = client.publish(Message(SUBJECT, b"x" * 1001, closure="big"))
    assert status.status is ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED
    assert status.closure == "big"
    ok = client.publish(Message(SUBJECT, b"x" * 900, closure="fits"))
    assert ok.status is ops.Status.PUBLISH_OK


def test_basic_entitlement_only_token_holders_publish(start_server: Any) -> None:
    server = start_server(Entitlement="Basic", EntitlementAllowToken="s3cret")
    anyone = RawClient(server.port)
    anyone.connect("anyone", token="guess")
    denied = anyone.publish(Message(SUBJECT, b"x", closure="a"))
    assert denied.status is ops.Status.PUBLISH_DENIED
    anyone.subscribe(SUBJECT)
    allow = anyone.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.status is ops.Status.SUBSCRIBE_ALLOW
    holder = RawClient(server.port)
    holder.connect("holder", token="s3cret")
    assert holder.publish(Message(SUBJECT, b"y", closure="b")).status is ops.Status.PUBLISH_OK


def test_http_snapshot_and_stats(start_server: Any) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.connect()
    client.publish(Message(SUBJECT, b"193", {"volume": "6.62M"}, retained=True, closure="1"))
    base = f"http://127.0.0.1:{server.port}"
    with urllib.request.urlopen(f"{base}/snapshot?subject={SUBJECT}") as reply:
        assert reply.read() == b"193"
        assert reply.headers["X-Migratory-Seq"] == "1"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/snapshot?subject=/No/Such")
    assert missing.value.code == 404
    with urllib.request.urlopen(f"{base}/stats") as reply:
        stats = json.loads(reply.read())
    assert stats["messages_published"] == 1


def test_ping_op_and_websocket_ping(start_server: Any) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.connect()
    client.send_op(ops.Ping(42))
    assert client.recv_op() == ops.Pong(42)
    client.send_raw(ws.encode_ping(b"hi", mask=os.urandom(4)))
    assert client.recv_event() == ws.Pong(b"hi")


def test_ctrl_c_closes_clients_with_going_away_and_exits_zero(start_server: Any) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.connect()
    server.proc.send_signal(2)
    assert client.recv_close(timeout=30).code == close_codes.GOING_AWAY.code
    assert server.proc.wait(30) == 0  # a clean exit; the 30 s only guard against a hang
    assert "shutting down" in server.log()
