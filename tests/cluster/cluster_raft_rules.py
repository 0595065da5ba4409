# mypy: disable-error-code="attr-defined"
"""Raft rules of the cluster state machine: submitting, committing, failing (test helper).

A mixin of ``cluster_machine.ClusterMachine`` (the state and helpers are the
machine's). Raft itself is ``cluster_consensus``; what a seed does with Raft's answers
is the real ``cluster/raft_outcomes.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_consensus import FAILURES, NEVER_COMMITS, Barrier, InFlight
from cluster_faults import _state
from cluster_world import SEEDS, bursts, choose, picks
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from pysyncobj import FAIL_REASON

from cluster.coordination import CommittedBatch, PublishRequest
from cluster.raft_outcomes import CLOSED_NAME, barrier_committed, raft_failed

if TYPE_CHECKING:
    from cluster_world import Member

takes = st.integers(0, 3).map(lambda n: n != 3)  # mostly True
epochs = st.integers(1, 2**48 - 1)
reasons = st.sampled_from(FAILURES)
leader_losses = st.sampled_from(  # what a leader that lost its majority says
    (FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME,
     FAIL_REASON.MISSING_LEADER)
)


def fail_name(reason: int) -> str:
    return next(k for k, v in vars(FAIL_REASON).items() if v == reason and k.isupper())


class RaftRules:
    def _submitters(self) -> list[Member]:
        seeds = [m for m in self._live(seeds=True) if m.connected]
        edges = [m for m in self._linked() if m.link and self.members[m.link.seed].live]
        return [m for m in (*seeds, *edges) if m.name in self.unsubmitted]

    @precondition(lambda self: self._submitters())
    @rule(pick=picks, refusal=st.none() | st.sampled_from(FAILURES))
    def submit(self, pick: int, refusal: int | None) -> None:
        """A seed submits its clients' publishes to Raft, a non-seed forwards them to its
        upstream seed, which submits them; Raft takes them or refuses (``refusal``)."""
        member = choose(self._submitters(), pick)
        assert member is not None
        self._submit(member, refusal)

    def _submit(self, member: Member, refusal: int | None) -> None:
        assert member.stream is not None
        requests = member.stream.publishing.take_outgoing()
        self.unsubmitted.discard(member.name)
        if member.is_seed:
            via, reply_to = member, None
        else:
            assert member.link is not None
            via, reply_to = self.members[member.link.seed], member.name
            if via.leaving:  # its stopped Raft node refuses at once (cluster/raft.py)
                assert via.stream is not None
                raft_failed(via.stream, [(r.origin, r.ref) for r in requests], CLOSED_NAME,
                            unknown=False, reply_to=reply_to, now=self.now)
                return
        entries = [self._in_flight(r, via.name, reply_to) for r in requests]
        if refusal is None or refusal not in NEVER_COMMITS:
            self.raft.in_flight.extend(entries)
            self.raft.in_flight.sort(key=self._raft_order)
        if refusal is not None:
            for entry in entries:
                entry.in_doubt = True
            self._raft_told(via, reply_to, [(r.origin, r.ref) for r in requests], refusal)

    def _raft_order(self, entry: InFlight) -> tuple[bool, int]:
        """Raft takes entries in publish order, those overtaken last."""
        return entry.overtaken, self.publish_order[entry.request.message.content]

    def _in_flight(self, request: PublishRequest, via: str, reply_to: str | None) -> InFlight:
        publisher = self.publishes[request.message.content].publisher
        return InFlight(request, publisher, via, reply_to)

    def _raft_told(
        self, via: Member, reply_to: str | None, origins: list[tuple[str, int]], reason: int
    ) -> None:
        """Raft failed ``via``'s submission with ``reason``: the seed's reaction is the
        real one (cluster/raft_outcomes.py), a barrier when the outcome is unknown."""
        assert via.stream is not None
        unknown = reason not in self.definite_failures
        if raft_failed(via.stream, origins, fail_name(reason), unknown=unknown,
                       reply_to=reply_to, now=self.now):
            barrier = Barrier(via.name, via.incarnation, origins, fail_name(reason), reply_to)
            self.raft.barriers.append(barrier)

    @precondition(lambda self: self.raft.quorum and self.raft.in_flight)
    @rule(data=st.data(), epoch_candidate=epochs)
    def commit(self, data: st.DataObject, epoch_candidate: int) -> None:
        """Raft commits a batch of some entries in flight."""
        self._commit(self.raft.committable(lambda _: data.draw(takes)), epoch_candidate)

    def _commit(self, chosen: list[InFlight], epoch_candidate: int) -> CommittedBatch:
        batch = self.raft.commit(chosen, epoch_candidate)
        self.log.append(batch)
        return batch

    @precondition(lambda self: self.raft.quorum and (self.raft.barriers or self._in_doubt()))
    @rule(data=st.data(), epoch_candidate=epochs)
    def barrier(self, data: st.DataObject, epoch_candidate: int) -> None:
        """A seed's barrier commits (an empty batch): entries in doubt commit before it or
        never; each seed settles its barriers when its own stream reaches it."""
        chosen = self.raft.committable(lambda _: data.draw(takes))
        if chosen:
            self._commit(chosen, epoch_candidate)
        barrier = self._commit([], epoch_candidate)
        self.settle_at[barrier.clsn] = self.raft.discard_in_doubt()

    def _in_doubt(self) -> bool:
        return any(entry.in_doubt for entry in self.raft.in_flight)

    def _settle_barriers(self, member: Member, clsn: int) -> None:
        """The seed's barriers committed up to ``clsn`` settle (their callback comes after
        every batch before them is handed over)."""
        for at in [c for c in self.settle_at if c <= clsn]:
            for barrier in [b for b in self.settle_at[at]
                            if (b.via, b.incarnation) == (member.name, member.incarnation)]:
                self.settle_at[at].remove(barrier)
                assert member.stream is not None
                barrier_committed(member.stream, barrier.origins, barrier.error,
                                  reply_to=barrier.reply_to, now=self.now)

    @precondition(lambda self: any(not e.in_doubt for e in self.raft.in_flight))
    @rule(lost=st.integers(1, 3), reason=reasons)
    def leader_change(self, lost: int, reason: int) -> None:
        """A new Raft leader: Raft fails the last ``lost`` entries in flight with
        ``reason`` to their submitters (they are lost, or may still commit)."""
        for entry in [e for e in self.raft.in_flight if not e.in_doubt][::-1][:lost]:
            self._raft_fails(entry, reason)

    def _older_forwards(self) -> list[InFlight]:
        """Forwards in flight with a newer request of their origin in flight after them."""
        newest: dict[str, int] = {}
        for entry in self.raft.in_flight:
            origin, ref = entry.request.origin, entry.request.ref
            newest[origin] = max(ref, newest.get(origin, ref))
        return [e for e in self.raft.in_flight if not e.in_doubt and e.reply_to is not None
                and e.request.ref < newest[e.request.origin]]

    @precondition(lambda self: self._older_forwards())
    @rule(pick=picks, reason=reasons)
    def leader_change_midway(self, pick: int, reason: int) -> None:
        """A new Raft leader fails a non-seed's forward whose newer ones it took (they
        went to the new leader): lost, or in doubt until a barrier -- a copy of it sent
        again through another seed comes after the newer ones were numbered, and is
        dropped (``CommittedBatch.overtaken``: the publish failed for sure)."""
        entry = choose(self._older_forwards(), pick)
        assert entry is not None
        self._raft_fails(entry, reason)

    def _raft_fails(self, entry: InFlight, reason: int) -> None:
        if reason in NEVER_COMMITS:
            self.raft.in_flight.remove(entry)
        else:
            entry.in_doubt = True
        via = self.members[entry.via]
        if via.live and not via.leaving:  # (a stopped Raft node hears nothing)
            origins = [(entry.request.origin, entry.request.ref)]
            self._raft_told(via, entry.reply_to, origins, reason)

    @precondition(lambda self: self.raft.quorum and not self.majority_lost)
    @rule(pick=picks, burst=bursts, survivors=st.integers(0, 1), reason=leader_losses,
          compacted=st.booleans(), power_cut=st.booleans())
    def lose_majority(
        self,
        pick: int,
        burst: list[tuple[str, str | None, bool]],
        survivors: int,
        reason: int,
        compacted: bool,
        power_cut: bool = False,
    ) -> None:
        """Under load (``burst`` just submitted), seeds die until at most one is left (once
        a run): nothing commits until a majority is back (restart). The survivor's Raft
        fails what it had in flight with ``reason``. ``compacted``: every seed had just
        compacted its log (so every one restarts from a dump, with the caches in it).
        ``power_cut`` (with no survivor): every non-seed dies in the same step, its
        forwards and clients with it; all come back in any order (restart)."""
        self.majority_lost = True
        if self._serving():
            self.publish(pick, burst, submit=True)
        if compacted:
            for seed in self._live(seeds=True):
                self.raft.dump(seed.name)
        busy = {entry.via for entry in self.raft.in_flight}
        live = sorted(self._live(seeds=True), key=lambda m: m.name not in busy)
        for seed in live[survivors:]:  # a seed with entries in flight survives if one does
            self._crash(seed, pick)
        if power_cut and not survivors:
            for non_seed in self._live(seeds=False):
                self._crash(non_seed, pick)
        for entry in [e for e in self.raft.in_flight if not e.in_doubt]:
            if self.members[entry.via].live:
                self._raft_fails(entry, reason)

    def _may_compact(self) -> list[Member]:
        return [m for m in self._live(seeds=True)
                if self.raft.dumps.get(m.name, (-1, b""))[0] < len(self.log)]

    @precondition(lambda self: self._may_compact())
    @rule(seeds=st.sets(st.sampled_from(SEEDS), min_size=1))
    def compact(self, seeds: set[str]) -> None:
        """Seeds compact their Raft log into a dump of the replicated state (each on its
        own, at the same thresholds: often all of them)."""
        for seed in self._may_compact():
            if seed.name in seeds:
                self.raft.dump(seed.name)

    def _behind_a_dump(self) -> list[tuple[Member, str]]:
        """(a lagging seed, a live seed whose dump is past it)"""
        return [(m, leader.name) for m in self._live(seeds=True) if m.connected
                for leader in self._live(seeds=True)
                if leader is not m and self.raft.dumps.get(leader.name, (-1, b""))[0] > m.feed]

    @precondition(lambda self: self._behind_a_dump())
    @rule(pick=picks)
    def raft_sends_dump(self, pick: int) -> None:
        """The leader sends a lagging seed its dump instead of the log it compacted: the
        seed jumps to the dump's caches, then takes the batches after it. A seed whose
        stream is already past the dump (its Raft log lagged; at a gap its stream took a
        peer seed's caches) refuses it, changing nothing: it would move its clients
        back."""
        pairs = self._behind_a_dump()
        member, leader = pairs[pick % len(pairs)]
        assert member.stream is not None
        stream, dump = member.stream, self.raft.dumps[leader]
        sync = self.raft.restore(member.name, dump)
        assert sync is not None
        before, ahead = _state(member), member.applied > sync.clsn
        installed = self._jump(member, sync, lambda: stream.on_restore(sync, self._tick()))
        assert installed != ahead, (
            f"{member.name} at clsn {member.applied} {'took' if installed else 'refused'} "
            f"the Raft dump at clsn {sync.clsn}"
        )
        if not installed:
            assert _state(member) == before, f"{member.name} changed on a dump behind it"
        member.feed = dump[0]

