# mypy: disable-error-code="attr-defined"
"""Upstream links of the cluster state machine (test helper).

A mixin of ``cluster_machine.ClusterMachine``. A non-seed's link to its upstream seed
is the seed's real follower queue (``CommittedStream.follow``), read later by the
non-seed's real ``UpstreamReplication`` decisions; every frame is checked against the
link contract (``cluster_link_contract``). A link ends with what was still in flight
lost; the non-seed then dials a seed -- whichever answers -- and forwards what it had
forwarded unanswered to it again (the real ``start_link``), ahead of its newer publishes.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, TypeVar

import trio
from cluster_consensus import InFlight
from cluster_link_contract import LinkContract
from cluster_world import UpstreamLink, choose, frames_of, picks
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from cluster import link
from cluster.stream import Outbound
from cluster.upstream import LeaveUpstream

if TYPE_CHECKING:
    from cluster_world import Member

T = TypeVar("T")


class UpstreamLinks:
    def _linked(self) -> list[Member]:
        return [m for m in self._live(seeds=False) if m.link is not None]

    def _unlinked(self) -> list[Member]:
        """Non-seeds that would dial a seed now."""
        if not self._live(seeds=True):
            return []
        return [m for m in self._live(seeds=False) if m.link is None and m.connected]

    def _receive(self, member: Member, count: int, pick: int) -> None:
        """A non-seed takes up to ``count`` frames from its upstream link."""
        link_ = member.link
        assert link_ is not None and member.upstream is not None
        for op in frames_of(link_, count):
            if op is None:  # the seed closed the link
                self._leave(member)
                return
            link_.contract.check(op, self.log)
            try:
                if isinstance(op, link.Sync):
                    self._jump(member, op.sync, lambda op=op: member.upstream._on_op(
                        link_.seed, op, self._tick()))
                else:
                    member.upstream._on_op(link_.seed, op, self._tick())
            except LeaveUpstream:
                if self.shed_at_gap and member.replica is not None and member.replica.needs_sync:
                    self._fail_over(member, pick)
                self._leave(member)
                return

    def _dial(self, member: Member, seed: Member) -> None:
        """A non-seed asks ``seed`` to replicate to it (cluster/upstream.py ``_follow``)."""
        assert member.upstream is not None and seed.stream is not None
        replicate = member.upstream.start_link(seed.name, self._tick())
        if member.upstream.stream.publishing.outgoing:  # what it forwards again, first
            self.unsubmitted.add(member.name)
        send, receive = trio.open_memory_channel[Outbound](self.follower_queue)
        contract = LinkContract(member.name, member.applied, self.max_cached)
        member.link = UpstreamLink(seed.name, send, receive, contract)
        seed.stream.follow(member.name, replicate.from_clsn, replicate.full, send)

    def _leave(self, member: Member) -> None:
        """The non-seed's link ends (cluster/peers.py unfollows it on the seed's side)."""
        link_ = member.link
        if link_ is None:
            return
        member.link = None
        if member.upstream is not None:
            member.upstream.end_link()
        seed = self.members[link_.seed]
        if seed.stream is not None:
            follower = seed.stream.followers.get(member.name)
            if follower is not None and follower.queue is link_.send:
                seed.stream.unfollow(member.name)
        link_.close()

    def _heartbeats(self) -> None:
        """Idle links carry a heartbeat (cluster/peers.py's writer)."""
        for seed in self._live(seeds=True):
            assert seed.stream is not None
            for follower in list(seed.stream.followers.values()):
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                    follower.queue.send_nowait(seed.stream.heartbeat())

    @precondition(lambda self: self._linked())
    @rule(pick=picks, seed_pick=picks, read=st.integers(0, 3))
    def switch_upstream(self, pick: int, seed_pick: int, read: int) -> None:
        """A non-seed takes ``read`` more frames, then leaves its seed mid-stream (silent,
        not ready, a reset): what was in flight is lost; it goes on from another seed,
        behind it or ahead."""
        member = choose(self._linked(), pick)
        assert member is not None
        if read:
            self._receive(member, read, pick)
        old = member.link.seed if member.link is not None else None
        self._leave(member)
        seed = choose([m for m in self._live(seeds=True) if m.name != old], seed_pick)
        if seed is not None and member.live and member.connected:
            self._dial(member, seed)


    def _overtakable(self) -> list[InFlight]:
        """Forwards in flight through a seed their non-seed has left since."""
        out = []
        for entry in self.raft.in_flight:
            if entry.reply_to is None or entry.overtaken:
                continue
            link_ = self.members[entry.reply_to].link
            if link_ is None or link_.seed != entry.via:
                out.append(entry)
        return out

    @precondition(lambda self: self._overtakable())
    @rule()
    def forwards_overtaken(self) -> None:
        """What a non-seed forwarded to a seed it has left since reaches that seed late (a
        stalled link, a stopped seed), after what it forwarded next through another seed:
        Raft may take them after the newer ones."""
        for entry in self._overtakable():
            entry.overtaken = True
        self.raft.in_flight.sort(key=self._raft_order)
