"""The pieces of the simulated cluster around the code under test (test helper).

Members, each the real composition minus the I/O: a :class:`CommittedStream` around
its :class:`ClusterPublishing` and :class:`Replica`, and -- on a non-seed -- the real
:class:`UpstreamReplication` decisions, fed the frames its upstream seed's stream
queued for it. Subscribers speak to a member's hub as the SDK does; publishes record
the answers their client gets. ``cluster_machine`` drives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import trio
from cluster_checker import SubscriberView, resync_cause
from cluster_link_contract import LinkContract
from hypothesis import strategies as st

from cluster import link
from cluster.cache_sync import CacheSync, export_sync
from cluster.coordination import CommittedBatch
from cluster.link_sync import SyncAssembly
from cluster.replica import Replica
from cluster.stream import CommittedStream, Outbound, wire_bytes
from cluster.upstream import UpstreamReplication
from migratory.model.message import Message
from migratory.model.outbox import Outbox
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import BinaryMessage, FrameDecoder
from migratory.server.hub import Hub
from migratory.server.run_output import RunOutput
from migratory.server.session_link import Link

SEEDS = ("seed-0", "seed-1", "seed-2")
MEMBERS = (*SEEDS, "edge-0", "edge-1")
SUBJECTS = ("/Stocks/NYSE/IBM", "/Stocks/NASDAQ/GM", "/Scores/NBA/LAL")  # IBM, GM: one group
PUBLISHERS = (None, "p0", "p1")  # None: a publisher without order to keep

picks = st.integers(0, 1_000)
publications = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(PUBLISHERS), st.booleans())
bursts = st.lists(publications, min_size=1, max_size=4)

T = TypeVar("T")


def choose(candidates: Sequence[T], pick: int) -> T | None:
    return candidates[pick % len(candidates)] if candidates else None


@dataclass
class UpstreamLink:
    """A non-seed's link to its upstream seed: the frames the seed queued, read later."""

    seed: str
    send: trio.MemorySendChannel[Outbound]
    receive: trio.MemoryReceiveChannel[Outbound]
    contract: LinkContract

    def close(self) -> None:
        self.send.close()
        self.receive.close()


@dataclass
class Member:
    name: str
    is_seed: bool
    incarnation: int = 0
    stream: CommittedStream | None = None  # None: down
    upstream: UpstreamReplication | None = None  # a non-seed's replication decisions
    link: UpstreamLink | None = None  # a non-seed's link to its upstream seed
    connected: bool = True  # False: cut off from Raft (seed) or from every seed (non-seed)
    feed: int = 0  # a seed: how many batches of the Raft log its stream was offered
    high_water: int = 0  # the highest clsn applied in this incarnation
    late: int = 0  # a seed: batches its stream will get late
    held: list[CommittedBatch] = field(default_factory=list)  # ... and has not got yet
    leaving: bool = False  # a seed whose Raft stopped, following another (cluster_leave)

    @property
    def replica(self) -> Replica | None:
        return None if self.stream is None else self.stream.replica

    @property
    def live(self) -> bool:
        return self.stream is not None

    @property
    def serving(self) -> bool:
        return self.stream is not None and not self.stream.replica.needs_sync

    @property
    def applied(self) -> int:
        return -1 if self.stream is None else self.stream.replica.applied_clsn

    @property
    def hub(self) -> Hub:
        assert self.stream is not None, f"{self.name} is down"
        return self.stream.replica.hub


class _Socket:
    """A connection's socket as its session's runs see it (``run_output.queue_run``):
    taking every batch as it fills, none partly written."""

    writing = False


BATCH_SPACES = (1 << 20, 64)
"""A connection's MaxBatchingSpace: runs taken whole, or frame by frame up to the one
that fills a batch (about each frame: the rest joined again), as a session's are."""


class Connection(RunOutput):
    """A subscriber's WebSocket to one member: the frames its hub wrote, read later.

    Each write carries the resync cause the model expected when the hub wrote it
    (``cause``, set at subscribe and before the member jumps to a sync). A write may
    hold several frames: the messages a member's cache sync jumped over come as runs
    (``deliver_run``, the session's own, :class:`RunOutput`), read as the client
    reads its socket.
    """

    def __init__(self, member: Member, batch_space: int = BATCH_SPACES[0]) -> None:
        self.member = member
        self.hub = member.hub
        self.cause: str | None = None
        self.frames: list[tuple[bytes, str | None]] = []
        self.runs = 0  # writes of more than one frame (a run, or the rest of one)
        self.owed_at: tuple[str, Position] | None = None
        """A held resume that asks for the snapshot as of its position: whether it is
        owed a DATA_RESYNC is told when the hub answers it (the snapshot may change
        before; tests/server/test_hub_resume_snapshot.py)."""
        self._decoder = FrameDecoder(client_frames=False)
        # what deliver_run reads of a session: nothing pending, its batch size; a socket
        self.outbox = Outbox(batch_space=batch_space, max_pending=1 << 30)
        self._link = cast("Link", _Socket())

    def deliver(self, frame: bytes) -> None:
        cause = self.cause
        if self.owed_at is not None:
            subject, position = self.owed_at
            records = [r for r in export_sync(self.hub, 0).subjects if r.subject == subject]
            cause = cause or resync_cause(position, records[0] if records else None,
                                          snapshot=True)
            for event in FrameDecoder(client_frames=False).events(frame):
                assert isinstance(event, BinaryMessage)
                op = ops.decode_server_op(event.data)
                if isinstance(op, ops.SubjectStatus) and op.status in (
                        ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC):
                    self.owed_at = None  # the held resume is answered
        self.frames.append((frame, cause))

    def read(self) -> list[tuple[ops.ServerOp, str | None]]:
        frames, self.frames = self.frames, []
        out: list[tuple[ops.ServerOp, str | None]] = []
        for frame, cause in frames:
            events = self._decoder.events(frame)
            assert events, "a write of no whole frame"
            self.runs += len(events) > 1
            for event in events:
                assert isinstance(event, BinaryMessage)
                out.append((ops.decode_server_op(event.data), cause))
        return out


