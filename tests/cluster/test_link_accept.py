"""cluster/link_accept.py on real loopback sockets: a stranger's connections to a
member's cluster port are bounded while they authenticate, a member still links during
the flood, and every refusal is logged saying why -- once, however the stranger
varies what it sends."""

from __future__ import annotations

import logging
import os
import ssl
import struct
from pathlib import Path

import cbor2
import pytest
import trio
import trio.testing
from listen_ports import listen_port

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.link_accept import (
    LINK_CONNECTIONS_PER_SECOND,
    LINK_HANDSHAKES_PER_SECOND,
    MAX_PENDING_HANDSHAKES,
    SOURCES_PER_KIND,
    StrangerRefusals,
    reason_kind,
)
from cluster.link_io import ClusterTls, connect
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.standard import StandardNode
from cluster.stream import CommittedStream
from migratory.certificates import make_cluster_certificates
from migratory.config import Config
from migratory.server.front_rate import ConnectionRate
from migratory.server.handshake_share import HandshakeShare
from migratory.server.hub import Hub
from migratory.tls import cluster_contexts

PASSWORD = "link-accept-password"
NON_SEED = "127.0.0.1:1"
STRANGERS = MAX_PENDING_HANDSHAKES + 72


def peer_service(port: int, tls: ClusterTls | None = None) -> PeerService:
    name = f"127.0.0.1:{port}"
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    stream = CommittedStream(ClusterPublishing(origin="me#1", replica=replica))
    return PeerService(name=name, members=frozenset({name, NON_SEED}), password=PASSWORD,
                       tls=tls, stream=stream, take_forward=lambda peer, requests: None)


async def a_member_links(port: int) -> None:
    """A non-seed authenticates on ``port`` and is answered: the member still links."""
    channel = await connect(("127.0.0.1", port), member=NON_SEED, password=PASSWORD,
                            max_frame=link.MAX_FRAME)
    await channel.send(link.Replicate(0, full=False))
    assert await channel.receive() == link.Heartbeat(0, True)
    await channel.aclose()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "refused" in r.getMessage()]


async def closed_by_the_server(
    stream: trio.SocketStream, index: int, closed: set[int]
) -> None:
    """Reads the challenge and waits: the index goes in ``closed`` on EOF."""
    try:
        while await stream.receive_some(1 << 16):
            pass
    except trio.BrokenResourceError:
        pass
    closed.add(index)


def test_strangers_waiting_for_a_handshake_are_bounded_and_a_member_still_links(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """200 idle connections (none sends a byte): the member keeps 128 waiting and closes
    the oldest 72 at once, not after HANDSHAKE_TIMEOUT (5 s); before, it held all 200
    (2,000 held 2,017 descriptors of a real seed, and past its open-file limit the Raft
    leader stopped: cluster/link_accept.py). A member dialling during the flood
    links and replicates."""
    caplog.set_level(logging.INFO)
    port = listen_port()
    service = peer_service(port)
    service.handshakes.rate = ConnectionRate(0)  # 200 at once from 127.0.0.1: not this limit
    service.handshakes.share = HandshakeShare(0)  # nor this one
    closed: set[int] = set()

    async def main() -> None:
        with trio.fail_after(4.5):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run, ("127.0.0.1", port))
                strangers = []
                for index in range(STRANGERS):
                    stranger = await trio.open_tcp_stream("127.0.0.1", port)
                    strangers.append(stranger)
                    nursery.start_soon(closed_by_the_server, stranger, index, closed)
                with trio.move_on_after(2.5):  # well within HANDSHAKE_TIMEOUT (5 s)
                    while len(closed) < STRANGERS - MAX_PENDING_HANDSHAKES:
                        await trio.sleep(0.01)
                await a_member_links(port)
                nursery.cancel_scope.cancel()

    trio.run(main)
    # the member's dial made room too: by closing the oldest stranger still waiting
    assert closed >= set(range(STRANGERS - MAX_PENDING_HANDSHAKES)), sorted(closed)[:10]
    assert len(closed) <= STRANGERS - MAX_PENDING_HANDSHAKES + 1
    assert refusals(caplog) == [
        f"cluster link refused: {MAX_PENDING_HANDSHAKES} connections to this port still "
        "authenticating (MAX_PENDING_HANDSHAKES): the oldest from this address closed "
        "(from 127.0.0.1)"
    ]


