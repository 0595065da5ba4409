"""The cluster as a state machine: 3 seeds + 2 non-seeds over an abstract Raft, no threads.

Every member is the real composition without its I/O: a CommittedStream (followers,
ring, sync_for) around ClusterPublishing and a Replica; a non-seed replicates through
the real UpstreamReplication decisions from the frames its seed's stream queued for
it, over links that switch, drop frames and end. Seeds hold the real replicated state
(CoordinationConsumer: numbering and caches) and its dumps (``cluster_consensus``).
Subscribers read through the SDK's SubjectTracker and fail over by position; every
publish records the answers its client got.

``cluster_checker`` and ``cluster_link_contract`` hold the invariants;
``test_cluster_checker`` shows each failing on a planted bug. The fault rules are in
``cluster_faults``; a seed whose Raft node stops and leaves through another seed in
``cluster_leave``.

Not modelled: Raft's own elections and log divergence (the committed log is given),
the loss of ALL Raft state (new epochs for used groups), conflation, history, cache
expiry by time, readiness timing (a member serves once it is whole), and bytes on
the wire (frames are whole; a link loses a suffix of them when it ends).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from cluster_checker import (
    CommittedLog,
    SubscriberView,
    check_member,
    check_publish_answers,
    check_subscribers,
)
from cluster_consensus import Barrier, Consensus
from cluster_faults import FaultRules
from cluster_leave import LeavingSeeds
from cluster_links import UpstreamLinks
from cluster_raft_rules import RaftRules, epochs
from cluster_world import (
    BATCH_SPACES,
    MEMBERS,
    SEEDS,
    SUBJECTS,
    Member,
    Publish,
    Subscriber,
    bursts,
    choose,
    picks,
)
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cluster import link
from cluster.cache_sync import CacheSync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator
from cluster.forwarding import Outgoing
from cluster.publishing import ClusterPublishing
from cluster.raft import DEFINITE_FAILURES, CoordinationConsumer
from cluster.replica import Offer, Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.model.message import Message
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker

MAX_SUBSCRIBERS = 5
RING_BATCHES = 3  # short: a non-seed that fell further behind needs a whole sync
FOLLOWER_QUEUE = 24  # a follower further behind than this is dropped (it will resume)
PUBLISH_TIMEOUT = 5.0
TICK = 0.01

T = TypeVar("T")


class ClusterMachine(
    RaftRules, UpstreamLinks, FaultRules, LeavingSeeds, RuleBasedStateMachine
):
    # hooks for planted bugs (test_cluster_planted)
    replica_class: type[Replica] = Replica
    stream_class: type[CommittedStream] = CommittedStream
    upstream_class: type[UpstreamReplication] = UpstreamReplication
    coordinator_class: type[Coordinator] = Coordinator
    publishing_class: type[ClusterPublishing] = ClusterPublishing
    consumer_class: type[CoordinationConsumer] = CoordinationConsumer
    definite_failures: frozenset[int] = DEFINITE_FAILURES
    incarnations_in_origins = True
    follower_queue = FOLLOWER_QUEUE

    def __init__(self) -> None:
        super().__init__()
        self.log = CommittedLog()
        self.members = {name: Member(name, name in SEEDS) for name in MEMBERS}
        self.raft = Consensus(self._make_consumer)
        self.majority_lost = False
        self.unsubmitted: set[str] = set()  # members whose clients' publishes wait
        self.publishes: dict[bytes, Publish] = {}
        self.publish_order: dict[bytes, int] = {}
        self.homes: dict[str, str] = {}  # an ordered publisher's member (its connection)
        self.counters: dict[str, int] = {}
        self.subscribers: list[Subscriber] = []
        self.settle_at: dict[int, list[Barrier]] = {}  # barrier batch clsn -> barriers
        self.max_cached = 1000
        self.shed_at_gap = True
        self.now = 0.0

    def _make_consumer(
        self, on_commit: Callable[[CommittedBatch], None], on_restore: Callable[[CacheSync], None]
    ) -> CoordinationConsumer:
        consumer = self.consumer_class(on_commit, on_restore, self.max_cached)
        consumer.coordinator = self.coordinator_class()
        return consumer

    @initialize(max_cached=st.sampled_from([2, 1000]), shed_at_gap=st.booleans())
    def start_cluster(self, max_cached: int, shed_at_gap: bool = True) -> None:
        """``shed_at_gap``: a member that finds a gap sends its clients away at once
        (else they stay through the sync -- the product sheds them after 3 s)."""
        self.max_cached, self.shed_at_gap = max_cached, shed_at_gap
        for member in self.members.values():
            self._start(member)
            if member.is_seed:
                self.raft.start(member.name)

    def _start(self, member: Member) -> None:
        """A new incarnation of ``member``: fresh hub, replica, publishing, stream."""
        member.incarnation += 1
        hub = Hub(epoch=UNNUMBERED_EPOCH, max_cached_messages=self.max_cached,
                  cache_expire_seconds=1e9)
        origin = f"{member.name}#{member.incarnation}"
        publishing = self.publishing_class(
            origin=origin if self.incarnations_in_origins else member.name,
            replica=self.replica_class(hub),
            publish_timeout=PUBLISH_TIMEOUT,
        )
        member.stream = self.stream_class(
            publishing, ring_size=RING_BATCHES, is_ready=lambda: self._ready(member)
        )
        member.feed, member.high_water, member.link, member.late = 0, 0, None, 0
        member.held = []
        if not member.is_seed:
            member.upstream = self.upstream_class(
                name=member.name, seeds=[], password="model", stream=member.stream,
                outgoing=Outgoing(publishing), max_frame=link.MAX_FRAME,
            )

    def _ready(self, member: Member) -> bool:
        """What a member's heartbeats and sync answers say about itself (a seed whose Raft
        stopped: not ready)."""
        if member.leaving:
            return False
        if not member.is_seed:
            return member.serving and member.link is not None
        return self.raft.quorum and member.connected and member.serving

    def _tick(self) -> float:
        self.now += TICK
        return self.now

    def _live(self, seeds: bool | None = None) -> list[Member]:
        return [m for m in self.members.values()
                if m.live and (seeds is None or m.is_seed == seeds)]

    def _serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.serving]

    def _lagging(self) -> list[Member]:
        """Members with batches or frames to take (or a seed to dial first)."""
        seeds = [m for m in self._live(seeds=True) if m.connected and m.feed < len(self.log)]
        return [*seeds, *self._linked(), *self._unlinked()]

    # --- publishing and committing ---------------------------------------------------

    @precondition(lambda self: self._serving())
    @rule(pick=picks, burst=bursts, submit=st.booleans())
    def publish(self, pick: int, burst: list[tuple[str, str | None, bool]],
                submit: bool = False) -> None:
        """Clients publish at a serving member (an ordered publisher stays on its member,
        its connection, while that one lives); ``submit``: handed to Raft at once."""
        member = choose(self._serving(), pick)
        assert member is not None
        for subject, publisher, retained in burst:
            at = member
            if publisher is not None:
                home = self.members.get(self.homes.get(publisher, ""))
                at = home if home is not None and home.live else member
                self.homes[publisher] = at.name
            self._publish(at, subject, publisher, retained)
        if submit:
            for submitter in self._submitters():
                self._submit(submitter, None)

    def _publish(self, member: Member, subject: str, publisher: str | None,
                 retained: bool) -> None:
        assert member.stream is not None
        name = publisher or "anon"
        counter = self.counters.get(name, 0)
        self.counters[name] = counter + 1
        fields = {"by": name, f"f{counter % 3}": str(counter)}
        message = Message(subject, f"{name}#{counter}".encode(), fields, retained=retained)
        publishing = member.stream.publishing
        record = Publish(member.name, member.incarnation, publishing.origin, publisher, message)
        self.publishes[message.content] = record
        self.publish_order[message.content] = len(self.publish_order)
        publishing.submit(message, record, self.now)
        self.unsubmitted.add(member.name)

    @precondition(lambda self: self._serving() and self.raft.quorum)
    @rule(pick=picks, rounds=st.lists(bursts, min_size=1, max_size=3),
          epoch_candidate=epochs, behind=st.sets(st.sampled_from(MEMBERS), max_size=2))
    def traffic(
        self,
        pick: int,
        rounds: list[list[tuple[str, str | None, bool]]],
        epoch_candidate: int,
        behind: set[str],
    ) -> None:
        """A quiet moment: rounds of publishes, each submitted and committed as a batch,
        then delivered to every member but those ``behind``."""
        for burst in rounds:
            if self._serving():
                self.publish(pick, burst, submit=True)
            if self.raft.in_flight:
                self._commit(self.raft.committable(lambda _: True), epoch_candidate)
        self._heartbeats()
        for member in self._lagging():
            if member.name not in behind:
                self._deliver(member, len(self.log), pick)

    # --- the committed stream ----------------------------------------------------------

    @precondition(lambda self: self._lagging())
    @rule(pick=picks, count=st.integers(1, 4))
    def deliver(self, pick: int, count: int) -> None:
        """A member takes its next batches (a seed from Raft, a non-seed from its link)."""
        member = choose(self._lagging(), pick)
        assert member is not None
        self._deliver(member, count, pick)

    @rule(count=st.integers(1, 4))
    def deliver_everywhere(self, count: int) -> None:
        """Every member takes its next batches; idle links carry a heartbeat first."""
        self._heartbeats()
        for member in self._lagging():
            self._deliver(member, count, pick=count)

    def _deliver(self, member: Member, count: int, pick: int) -> None:
        if member.is_seed:
            self._feed_seed(member, count, pick)
        else:
            if member.link is None:  # it dials a seed -- whichever answers: behind it,
                seed = choose(self._live(seeds=True), pick)  # ahead, not ready, needy
                assert seed is not None
                self._dial(member, seed)
            self._receive(member, count, pick)
        self._watch(member)

    def _feed_seed(self, member: Member, count: int, pick: int) -> None:
        for _ in range(count):
            stream = member.stream
            if stream is None or not member.connected or member.feed >= len(self.log):
                return
            batch = self.log.batches[member.feed]
            member.feed += 1
            if member.late:
                member.late -= 1
                member.held.append(batch)
                continue
            self._offer(member, batch, pick)
            self._offer_held(member, pick)
            self._settle_barriers(member, batch.clsn)

    def _offer_held(self, member: Member, pick: int) -> None:
        held, member.held = member.held, []
        for batch in held:
            self._offer(member, batch, pick)

    def _offer(self, member: Member, batch: CommittedBatch, pick: int) -> None:
        assert member.stream is not None
        if member.stream.on_committed(batch, self._tick()) is Offer.GAP:
            if self.shed_at_gap:
                self._fail_over(member, pick)  # the member sheds its clients (1013)
            peer = choose([m for m in self._live(seeds=True) if m is not member], pick)
            if peer is not None:  # cluster/seed.py: it asks a peer seed at once
                self._ask_for_sync(member, peer)

    def _jump(self, member: Member, sync: CacheSync, install: Callable[[], T]) -> T:
        """``member`` installs ``sync``: its subscribers may be told what it jumped over."""
        mine = [s for s in self.subscribers
                if s.connection is not None and s.connection.member is member]
        for subscriber in mine:
            subscriber.expect_jump(sync)
        try:
            return install()
        finally:
            for subscriber in mine:
                if subscriber.connection is not None:
                    subscriber.connection.cause = None

    # --- subscribers -----------------------------------------------------------------

    @precondition(lambda self: len(self.subscribers) < MAX_SUBSCRIBERS)
    @precondition(lambda self: self._serving())
    @rule(subject=st.sampled_from(SUBJECTS), pick=picks)
    def subscribe(self, subject: str, pick: int) -> None:
        member = choose(self._serving(), pick)
        assert member is not None
        view = SubscriberView(f"sub-{len(self.subscribers)}", subject, SubjectTracker(subject))
        subscriber = Subscriber(view, batch_space=BATCH_SPACES[len(self.subscribers) % 2])
        self.subscribers.append(subscriber)
        subscriber.connect(member, self._tick())

    @precondition(lambda self: self.subscribers)
    @rule(pick=picks)
    def read(self, pick: int) -> None:
        """A subscriber reads what its connection holds, or reconnects (to any serving
        member, resuming from its position)."""
        subscriber = self.subscribers[pick % len(self.subscribers)]
        member = choose(self._serving(), pick)
        if subscriber.connection is not None:
            subscriber.read(self._tick())
        elif member is not None:
            subscriber.connect(member, self._tick())

    def reconnect(self) -> None:
        for subscriber in self.subscribers:
            member = choose(self._serving(), 0)
            if subscriber.connection is None and member is not None:
                subscriber.connect(member, self._tick())

    def _fail_over(self, member: Member, pick: int) -> None:
        """Clients of a member that died or must resync lose what they had not read."""
        for subscriber in self.subscribers:
            if subscriber.connection is not None and subscriber.connection.member is member:
                subscriber.close()
                target = choose(self._serving(), pick)
                if target is not None:
                    subscriber.connect(target, self._tick())

    # --- invariants ------------------------------------------------------------------

    def _watch(self, member: Member) -> None:
        """A member never moves back within an incarnation."""
        if member.live:
            assert member.applied >= member.high_water, (
                f"{member.name} moved back from clsn {member.high_water} to {member.applied}"
            )
            member.high_water = member.applied

    @invariant()
    def members_never_move_back(self) -> None:
        for member in self.members.values():
            self._watch(member)

    @invariant()
    def members_hold_the_committed_log(self) -> None:
        for member in self._serving():
            check_member(member.name, member.hub, member.applied, self.log, self.max_cached)

    @invariant()
    def subscribers_see_the_committed_log(self) -> None:
        check_subscribers((s.view for s in self.subscribers), self.log, final=False)

    @invariant()
    def publishes_are_answered_truthfully(self) -> None:
        for publish in self.publishes.values():
            check_publish_answers(publish.message, publish.results, self.log)

    def teardown(self) -> None:
        if sys.exc_info()[1] is not None:
            return  # a step failed: let its error be the one reported
        if self.raft.consumers or any(m.live for m in self.members.values()):  # initialized
            self.heal_and_drain()