@dataclass
class Subscriber:
    """One subscribed subject of one client, through the SDK's tracker."""

    view: SubscriberView
    connection: Connection | None = None
    batch_space: int = BATCH_SPACES[0]
    """Its connections' (:class:`Connection`)."""
    waiting_at: Position | None = None
    """The position of a resume the hub holds until it catches up (it lags)."""

    def connect(self, member: Member, now: float) -> None:
        """Subscribe, or resume from the tracker's position, as the SDK does."""
        hub, view = member.hub, self.view
        request = view.tracker.request()
        records = [r for r in export_sync(hub, 0).subjects if r.subject == view.subject]
        cause = resync_cause(request.position, records[0] if records else None,
                             snapshot=request.snapshot)
        self.connection = Connection(member, self.batch_space)
        self.connection.cause = cause
        answer = hub.subscribe(self.connection, request, now)
        self.waiting_at = request.position if len(answer) == 1 and request.position else None
        for op in answer:
            view.take(op, cause)
        if cause == "lagging":
            # not numbered on this member yet: DATA_RESYNC now, then the hub holds the
            # resume until it reaches the client's position, and DATA_SYNC then
            self.waiting_at = request.position
            self.connection.cause = None
        if self.waiting_at is not None and request.snapshot:
            self.connection.owed_at = (view.subject, self.waiting_at)

    def expect_jump(self, sync: CacheSync) -> None:
        """The member is about to jump to ``sync``: what may the hub say about it?"""
        connection = self.connection
        if connection is None:
            return
        subject = self.view.subject
        position = connection.hub.position(subject)
        waiting = self.waiting_at
        if waiting is not None and (position is None or position.seq == 0 or (
                waiting.epoch == position.epoch and waiting.seq > position.seq)):
            position = waiting  # still waiting: its own position decides
        records = [r for r in sync.subjects if r.subject == subject]
        if position is waiting and not records:
            # a resume the hub holds, and the sync does not number the subject (a member
            # back from a crash jumping to its empty start): it goes on waiting, and gets
            # DATA_SYNC once the member reaches it (its DATA_RESYNC came at connect)
            connection.cause = None
            return
        connection.cause = resync_cause(position, records[0] if records else None,
                                        snapshot=position is waiting
                                        and connection.owed_at is not None)

    def read(self, now: float) -> None:
        """Take what the connection holds; on a gap resubscribe from the position."""
        connection = self.connection
        if connection is None:
            return
        for op, cause in connection.read():
            self.view.take(op, cause)
        if self.view.needs_resubscribe:
            self.view.needs_resubscribe = False
            self.connect(connection.member, now)

    def close(self) -> None:
        """The connection is gone; frames not read yet are lost."""
        connection = self.connection
        if connection is not None:
            connection.hub.unsubscribe(connection, self.view.subject)
        self.connection = None


@dataclass
class Publish:
    """One client publish and the answers its client got (a PublishReply)."""

    member: str
    incarnation: int
    origin: str
    publisher: str | None  # None: a publisher without order to keep
    message: Message
    results: list[ops.PublishStatus] = field(default_factory=list)

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.results.append(status)

    def flush(self) -> None:
        pass


def frames_of(link_: UpstreamLink, most: int) -> list[link.LinkOp | None]:
    """Up to ``most`` operations the seed sent on the link; None once it closed."""
    out: list[link.LinkOp | None] = []
    for _ in range(most):
        try:
            frame = wire_bytes(link_.receive.receive_nowait())
        except trio.WouldBlock:
            break
        except (trio.EndOfChannel, trio.ClosedResourceError):
            out.append(None)
            break
        out.append(_decoded(frame))
    return out


def _decoded(data: bytes) -> link.LinkOp:
    """The one operation in ``data``: a frame, or the frames of a sync in parts."""
    assembly = SyncAssembly()
    while data:
        size = int.from_bytes(data[:4], "big")
        op, data = link.decode_op(data[4:4 + size]), data[4 + size:]
        if isinstance(op, link.SyncPart):
            sync = assembly.add(op)
            op = link.Sync(sync) if sync is not None else op
        if not isinstance(op, link.SyncPart):
            assert not data, "one queued item is one operation"
            return op
    raise AssertionError("a sync in parts without its last part")
