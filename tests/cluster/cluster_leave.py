# mypy: disable-error-code="attr-defined"
"""A seed whose Raft node stopped leaves through another seed (test helper).

A mixin of ``cluster_machine.ClusterMachine``. The product's path
(``GuaranteedNode._leave_after_raft_stopped``, cluster/node.py; docs/cluster.md "Its
own clients"): a seed's Raft node stops (its disk) at any point -- with its own
publishes and its non-seeds' forwards in flight, some passed on to the leader (they may
still commit), the rest lost with it; batches not delivered to it yet. Its stopped node
answers nothing again; a submit to it is refused at once ``RAFT_STOPPED``
(``cluster.raft_outcomes``: a forward ends that non-seed's link, its own stay pending).
The member then follows another seed as a non-seed does -- the real
``UpstreamReplication`` around its own stream and publishing, whose ``start_link``
forwards its unanswered publishes again first (``ClusterPublishing.resend_unanswered``;
copies of those that committed are repeats) -- while its subscribers read on. Once every
publish it took has its outcome it drains its clients (4502: they read what they were
sent, then resume elsewhere from their position) and exits; it comes back as a seed.

While it leaves, the member is a non-seed to the machine (``is_seed`` False, ``leaving``
True): it dials, reads and forwards through its link; it never votes or commits again,
and its heartbeats say it is not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_world import choose, picks
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from cluster import link
from cluster.forwarding import Outgoing
from cluster.raft_outcomes import CLOSED_NAME, raft_failed

if TYPE_CHECKING:
    from cluster_world import Member


class LeavingSeeds:
    def _may_stop_raft(self) -> list[Member]:
        """Seeds whose Raft may stop: one at a time, with another live seed to follow."""
        if any(m.leaving for m in self.members.values()):
            return []
        seeds = self._live(seeds=True)
        return seeds if len(seeds) >= 2 else []

    @precondition(lambda self: self._may_stop_raft())
    @rule(pick=picks, seed_pick=picks, passed_on=st.integers(0, 8), refused=st.booleans(),
          dial=st.booleans())
    def seed_raft_stops(self, pick: int, seed_pick: int, passed_on: int, refused: bool,
                        dial: bool) -> None:
        """A seed's Raft node stops (its disk). Of what it had submitted (its own and its
        non-seeds' forwards) the first ``passed_on`` reached the other seeds (may still
        commit), the rest are lost. ``refused``: its queued publishes were taken and
        refused ``RAFT_STOPPED`` before its submits ended. ``dial``: it links to another
        seed at once (else at its next delivery, its clients publishing meanwhile)."""
        member = choose(self._may_stop_raft(), pick)
        assert member is not None and member.stream is not None
        mine = [entry for entry in self.raft.in_flight if entry.via == member.name]
        for entry in mine[passed_on:]:
            self.raft.in_flight.remove(entry)  # (Raft passes a seed's entries on in order)
        self.raft.stop(member.name)  # what it passed on is in doubt; its barriers are gone
        publishing = member.stream.publishing
        if refused:
            requests = publishing.take_outgoing()
            origins = [(r.origin, r.ref) for r in requests]
            assert not raft_failed(member.stream, origins, CLOSED_NAME, unknown=False,
                                   reply_to=None, now=self.now)
        # GuaranteedNode._leave_after_raft_stopped: it follows the other seeds
        member.is_seed, member.leaving, member.late, member.held = False, True, 0, []
        member.upstream = self.upstream_class(
            name=member.name, seeds=[], password="model", stream=member.stream,
            outgoing=Outgoing(publishing), max_frame=link.MAX_FRAME,
        )
        if publishing.outgoing:
            self.unsubmitted.add(member.name)
        else:
            self.unsubmitted.discard(member.name)
        if dial and member.connected:
            seed = choose(self._live(seeds=True), seed_pick)
            if seed is not None:
                self._dial(member, seed)

    def _drainable(self) -> list[Member]:
        """Leaving seeds whose every publish has its outcome (the drain waits for each
        client's; the publish timeout ends the wait)."""
        return [m for m in self._live(seeds=False) if m.leaving and m.stream is not None
                and not m.stream.publishing.pending]

    @precondition(lambda self: self._drainable())
    @rule(pick=picks)
    def leaving_seed_drains(self, pick: int) -> None:
        """The leaving seed drains its clients: each reads what it was sent before its
        4502 DRAINED, then resumes from its position on another member; the member exits
        (it comes back as a seed: ``restart``)."""
        member = choose(self._drainable(), pick)
        assert member is not None
        for subscriber in self.subscribers:
            if subscriber.connection is not None and subscriber.connection.member is member:
                subscriber.read(self._tick())
                subscriber.close()
                target = choose([m for m in self._serving() if m is not member], pick)
                if target is not None:
                    subscriber.connect(target, self._tick())
        self._crash(member, pick)
