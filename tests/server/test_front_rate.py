"""New connections per second per address, counted at accept (migratory/server/
front_rate.py): the sans-I/O bucket and grouping, then an in-process server whose
clock stands still (trio's MockClock, never jumping: no bucket refills during the
test, so the counts are exact whatever the machine's load)."""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme
from tls_files import write_tls_files

from migratory.config import ConfigError, load_config
from migratory.server.app import Server
from migratory.server.front_rate import ConnectionRate, address_group
from migratory.server.handshake_share import HandshakeShare


@pytest.mark.parametrize(("host", "prefix", "group"), [
    ("192.0.2.7", 64, "192.0.2.7"),
    ("::ffff:192.0.2.7", 64, "192.0.2.7"),  # a dual-stack listener's IPv4 client
    ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:2::1", 64, "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", 64, "2001:db8:1:3::/64"),
    ("2001:db8:1:2::1", 48, "2001:db8:1::/48"),
    ("2001:db8:1:2::1", 128, "2001:db8:1:2::1"),
    ("::1", 64, "::/64"),
    ("fe80::1%eth0", 64, "fe80::/64"),
    ("not-an-address", 64, "not-an-address"),
])
def test_an_ipv6_address_counts_as_its_network(host: str, prefix: int, group: str) -> None:
    assert address_group(host, prefix) == group


def test_the_addresses_of_one_64_share_one_bucket_and_others_have_theirs() -> None:
    rate = ConnectionRate(3)
    one_subnet = [f"2001:db8:0:1::{n:x}" for n in range(1, 7)]
    taken = [rate.take(address_group(host), 0.0) for host in one_subnet]
    assert taken == [True, True, True, False, False, False]
    assert rate.take(address_group("2001:db8:0:2::1"), 0.0)  # the next /64
    assert rate.take(address_group("192.0.2.1"), 0.0)
    assert rate.refused == 3


def test_the_bucket_refills_at_its_rate_up_to_one_second_worth() -> None:
    rate = ConnectionRate(10)
    assert sum(rate.take("a", 0.0) for _ in range(30)) == 10
    assert sum(rate.take("a", 0.5) for _ in range(30)) == 5
    assert sum(rate.take("a", 100.0) for _ in range(30)) == 10  # never more than a burst
    assert ConnectionRate(0).take("a", 0.0)  # 0: no limit
    with pytest.raises(ValueError):
        ConnectionRate(-1)


@pytest.mark.parametrize("make", [lambda: ConnectionRate(5), lambda: HandshakeShare(100)],
                         ids=["ConnectionRate", "HandshakeShare"])
def test_buckets_are_forgotten_once_full_again(
    make: Callable[[], ConnectionRate | HandshakeShare],
) -> None:
    """Memory: as many buckets (handshake_share.py: records) as groups seen within the
    last second, however many groups came before."""
    rate = make()
    for n in range(10_000):
        rate.take(f"10.0.{n // 256}.{n % 256}", n / 1000)  # 1,000 new addresses a second
    assert len(rate) <= 1_001
    rate.take("10.9.9.9", 20.0)
    assert len(rate) == 1


def test_the_keys_are_validated() -> None:
    config = load_config(overrides={"MaxConnectionRatePerAddress": "0",
                                    "PerAddressIPv6Prefix": "48"}, environ={})
    assert (config.max_connection_rate_per_address, config.per_address_ipv6_prefix) == (0, 48)
    for key, value in (("MaxConnectionRatePerAddress", "-1"), ("PerAddressIPv6Prefix", "0"),
                       ("PerAddressIPv6Prefix", "129")):
        with pytest.raises(ConfigError, match=key):
            load_config(overrides={key: value}, environ={})


def client_hello() -> bytes:
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = tls.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def tls_settings(tls: dict[str, str], **extra: str) -> dict[str, str]:
    """A plain and an encrypted listener on 127.0.0.1, and ``extra``."""
    return {"Listen": "127.0.0.1:0", "ListenEncrypted": "127.0.0.1:0",
            "TlsCertificate": tls["TlsCertificate"], "TlsKey": tls["TlsKey"], **extra}


