"""The TLS handshakes a second shared between addresses (migratory/server/
handshake_share.py): the sans-I/O share driven by simulated attempts, then an
in-process server whose clock stands still (no refill during the test: the counts are
exact whatever the machine's load)."""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme
from hypothesis import given
from hypothesis import strategies as st
from test_front_rate import server_hellos, the_one_line, tls_settings
from tls_files import write_tls_files

from migratory.config import ConfigError, load_config
from migratory.server.app import Server
from migratory.server.front_rate import ConnectionRate
from migratory.server.handshake_share import HandshakeShare


def simulate(share: HandshakeShare, demands: dict[str, float], seconds: float,
             per_address: int = 0) -> tuple[Counter[str], Counter[str]]:
    """Each group of ``demands`` attempts its rate a second, evenly spaced (phases
    spread so the groups interleave), for ``seconds``; each attempt is asked of the
    per-address bucket (``per_address``, 0: none) then of ``share``. Attempted and
    admitted, by group."""
    rate = ConnectionRate(per_address)
    attempts: list[tuple[float, int, str]] = []
    for n, (group, demand) in enumerate(demands.items()):
        attempts.append((n / len(demands) / demand, n, group))
    heapq.heapify(attempts)
    tried: Counter[str] = Counter()
    admitted: Counter[str] = Counter()
    while attempts:
        now, n, group = heapq.heappop(attempts)
        if now >= seconds:
            continue
        tried[group] += 1
        if rate.take(group, now) and share.take(group, now):
            admitted[group] += 1
        heapq.heappush(attempts, (now + 1 / demands[group], n, group))
    return tried, admitted


@pytest.mark.parametrize("flooders", [1, 20, 100])
def test_a_quiet_address_is_served_whatever_the_number_of_flooding_addresses(
    flooders: int,
) -> None:
    """Flooders each attempting 1,000 connections a second (the per-address bucket
    lets 100 through), a client attempting 10 a second from its own address, a budget
    of 500 a second for 10 s: the budget is spent (never more than 500 a second and
    one burst) and the client gets every connection it asks for while that is under
    its share (1 or 20 flooders: 500 / 22 > 10), at least its share otherwise (100
    flooders: 500 / 102 ~ 4.9 a second). Before (the per-address bucket alone) 20
    flooders got 2,000 a second."""
    demands = {f"10.0.0.{n}": 1000.0 for n in range(flooders)}
    demands["192.0.2.1"] = 10.0
    tried, admitted = simulate(HandshakeShare(500), demands, 10.0, per_address=100)
    assert tried["192.0.2.1"] == 100
    share = 500 / (flooders + 2)
    assert admitted["192.0.2.1"] >= min(100, 0.9 * share * 10)
    if flooders < 100:
        assert admitted["192.0.2.1"] == 100
    assert sum(admitted.values()) <= 500 * 10 + 500
    if flooders * 100 > 500:  # more asked than the budget: it is used
        assert sum(admitted.values()) >= 500 * 10 * 0.95


def test_the_flooders_share_what_the_quiet_leave() -> None:
    """20 flooders without a per-address bucket (MaxConnectionRatePerAddress = 0): each
    gets about an equal part of the budget, none more than twice another."""
    demands = {f"10.0.0.{n}": 2000.0 for n in range(20)}
    _, admitted = simulate(HandshakeShare(400), demands, 10.0)
    assert sum(admitted.values()) <= 400 * 11
    parts = [admitted[group] for group in demands]
    assert max(parts) <= 2 * min(parts)


def test_one_address_alone_has_the_whole_rate() -> None:
    """Behind a load balancer every client has its address: the share is a plain bound
    of the rate a second, of which half a second's worth is kept for a newcomer at
    first (a burst of 25), then the whole refill (50 a second)."""
    share = HandshakeShare(50)
    assert sum(share.take("lb", 0.0) for _ in range(200)) == 25
    _, admitted = simulate(HandshakeShare(50), {"lb": 1000.0}, 10.0)
    assert 500 <= admitted["lb"] <= 525
    assert HandshakeShare(0).take("lb", 0.0)  # 0: no limit
    with pytest.raises(ValueError):
        HandshakeShare(-1)


def test_a_newcomer_finds_the_share_kept_for_it_at_a_standstill() -> None:
    """The clock standing still: 4 groups asking 10 each of a budget of 20 are given
    4 each (20 / (4 + 1)), the rest refused as over their share; a fifth group still
    gets its connection from what is left."""
    share = HandshakeShare(20)
    given = Counter(group for _ in range(10) for group in "abcd" if share.take(group, 0.0))
    assert given == {"a": 4, "b": 4, "c": 4, "d": 4}
    assert share.refused == share.refused_over_share == 24
    assert share.take("e", 0.0)


@given(st.lists(st.tuples(st.floats(0, 0.2), st.integers(0, 30)), max_size=300))
def test_never_more_than_the_rate_and_one_burst(steps: list[tuple[float, int]]) -> None:
    """Whoever asks whenever: what is given by time t is at most rate x t + rate."""
    share, now, given = HandshakeShare(25), 0.0, 0
    for delay, group in steps:
        now += delay
        given += share.take(f"g{group}", now)
        assert given <= 25 * now + 25


def test_the_key_is_validated() -> None:
    assert load_config(environ={}).max_tls_handshake_rate == 500
    assert load_config(overrides={"MaxTlsHandshakeRate": "0"},
                       environ={}).max_tls_handshake_rate == 0
    with pytest.raises(ConfigError, match="MaxTlsHandshakeRate"):
        load_config(overrides={"MaxTlsHandshakeRate": "-1"}, environ={})


async def http_status(port: int, source: str) -> bytes:
    """The status line of GET /healthz from ``source``."""
    sock = trio.socket.socket()
    with sock:
        await sock.bind((source, 0))
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return (await stream.receive_some(4096)).split(b"\r\n", 1)[0]


def test_a_client_hello_flood_from_many_addresses_leaves_a_newcomer_its_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At a standstill of the clock, MaxTlsHandshakeRate = 20, the per-address rate
    off: ClientHellos from 4 addresses in turn, 10 each, get 16 handshakes (4 each:
    20 / (4 + 1)); the 24 others are reset at accept (counted, one log line); a
    ClientHello from a fifth address then gets its handshake, and plain HTTP from a
    flooding address is not counted. Before: 40 handshakes, and a newcomer's competed
    with them all."""
    tls = write_tls_files(trustme.CA(), tmp_path)
    caplog.set_level(logging.WARNING, "migratory.server")

    async def main() -> None:
        settings = tls_settings(tls, MaxConnectionRatePerAddress="0", MaxTlsHandshakeRate="20")
        server = Server(load_config(overrides=settings, environ={}))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            port = next(lst.address[1] for lst in server.listeners if lst.encrypted)
            plain = next(lst.address[1] for lst in server.listeners if not lst.encrypted)
            answered = 0
            for _ in range(10):
                for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
                    answered += await server_hellos(port, source, 1)
            assert answered == 16
            assert server.ctx.stats.refusals["MaxTlsHandshakeRate"] == 24
            assert await server_hellos(port, "127.0.0.6", 1) == 1
            for _ in range(5):  # the plain port: not counted (no TLS handshake)
                assert (await http_status(plain, "127.0.0.2")).startswith(b"HTTP/1.1 200")
            assert server.ctx.stats.refusals["MaxTlsHandshakeRate"] == 24
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())  # the clock stands still
    assert "from 127.0.0." in the_one_line(caplog, "MaxTlsHandshakeRate")

