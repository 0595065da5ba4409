"""A peer that has the ClusterPassword and abuses the link, against a real
:class:`PeerService` on loopback: each attack ends that link (or is bounded), is
logged and counted (``migratory_cluster_link_violations_total``), and a well-behaved
follower linked meanwhile goes on getting the committed stream.

- a frame above the acceptor's limit (``accepted_frame_limit(MaxFrameSize)``: 3 MiB by
  default where 64 MiB were taken, ~4.7 GB of Python objects once decoded);
- a forward of another member's publishes (its origin): numbered, the other member's
  own publish of that ref was answered as a repeat with the impostor's position --
  ``PUBLISH_OK`` for a message never numbered;
- ``SyncRequest`` or ``Replicate`` (full) again and again: each a capture of every
  subject on the event loop and a whole cache sync queued (counting no bytes);
- a sync request for an absurd clsn, a frame of an unknown op, an op of the wrong
  direction: refused, or ends the link, bounded either way.

A frame begun and stalled is in test_link_stall.py (MockClock).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import pytest
import trio
import trio.testing
from cluster_link_pair import open_pair
from listen_ports import listen_port

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator, PublishRequest, request_bytes
from cluster.link_io import LinkChannel, connect
from cluster.peers import FORWARD_SETTLE_TIMEOUT, FORWARD_WINDOW, PeerService
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from migratory.config import load_config
from migratory.model.message import Message
from migratory.server.hub import Hub

PASSWORD = "link-attack-password"
ATTACKER = "127.0.0.1:1"
FOLLOWER = "127.0.0.1:2"
LIMIT = link.accepted_frame_limit(load_config(environ={}).max_frame_size)


class Seed:
    """A PeerService whose forwards are numbered at once (as the sequencer's), counting
    the captures of its caches."""

    def __init__(self, port: int) -> None:
        self.name = f"127.0.0.1:{port}"
        self.port = port
        self.coordinator = Coordinator()
        replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
        self.stream = CommittedStream(ClusterPublishing(origin=f"{self.name}#1",
                                                        replica=replica))
        self.captures = 0
        capture = replica.capture_sync

        def counted() -> object:
            self.captures += 1
            return capture()

        replica.capture_sync = counted  # type: ignore[method-assign]
        self.service = PeerService(
            name=self.name, members=frozenset({self.name, ATTACKER, FOLLOWER}),
            password=PASSWORD, stream=self.stream, take_forward=self.take_forward,
            max_frame=LIMIT,
        )

    def take_forward(self, peer: str, requests: Sequence[PublishRequest]) -> None:
        batch = self.coordinator.apply_batch(7, requests)
        self.stream.on_committed(batch, trio.current_time())

    async def dial(self, member: str) -> LinkChannel:
        channel = await connect(("127.0.0.1", self.port), member=member, password=PASSWORD,
                                max_frame=link.MAX_FRAME)
        await channel.send(link.Replicate(0))
        return channel

    async def ended(self, before: int) -> None:
        while self.service.links_ended == before:
            await trio.sleep(0.01)


MINE = f"{FOLLOWER}#9"


async def answer_of(channel: LinkChannel, ref: int) -> link.Batch:
    """The batch that answers FOLLOWER's publish ``ref``: numbered, or a repeat."""
    with trio.fail_after(5):
        while True:
            op = await channel.receive()
            assert op is not None, "the follower's link ended"
            if isinstance(op, link.Batch) and (
                (MINE, ref) in op.batch.origins
                or any(r[:2] == (MINE, ref) for r in op.batch.repeats)
            ):
                return op


def publish(origin: str, ref: int, content: bytes) -> PublishRequest:
    return PublishRequest(origin, ref, Message("/a/b", content))


Attack = Callable[[Seed, LinkChannel], Awaitable[None]]


def attacked(attack: Attack) -> tuple[Seed, list[link.Batch]]:
    """Run ``attack`` from ATTACKER's link while FOLLOWER follows; the batch that
    answers the publish FOLLOWER forwards after it."""
    seed = Seed(listen_port())

    async def main() -> list[link.Batch]:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(seed.service.run, ("127.0.0.1", seed.port))
                follower = await seed.dial(FOLLOWER)
                attacker = await seed.dial(ATTACKER)
                ended = seed.service.links_ended
                await attack(seed, attacker)
                with trio.move_on_after(2):  # (not ended: the checks below say what came of it)
                    await seed.ended(ended)
                await attacker.aclose()
                await follower.send(link.Forward((publish(MINE, 1, b"mine"),)))
                got = [await answer_of(follower, 1)]
                await follower.aclose()
                nursery.cancel_scope.cancel()
        return got

    return seed, trio.run(main)


def violations(seed: Seed) -> dict[str, int]:
    return {rule: n for rule, n in seed.service.handshakes.violations.items() if n}


def test_a_frame_above_the_acceptors_limit_ends_only_that_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A length prefix of LIMIT + 1 (taken and waited for before: 64 MiB was the limit):
    refused from its 4 bytes."""

    async def oversize(seed: Seed, attacker: LinkChannel) -> None:
        await attacker.stream.send_all((LIMIT + 1).to_bytes(4, "big") + b"\xa1")

    caplog.set_level(logging.WARNING)
    seed, batches = attacked(oversize)
    assert violations(seed) == {"frame_size": 1}
    assert [m.content for m in batches[0].batch.messages] == [b"mine"]
    assert any(f"link from {ATTACKER} closed: frame of {LIMIT + 1} bytes exceeds the limit "
               f"of {LIMIT} (frame_size)" in r.getMessage() for r in caplog.records)


def test_a_forward_of_another_members_publishes_is_refused() -> None:
    """The attacker forwards a publish under FOLLOWER's origin and the ref FOLLOWER uses
    next. Before: numbered; FOLLOWER's own publish of that ref then came back as a
    repeat (answered PUBLISH_OK with the attacker's position), its content never
    numbered."""

    async def impostor(seed: Seed, attacker: LinkChannel) -> None:
        await attacker.send(link.Forward((publish(MINE, 1, b"forged"),)))

    seed, batches = attacked(impostor)
    (batch,) = batches
    assert (batch.batch.origins, batch.batch.repeats) == (((MINE, 1),), ())
    assert [m.content for m in batch.batch.messages] == [b"mine"]
    assert violations(seed) == {"origin": 1}


@pytest.mark.parametrize("op", [link.SyncRequest(0), link.Replicate(0, full=True)],
                         ids=["SyncRequest", "Replicate"])
def test_a_flood_of_sync_requests_takes_one_capture(op: link.LinkOp) -> None:
    """200 requests for a whole cache sync in one write (the attacker reads nothing):
    before, 200 captures of every subject on the event loop and 200 syncs queued; now
    the link ends at the first request that comes while a sync is queued for it."""

    async def flood(seed: Seed, attacker: LinkChannel) -> None:
        await attacker.stream.send_all(link.encode_frame(op) * 200)

    seed, batches = attacked(flood)
    assert seed.captures <= 2  # Replicate(full): the attacker's first, and one more
    assert violations(seed) == {"sync_request" if isinstance(op, link.SyncRequest)
                                else "replicate": 1}
    assert [m.content for m in batches[0].batch.messages] == [b"mine"]


def test_a_sync_request_for_an_absurd_clsn_is_refused_at_no_cost() -> None:
    seed = Seed(listen_port())

    async def main() -> link.LinkOp | None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.service.run, ("127.0.0.1", seed.port))
            channel = await connect(("127.0.0.1", seed.port), member=ATTACKER,
                                    password=PASSWORD, max_frame=link.MAX_FRAME)
            await channel.send(link.SyncRequest(2**64 - 1))
            with trio.fail_after(5):
                answer = await channel.receive()
                while isinstance(answer, link.Heartbeat):
                    answer = await channel.receive()
            await channel.aclose()
            nursery.cancel_scope.cancel()
        return answer

    answer = trio.run(main)
    assert isinstance(answer, link.SyncRefused) and answer.clsn == 0
    assert seed.captures == 0


@pytest.mark.parametrize("frame", [
    b"\x00\x00\x00\x04\xa1\x61t\x61z",  # a valid frame of an unknown op
    link.encode_frame(link.Heartbeat(5)),  # a seed's op, sent to a seed
    link.encode_frame(link.Batch(Coordinator().apply_batch(7, [publish(ATTACKER + "#1", 1,
                                                                        b"x")]))),
], ids=["unknown op", "Heartbeat", "Batch"])
def test_an_op_a_seed_does_not_take_ends_only_that_link(frame: bytes) -> None:
    async def send(seed: Seed, attacker: LinkChannel) -> None:
        await attacker.stream.send_all(frame)

    seed, batches = attacked(send)
    assert violations(seed) == {}  # a protocol error, logged at info
    assert [m.content for m in batches[0].batch.messages] == [b"mine"]


# --- a flood of forwards faster than Raft commits -------------------------------------------


class StalledRaft:
    """A seed's take_forward whose Raft answers nothing until told to."""

    def __init__(self) -> None:
        self.taken: list[trio.Event] = []
        self.bytes = 0

    def take_forward(self, peer: str, requests: Sequence[PublishRequest]) -> trio.Event:
        self.taken.append(trio.Event())
        self.bytes += sum(request_bytes(r) for r in requests)
        return self.taken[-1]


async def flooded(raft: StalledRaft, clock: trio.testing.MockClock) -> list[int]:
    """An authenticated non-seed writes 200 forwards of ~100 KB at once (20 MB) to a seed
    whose Raft commits nothing; how many the seed had taken: while stalled, after the
    first ten were answered, and after FORWARD_SETTLE_TIMEOUT."""
    acceptor, connector = open_pair()
    ours, theirs = trio.testing.memory_stream_pair()
    channel = LinkChannel(ours, role="accept", member="a:1", password=PASSWORD)
    channel.codec = acceptor
    seed = Seed(listen_port())
    seed.service.take_forward = raft.take_forward
    flood = [connector.send(link.Replicate(0))] + [
        connector.send(link.Forward((publish(f"{ATTACKER}#1", i, bytes(100_000)),)))
        for i in range(1, 201)
    ]
    await theirs.send_all(b"".join(flood))
    taken = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(seed.service._serve, ATTACKER, channel)
        await trio.testing.wait_all_tasks_blocked()
        taken.append(len(raft.taken))
        for settled in raft.taken[:10]:
            settled.set()
        await trio.testing.wait_all_tasks_blocked()
        taken.append(len(raft.taken))
        clock.jump(FORWARD_SETTLE_TIMEOUT)
        await trio.testing.wait_all_tasks_blocked()
        taken.append(len(raft.taken))
        nursery.cancel_scope.cancel()
    return taken


def test_forwards_faster_than_raft_commits_wait_on_the_link() -> None:
    """Before, all 200 were Raft commands at once (pysyncobj's queue takes 100,000 of up
    to a frame each); now a link has at most FORWARD_WINDOW (8 MiB) in flight, reads
    more as Raft answers, and a forward unanswered for FORWARD_SETTLE_TIMEOUT (a lost
    callback) stops counting."""
    raft = StalledRaft()
    clock = trio.testing.MockClock()
    taken = trio.run(flooded, raft, clock, clock=clock)
    per_forward = raft.bytes // taken[-1]
    window = FORWARD_WINDOW // per_forward + 1
    assert taken == [window, window + 10, min(200, 2 * window + 10)]


# --- a second link claiming a follower's name ---------------------------------------------------


async def claimed_twice(seed: Seed) -> tuple[str, link.Batch]:
    """FOLLOWER replicates; another link authenticates as FOLLOWER and replicates too.
    What became of the first link, and what the second got for a batch committed then."""
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.service.run, ("127.0.0.1", seed.port))
        first = await seed.dial(FOLLOWER)
        assert await first.receive() == link.Heartbeat(0, True)
        second = await seed.dial(FOLLOWER)
        seed.take_forward(ATTACKER, [publish(f"{ATTACKER}#1", 1, b"later")])
        outcome = "heartbeats and no batch for 2 s"
        with trio.move_on_after(2):
            while (op := await first.receive()) is not None:
                assert not isinstance(op, link.Batch)
            outcome = "closed"
        batch = await answer_of_origin(second, f"{ATTACKER}#1")
        nursery.cancel_scope.cancel()
    return outcome, batch


async def answer_of_origin(channel: LinkChannel, origin: str) -> link.Batch:
    with trio.fail_after(5):
        while True:
            op = await channel.receive()
            if isinstance(op, link.Batch) and any(o == origin for o, _ in op.batch.origins):
                return op


def test_a_second_link_of_one_follower_closes_the_first(caplog: pytest.LogCaptureFixture) -> None:
    """Before, the first link got no batch again but its writer's heartbeats: its member
    heard from the seed, stayed "catching up" and never left it."""
    caplog.set_level(logging.WARNING)
    outcome, batch = trio.run(claimed_twice, Seed(listen_port()))
    assert outcome == "closed"
    assert [m.content for m in batch.batch.messages] == [b"later"]
    assert any(f"replica {FOLLOWER} linked again" in r.getMessage() for r in caplog.records)


# --- many links from one member ------------------------------------------------------------


async def many_links(seed: Seed, count: int) -> list[str]:
    """ATTACKER opens ``count`` links (not replicating); what each came to."""
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.service.run, ("127.0.0.1", seed.port))
        channels = [await connect(("127.0.0.1", seed.port), member=ATTACKER,
                                  password=PASSWORD,
                                  max_frame=link.MAX_FRAME) for _ in range(count)]
        outcomes = []
        for channel in channels:
            with trio.move_on_after(1):
                op = await channel.receive()
                outcomes.append("closed" if op is None else type(op).__name__)
                continue
            outcomes.append("silent")
        follower = await seed.dial(FOLLOWER)  # another member is served meanwhile
        outcomes.append(type(await follower.receive()).__name__)
        nursery.cancel_scope.cancel()
    return outcomes


def test_more_links_from_one_member_than_allowed_close_its_oldest() -> None:
    """Before, all ten held open (each with up to a frame of buffer, as many as the peer
    liked); now the eight newest."""
    seed = Seed(listen_port())
    outcomes = trio.run(many_links, seed, 10)
    assert outcomes == ["closed"] * 2 + ["Heartbeat"] * 8 + ["Heartbeat"]
    assert violations(seed) == {"links": 2}