def the_one_line(caplog: pytest.LogCaptureFixture, key: str) -> str:
    """The only log line naming ``key``."""
    lines = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0]


async def server_hellos(port: int, source: str, count: int) -> int:
    """How many of ``count`` connections from ``source`` sending a ClientHello got the
    server's handshake back (the others were reset or closed)."""
    hello, answered = client_hello(), 0
    for _ in range(count):
        sock = trio.socket.socket()
        try:
            await sock.bind((source, 0))
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
            await stream.send_all(hello)
            answered += (await stream.receive_some(5))[:1] == b"\x16"  # a handshake record
        except (OSError, trio.BrokenResourceError):  # reset
            pass
        finally:
            sock.close()
    return answered


def test_a_client_hello_flood_from_one_address_costs_no_handshake_past_the_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """40 ClientHellos from 127.0.0.2 at a standstill of the clock: 5 handshakes (the
    rate's burst), 35 reset at accept (counted, one log line); another address still
    gets its 5. Before: 40 and 5 handshakes (nothing counted new connections)."""
    tls = write_tls_files(trustme.CA(), tmp_path)
    caplog.set_level(logging.WARNING, "migratory.server")

    async def main() -> None:
        settings = tls_settings(tls, MaxConnectionRatePerAddress="5")
        server = Server(load_config(overrides=settings, environ={}))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            port = next(lst.address[1] for lst in server.listeners if lst.encrypted)
            assert await server_hellos(port, "127.0.0.2", 40) == 5
            assert await server_hellos(port, "127.0.0.3", 10) == 5
            assert server.ctx.stats.refusals["MaxConnectionRatePerAddress"] == 40
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())  # the clock stands still
    assert "from 127.0.0.2" in the_one_line(caplog, "MaxConnectionRatePerAddress")


def test_ipv6_clients_count_by_their_64(caplog: pytest.LogCaptureFixture) -> None:
    """Loopback has one IPv6 address: that it is counted as ``::/64`` (not ``::1``)
    shows the grouping is what the accept loop counts by."""
    caplog.set_level(logging.WARNING, "migratory.server")

    async def main() -> None:
        settings = {"Listen": "[::1]:0", "MaxConnectionRatePerAddress": "1"}
        server = Server(load_config(overrides=settings, environ={}))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            port = server.listeners[0].address[1]
            for _ in range(2):
                with contextlib.suppress(OSError):  # the second: reset, maybe at once
                    stream = await trio.open_tcp_stream("::1", port)
                    await stream.aclose()
            for _ in range(10_000):  # the accept loop's turn
                if server.ctx.stats.refusals.get("MaxConnectionRatePerAddress"):
                    break
                await trio.sleep(0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())
    assert any("from ::/64 " in r.getMessage() for r in caplog.records)


def test_garbage_on_the_tls_port_is_said_once_then_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """30 connections sending garbage to the TLS port: one 'TLS failed' line, 30 counted
    in migratory_protocol_errors_total{kind="tls"}. Before: a line per connection (the
    flood of benchmarks/attacks.py wrote 24,340 lines in 10 s)."""
    tls = write_tls_files(trustme.CA(), tmp_path)
    caplog.set_level(logging.INFO, "migratory.connection")

    async def main() -> None:
        settings = {"Listen": "127.0.0.1:0", "ListenEncrypted": "127.0.0.1:0",
                    "TlsCertificate": tls["TlsCertificate"], "TlsKey": tls["TlsKey"],
                    "MaxConnectionRatePerAddress": "0"}
        server = Server(load_config(overrides=settings, environ={}))
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            port = next(lst.address[1] for lst in server.listeners if lst.encrypted)
            for _ in range(30):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"\x00" * 64)
                with contextlib.suppress(trio.BrokenResourceError):
                    while await stream.receive_some(4096):  # until the server closes it
                        pass
                await stream.aclose()
            assert server.ctx.stats.protocol_error_kinds["tls"] == 30
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())
    assert len([r for r in caplog.records if "TLS failed" in r.getMessage()]) == 1
