"""The cluster as a state machine: 3 seeds + 2 non-seeds over an abstract Raft, no threads.

One committed log of CommittedBatch, numbered by every live seed's Coordinator (they
must agree). Members apply it through their Replica, lag behind it, crash, restart
from the log or from a Raft dump plus a cache sync; subscribers read through the SDK's
SubjectTracker and fail over by position. ``cluster_checker`` holds the invariants.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from cluster_checker import (
    CommittedLog,
    SubscriberView,
    check_member,
    check_subscribers,
    resync_cause,
)
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from cluster.coordination import (
    UNNUMBERED_EPOCH,
    CommittedBatch,
    Coordinator,
    PublishRequest,
)
from cluster.replica import Offer, Replica
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker

SEEDS = ("seed-0", "seed-1", "seed-2")
MEMBERS = (*SEEDS, "edge-0", "edge-1")
SUBJECTS = ("/Stocks/NYSE/IBM", "/Stocks/NASDAQ/GM", "/Scores/NBA/LAL")  # IBM, GM: one group
PUBLISHERS = (None, "p0", "p1")  # None: a publisher without order to keep
MAX_SUBSCRIBERS = 5

picks = st.integers(0, 1_000)


class Connection:
    """A subscriber's WebSocket to one member: frames the hub wrote, read later."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.frames: list[bytes] = []
        self._decoder = FrameDecoder(client_frames=False)

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)

    def read(self) -> list[ops.ServerOp]:
        data, self.frames = b"".join(self.frames), []
        return [ops.decode_server_op(e.data) for e in self._decoder.events(data)]  # type: ignore[union-attr]


@dataclass
class Member:
    name: str
    replica: Replica | None = None  # None: down
    connected: bool = True  # False: cut off from the committed stream
    feed: int = 0  # how many batches of the log its stream has offered

    @property
    def serving(self) -> bool:
        return self.replica is not None and not self.replica.needs_sync


@dataclass
class Subscriber:
    view: SubscriberView
    connection: Connection | None = None


@dataclass
class Pending:
    request: PublishRequest
    publisher: str | None


@dataclass
class Publishing:
    pending: list[Pending] = field(default_factory=list)
    acked: dict[int, Message] = field(default_factory=dict)  # ref -> committed message
    unknown: set[int] = field(default_factory=set)  # dropped in flight: never acked
    counters: dict[str, int] = field(default_factory=dict)
    entries: list[tuple[int, tuple[PublishRequest, ...]]] = field(default_factory=list)