def test_a_standard_members_listener_is_bounded_too() -> None:
    """Standard members take links through the same gate (cluster/standard.py): 200
    strangers that send nothing, the oldest 72 closed at once (before: none for 5 s)."""
    config = Config.from_mapping({
        "Listen": "127.0.0.1:0", "ClusterDeliveryMode": "Standard", "ClusterPassword": PASSWORD,
        "ClusterMembers": "127.0.0.1:9001, 127.0.0.1:9002, 127.0.0.1:9003",
        "ClusterMemberListen": "127.0.0.1:9001",
    })
    closed: set[int] = set()

    async def main() -> None:
        node = StandardNode(config)
        async with trio.open_nursery() as nursery:
            for index in range(STRANGERS):
                server_side, stranger = trio.testing.memory_stream_pair()
                nursery.start_soon(node._serve_peer, server_side)
                nursery.start_soon(closed_by_the_server, stranger, index, closed)
            with trio.move_on_after(2.5):  # well within HANDSHAKE_TIMEOUT (5 s)
                while len(closed) < STRANGERS - MAX_PENDING_HANDSHAKES:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(closed) == STRANGERS - MAX_PENDING_HANDSHAKES  # which: as trio started them


def frame(body: object) -> bytes:
    payload = cbor2.dumps(body)
    return struct.pack(">I", len(payload)) + payload


def wrong_password_auth(member: str) -> bytes:
    return frame({"t": "auth", "m": member, "n": os.urandom(16), "mac": os.urandom(32)})


VARIED_ATTACKS = {
    "oversize length": lambda i: struct.pack(">I", 5000 + i),
    "wrong password": lambda i: wrong_password_auth(f"10.0.0.{i}:{1000 + i}"),
    "unexpected tag": lambda i: frame({"t": f"tag{i}"}),
}


def test_refusals_are_logged_once_per_kind_however_the_stranger_varies_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each refusal names what the stranger sent (a size, a member name, a tag); keyed
    by the whole reason, 20 connections varying it made 20 warnings of each kind (a
    stranger could write the log at will). Now one per kind, each saying why."""
    caplog.set_level(logging.INFO)
    port = listen_port()
    service = peer_service(port)

    async def main() -> None:
        with trio.fail_after(4):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run, ("127.0.0.1", port))
                for attack in VARIED_ATTACKS.values():
                    for i in range(20):
                        ended = service.links_ended
                        stranger = await trio.open_tcp_stream("127.0.0.1", port)
                        await stranger.send_all(attack(i))
                        while service.links_ended == ended:
                            await trio.sleep(0.005)
                        await stranger.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert refusals(caplog) == [
        "cluster link refused: authentication failed: frame of 5000 bytes exceeds the "
        "limit of 4096 (from 127.0.0.1)",
        "cluster link refused: authentication failed: bad mac from '10.0.0.0:1000' "
        "(wrong ClusterPassword or replay) (from 127.0.0.1)",
        "cluster link refused: authentication failed: expected 'auth', got 'tag0' "
        "(from 127.0.0.1)",
    ]


async def challenged(port: int) -> trio.SocketStream:
    """A stranger's connection, the member's challenge read."""
    stranger = await trio.open_tcp_stream("127.0.0.1", port)
    await stranger.receive_some(1 << 16)
    return stranger


async def recorded_auth(port: int) -> bytes:
    """The auth frame a member really sent on an earlier connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    me = link.LinkConnection(role="connect", member=NON_SEED, password=PASSWORD)
    me.initiate()
    me.receive_data(await stream.receive_some(1 << 16))
    event = me.next_event()
    assert isinstance(event, link.Outgoing)
    await stream.send_all(event.data)
    await stream.aclose()
    return event.data


