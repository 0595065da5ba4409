"""Over a real socket against a real server: the protocol version a session speaks is
the lower of the client's and the server's, and every frame the server sends that
session is an operation of that version (``ops.SERVER_OPS_BY_VERSION``)."""

from __future__ import annotations

from typing import Any

import cbor2
from rawclient import RawClient

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws

SUBJECT = "/Stocks/NYSE/IBM"


def names_until_pong(client: RawClient, ping_id: int) -> list[str]:
    """The ``op`` of every frame up to the pong answering ``ping_id`` (sent now)."""
    client.send_op(ops.Ping(ping_id))
    names = []
    while True:
        event = client.recv_event()
        assert isinstance(event, ws.BinaryMessage), event
        body = cbor2.loads(event.data)
        names.append(body["op"])
        if body == {"op": "pong", "id": ping_id}:
            return names


def test_a_newer_client_is_answered_with_this_servers_version(start_server: Any) -> None:
    # was: closed 4000 "connect: protocol version 2 is not supported": a newer SDK could
    # not talk to an older server at all
    server = start_server(BatchTime="0")
    client = RawClient(server.port)
    client.send_op(ops.Connect(client="from-the-future", version=ops.PROTOCOL_VERSION + 1))
    reply = client.recv_op()
    assert isinstance(reply, ops.Connected)
    assert reply.version == ops.PROTOCOL_VERSION


def test_every_frame_of_a_session_is_of_its_version(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    for i in range(3):
        publisher.publish(Message(SUBJECT, f"m{i}".encode(), {"k": str(i)}, True, closure=f"c{i}"))
    client = RawClient(server.port)
    client.send_op(ops.Connect(client="newer", version=ops.PROTOCOL_VERSION + 5))
    connected = client.recv_op()
    assert isinstance(connected, ops.Connected)
    allowed = ops.SERVER_OPS_BY_VERSION[connected.version]
    client.send_op(ops.Subscribe((
        ops.SubscriptionRequest(SUBJECT),
        ops.SubscriptionRequest("/a/b", history=5),
        ops.SubscriptionRequest("/Stocks/NYSE/MSFT", position=Position(1, 4)),
        ops.SubscriptionRequest("/bad//subject"),
    )))
    client.send_op(ops.Publish(Message(SUBJECT, b"mine", closure="c9")))
    client.send_op(ops.Publish(Message("/$x/y", b"denied", closure="c10")))
    client.send_op(ops.Publish(Message(SUBJECT, b"no closure")))
    names = names_until_pong(client, 1)
    client.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, position=Position(1, 1)),)))
    client.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, history=10),)))
    names += names_until_pong(client, 2)
    assert set(names) <= allowed, set(names) - allowed
    assert {"status", "publish_status", "message", "batch", "pong"} <= set(names)
