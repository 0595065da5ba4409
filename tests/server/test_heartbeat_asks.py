"""Hostile ``heartbeat`` asks in ``connect`` (docs/protocol.md, "Heartbeats"), sent as
bytes: a value that is not an integer of at least 1 closes the session 4000
BAD_OPERATION with a reason naming the key; an integer too large for a grant is clamped
to an hour; one too small is raised to ClientHeartbeatMinimum and to two ticks."""

from __future__ import annotations

import math
from typing import Any

import cbor2
import pytest
from rawclient import RawClient

from migratory.protocol import close_codes, ops
from migratory.protocol.cbor_reader import OperationError
from migratory.server.heartbeats import MAX_INTERVAL_MS, Heartbeats

REFUSED: list[Any] = [
    0, -1, -(2**63), -(2**64), 2**63, 2**64,  # out of range (the last two: CBOR bignums)
    2000.0, 2000.5, math.inf, math.nan,  # floats, whole or not
    "2000", b"\x07\xd0", True, False, None, [2000], {"ms": 2000},
    cbor2.CBORTag(1, 2000),  # a tagged integer (an epoch time)
]
CLAMPED: list[tuple[int, int]] = [
    (1, 1000), (999, 1000), (1000, 1000), (2001, 2001),
    (MAX_INTERVAL_MS, MAX_INTERVAL_MS), (MAX_INTERVAL_MS + 1, MAX_INTERVAL_MS),
    (10**12, MAX_INTERVAL_MS), (2**63 - 1, MAX_INTERVAL_MS),
]


def connect_bytes(heartbeat: Any) -> bytes:
    return cbor2.dumps({"op": "connect", "version": 1, "client": "h", "heartbeat": heartbeat})


@pytest.mark.parametrize("heartbeat", REFUSED, ids=repr)
def test_the_decoder_refuses_a_heartbeat_that_is_not_an_integer_of_at_least_1(
        heartbeat: Any) -> None:
    with pytest.raises(OperationError, match="'heartbeat'"):
        ops.decode_client_op(connect_bytes(heartbeat))


@pytest.mark.parametrize(("asked", "granted"), CLAMPED)
def test_any_integer_from_1_on_is_taken_and_granted_within_bounds(
        asked: int, granted: int) -> None:
    op = ops.decode_client_op(connect_bytes(asked))
    assert op == ops.Connect(client="h", heartbeat_ms=asked)
    assert Heartbeats(1000, 0.1).grant(op.heartbeat_ms) == granted


def test_a_server_closes_each_refused_ask_with_a_reason_and_clamps_the_rest(
        start_server: Any) -> None:
    server = start_server(ClientHeartbeatMinimum="1000")
    for heartbeat in REFUSED:
        client = RawClient(server.port)
        client.send_payload(connect_bytes(heartbeat))
        close = client.recv_close()
        assert close.code == close_codes.BAD_OPERATION.code, heartbeat
        assert "'heartbeat'" in close.reason, (heartbeat, close.reason)
        client.close()
    for asked, granted in CLAMPED:
        client = RawClient(server.port)
        client.send_payload(connect_bytes(asked))
        connected = client.recv_op()
        assert isinstance(connected, ops.Connected), (asked, connected)
        assert connected.heartbeat_ms == granted, asked
        client.close()
    # the server still serves, and counted each refusal as a bad operation
    client = RawClient(server.port)
    assert client.connect("after").heartbeat_ms is None


def test_a_server_with_a_minimum_below_two_ticks_grants_two_ticks(start_server: Any) -> None:
    # ClientHeartbeatMinimum = 1: a grant of 1 ms would be a promise the sweep (a look per
    # 100 ms tick) cannot keep, and a client holding the server to it leaves at once
    server = start_server(ClientHeartbeatMinimum="1")
    client = RawClient(server.port)
    client.send_payload(connect_bytes(1))
    connected = client.recv_op()
    assert isinstance(connected, ops.Connected) and connected.heartbeat_ms == 200
    assert client.recv_op(timeout=2) == ops.Pong(None)
