"""A handshaken pair of link connections and the wire helpers the link tests share."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

import cbor2

from cluster.link import LinkConnection

PASSWORD = "s3cret"
ACCEPTOR = "10.0.0.1:8801"
CONNECTOR = "10.0.0.2:8801"


def counting_nonces(first: int) -> Callable[[int], bytes]:
    counter = itertools.count(first)
    return lambda size: next(counter).to_bytes(size, "big")


def pair(
    *, acceptor_password: str = PASSWORD, connector_password: str = PASSWORD
) -> tuple[LinkConnection, LinkConnection]:
    acceptor = LinkConnection(
        role="accept", member=ACCEPTOR, password=acceptor_password, nonce_source=counting_nonces(1)
    )
    connector = LinkConnection(
        role="connect",
        member=CONNECTOR,
        password=connector_password,
        nonce_source=counting_nonces(1000),
    )
    return acceptor, connector


def drain(conn: LinkConnection) -> list[Any]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def frame(body: Any) -> bytes:
    payload = cbor2.dumps(body)
    return struct.pack(">I", len(payload)) + payload


def payload_of(data: bytes) -> Any:
    (size,) = struct.unpack(">I", data[:4])
    assert len(data) == 4 + size
    return cbor2.loads(data[4:])


def open_pair() -> tuple[LinkConnection, LinkConnection]:
    acceptor, connector = pair()
    assert connector.initiate() == b""
    connector.receive_data(acceptor.initiate())
    (auth,) = drain(connector)
    acceptor.receive_data(auth.data)
    welcome, _ = drain(acceptor)
    connector.receive_data(welcome.data)
    drain(connector)
    assert acceptor.authenticated and connector.authenticated
    return acceptor, connector


def feed_whole(conn: LinkConnection, data: bytes) -> list[Any]:
    conn.receive_data(data)
    return drain(conn)


def feed_bytewise(conn: LinkConnection, data: bytes) -> list[Any]:
    events = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        events += drain(conn)
    return events
