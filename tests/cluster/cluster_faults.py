# mypy: disable-error-code="attr-defined"
"""The fault rules of the cluster state machine, and its final recovery (test helper).

A mixin of ``cluster_machine.ClusterMachine``: the state and the helpers are the
machine's. Each rule names the failure it plays; the real code decides what the
members do about it, and the machine's invariants judge the outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_checker import check_subscribers
from cluster_consensus import FAILURES
from cluster_link_contract import check_sync_answer
from cluster_world import SEEDS, choose, picks
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from pysyncobj import FAIL_REASON

from cluster import link
from cluster.cache_sync import export_sync
from cluster.upstream import LeaveUpstream

if TYPE_CHECKING:
    from cluster_world import Member

reasons = st.sampled_from(FAILURES)
leader_losses = st.sampled_from(  # what a leader that lost its majority says
    (FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME,
     FAIL_REASON.MISSING_LEADER)
)



def _state(member: Member) -> tuple[object, ...]:
    replica = member.replica
    assert replica is not None
    subjects = export_sync(replica.hub, 0).subjects
    return (replica.applied_clsn, replica.needs_sync, replica.buffered, subjects)


class FaultRules:
    # --- Raft -------------------------------------------------------------------------

    # --- members ---------------------------------------------------------------------

    def _may_crash(self) -> list[Member]:
        seeds_down = any(not m.live or m.leaving for m in self.members.values()
                         if m.name in SEEDS)
        return [m for m in self._live() if not (seeds_down and m.is_seed)]

    @precondition(lambda self: self._may_crash())
    @rule(pick=picks)
    def crash(self, pick: int) -> None:
        """A member dies (3 seeds tolerate one down): its hub, its links, its clients;
        what it submitted to Raft may still commit, what it had not is gone."""
        member = choose(self._may_crash(), pick)
        assert member is not None
        self._crash(member, pick)

    def _crash(self, member: Member, pick: int) -> None:
        if member.is_seed:
            self.raft.stop(member.name)
        if member.is_seed or member.leaving:
            for edge in self._linked():
                if edge.link is not None and edge.link.seed == member.name:
                    edge.link.send.close()  # what it sent arrives, then the link ends
        if not member.is_seed:
            self._leave(member)
        self.unsubmitted.discard(member.name)
        member.stream, member.upstream, member.connected = None, None, True
        if member.leaving:  # (it comes back as the seed it is)
            member.is_seed, member.leaving = True, False
        self._fail_over(member, pick)

    @precondition(lambda self: any(not m.live for m in self.members.values()))
    @rule(pick=picks, from_dump=st.booleans())
    def restart(self, pick: int, from_dump: bool) -> None:
        """A member comes back: a seed from its last dump (the caches with it) and the log
        after it, or from its whole log; a non-seed empty (it dials a seed)."""
        member = choose([m for m in self.members.values() if not m.live], pick)
        assert member is not None
        self._restart(member, from_dump=from_dump)

    def _restart(self, member: Member, *, from_dump: bool) -> None:
        self._start(member)
        if member.is_seed:
            dump = self.raft.dumps.get(member.name) if from_dump else None
            sync = self.raft.restore(member.name, dump)
            if sync is not None:
                assert member.stream is not None
                assert member.stream.on_restore(sync, self._tick())
                member.feed = sync.clsn

    @precondition(lambda self: self._live())
    @rule(pick=picks, cut=st.booleans())
    def partition(self, pick: int, cut: bool) -> None:
        """Cut a member off (``cut``) -- a seed from Raft (it lags, is not ready), a
        non-seed from every seed (its link ends) -- or heal one."""
        member = choose([m for m in self._live() if m.connected == cut], pick)
        if member is None:
            return
        member.connected = not cut
        if cut and not member.is_seed:
            self._leave(member)

    @precondition(lambda self: self._linked() or any(
        m.stream.publishing.pending for m in self._live() if m.stream))
    @rule()
    def time_passes(self) -> None:
        """Seconds pass: publishes not answered in time get "outcome unknown"; upstream
        seeds not ready since then are left at their next heartbeat."""
        self.now += 6.0
        for member in self._live():
            assert member.stream is not None
            member.stream.publishing.expire(self.now)

    # --- gaps and syncs ----------------------------------------------------------------

    @precondition(lambda self: self._live(seeds=True))
    @rule(seeds=st.sets(st.sampled_from(SEEDS), min_size=1), count=st.integers(1, 3))
    def seed_batches_late(self, seeds: set[str], count: int) -> None:
        """The streams of ``seeds`` will get their next ``count`` batches only after the
        one that follows them: a gap, then batches buffered; each needs a peer's sync.
        (The Raft thread hands batches over in order: this plays the seeds' defensive
        sync path, cluster/seed.py ``_sync_from_a_peer_seed``.)"""
        for name in seeds:
            self.members[name].late = count

    def _needy_seeds(self) -> list[Member]:
        return [m for m in self._live(seeds=True) if m.replica and m.replica.needs_sync]

    @precondition(lambda self: self._needy_seeds())
    @rule(pick=picks, peer_pick=picks)
    def seed_asks_for_sync(self, pick: int, peer_pick: int) -> None:
        """A seed that needs a sync asks a peer seed for one at its floor (cluster/seed.py
        ``_sync_from``). The peer may be behind or need a sync itself: then it refuses."""
        member = choose(self._needy_seeds(), pick)
        peer = choose([m for m in self._live(seeds=True) if m is not member], peer_pick)
        if member is not None and peer is not None:
            self._ask_for_sync(member, peer)

    def _ask_for_sync(self, member: Member, peer: Member) -> None:
        assert member.replica is not None and member.stream is not None
        assert peer.stream is not None
        stream, floor, needed = member.stream, member.replica.sync_floor, not peer.serving
        given = peer.stream.sync_for(floor)
        if not isinstance(given, link.SyncRefused):  # a sync, written in parts
            given = link.Sync(given.capture.whole())
        answer = link.decode_op(link.encode_frame(given)[4:])
        check_sync_answer(answer, floor=floor, giver_needed_sync=needed, log=self.log,
                          max_cached=self.max_cached)
        if isinstance(answer, link.Sync):
            sync = answer.sync
            self._jump(member, sync, lambda: stream.install_sync(sync, self._tick()))

    def _stale_pairs(self) -> list[tuple[Member, Member]]:
        return [(m, p) for m in self._live() for p in self._serving()
                if p.applied < m.applied]

    @precondition(lambda self: self._stale_pairs())
    @rule(pick=picks)
    def offer_stale_sync(self, pick: int) -> None:
        """A peer behind a member offers it its caches (a seed that fell behind, or an
        answer to an old request): refused, nothing changes (a non-seed leaves that
        seed)."""
        pairs = self._stale_pairs()
        member, peer = pairs[pick % len(pairs)]
        assert peer.replica is not None and member.stream is not None
        sync = peer.replica.make_sync()
        assert sync is not None
        before, stream = _state(member), member.stream
        upstream, link_ = member.upstream, member.link
        if upstream is not None and link_ is not None:
            try:
                self._jump(member, sync, lambda: upstream._on_op(
                    link_.seed, link.Sync(sync), self._tick()))
            except LeaveUpstream:
                self._leave(member)
            else:
                raise AssertionError(f"{member.name} stayed with a seed that offered an old sync")
        else:
            installed = self._jump(member, sync, lambda: stream.install_sync(sync, self._tick()))
            assert not installed, f"{member.name} installed a sync older than what it applied"
        assert _state(member) == before, f"{member.name} changed on a sync older than it"

    # --- upstream links --------------------------------------------------------------

    # --- the end: everything comes back --------------------------------------------

    def heal_and_drain(self) -> None:
        """Every member back (seeds from their dumps), connected and caught up; Raft
        settles what it has; every publish answered; every subscriber reads it all."""
        for member in self.members.values():
            member.connected = True
            if not member.live:
                self._restart(member, from_dump=True)
        for _ in range(3):
            for member in self._live(seeds=False):
                if member.link is None:
                    self._dial(member, self._heal_seed())
            for member in self._submitters():
                self._submit(member, None)
            self._settle_raft()
            for _ in range(len(self.members)):
                self._catch_up_everyone()
        for member in self.members.values():
            assert member.serving, f"{member.name} is not whole"
            assert member.applied == len(self.log), f"{member.name} did not catch up"
        for _ in range(2):
            self.reconnect()
            for subscriber in self.subscribers:
                subscriber.read(self._tick())
        self.members_hold_the_committed_log()
        check_subscribers((s.view for s in self.subscribers), self.log, final=True)
        self.check_final_answers()

    def _heal_seed(self) -> Member:
        """The seed the non-seeds follow at the end (a leaving seed follows another)."""
        return next(m for m in self.members.values() if m.is_seed and m.live)

    def _settle_raft(self) -> None:
        if self.raft.in_flight:
            self._commit(self.raft.committable(lambda _: True), 7)
        if self.raft.barriers or self._in_doubt():
            barrier = self._commit([], 7)
            self.settle_at[barrier.clsn] = self.raft.discard_in_doubt()

    def _catch_up_everyone(self) -> None:
        for seed in self._live(seeds=True):
            seed.late = 0
            self._feed_seed(seed, len(self.log), pick=0)
            self._offer_held(seed, pick=0)
        whole = [m for m in self._live(seeds=True)
                 if m.serving and m.feed == len(self.log)]
        for seed in self._needy_seeds():
            if whole:
                self._ask_for_sync(seed, whole[0])
            else:  # nobody to sync from: a seed replays its log
                self._crash(seed, pick=0)
                self._restart(seed, from_dump=False)
        for member in self._live(seeds=False):
            if member.link is None:
                self._dial(member, self._heal_seed())
            self._receive(member, 10**6, pick=0)

    def check_final_answers(self) -> None:
        """Once everything is committed and applied, every publish whose client is still
        connected is answered exactly once (after the timeout for the lost ones)."""
        self.now += 60.0
        for member in self._live():
            assert member.stream is not None
            member.stream.publishing.expire(self.now)
        self.publishes_are_answered_truthfully()
        for publish in self.publishes.values():
            member = self.members[publish.member]
            if member.live and member.incarnation == publish.incarnation:
                assert len(publish.results) == 1, f"{publish.message.content!r} never answered"

