"""The pieces of the simulated cluster around the code under test (test helper).

Members (a Replica each, or none while down), subscribers that speak to a member's hub
as the SDK does, and the publishes in flight. ``test_cluster_machine`` drives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster_checker import SubscriberView, resync_cause

from cluster.cache_sync import export_sync
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.replica import Replica
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol.websocket import BinaryMessage, FrameDecoder
from migratory.server.hub import Hub


@dataclass
class Member:
    name: str
    replica: Replica | None = None  # None: down
    connected: bool = True  # False: cut off from the committed stream
    feed: int = 0  # how many batches of the log its stream has offered

    @property
    def serving(self) -> bool:
        return self.replica is not None and not self.replica.needs_sync

    @property
    def hub(self) -> Hub:
        assert self.replica is not None, f"{self.name} is down"
        return self.replica.hub


class Connection:
    """A subscriber's WebSocket to one member: the frames its hub wrote, read later."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.hub = member.hub
        self.frames: list[bytes] = []
        self._decoder = FrameDecoder(client_frames=False)

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)

    def read(self) -> list[ops.ServerOp]:
        data, self.frames = b"".join(self.frames), []
        events = self._decoder.events(data)
        assert all(isinstance(e, BinaryMessage) for e in events)
        return [ops.decode_server_op(e.data) for e in events if isinstance(e, BinaryMessage)]


@dataclass
class Subscriber:
    """One subscribed subject of one client, through the SDK's tracker."""

    view: SubscriberView
    connection: Connection | None = None

    def connect(self, member: Member, now: float) -> None:
        """Subscribe, or resume from the tracker's position, as the SDK does."""
        hub, view = member.hub, self.view
        request = view.tracker.request()
        records = [r for r in export_sync(hub, 0).subjects if r.subject == view.subject]
        view.expected_cause = resync_cause(request.position, records[0] if records else None)
        self.connection = Connection(member)
        for op in hub.subscribe(self.connection, request, now):
            view.take(op)

    def read(self, now: float) -> None:
        """Take what the connection holds; on a gap resubscribe from the position."""
        connection = self.connection
        if connection is None:
            return
        for op in connection.read():
            self.view.take(op)
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
class Pending:
    request: PublishRequest
    publisher: str | None  # None: a publisher without order to keep


@dataclass
class Publishing:
    """Publishes in flight, acknowledged, or lost with an unknown outcome."""

    pending: list[Pending] = field(default_factory=list)
    acked: dict[int, Message] = field(default_factory=dict)  # ref -> committed message
    unknown: set[int] = field(default_factory=set)  # lost in flight: never acknowledged
    counters: dict[str, int] = field(default_factory=dict)
    entries: list[tuple[int, tuple[PublishRequest, ...]]] = field(default_factory=list)
    """The Raft log: (epoch candidate, requests) of every committed batch."""

    def take(self, member: str, subject: str, publisher: str | None, retained: bool) -> None:
        """A client publishes at ``member``; its content names it uniquely."""
        name = publisher or "anon"
        counter = self.counters.get(name, 0)
        self.counters[name] = counter + 1
        fields = {"by": name, f"f{counter % 3}": str(counter)}
        message = Message(subject, f"{name}#{counter}".encode(), fields, retained=retained)
        request = PublishRequest(member, sum(self.counters.values()), message)
        self.pending.append(Pending(request, publisher))

    def acknowledge(self, batch: CommittedBatch, chosen: list[Pending]) -> None:
        """The origins answer PUBLISH_OK with each committed message's position."""
        for pending, message, origin in zip(chosen, batch.messages, batch.origins, strict=True):
            request = pending.request
            assert origin == (request.origin, request.ref)
            assert message.content == request.message.content
            self.acked[request.ref] = message
            self.pending.remove(pending)

    def lose(self, pending: Pending) -> None:
        self.pending.remove(pending)
        self.unknown.add(pending.request.ref)
