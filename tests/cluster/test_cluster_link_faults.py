"""Issue 8, in process (trio, real loopback sockets): a link that fails in the middle
of connecting ends that attempt, never the member; the peer writer never drops or
half-writes a frame.

- A seed that resets the connection (SO_LINGER 0) or closes it mid-handshake made a
  non-seed exit on ``trio.BrokenResourceError`` from ``connect()``:
  :class:`UpstreamReplication` must keep dialling.
- :class:`PeerService` must survive garbage, resets and wrong handshakes and still
  serve the next peer.
- The peer writer once covered taking a frame off the queue *and* writing it with one
  ``move_on_after``: a write longer than the heartbeat period was cancelled half-way.
  A slow stream under ``MockClock`` shows every frame arriving once, in order; the
  old writer, planted, fails the same check.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from cluster_link_pair import open_pair
from listen_ports import listen_port

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.forwarding import Outgoing
from cluster.link_io import DIAL_TIMEOUT, HANDSHAKE_TIMEOUT, LinkChannel, connect
from cluster.peers import HEARTBEAT_SECONDS, PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream, Outbound, wire_bytes
from cluster.upstream import UpstreamReplication
from migratory.model.message import Message
from migratory.server.hub import Hub

PASSWORD = "link-fault-password"
NON_SEED = "127.0.0.1:1"


def new_stream() -> CommittedStream:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    return CommittedStream(ClusterPublishing(origin="me#1", replica=replica))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def reset(stream: trio.SocketStream) -> None:
    """Close with an RST: SO_LINGER 0."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


# --- a seed that fails while a non-seed connects -------------------------------------

Behaviour = Callable[[trio.SocketStream, str], Awaitable[None]]


async def reset_at_once(stream: trio.SocketStream, name: str) -> None:
    reset(stream)


async def reset_after_challenge(stream: trio.SocketStream, name: str) -> None:
    """A valid challenge, then an RST once the connector answers."""
    seed = link.LinkConnection(role="accept", member=name, password=PASSWORD)
    await stream.send_all(seed.initiate())
    await stream.receive_some(1 << 16)
    reset(stream)


