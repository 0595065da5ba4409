"""The link adapter's bounds (cluster/link_io.py, cluster/forwarding.py).

- A frame begun and stalled: a peer that sends a length prefix and part of a frame,
  then nothing, held its link (and up to a frame of buffer) for ever; now the link
  ends FRAME_STALL seconds after the last byte. A link idle between frames waits on.
- A non-seed's forward: every queued publish went into one ``Forward``; a queue of
  more than MAX_FRAME (publishes held while the link was down) could not be encoded,
  the link ended, and the next link resent them all in one frame again. Now forwards
  of at most FORWARD_BYTES, in order, nothing lost.
- Another link protocol version, on loopback: the dialling member gets a
  :class:`Disagreement` saying both versions; the accepting one refuses and counts it
  (``migratory_cluster_link_refused_total{limit="LINK_VERSION"}``), and serves the next.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio
import trio.testing
from cluster_link_pair import frame, open_pair
from listen_ports import listen_port

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch
from cluster.forwarding import Outgoing, forward_to
from cluster.link_io import FRAME_STALL, Disagreement, LinkChannel, connect
from cluster.peers import PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.config import load_config
from migratory.model.message import Message
from migratory.server.hub import Hub

PASSWORD = "link-io-bounds"


def channel_pair() -> tuple[LinkChannel, trio.abc.Stream]:
    """An authenticated channel (the acceptor's side) and the raw stream of its peer."""
    acceptor, _ = open_pair()
    ours, theirs = trio.testing.memory_stream_pair()
    channel = LinkChannel(ours, role="accept", member="a:1", password=PASSWORD)
    channel.codec = acceptor
    return channel, theirs


async def stalled(prefix: bytes, wait: float) -> tuple[str, float]:
    """What ``receive()`` came to after the peer sent ``prefix`` and stopped, and when."""
    channel, peer = channel_pair()
    await peer.send_all(prefix)
    start = trio.current_time()
    with trio.move_on_after(wait):
        try:
            op = await channel.receive()
        except link.LinkViolation as exc:
            return f"{exc.rule}: {exc.reason}", trio.current_time() - start
        return f"op {op}", trio.current_time() - start
    return "waiting", trio.current_time() - start


def test_a_frame_begun_and_stalled_ends_its_link_after_frame_stall() -> None:
    heartbeat = link.encode_frame(link.Heartbeat(3))
    clock = trio.testing.MockClock(autojump_threshold=0)
    outcome, after = trio.run(stalled, heartbeat[:-1], FRAME_STALL * 100, clock=clock)
    assert outcome == (f"frame_stall: a frame begun ({len(heartbeat) - 1} bytes of it) got no "
                       f"byte more for {FRAME_STALL:g} s")
    assert after == pytest.approx(FRAME_STALL)
    outcome, _ = trio.run(stalled, b"\x00\x00", FRAME_STALL * 100, clock=clock)  # a prefix, cut
    assert outcome.startswith("frame_stall: a frame begun (2 bytes of it)")


def test_a_link_idle_between_frames_waits_on() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    outcome, waited = trio.run(stalled, b"", FRAME_STALL * 100, clock=clock)
    assert (outcome, waited) == ("waiting", FRAME_STALL * 100)
    whole = link.encode_frame(link.Heartbeat(3))
    outcome, _ = trio.run(stalled, whole, FRAME_STALL * 100, clock=clock)
    assert outcome == "op Heartbeat(clsn=3, ready=True)"


async def slow_frame_arrives() -> str:
    """A frame that comes a byte every FRAME_STALL / 2 seconds is not stalled."""
    channel, peer = channel_pair()
    frame = link.encode_frame(link.Heartbeat(9))

    async def trickle() -> None:
        for i in range(len(frame)):
            await peer.send_all(frame[i : i + 1])
            await trio.sleep(FRAME_STALL / 2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        op = await channel.receive()
        nursery.cancel_scope.cancel()
    return repr(op)


def test_a_slow_frame_still_coming_is_not_stalled() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    assert trio.run(slow_frame_arrives, clock=clock) == "Heartbeat(clsn=9, ready=True)"


# --- forwards ------------------------------------------------------------------------------


async def forwarded(count: int, size: int) -> tuple[list[int], list[int]]:
    """``count`` publishes of ``size`` bytes queued at once, forwarded over one link:
    the refs each Forward frame carried, in order, and the frames' sizes."""
    acceptor, connector = open_pair()
    ours, theirs = trio.testing.memory_stream_pair()
    channel = LinkChannel(ours, role="connect", member="b:1", password=PASSWORD)
    channel.codec = connector
    publishing = ClusterPublishing(origin="b:1#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))
    for i in range(count):
        publishing.submit(Message(f"/a/{i}", bytes(size)), None, 0.0)
    refs: list[int] = []
    sizes: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward_to, channel, Outgoing(publishing), 0)
        while len(refs) < count:
            data = await theirs.receive_some(1 << 20)
            sizes.append(len(data))
            acceptor.receive_data(data)
            while (op := acceptor.next_event()) is not None:
                assert isinstance(op, link.Forward)
                refs += [r.ref for r in op.requests]
        nursery.cancel_scope.cancel()
    return refs, sizes


def test_a_queue_larger_than_a_frame_goes_in_forwards_of_at_most_forward_bytes() -> None:
    """600 publishes of 120 KB queued (72 MB, past MAX_FRAME): before, one Forward of all
    of them, refused by its own encoder ("frame of 72,... bytes exceeds MAX_FRAME")."""
    refs, _ = trio.run(forwarded, 600, 120_000)
    assert refs == list(range(1, 601))


def test_each_forward_fits_the_acceptors_limit() -> None:
    refs, sizes = trio.run(forwarded, 40, 120_000)
    assert refs == list(range(1, 41))
    assert len(sizes) > 1 and max(sizes) <= link.FORWARD_BYTES + 120_000 + 1000


# --- another link protocol version ------------------------------------------------------------


async def newer_acceptor(port: int) -> str:
    """A member of version 2 at ``port``; what ``connect()`` (version 1) says of it."""
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async def accept(stream: trio.SocketStream) -> None:
        codec = link.LinkConnection(role="accept", member=f"127.0.0.1:{port}",
                                    password=PASSWORD, version=2)
        await stream.send_all(codec.initiate())
        await stream.receive_some(1 << 16)  # nothing: the dialler closes
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, accept, listeners)
        try:
            await connect(("127.0.0.1", port), member="127.0.0.1:1", password=PASSWORD,
                          max_frame=link.MAX_FRAME)
        except Disagreement as exc:
            return exc.reason
        finally:
            nursery.cancel_scope.cancel()
    return "linked"


def test_a_dialler_refuses_a_member_of_another_version_saying_why() -> None:
    port = listen_port()
    assert trio.run(newer_acceptor, port) == (
        f"127.0.0.1:{port} speaks cluster link protocol version 2, this member 1: upgrade "
        "this member too (docs/cluster.md, Upgrading)")


async def older_dialler(port: int) -> tuple[int, link.LinkOp | None]:
    """A version-2 member dials a PeerService of version 1, then a version-1 member."""
    name = f"127.0.0.1:{port}"
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    service = PeerService(
        name=name, members=frozenset({name, "127.0.0.1:1"}), password=PASSWORD,
        stream=CommittedStream(ClusterPublishing(origin=f"{name}#1", replica=replica)),
        take_forward=None,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, ("127.0.0.1", port))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        codec = link.LinkConnection(role="connect", member="127.0.0.1:1", password=PASSWORD,
                                    version=2)
        codec.initiate()
        codec.receive_data(await stream.receive_some(1 << 16))
        with pytest.raises(link.VersionMismatch):
            codec.next_event()
        # a dialler that answers anyway, in its own version: refused before its proof
        auth = {"t": "auth", "m": "127.0.0.1:1", "n": bytes(16), "mac": bytes(32), "v": 2}
        await stream.send_all(frame(auth))
        with trio.fail_after(5):
            assert await stream.receive_some(1 << 16) == b""  # closed
        channel = await connect(("127.0.0.1", port), member="127.0.0.1:1", password=PASSWORD,
                                max_frame=link.MAX_FRAME)
        await channel.send(link.Replicate(0))
        first = await channel.receive()
        await channel.aclose()
        nursery.cancel_scope.cancel()
    return service.handshakes.refusal_counts()["LINK_VERSION"], first


def test_an_acceptor_refuses_and_counts_a_dialler_of_another_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    refused, first = trio.run(older_dialler, listen_port())
    assert refused == 1
    assert first == link.Heartbeat(0, True)  # the next member is served
    assert any("cluster link refused: 127.0.0.1:1 speaks cluster link protocol version 2, "
               "this member 1: upgrade this member too" in r.getMessage()
               for r in caplog.records)


# --- what a connector takes from the member it dialled ----------------------------------

DEFAULT_MAX_FRAME_SIZE = load_config(environ={}).max_frame_size


async def dialled_by_a_non_seed(port: int, batch: link.Batch) -> tuple[int, int]:
    """A "seed" at ``port`` that answers a non-seed's Replicate with ``batch``, then
    closes; the clsn the non-seed applied, and the frame's size."""
    name = f"127.0.0.1:{port}"
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    data = link.encode_frame(batch)

    async def seed(stream: trio.SocketStream) -> None:
        channel = LinkChannel(stream, role="accept", member=name, password=PASSWORD)
        await channel.handshake()
        assert isinstance(await channel.receive(), link.Replicate)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await channel.send_encoded(data)
            await channel.aclose()

    stream = CommittedStream(ClusterPublishing(origin="n#1", replica=Replica(Hub(
        epoch=UNNUMBERED_EPOCH))))
    upstream = UpstreamReplication(
        name="127.0.0.1:1", seeds=[("127.0.0.1", port)], password=PASSWORD, stream=stream,
        outgoing=Outgoing(stream.publishing), max_frame=link.connected_frame_limit(
            DEFAULT_MAX_FRAME_SIZE))
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, seed, listeners)
        with trio.fail_after(30):  # a hang guard, not a speed assertion
            await upstream._follow(("127.0.0.1", port))
        nursery.cancel_scope.cancel()
    return stream.replica.applied_clsn, len(data) - 4


def test_a_non_seed_refuses_a_frame_above_the_connectors_limit_from_its_prefix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, a connector took frames of up to MAX_FRAME (64 MiB) from the member it
    dialled: here a batch of one 6 MiB message, applied (clsn 1). A seed sends batches
    of a Raft command and sync parts, each bounded (connected_frame_limit: 5.06 MiB with
    the defaults); whoever answers at a seed's address with the password can send more.
    Now the link ends at the length prefix, said at warning, nothing applied."""
    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    limit = link.connected_frame_limit(DEFAULT_MAX_FRAME_SIZE)
    assert limit < link.MAX_FRAME
    big = Message("/a/b", bytes(limit), epoch=7, seq=1)
    batch = link.Batch(CommittedBatch(1, (big,), (("x#1", 1),)))
    applied, size = trio.run(dialled_by_a_non_seed, listen_port(), batch)
    assert size > limit
    assert applied == 0
    warned = [r.getMessage() for r in caplog.records if "bounds" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert f"frame of {size} bytes exceeds the limit of {limit}" in warned[0]
    small = link.Batch(CommittedBatch(1, (Message("/a/b", b"x", epoch=7, seq=1),), ()))
    assert trio.run(dialled_by_a_non_seed, listen_port(), small)[0] == 1
