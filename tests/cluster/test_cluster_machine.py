"""The cluster as a state machine: 3 seeds + 2 non-seeds over an abstract Raft, no threads.

One committed log of CommittedBatch, numbered by every live seed's Coordinator (they
must agree). Members apply it through their Replica, lag behind it, crash, restart
from the log or from a Raft dump plus a cache sync; subscribers read through the SDK's
SubjectTracker and fail over by position. ``cluster_checker`` holds the invariants;
``test_cluster_checker`` shows them failing on planted bugs.

Not modelled: Raft itself (elections, log divergence: the committed log is given),
the loss of ALL Raft state (new epochs for used groups), conflation, history, cache
expiry by time, and the wire between members (a member's stream is an index into the
log).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence

from cluster_checker import CommittedLog, SubscriberView, check_member, check_subscribers
from cluster_world import Member, Pending, Publishing, Subscriber
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cluster.coordination import UNNUMBERED_EPOCH, Coordinator
from cluster.replica import Offer, Replica
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker


def install_from(member: Replica, peer: Replica, now: float) -> None:
    """A cache sync from ``peer`` (never behind ``member``: the rules pick it so)."""
    sync = peer.make_sync()
    assert sync is not None, "a peer needing a sync was asked for one"
    assert member.install_sync(sync, now), "a sync older than the member was installed"

SEEDS = ("seed-0", "seed-1", "seed-2")
MEMBERS = (*SEEDS, "edge-0", "edge-1")
SUBJECTS = ("/Stocks/NYSE/IBM", "/Stocks/NASDAQ/GM", "/Scores/NBA/LAL")  # IBM, GM: one group
PUBLISHERS = (None, "p0", "p1")  # None: a publisher without order to keep
MAX_SUBSCRIBERS = 5

picks = st.integers(0, 1_000)
takes = st.integers(0, 3).map(lambda n: n != 3)  # mostly True
losses = st.integers(0, 2)
epochs = st.integers(1, 2**48 - 1)
publications = st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(PUBLISHERS), st.booleans())
bursts = st.lists(publications, min_size=1, max_size=4)


class ClusterMachine(RuleBasedStateMachine):
    replica_class: type[Replica] = Replica
    coordinator_class: type[Coordinator] = Coordinator

    def __init__(self) -> None:
        super().__init__()
        self.log = CommittedLog()
        self.members = {name: Member(name) for name in MEMBERS}
        self.coordinators: dict[str, Coordinator] = {}  # the live seeds' replicated state
        self.leader = SEEDS[0]
        self.publishing = Publishing()
        self.subscribers: list[Subscriber] = []
        self.max_cached = 1000
        self.now = 0.0

    @initialize(max_cached=st.sampled_from([2, 1000]))
    def start_cluster(self, max_cached: int) -> None:
        self.max_cached = max_cached
        for member in self.members.values():
            member.replica = self._new_replica()
        self.coordinators = {seed: self.coordinator_class() for seed in SEEDS}

    def _new_replica(self) -> Replica:
        hub = Hub(epoch=UNNUMBERED_EPOCH, max_cached_messages=self.max_cached)
        return self.replica_class(hub)

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def _live(self) -> list[Member]:
        return [m for m in self.members.values() if m.replica is not None]

    def _down(self) -> list[Member]:
        return [m for m in self.members.values() if m.replica is None]

    def _serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.serving]

    def _needing_sync(self) -> list[Member]:
        return [m for m in self._live() if m.replica and m.replica.needs_sync]

    def _connected(self, connected: bool = True) -> list[Member]:
        return [m for m in self._live() if m.connected == connected]

    def _lagging(self) -> list[Member]:
        """Connected members whose stream has batches left to offer."""
        return [m for m in self._connected() if m.feed < len(self.log)]

    @staticmethod
    def _choose(candidates: Sequence[Member], pick: int) -> Member | None:
        return candidates[pick % len(candidates)] if candidates else None

    # --- publishing and committing ---------------------------------------------------

    def _quorum(self) -> bool:
        return sum(seed in self.coordinators for seed in SEEDS) >= 2

    @precondition(lambda self: self._serving())
    @rule(pick=picks, burst=bursts)
    def publish(self, pick: int, burst: list[tuple[str, str | None, bool]]) -> None:
        """Clients publish at a serving member."""
        member = self._choose(self._serving(), pick)
        assert member is not None
        for subject, publisher, retained in burst:
            self.publishing.take(member.name, subject, publisher, retained)

    @precondition(lambda self: self._quorum())
    @rule(data=st.data(), epoch_candidate=epochs)
    def commit(self, data: st.DataObject, epoch_candidate: int) -> None:
        """Raft commits a batch of some pending requests, in some interleaving."""
        chosen = self._committable(lambda: data.draw(takes))
        keys = data.draw(st.lists(st.integers(0, 99), min_size=len(chosen), max_size=len(chosen)))
        for publisher in {p.publisher for p in chosen if p.publisher is not None}:
            mine = [i for i, p in enumerate(chosen) if p.publisher == publisher]
            for i, key in zip(mine, sorted(keys[i] for i in mine), strict=True):
                keys[i] = key  # an interleaving that keeps each publisher's order
        order = sorted(range(len(chosen)), key=lambda i: keys[i])
        self._commit([chosen[i] for i in order], epoch_candidate)

    @precondition(lambda self: self._serving() and self._quorum())
    @rule(pick=picks, burst=bursts, epoch_candidate=epochs)
    def traffic(
        self, pick: int, burst: list[tuple[str, str | None, bool]], epoch_candidate: int
    ) -> None:
        """A quiet moment: publishes, a batch of all that can go, every member fed."""
        self.publish(pick, burst)
        self._commit(self._committable(lambda: True), epoch_candidate)
        self.deliver_everywhere(1)

    def _committable(self, take: Callable[[], bool]) -> list[Pending]:
        """Pending requests of connected members that ``take`` says yes to, in order.

        Each publisher's requests in the result are a prefix of its pending ones.
        """
        chosen: list[Pending] = []
        blocked: set[str | None] = set()
        for pending in self.publishing.pending:
            connected = self.members[pending.request.origin].connected
            if connected and pending.publisher not in blocked and take():
                chosen.append(pending)
            elif pending.publisher is not None:
                blocked.add(pending.publisher)
        return chosen

    def _commit(self, chosen: list[Pending], epoch_candidate: int) -> None:
        """Raft commits a batch: every live seed numbers it, identically; origins ack."""
        requests = tuple(p.request for p in chosen)
        batches = {
            s: c.apply_batch(epoch_candidate, requests) for s, c in self.coordinators.items()
        }
        batch = batches[self.leader]
        assert all(b == batch for b in batches.values()), "seeds numbered a batch differently"
        self.publishing.entries.append((epoch_candidate, requests))
        self.log.append(batch)
        self.publishing.acknowledge(batch, chosen)

    @rule(lost=losses, pick=picks)
    def leader_change(self, lost: int, pick: int) -> None:
        """A new Raft leader; the last requests in flight at the old one may be lost."""
        live = [s for s in SEEDS if s in self.coordinators]
        self.leader = live[pick % len(live)]
        for pending in self.publishing.pending[::-1][:lost]:
            self.publishing.lose(pending)

    # --- members ---------------------------------------------------------------------

    def _may_crash(self) -> list[Member]:
        seed_down = any(seed not in self.coordinators for seed in SEEDS)
        return [m for m in self._live() if not (seed_down and m.name in SEEDS)]

    @precondition(lambda self: self._may_crash())
    @rule(pick=picks, lost=losses)
    def crash(self, pick: int, lost: int) -> None:
        """A member dies (3 seeds tolerate one down): its hub, in-flight publishes, clients."""
        member = self._choose(self._may_crash(), pick)
        assert member is not None
        member.replica, member.connected = None, True
        for pending in [p for p in self.publishing.pending if p.request.origin == member.name]:
            self.publishing.lose(pending)
        if member.name in SEEDS:
            del self.coordinators[member.name]
            if self.leader == member.name:
                self.leader_change(lost, pick)
        self._fail_over(member, pick)

    @precondition(lambda self: self._down())
    @rule(pick=picks, from_dump=st.booleans())
    def restart(self, pick: int, from_dump: bool) -> None:
        member = self._choose(self._down(), pick)
        assert member is not None
        self._restart(member, from_dump=from_dump)

    def _restart(self, member: Member, *, from_dump: bool) -> None:
        member.replica = self._new_replica()
        member.feed = 0  # the log is replayed from the start, or
        if from_dump:  # Raft sent a state dump: the stream goes on after it, sync first
            member.feed = len(self.log)
            member.replica.skip_to(len(self.log))
        if member.name in SEEDS:
            self.coordinators[member.name] = self._restored_coordinator(from_dump=from_dump)

    def _restored_coordinator(self, *, from_dump: bool) -> Coordinator:
        leader = self.coordinators[self.leader]
        if from_dump:
            restored: Coordinator = pickle.loads(pickle.dumps(leader))
        else:
            restored = self.coordinator_class()
            for epoch_candidate, requests in self.publishing.entries:
                restored.apply_batch(epoch_candidate, requests)
        assert restored.to_state() == leader.to_state(), "a restored seed numbers differently"
        return restored

    @precondition(lambda self: self._needing_sync())
    @rule(pick=picks, restream=st.booleans())
    def sync(self, pick: int, restream: bool) -> None:
        """Install a cache sync from a serving peer that is not behind.

        Then the stream starts again after the sync's clsn, or goes on where it was
        (the batches buffered meanwhile fill in).
        """
        member = self._choose(self._needing_sync(), pick)
        assert member is not None and member.replica is not None
        applied = member.replica.applied_clsn
        peers = [p for p in self._serving() if p.replica and p.replica.applied_clsn >= applied]
        peer = self._choose(peers, pick)
        if peer is not None and peer.replica is not None:
            install_from(member.replica, peer.replica, self._tick())
            if restream:
                member.feed = member.replica.applied_clsn

    @precondition(lambda self: self._connected())
    @rule(pick=picks)
    def partition(self, pick: int) -> None:
        """Cut a member off the committed stream: it lags, its publishes wait."""
        member = self._choose(self._connected(), pick)
        assert member is not None
        member.connected = False

    @precondition(lambda self: self._connected(False))
    @rule(pick=picks)
    def heal(self, pick: int) -> None:
        member = self._choose(self._connected(False), pick)
        assert member is not None
        member.connected = True

    @precondition(lambda self: self._lagging())
    @rule(pick=picks, count=st.integers(1, 4))
    def deliver(self, pick: int, count: int) -> None:
        """A connected member consumes its next batches."""
        member = self._choose(self._lagging(), pick)
        assert member is not None
        self._deliver(member, count, pick)

    @rule(count=st.integers(1, 4))
    def deliver_everywhere(self, count: int) -> None:
        """Every connected member consumes its next batches."""
        for member in self._lagging():
            self._deliver(member, count, pick=count)

    def _deliver(self, member: Member, count: int, pick: int) -> None:
        for _ in range(count):
            if member.replica is None or not member.connected or member.feed >= len(self.log):
                return
            offer = member.replica.offer(self.log.batches[member.feed], self._tick())
            member.feed += 1
            if offer is Offer.GAP:  # the runtime closes its clients with 1013
                self._fail_over(member, pick)

    @precondition(lambda self: self._lagging())
    @rule(pick=picks, noticed=st.booleans())
    def jump_ahead(self, pick: int, noticed: bool) -> None:
        """The stream of a lagging member skips ahead (Raft sent a dump instead of the log).

        Noticed at once (the dump's clsn) or only when the next batch is a gap.
        """
        member = self._choose(self._lagging(), pick)
        assert member is not None and member.replica is not None
        member.feed = len(self.log)
        if noticed and member.replica.skip_to(len(self.log)):
            self._fail_over(member, pick)

    # --- subscribers -----------------------------------------------------------------

    @precondition(lambda self: len(self.subscribers) < MAX_SUBSCRIBERS)
    @precondition(lambda self: self._serving())
    @rule(subject=st.sampled_from(SUBJECTS), pick=picks)
    def subscribe(self, subject: str, pick: int) -> None:
        member = self._choose(self._serving(), pick)
        assert member is not None
        view = SubscriberView(f"sub-{len(self.subscribers)}", subject, SubjectTracker(subject))
        subscriber = Subscriber(view)
        self.subscribers.append(subscriber)
        subscriber.connect(member, self._tick())

    @precondition(lambda self: self.subscribers)
    @rule(pick=picks)
    def read(self, pick: int) -> None:
        """A subscriber reads what its connection holds."""
        self.subscribers[pick % len(self.subscribers)].read(self._tick())

    @precondition(lambda self: any(s.connection is None for s in self.subscribers))
    @rule(pick=picks)
    def reconnect(self, pick: int) -> None:
        for subscriber in self.subscribers:
            member = self._choose(self._serving(), pick)
            if subscriber.connection is None and member is not None:
                subscriber.connect(member, self._tick())

    def _fail_over(self, member: Member, pick: int) -> None:
        """Clients of a member that died or must resync lose what they had not read."""
        for subscriber in self.subscribers:
            if subscriber.connection is not None and subscriber.connection.member is member:
                subscriber.close()
                target = self._choose(self._serving(), pick)
                if target is not None:
                    subscriber.connect(target, self._tick())

    # --- invariants ------------------------------------------------------------------

    @invariant()
    def members_hold_the_committed_log(self) -> None:
        for member in self._serving():
            assert member.replica is not None
            check_member(
                member.name,
                member.replica.hub,
                member.replica.applied_clsn,
                self.log,
                self.max_cached,
            )

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
        """Every member back, connected and caught up; every subscriber reads everything."""
        for member in self.members.values():
            if member.replica is None:
                self._restart(member, from_dump=False)
            member.connected = True
            assert member.replica is not None  # the link tells the clsn it goes on from:
            if member.feed == len(self.log) and member.replica.skip_to(len(self.log)):
                self._fail_over(member, pick=0)
        for _ in range(len(MEMBERS)):
            for member in self._serving():
                self._deliver(member, len(self.log), pick=0)
            self._sync_all_from_a_caught_up_member()
        for _ in range(2):
            self.reconnect(pick=0)
            for subscriber in self.subscribers:
                subscriber.read(self._tick())
        for member in self.members.values():
            assert member.serving and member.replica is not None
            assert member.replica.applied_clsn == len(self.log), f"{member.name} did not catch up"
        self.members_hold_the_committed_log()
        check_subscribers((s.view for s in self.subscribers), self.log, final=True)

    def _sync_all_from_a_caught_up_member(self) -> None:
        caught_up = [m for m in self._serving() if m.hub and m.feed == len(self.log)]
        if not caught_up:  # nobody to sync from: a member replays the log
            self._restart(self.members[SEEDS[0]], from_dump=False)
            return
        peer = caught_up[0]
        assert peer.replica is not None
        for member in self._needing_sync():
            assert member.replica is not None
            install_from(member.replica, peer.replica, self._tick())
            member.feed = member.replica.applied_clsn


ClusterMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cluster_machine = ClusterMachine.TestCase