async def close_mid_frame(stream: trio.SocketStream, name: str) -> None:
    seed = link.LinkConnection(role="accept", member=name, password=PASSWORD)
    challenge = seed.initiate()
    await stream.send_all(challenge[: len(challenge) // 2])
    await stream.aclose()


async def garbage(stream: trio.SocketStream, name: str) -> None:
    await stream.send_all(b"\xff" * 64)
    await trio.sleep(0.05)
    await stream.aclose()


@pytest.mark.parametrize(
    "behaviour", [reset_at_once, reset_after_challenge, close_mid_frame, garbage]
)
def test_a_non_seed_keeps_dialling_a_seed_that_fails_mid_connect(
    behaviour: Behaviour, caplog: pytest.LogCaptureFixture
) -> None:
    trio.run(keeps_dialling, behaviour)
    assert errors(caplog) == []  # ordinary link failures, not tracebacks


async def keeps_dialling(behaviour: Behaviour) -> None:
    accepted = 0
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    name = f"127.0.0.1:{port}"

    async def seed(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await behaviour(stream, name)

    stream = new_stream()
    upstream = UpstreamReplication(
        name=NON_SEED, seeds=[("127.0.0.1", port)], password=PASSWORD,
        stream=stream, outgoing=Outgoing(stream.publishing), max_frame=link.MAX_FRAME)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, seed, listeners)
            await nursery.start(upstream.run)
            while accepted < 4:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert upstream.view.seed is None  # never got as far as replicating


# --- a peer service that gets garbage, resets and wrong handshakes ----------------------


def free_port() -> int:
    return listen_port()  # below the ephemeral range: tests/listen_ports.py


async def raw(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def handshaken(port: int, member: str = NON_SEED) -> trio.SocketStream:
    """A raw stream past the handshake, as ``member``."""
    stream = await raw(port)
    me = link.LinkConnection(role="connect", member=member, password=PASSWORD)
    me.initiate()
    while True:
        me.receive_data(await stream.receive_some(1 << 16))
        while (event := me.next_event()) is not None:
            if isinstance(event, link.Outgoing):
                await stream.send_all(event.data)
            elif isinstance(event, link.Authenticated):
                return stream


async def send_and_close(stream: trio.SocketStream, data: bytes) -> None:
    await stream.send_all(data)
    await trio.sleep(0.05)
    await stream.aclose()


async def attack_reset(port: int) -> None:
    reset(await raw(port))


async def attack_garbage(port: int) -> None:
    await send_and_close(await raw(port), b"\x00\x00\x00\x05hello")


async def attack_huge_length(port: int) -> None:
    await send_and_close(await raw(port), b"\xff\xff\xff\xff")


async def attack_unknown_member(port: int) -> None:
    await (await handshaken(port, member="10.9.9.9:1")).aclose()


async def attack_garbage_op(port: int) -> None:
    await send_and_close(await handshaken(port), b"\x00\x00\x00\x03\xa1\x61t")


async def attack_reset_mid_frame(port: int) -> None:
    stream = await handshaken(port)
    await stream.send_all(b"\x00\x00\x01\x00partial")
    reset(stream)


async def attack_forward_before_replicate(port: int) -> None:
    await send_and_close(await handshaken(port), link.encode_frame(link.Forward(())))


ATTACKS = [
    attack_reset,
    attack_garbage,
    attack_huge_length,
    attack_unknown_member,
    attack_garbage_op,
    attack_reset_mid_frame,
    attack_forward_before_replicate,
]


def test_the_peer_service_survives_every_bad_link_and_serves_the_next_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    trio.run(survives_every_bad_link)
    assert errors(caplog) == []  # ordinary link failures, not tracebacks
    ended = [r.getMessage() for r in caplog.records if "link from" in r.getMessage()]
    assert any(f"link from {NON_SEED} ended" in m for m in ended), ended


async def survives_every_bad_link() -> None:
    port = free_port()
    name = f"127.0.0.1:{port}"
    stream = new_stream()
    service = PeerService(
        name=name, members=frozenset({name, NON_SEED}), password=PASSWORD,
        stream=stream, take_forward=lambda peer, requests: None,
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run, ("127.0.0.1", port))
            for attack in ATTACKS:
                ended = service.links_ended
                await attack(port)
                while service.links_ended == ended:
                    await trio.sleep(0.01)
            channel = await connect(("127.0.0.1", port), member=NON_SEED, password=PASSWORD,
                                    max_frame=link.MAX_FRAME)
            await channel.send(link.Replicate(0, full=False))
            assert await channel.receive() == link.Heartbeat(0, True)
            await channel.aclose()
            nursery.cancel_scope.cancel()
    assert service.links_ended >= len(ATTACKS)


# --- the peer writer: no frame dropped or half-written ----------------------------------


class ChunkedStream(trio.abc.SendStream):
    """Writes 100 bytes per ``tick`` seconds: a frame takes longer than a heartbeat
    period, and a cancelled write leaves half a frame, as on a socket."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.written = bytearray()
        self.writes = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        for start in range(0, len(data), 100):
            await trio.sleep(self.tick)
            self.written += data[start : start + 100]

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def committed(count: int) -> list[CommittedBatch]:
    coordinator = Coordinator()
    return [
        coordinator.apply_batch(
            7, [PublishRequest("x", i, Message("/a/b", bytes(600), closure=str(i)))]
        )
        for i in range(count)
    ]


Writer = Callable[
    [PeerService, LinkChannel, trio.MemoryReceiveChannel[Outbound], trio.CancelScope],
    Awaitable[None],
]


async def planted_old_writer(
    service: PeerService,
    channel: LinkChannel,
    frames: trio.MemoryReceiveChannel[Outbound],
    scope: trio.CancelScope,
) -> None:
    """The writer before the fix: one deadline over taking a frame and writing it."""
    async with frames:
        while True:
            with trio.move_on_after(HEARTBEAT_SECONDS):
                frame = await frames.receive()
                await channel.send_encoded(wire_bytes(frame))
                continue
            await channel.send_encoded(service.stream.heartbeat())


async def fixed_writer(
    service: PeerService,
    channel: LinkChannel,
    frames: trio.MemoryReceiveChannel[Outbound],
    scope: trio.CancelScope,
) -> None:
    await service._write(channel, frames, scope)


async def written_through(writer: Writer, count: int, tick: float) -> list[link.LinkOp]:
    """Queue ``count`` batches (and pauses longer than a heartbeat period) for a writer
    over a :class:`ChunkedStream`; what a peer decodes from the bytes written."""
    acceptor, connector = open_pair()
    out = ChunkedStream(tick)
    channel = LinkChannel(out, role="accept", member="a:1", password=PASSWORD)  # type: ignore[arg-type]
    channel.codec = acceptor
    service = PeerService(
        name="a:1", members=frozenset(), password=PASSWORD, stream=new_stream(),
        take_forward=None,
    )
    send, receive = trio.open_memory_channel[Outbound](count)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, service, channel, receive, nursery.cancel_scope)
        for i, batch in enumerate(committed(count)):
            send.send_nowait(link.encode_frame(link.Batch(batch)))
            if i % 3 == 0:
                await trio.sleep(HEARTBEAT_SECONDS * 1.5)
        await trio.sleep(count * 10 * tick + 1)
        nursery.cancel_scope.cancel()
    connector.receive_data(bytes(out.written))
    ops = []
    while (event := connector.next_event()) is not None:
        ops.append(event)
    return ops


def batches(ops: list[link.LinkOp]) -> list[int]:
    return [op.batch.clsn for op in ops if isinstance(op, link.Batch)]


def on_mock_clock(writer: Writer, count: int, tick: float) -> list[link.LinkOp]:
    clock = trio.testing.MockClock(autojump_threshold=0)
    ops: list[link.LinkOp] = trio.run(written_through, writer, count, tick, clock=clock)
    return ops


@pytest.mark.parametrize("tick", [0.01, 0.05])  # a frame takes ~0.07 s, ~0.35 s
def test_every_queued_frame_is_written_once_in_order_even_when_slow(tick: float) -> None:
    ops = on_mock_clock(fixed_writer, 12, tick)
    assert batches(ops) == list(range(1, 13))
    assert any(isinstance(op, link.Heartbeat) for op in ops)  # idle gaps were filled


def test_a_busy_link_carries_heartbeats_and_the_seeds_readiness_changes() -> None:
    """A batch every 0.1 s for 4 s, the seed not ready for the first second: heartbeats
    are the only carrier of its readiness. The writer sent one only after a quarter
    second with nothing queued, never under such load, so a non-seed that linked while
    its seed was not ready stayed "not ready" (every client turned away) for as long as
    the load lasted (test_cluster_fault_combinations.py, every Raft link stalled: 30 s)."""
    async def main() -> list[link.LinkOp]:
        acceptor, connector = open_pair()
        out = ChunkedStream(0.0)
        channel = LinkChannel(out, role="accept", member="a:1", password=PASSWORD)  # type: ignore[arg-type]
        channel.codec = acceptor
        ready = False
        stream = new_stream()
        stream.is_ready = lambda: ready
        service = PeerService(name="a:1", members=frozenset(), password=PASSWORD,
                              stream=stream, take_forward=None)
        send, receive = trio.open_memory_channel[Outbound](100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._write, channel, receive, nursery.cancel_scope)
            for i, batch in enumerate(committed(40)):
                send.send_nowait(link.encode_frame(link.Batch(batch)))
                ready = i >= 10
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        connector.receive_data(bytes(out.written))
        ops = []
        while (event := connector.next_event()) is not None:
            ops.append(event)
        return ops

    ops = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [op.batch.clsn for op in ops if isinstance(op, link.Batch)] == list(range(1, 41))
    beats = [op for op in ops if isinstance(op, link.Heartbeat)]
    assert len(beats) >= 3.0 / HEARTBEAT_SECONDS, len(beats)
    assert not beats[0].ready and beats[-1].ready


def test_frames_queued_together_go_out_in_one_write() -> None:
    async def main() -> tuple[list[object], int]:
        acceptor, connector = open_pair()
        out = ChunkedStream(0.0)
        channel = LinkChannel(out, role="accept", member="a:1", password=PASSWORD)  # type: ignore[arg-type]
        channel.codec = acceptor
        service = PeerService(name="a:1", members=frozenset(), password=PASSWORD,
                              stream=new_stream(), take_forward=None)
        send, receive = trio.open_memory_channel[Outbound](10)
        for batch in committed(5):  # queued before the writer runs
            send.send_nowait(link.encode_frame(link.Batch(batch)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._write, channel, receive, nursery.cancel_scope)
            await trio.sleep(HEARTBEAT_SECONDS / 2)
            nursery.cancel_scope.cancel()
        connector.receive_data(bytes(out.written))
        ops: list[object] = []
        while (event := connector.next_event()) is not None:
            ops.append(event)
        return ops, out.writes

    ops, writes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [op.batch.clsn for op in ops if isinstance(op, link.Batch)] == [1, 2, 3, 4, 5]
    assert writes == 1


def test_the_old_writer_planted_drops_or_cuts_frames() -> None:
    try:
        ops = on_mock_clock(planted_old_writer, 12, 0.05)
    except link.LinkError:
        return  # half a frame, then the next one: garbage on the wire
    assert batches(ops) != list(range(1, 13))


# --- forwarding: a link that ends while publishes wait to be forwarded -------------------


def test_publishes_queued_when_a_forwarding_link_ends_go_out_on_the_next_link() -> None:
    """The link to the seed ends (the forwarding task is cancelled) while it lingers to
    batch publishes: the next link's forwarding task must still take them. It used to
    wait for a wake-up that never came (only the first publish into an empty queue
    wakes it): the member's publishing stalled for good."""

    async def main() -> list[PublishRequest]:
        stream = new_stream()
        outgoing = Outgoing(stream.publishing)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outgoing.next_requests)  # the first link's forwarder
            await trio.sleep(0.01)
            stream.publishing.submit(Message("/a/b", b"m1"), None, trio.current_time())
            await trio.sleep(0)  # woken: it lingers to batch more
            nursery.cancel_scope.cancel()  # the link ends
        stream.publishing.submit(Message("/a/b", b"m2"), None, trio.current_time())
        with trio.fail_after(5):
            return await outgoing.next_requests()  # the next link's forwarder

    requests = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [r.message.content for r in requests] == [b"m1", b"m2"]


def test_a_dial_nobody_answers_fails_within_the_dial_timeout() -> None:
    """A seed pod gone with its IP: the SYN goes unanswered (here: a listener whose
    accept queue is full drops it) and the kernel would retry for ~2 minutes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)):  # fills the accept queue

            async def dial() -> float:
                start = trio.current_time()
                with pytest.raises(trio.TooSlowError):
                    await connect(("127.0.0.1", port), member="m", password="p",
                                  max_frame=link.MAX_FRAME)
                return trio.current_time() - start

            waited = trio.run(dial)
    assert DIAL_TIMEOUT <= waited < DIAL_TIMEOUT + 1.0


def test_links_that_never_authenticate_are_refused_saying_why_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connections that send nothing (anyone who reaches a member's or a Workers
    sequencer's port can open them) end after HANDSHAKE_TIMEOUT, and the warning says
    so, once for many: it read 'cluster link refused: ' with nothing after it, once per
    connection (50 idle connections, 50 empty warnings)."""
    caplog.set_level(logging.INFO)
    service = PeerService(name="127.0.0.1:2", members=frozenset({NON_SEED}), password=PASSWORD,
                          stream=new_stream(), take_forward=None)

    async def main() -> None:
        clients = []  # held open: the server side waits for a handshake that never comes
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                server_side, client_side = trio.testing.memory_stream_pair()
                clients.append(client_side)
                nursery.start_soon(service.serve_peer, server_side)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    refused = [r.getMessage() for r in caplog.records if "link refused" in r.getMessage()]
    assert refused == [f"cluster link refused: no handshake within {HANDSHAKE_TIMEOUT:g} s "
                       "(from ?)"]
    assert service.links_ended == 20