BAD_HANDSHAKES = {
    "garbage": (lambda port: trio.sleep(0), lambda auth: os.urandom(200),
                "authentication failed: frame of "),
    "oversize length": (lambda port: trio.sleep(0), lambda auth: b"\xff\xff\xff\xff",
                        "authentication failed: frame of 4294967295 bytes exceeds the limit"),
    "truncated auth, then closed": (
        lambda port: trio.sleep(0), lambda auth: wrong_password_auth(NON_SEED)[:40],
        "peer closed the link"),
    "wrong password": (lambda port: trio.sleep(0), lambda auth: wrong_password_auth(NON_SEED),
                       "authentication failed: bad mac from '127.0.0.1:1' (wrong "
                       "ClusterPassword or replay)"),
    "a member's auth replayed": (recorded_auth, lambda auth: auth,
                                 "authentication failed: bad mac from '127.0.0.1:1' (wrong "
                                 "ClusterPassword or replay)"),
}


@pytest.mark.parametrize("attack", BAD_HANDSHAKES)
def test_a_bad_handshake_is_closed_saying_why_and_members_carry_on(
    attack: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    prepare, data, reason = BAD_HANDSHAKES[attack]
    port = listen_port()
    service = peer_service(port)

    async def main() -> None:
        with trio.fail_after(4):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run, ("127.0.0.1", port))
                auth = await prepare(port)
                while service.links_ended < (prepare is recorded_auth):
                    await trio.sleep(0.005)
                caplog.clear()  # what the member logged for recorded_auth's connection
                stranger = await challenged(port)
                await stranger.send_all(data(auth))
                if attack.endswith("closed"):
                    await stranger.aclose()
                else:  # the member closes it
                    assert await stranger.receive_some(1 << 16) == b""
                while service.links_ended < 1 + (prepare is recorded_auth):
                    await trio.sleep(0.005)
                await a_member_links(port)
                nursery.cancel_scope.cancel()

    trio.run(main)
    logged = refusals(caplog)
    assert len(logged) == 1 and logged[0].startswith(f"cluster link refused: {reason}"), logged


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("frame of 5000 bytes exceeds the limit of 4096",
         "frame of _ bytes exceeds the limit of _"),
        ("bad mac from '10.0.0.1:1' (wrong ClusterPassword or replay)",
         "bad mac from _ (wrong ClusterPassword or replay)"),
        ("expected 'auth', got 'it\\'s'", "expected _, got _"),
        ('expected \'auth\', got "x\'y"', "expected _, got _"),
        ("authentication failed: frame is not valid CBOR: error decoding map: unknown "
         "unsigned integer subtype 0x1e", "authentication failed: frame is not valid CBOR"),
    ],
)
def test_reason_kind_drops_what_the_peer_chose(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind


def test_a_stranger_on_many_addresses_gets_a_few_lines() -> None:
    """Garbage from 30 loopback addresses (any of 127.0.0.0/8 is ours to connect from):
    SOURCES_PER_KIND lines (before: one per address, 30)."""
    port = listen_port()
    service = peer_service(port)

    async def main() -> None:
        with trio.fail_after(4):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run, ("127.0.0.1", port))
                for i in range(30):
                    stranger = await trio.open_tcp_stream(
                        "127.0.0.1", port, local_address=f"127.0.0.{i + 2}")
                    await stranger.send_all(b"\xff\xff\xff\xff")
                    while await stranger.receive_some(1 << 16):
                        pass
                    await stranger.aclose()
                nursery.cancel_scope.cancel()

    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("migratory.cluster")
    logger.addHandler(handler)
    try:
        trio.run(main)
    finally:
        logger.removeHandler(handler)
    assert logged == [
        "cluster link refused: authentication failed: frame of 4294967295 bytes exceeds the "
        f"limit of 4096 (from 127.0.0.{i + 2})" for i in range(SOURCES_PER_KIND)
    ]


def test_stranger_refusals_count_what_they_do_not_log() -> None:
    lines = StrangerRefusals(every=60.0, sources_per_kind=2)
    assert [lines.line(a, "garbage", 0.0) for a in "abcd"] == ["", "", None, None]
    assert lines.line("a", "garbage", 1.0) is None  # a repeat within the minute
    assert lines.line("a", "wrong password", 1.0) == ""  # another kind
    assert lines.line("e", "garbage", 60.0) == " (3 more like it not logged)"
    assert lines.line("a", "garbage", 61.0) == ""


