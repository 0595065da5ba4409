"""Connection limits without sockets (migratory/server/limits.py) and their config keys."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from migratory.config import Config, ConfigError
from migratory.server.limits import (
    ConnectionLimits,
    connection_cap,
    refusal_bytes,
    refusal_response,
)


@dataclass(eq=False)
class Conn:
    address: str
    handshaking: bool = True
    busy: bool = False


def test_the_cap_keeps_a_reserve_below_the_open_file_limit() -> None:
    config = Config.defaults()
    assert config.file_descriptor_reserve == 512 and config.max_connections == 0
    assert connection_cap(config, 20_000) == 20_000 - 512
    assert connection_cap(config, 600) == 300  # never less than half
    assert connection_cap(Config.from_mapping({"MaxConnections": "50"}), 20_000) == 50


def test_total_per_address_and_handshake_limits() -> None:
    config = Config.from_mapping(
        {"MaxConnections": "5", "MaxConnectionsPerAddress": "3", "MaxHandshakesPerAddress": "2"}
    )
    limits = ConnectionLimits(config)
    a1, a2 = Conn("10.0.0.1"), Conn("10.0.0.1")
    assert limits.admit("10.0.0.1") is None and limits.admit("10.0.0.1") is None
    refusal = limits.admit("10.0.0.1")
    assert refusal is not None and refusal.kind == "MaxHandshakesPerAddress" in refusal.reason
    limits.handshake_done(a1)
    a1.handshaking = False
    assert limits.admit("10.0.0.1") is None  # a3, handshaking
    refusal = limits.admit("10.0.0.1")
    assert refusal is not None and refusal.kind == "MaxConnectionsPerAddress" in refusal.reason
    assert limits.admit("10.0.0.2") is None and limits.admit("10.0.0.3") is None
    refusal = limits.admit("10.0.0.4")
    assert refusal is not None and refusal.kind == "MaxConnections" in refusal.reason
    limits.release(a2)  # closed while handshaking: both counts drop
    assert limits.open == 4
    assert limits.admit("10.0.0.4") is None


def test_the_incomplete_frame_budget() -> None:
    limits = ConnectionLimits(Config.from_mapping({"IncompleteFrameBudget": "2097152"}))
    assert limits.hold_incomplete(2_000_000)
    assert not limits.hold_incomplete(100_000)
    assert limits.incomplete_bytes == 2_000_000
    assert limits.hold_incomplete(-1_000_000) and limits.hold_incomplete(100_000)


def test_refusal_is_a_503() -> None:
    reply = refusal_response("too many connections")
    assert reply.startswith(b"HTTP/1.1 503 ") and reply.endswith(b"too many connections\n")


def test_a_refusal_is_said_in_the_ports_protocol() -> None:
    """A native port: 503; a ListenMqtt port: CONNACK 3 (server unavailable); a TLS port:
    nothing (a reset). Was: a 503 on every port (tests/server/test_mqtt_refusals.py)."""
    why = "too many connections"
    assert refusal_bytes(why, mqtt_port=False, encrypted=False) == refusal_response(why)
    assert refusal_bytes(why, mqtt_port=True, encrypted=False) == b"\x20\x02\x00\x03"
    assert refusal_bytes(why, mqtt_port=True, encrypted=True) is None
    assert refusal_bytes(why, mqtt_port=False, encrypted=True) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MaxConnectionsPerAddress", "-1"),
        ("FileDescriptorReserve", "2"),
        ("MaxSubjectsPerSubscribe", "20000"),
        ("MaxFragmentsPerMessage", "0"),
        ("IncompleteFrameBudget", "1000"),
        ("PublishAllowFromAddressList", "10.0.0.0/33"),
        ("PublishAllowFromAddressList", "example.com"),
    ],
)
def test_bad_limit_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Config.from_mapping({key: value})


def test_limit_keys_round_trip_as_text() -> None:
    config = Config.from_mapping({"PublishAllowFromAddressList": "10.0.0.0/8,::1"})
    text = config.as_text()
    assert text["PublishAllowFromAddressList"] == "10.0.0.0/8,::1/128"
    assert Config.from_mapping(text).publish_allow_from_address_list == (
        config.publish_allow_from_address_list
    )


def test_a_full_server_closes_the_oldest_handshake_for_a_newcomer() -> None:
    """MaxConnections reached by connections still in their handshake: a newcomer is
    admitted and the oldest handshake (of the listener holding most) is named to close;
    a server full of clients that finished theirs refuses. Before: always refused."""
    config = Config.from_mapping({"MaxConnections": "3", "MaxHandshakesPerAddress": "0"})
    limits = ConnectionLimits(config)
    idle = [Conn(f"10.0.0.{i}") for i in range(3)]
    for conn in idle:
        assert limits.admit(conn.address) is None
        assert limits.enter(conn, "ws") is None
    newcomer = Conn("10.0.0.9")
    assert limits.admit(newcomer.address) is None
    eviction = limits.enter(newcomer, "mqtt")
    assert eviction is not None and eviction.kind == "MaxConnections"
    assert eviction.evicted.key is idle[0] and limits.pending_handshakes == 3
    limits.release(idle[0])  # the server closed it
    for conn in [*idle[1:], newcomer]:
        limits.handshake_done(conn)
        conn.handshaking = False
        limits.connected(conn)
    assert limits.pending_handshakes == 0
    refusal = limits.admit("10.0.0.10")
    assert refusal is not None and refusal.kind == "MaxConnections"


def test_past_max_pending_handshakes_a_listener_closes_its_oldest() -> None:
    config = Config.from_mapping({"MaxPendingHandshakes": "2", "MaxHandshakesPerAddress": "0"})
    limits = ConnectionLimits(config)
    conns = [Conn(f"10.0.0.{i}") for i in range(4)]
    assert limits.enter(conns[0], "ws") is None and limits.enter(conns[1], "ws") is None
    assert limits.enter(conns[2], "mqtt") is None  # another listener: its own count
    eviction = limits.enter(conns[3], "ws")
    assert eviction is not None and eviction.kind == "MaxPendingHandshakes"
    assert eviction.evicted.key is conns[0] and eviction.limit == 2
    limits.release(conns[1])  # closed while in its handshake: no longer counted
    assert limits.pending_handshakes == 2


def test_max_pending_handshakes_is_validated() -> None:
    assert Config.defaults().max_pending_handshakes == 1000
    with pytest.raises(ConfigError, match="MaxPendingHandshakes"):
        Config.from_mapping({"MaxPendingHandshakes": "0"})


def test_a_connection_whose_request_waits_for_its_answer_is_never_closed_for_room() -> None:
    """An HTTP keep-alive connection stays closable after its answers (one request per
    HandshakeTimeout would hold it for ever) until it becomes a client session, but not
    while a request of it waits for its answer (a publish for its commit)."""
    config = Config.from_mapping({"MaxConnections": "3", "MaxHandshakesPerAddress": "0"})
    limits = ConnectionLimits(config)
    pool = [Conn("10.0.0.1"), Conn("10.0.0.2"), Conn("10.0.0.3")]
    for conn in pool:
        assert limits.admit(conn.address) is None and limits.enter(conn, "ws") is None
        limits.handshake_done(conn)  # an answered request: still closable
        conn.handshaking = False
    pool[0].busy = True
    newcomer = Conn("10.0.0.9")
    assert limits.admit(newcomer.address) is None
    eviction = limits.enter(newcomer, "ws")
    assert eviction is not None and eviction.evicted.key is pool[1]
    limits.release(pool[1])
    limits.connected(newcomer)  # `connect`: a client session, never closed for room
    for conn in (pool[0], pool[2]):
        conn.busy = True
    assert limits.admit("10.0.0.10") is None  # two busy ones still in their handshake
    last = Conn("10.0.0.10")
    eviction = limits.enter(last, "ws")  # the only one that may go: the newcomer itself
    assert eviction is not None and eviction.evicted.key is last
    assert limits.pending_handshakes == 2