class ClusterMachine(RuleBasedStateMachine):
    replica_class: type[Replica] = Replica
    coordinator_class: type[Coordinator] = Coordinator

    def __init__(self) -> None:
        super().__init__()
        self.log = CommittedLog()
        self.members = {name: Member(name) for name in MEMBERS}
        self.coordinators: dict[str, Coordinator] = {}
        self.leader = SEEDS[0]
        self.publishing = Publishing()
        self.subscribers: list[Subscriber] = []
        self.max_cached = 1000
        self.now = 0.0

    # --- setup and helpers ---------------------------------------------------------

    @initialize(max_cached=st.sampled_from([2, 1000]))
    def start_cluster(self, max_cached: int) -> None:
        self.max_cached = max_cached
        for member in self.members.values():
            member.replica = self._new_replica(needs_sync=False)
        self.coordinators = {seed: self.coordinator_class() for seed in SEEDS}

    def _new_replica(self, *, needs_sync: bool) -> Replica:
        hub = Hub(epoch=UNNUMBERED_EPOCH, max_cached_messages=self.max_cached)
        return self.replica_class(hub, needs_sync=needs_sync)

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def _serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.serving]

    @staticmethod
    def _choose(candidates: Sequence[Member], pick: int) -> Member | None:
        return candidates[pick % len(candidates)] if candidates else None

    # --- publishing and committing ---------------------------------------------------

    @rule(pick=picks, subject=st.sampled_from(SUBJECTS), publisher=st.sampled_from(PUBLISHERS),
          retained=st.booleans())
    def publish(self, pick: int, subject: str, publisher: str | None, retained: bool) -> None:
        member = self._choose(self._serving(), pick)
        if member is None:
            return
        name = publisher or "anon"
        counter = self.publishing.counters.get(name, 0)
        self.publishing.counters[name] = counter + 1
        fields = {"by": name, f"f{counter % 3}": str(counter)}
        message = Message(subject, f"{name}#{counter}".encode(), fields, retained=retained)
        ref = sum(self.publishing.counters.values())
        self.publishing.pending.append(Pending(PublishRequest(member.name, ref, message), publisher))

    @rule(data=st.data(), epoch_candidate=st.integers(1, 2**48 - 1))
    def commit(self, data: st.DataObject, epoch_candidate: int) -> None:
        if sum(seed in self.coordinators for seed in SEEDS) < 2:
            return  # no quorum
        chosen = self._choose_batch(data)
        requests = tuple(p.request for p in chosen)
        batches = {s: c.apply_batch(epoch_candidate, requests) for s, c in self.coordinators.items()}
        batch = batches[self.leader]
        assert all(b == batch for b in batches.values()), "seeds numbered a batch differently"
        self.publishing.entries.append((epoch_candidate, requests))
        self.log.append(batch)
        self._acknowledge(batch, chosen)

    def _choose_batch(self, data: st.DataObject) -> list[Pending]:
        """Some pending requests of reachable members; each publisher's stay a prefix in order."""
        chosen: list[Pending] = []
        blocked: set[str | None] = set()
        for pending in self.publishing.pending:
            origin = self.members[pending.request.origin]
            take = origin.connected and pending.publisher not in blocked and data.draw(st.booleans())
            if take:
                chosen.append(pending)
            elif pending.publisher is not None:
                blocked.add(pending.publisher)
        keys = data.draw(st.lists(st.integers(0, 99), min_size=len(chosen), max_size=len(chosen)))
        for publisher in {p.publisher for p in chosen if p.publisher is not None}:
            mine = [i for i, p in enumerate(chosen) if p.publisher == publisher]
            for i, key in zip(mine, sorted(keys[i] for i in mine), strict=True):
                keys[i] = key  # an interleaving that keeps each publisher's order
        return [p for _, p in sorted(zip(keys, chosen, strict=True), key=lambda kp: kp[0])]

    def _acknowledge(self, batch: CommittedBatch, chosen: list[Pending]) -> None:
        for pending, message, origin in zip(chosen, batch.messages, batch.origins, strict=True):
            request = pending.request
            assert origin == (request.origin, request.ref)
            assert (message.subject, message.content) == (request.message.subject,
                                                          request.message.content)
            self.publishing.acked[request.ref] = message  # PUBLISH_OK with its position
            self.publishing.pending.remove(pending)

    @rule(drops=st.lists(st.booleans(), max_size=8), pick=picks)
    def leader_change(self, drops: list[bool], pick: int) -> None:
        """A new Raft leader; requests in flight at the old one may be lost (never acked)."""
        live = [s for s in SEEDS if s in self.coordinators]
        self.leader = live[pick % len(live)]
        pending = self.publishing.pending
        for index in reversed([i for i, drop in enumerate(drops[: len(pending)]) if drop]):
            self.publishing.unknown.add(pending.pop(index).request.ref)

    # --- members ---------------------------------------------------------------------

    @rule(name=st.sampled_from(MEMBERS), drops=st.lists(st.booleans(), max_size=8), pick=picks)
    def crash(self, name: str, drops: list[bool], pick: int) -> None:
        member = self.members[name]
        seeds_down = sum(seed not in self.coordinators for seed in SEEDS)
        if member.replica is None or (name in SEEDS and seeds_down >= 1):
            return  # 3 seeds tolerate one down
        member.replica, member.connected = None, True
        for pending in [p for p in self.publishing.pending if p.request.origin == name]:
            self.publishing.pending.remove(pending)
            self.publishing.unknown.add(pending.request.ref)
        if name in SEEDS:
            del self.coordinators[name]
            if self.leader == name:
                self.leader_change(drops, pick)
        self._fail_over(name, pick, lose_unread=True)

    @rule(name=st.sampled_from(MEMBERS), from_dump=st.booleans())
    def restart(self, name: str, from_dump: bool) -> None:
        member = self.members[name]
        if member.replica is not None:
            return
        if from_dump:  # Raft sent a state dump: the stream goes on after it, sync first
            member.replica = self._new_replica(needs_sync=len(self.log) > 0)
            member.feed = len(self.log)
        else:  # the log is replayed from the start
            member.replica = self._new_replica(needs_sync=False)
            member.feed = 0
        if name in SEEDS:
            self.coordinators[name] = self._restored_coordinator(from_dump)

    def _restored_coordinator(self, from_dump: bool) -> Coordinator:
        leader = self.coordinators[self.leader]
        if from_dump:
            restored: Coordinator = pickle.loads(pickle.dumps(leader))
        else:
            restored = self.coordinator_class()
            for epoch_candidate, requests in self.publishing.entries:
                restored.apply_batch(epoch_candidate, requests)
        assert restored.to_state() == leader.to_state(), "a restored seed numbers differently"
        return restored

    @rule(name=st.sampled_from(MEMBERS), pick=picks)
    def sync(self, name: str, pick: int) -> None:
        member = self.members[name]
        if member.replica is None or not member.replica.needs_sync:
            return
        applied = member.replica.applied_clsn
        peers = [m for m in self._serving() if m.replica and m.replica.applied_clsn >= applied]
        peer = self._choose(peers, pick)
        if peer is None or peer.replica is None:
            return
        member.replica.install_sync(peer.replica.make_sync(), self._tick())
        member.feed = member.replica.applied_clsn  # the stream goes on after the sync

    @rule(name=st.sampled_from(MEMBERS), connected=st.booleans())
    def partition(self, name: str, connected: bool) -> None:
        self.members[name].connected = connected

    @rule(name=st.sampled_from(MEMBERS), count=st.integers(1, 4), pick=picks)
    def deliver(self, name: str, count: int, pick: int) -> None:
        member = self.members[name]
        for _ in range(count):
            if member.replica is None or not member.connected or member.feed >= len(self.log):
                return
            offer = member.replica.offer(self.log.batches[member.feed], self._tick())
            member.feed += 1
            if offer is Offer.GAP:  # the runtime closes its clients with 1013
                self._fail_over(name, pick, lose_unread=True)

    @rule(name=st.sampled_from(MEMBERS), noticed=st.booleans())
    def jump_ahead(self, name: str, noticed: bool) -> None:
        """The stream of a lagging member skips ahead (Raft sent a dump instead of the log).

        Noticed at once (the dump's clsn) or only when the next batch is a gap.
        """
        member = self.members[name]
        member.feed = len(self.log)
        if noticed and member.replica is not None:
            member.replica.skip_to(len(self.log))

    # --- subscribers -----------------------------------------------------------------

    @rule(subject=st.sampled_from(SUBJECTS), pick=picks)
    def subscribe(self, subject: str, pick: int) -> None:
        member = self._choose(self._serving(), pick)
        if member is None or len(self.subscribers) >= MAX_SUBSCRIBERS:
            return
        view = SubscriberView(f"sub-{len(self.subscribers)}", subject, SubjectTracker(subject))
        subscriber = Subscriber(view)
        self.subscribers.append(subscriber)
        self._connect(subscriber, member)

    @rule(pick=picks)
    def read(self, pick: int) -> None:
        if self.subscribers:
            self._read(self.subscribers[pick % len(self.subscribers)])

    @rule(pick=picks)
    def reconnect(self, pick: int) -> None:
        for subscriber in self.subscribers:
            if subscriber.connection is None:
                member = self._choose(self._serving(), pick)
                if member is not None:
                    self._connect(subscriber, member)

    def _connect(self, subscriber: Subscriber, member: Member) -> None:
        assert member.replica is not None
        hub, view = member.replica.hub, subscriber.view
        request = view.tracker.request()
        records = [r for r in hub.export_subjects() if r.subject == view.subject]
        view.expected_cause = resync_cause(request.position, records[0] if records else None)
        subscriber.connection = Connection(member.name)
        for op in hub.subscribe(subscriber.connection, request, self._tick()):
            view.take(op)

    def _read(self, subscriber: Subscriber) -> None:
        connection = subscriber.connection
        if connection is None:
            return
        for op in connection.read():
            subscriber.view.take(op)
        if subscriber.view.needs_resubscribe:  # the SDK resubscribes from its position
            subscriber.view.needs_resubscribe = False
            self._connect(subscriber, self.members[connection.member])

    def _fail_over(self, name: str, pick: int, *, lose_unread: bool) -> None:
        member = self.members[name]
        for subscriber in self.subscribers:
            connection = subscriber.connection
            if connection is None or connection.member != name:
                continue
            if member.replica is not None:
                member.replica.hub.unsubscribe(connection, subscriber.view.subject)
            if lose_unread:
                connection.frames.clear()
            subscriber.connection = None
            target = self._choose(self._serving(), pick)
            if target is not None:
                self._connect(subscriber, target)

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def members_hold_the_committed_log(self) -> None:
        for member in self._serving():
            assert member.replica is not None
            check_member(member.name, member.replica.hub, member.replica.applied_clsn, self.log,
                         self.max_cached)

    @invariant()
    def subscribers_see_the_committed_log(self) -> None:
        check_subscribers((s.view for s in self.subscribers), self.log, final=False)

    @invariant()
    def unknown_outcomes_are_never_acknowledged(self) -> None:
        assert not self.publishing.unknown & self.publishing.acked.keys()

    def teardown(self) -> None:
        if self.coordinators:  # initialized
            self.heal_and_drain()

    def heal_and_drain(self) -> None:
        """Every member back and connected, every batch applied, every frame read."""
        for name, member in self.members.items():
            if member.replica is None:
                self.restart(name, from_dump=False)
            member.connected = True
        for member in self.members.values():  # the link tells the clsn it goes on from
            assert member.replica is not None
            if member.feed == len(self.log):
                member.replica.skip_to(len(self.log))
        if not self._serving():  # nobody to sync from: one member replays the log
            self.members[SEEDS[0]].replica = None
            self.restart(SEEDS[0], from_dump=False)
        for _ in range(3):
            for name in MEMBERS:
                self.deliver(name, count=len(self.log) + 1, pick=0)
                self.sync(name, pick=0)
            self.reconnect(pick=0)
            for subscriber in self.subscribers:
                self._read(subscriber)
        for member in self.members.values():
            assert member.serving and member.replica is not None
            assert member.replica.applied_clsn == len(self.log), f"{member.name} did not catch up"
        self.members_hold_the_committed_log()
        check_subscribers((s.view for s in self.subscribers), self.log, final=True)


ClusterMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cluster_machine = ClusterMachine.TestCase


# --- the checker is shown to fail ------------------------------------------------------


class SkippingReplica(Replica):
    """Planted bug: silently skips the messages of batch 2."""

    def offer(self, batch: CommittedBatch, now: float) -> Offer:
        if batch.clsn == 2 and self.applied_clsn == 1 and not self.needs_sync:
            self._applied_clsn = 2
            return Offer.APPLIED
        return super().offer(batch, now)


class SeqReusingCoordinator(Coordinator):
    """Planted bug: every message of a subject after its second gets seq 2 again."""

    def _number(self, epoch_candidate: int, message: Message) -> Message:
        numbered = super()._number(epoch_candidate, message)
        if numbered.seq > 2:
            self.seqs[message.subject] = 2
            return numbered.with_position(numbered.epoch, 2)
        return numbered


class SkippingMachine(ClusterMachine):
    replica_class = SkippingReplica


class SeqReusingMachine(ClusterMachine):
    coordinator_class = SeqReusingCoordinator


@pytest.mark.parametrize("machine", [SkippingMachine, SeqReusingMachine])
def test_cluster_checker_catches_a_planted_bug(machine: type[ClusterMachine]) -> None:
    planted = settings(
        max_examples=300,
        stateful_step_count=50,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=planted)