def test_a_client_hello_flood_from_one_address_costs_the_rate_in_tls_handshakes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ClusterTls*, 130 ClientHellos from 127.0.0.2 with the clock standing still:
    LINK_CONNECTIONS_PER_SECOND (100) TLS handshakes, 30 reset at accept, counted, one
    line. Before: 130 handshakes (a key exchange and a signature each, for nothing)."""
    caplog.set_level(logging.INFO)
    service, port, hello_bytes = tls_peer_service(tmp_path)
    answered = 0

    async def main() -> None:
        nonlocal answered
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run, ("127.0.0.1", port))
            for _ in range(LINK_CONNECTIONS_PER_SECOND + 30):
                answered += await tls_answers(port, "127.0.0.2", hello_bytes)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())  # the clock stands still: no refill
    assert answered == LINK_CONNECTIONS_PER_SECOND
    assert service.handshakes.refusal_counts()["LINK_CONNECTIONS_PER_SECOND"] == 30
    assert [line for line in refusals(caplog) if "LINK_CONNECTIONS_PER_SECOND" in line] == [
        f"cluster link refused: more than {LINK_CONNECTIONS_PER_SECOND} new connections a "
        "second from this address (LINK_CONNECTIONS_PER_SECOND): reset at accept "
        "(from 127.0.0.2)"
    ]


def test_a_client_hello_flood_from_many_addresses_leaves_a_newcomer_its_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ClusterTls*, ClientHellos from 4 addresses in turn, 60 each, the clock
    standing still (each address under LINK_CONNECTIONS_PER_SECOND): 160 TLS handshakes
    (40 each: LINK_HANDSHAKES_PER_SECOND / (4 + 1)), 80 reset at accept; a fifth
    address still gets its handshake. Before: 240 handshakes (only the per-address
    rate, 100 each)."""
    caplog.set_level(logging.INFO)
    service, port, hello_bytes = tls_peer_service(tmp_path)
    answered: dict[str, int] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run, ("127.0.0.1", port))
            for _ in range(60):
                for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
                    got = await tls_answers(port, source, hello_bytes)
                    answered[source] = answered.get(source, 0) + got
            answered["127.0.0.6"] = await tls_answers(port, "127.0.0.6", hello_bytes)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())  # the clock stands still: no refill
    assert LINK_HANDSHAKES_PER_SECOND // 5 == 40
    assert answered == {"127.0.0.2": 40, "127.0.0.3": 40, "127.0.0.4": 40, "127.0.0.5": 40,
                        "127.0.0.6": 1}
    counts = service.handshakes.refusal_counts()
    assert (counts["LINK_HANDSHAKES_PER_SECOND"], counts["LINK_CONNECTIONS_PER_SECOND"]) == (80, 0)
    assert len([line for line in refusals(caplog) if "LINK_HANDSHAKES_PER_SECOND" in line]) == 4


def tls_peer_service(tmp_path: Path) -> tuple[PeerService, int, bytes]:
    """A member's service with ClusterTls* on a free port, and a stranger's ClientHello."""
    made = make_cluster_certificates(tmp_path, {"m0": ["127.0.0.1"]})["m0"]
    tls = ClusterTls(*cluster_contexts(str(made.certificate), str(made.key), str(made.ca)))
    port = listen_port()
    return peer_service(port, tls), port, tls_client_hello()


async def tls_answers(port: int, source: str, hello_bytes: bytes) -> int:
    """1 if a connection from ``source`` sending ``hello_bytes`` got the member's TLS
    handshake back, 0 if it was reset."""
    sock = trio.socket.socket()
    try:
        await sock.bind((source, 0))
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
        await stream.send_all(hello_bytes)
        return int((await stream.receive_some(5))[:1] == b"\x16")  # a handshake record
    except (OSError, trio.BrokenResourceError):  # reset at accept
        return 0
    finally:
        sock.close()


def tls_client_hello() -> bytes:
    """A stranger's ClientHello (no certificate, no trust: only its first flight)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()
