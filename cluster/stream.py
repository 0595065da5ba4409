"""A member's copy of the committed stream, and the non-seeds that follow it from here.

Every committed batch (from Raft on a seed, from its upstream seed on a non-seed) is
applied here in CLSN order: to the replica (hub, fan-out), to the publishing
acknowledgements, to a ring of recent batches (:mod:`cluster.batch_ring`), and to each
follower (a non-seed
replicating from this member). A batch becomes one link frame the first time a
follower's writer takes it, shared by every follower from then on; a member nobody
follows (every seed of a cluster without non-seeds) never encodes one -- that was
12-15 % of a seed's CPU under the throughput benchmark.

A follower asks to be caught up from its own CLSN. It is never moved backwards:

- behind this member, within the ring: it gets the ring's later batches, then live;
- behind, beyond the ring, or asking for a full sync: it gets this member's caches
  (a :class:`~cluster.link.Sync`) as soon as this member is whole and has reached the
  follower's CLSN, then live batches after it;
- ahead of this member (it came from a seed further on): it gets only the batches
  after its CLSN, once this member reaches them.

No I/O here: frames go into each follower's bounded queue of bytes; the link writer
(:mod:`cluster.peers`) drains it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from cluster import link
from cluster.batch_ring import RING_BATCHES, RING_MESSAGES, BatchRing
from cluster.cache_sync import SLICE_MESSAGES, CacheSync, SyncInstall
from cluster.coordination import CommittedBatch
from cluster.link_sync import SyncFrames
from cluster.publishing import ClusterPublishing
from cluster.replica import Offer, Replica

log = logging.getLogger("migratory.cluster")

FOLLOWER_QUEUE = 50_000
"""Frames queued for one follower before it is dropped as too slow (it will resume)."""
FOLLOWER_QUEUE_BYTES = 2 * link.MAX_FRAME
"""Bytes queued for one follower (its batches' content and subjects, other frames'
lengths) before it is dropped as too slow: twice the largest frame (a whole cache
sync counts nothing: it is built a part at a time as it is written). Bounded by
frames alone, a follower stopped or cut off while large messages flowed held a
second copy of each (the ring has the first) until 50,000 frames had queued: 262 MB
more in a sequencer after 300 MB of 100 KiB messages with one worker SIGSTOPped.
Dropped, it resumes from the ring or a sync."""


class BatchFrame:
    """A committed batch, encoded into its link frame on first use and kept so."""

    __slots__ = ("_frame", "_size", "batch", "live")

    def __init__(self, batch: CommittedBatch, *, live: bool = True) -> None:
        """``live``: queued to every follower (not rebuilt from the ring for one)."""
        self.batch = batch
        self.live = live
        self._frame: bytes | None = None
        self._size: int | None = None

    @property
    def size(self) -> int:
        """What it counts in a follower's backlog: a live batch's encoded frame, made by
        the first writer that takes it, waits in every slower follower's queue -- its
        messages' content and subjects (counted once, before it is encoded); one rebuilt
        from the ring for a catching-up follower is encoded only when its writer takes
        it (its content is the ring's), so it counts 0."""
        if self._size is None:
            self._size = (
                sum(len(m.content) + len(m.subject) for m in self.batch.messages)
                if self.live else 0
            )
        return self._size

    @property
    def clsn(self) -> int:
        return self.batch.clsn

    @property
    def encoded(self) -> bool:
        return self._frame is not None

    def frame(self) -> bytes:
        if self._frame is None:
            self._frame = link.encode_frame(link.Batch(self.batch))
        return self._frame


Outbound = bytes | BatchFrame | SyncFrames
"""What a follower's queue holds: an encoded frame, a batch encoded when written, or a
cache sync built and written a part at a time (:class:`~cluster.link_sync.SyncFrames`)."""


def wire_bytes(item: Outbound) -> bytes:
    """The bytes to write for one queued item (all of a sync's frames at once: a link's
    writer writes those one by one instead)."""
    if isinstance(item, BatchFrame):
        return item.frame()
    if isinstance(item, SyncFrames):
        return b"".join(item.frames())
    return item


class Backlog:
    """The bytes queued for one follower's link and not taken by its writer yet: the
    stream adds what it queues, the writer (:mod:`cluster.peers`) calls :meth:`taken`.
    ``on_drop`` (set by the link) ends the link when the follower is dropped, so what
    is still queued goes at once, not when a stopped follower wakes up."""

    __slots__ = ("bytes", "on_drop", "syncs")

    def __init__(self, on_drop: Callable[[], object] | None = None) -> None:
        self.bytes = 0
        self.syncs = 0
        """Cache syncs queued and not taken yet (the link takes no request for another
        meanwhile, cluster/peers.py)."""
        self.on_drop = on_drop

    @staticmethod
    def size(item: Outbound) -> int:
        """A sync counts nothing: it holds references to cached messages, and is built
        a part at a time as its writer takes it."""
        if isinstance(item, BatchFrame):
            return item.size
        return 0 if isinstance(item, SyncFrames) else len(item)

    def queued(self, item: Outbound) -> None:
        self.bytes += self.size(item)
        self.syncs += isinstance(item, SyncFrames)

    def taken(self, item: Outbound) -> None:
        self.bytes -= self.size(item)
        self.syncs -= isinstance(item, SyncFrames)


@dataclass(slots=True)
class Follower:
    """A non-seed replicating from this member."""

    name: str
    queue: trio.MemorySendChannel[Outbound]
    after: int
    """It holds every batch up to here: only later ones are sent."""
    wants_sync: bool
    """It gets a whole cache sync once this member is whole and has reached ``after``."""
    backlog: Backlog


class CommittedStream:
    def __init__(
        self,
        publishing: ClusterPublishing,
        *,
        ring_size: int = RING_BATCHES,
        ring_messages: int = RING_MESSAGES,
        is_ready: Callable[[], bool] = lambda: True,
        queue_bytes: int = FOLLOWER_QUEUE_BYTES,
    ) -> None:
        """``queue_bytes``: a follower's backlog past which it is dropped."""
        self.publishing = publishing
        self.queue_bytes = queue_bytes
        self.replica: Replica = publishing.replica
        self.ring = BatchRing(max_batches=ring_size, max_messages=ring_messages)
        self.followers: dict[str, Follower] = {}
        self.is_ready = is_ready
        """Whether this member's own state is current (a seed with a Raft leader,
        caught up); sent to followers in heartbeats."""

    # --- the stream ---------------------------------------------------------------

    def on_committed(self, batch: CommittedBatch, now: float) -> Offer:
        """Apply one committed batch and pass it on to the followers."""
        offer = self.publishing.on_committed(batch, now)
        if offer is not Offer.APPLIED:
            return offer
        self.ring.append(batch)
        item = BatchFrame(batch)
        for follower in list(self.followers.values()):
            if follower.wants_sync:
                self._try_sync(follower)
            elif batch.clsn > follower.after:
                follower.after = batch.clsn
                self._send(follower, item)
        return offer

    def on_restore(self, sync: CacheSync, now: float) -> bool:
        """Raft loaded a dump (with the caches) at ``sync.clsn``; False if this member
        was already further (nothing changes)."""
        return self.install_sync(sync, now)

    def install_sync(self, sync: CacheSync, now: float, *, over: bool = False) -> bool:
        """Jump to ``sync`` (a peer's caches, or a Raft dump's); False, changing
        nothing, for a sync behind what this member applied (it would move clients
        back), unless ``over`` (:meth:`Replica.begin_install`'s). All at once:
        :meth:`install_sync_in_slices` keeps the loop turning."""
        if not self.replica.install_sync(sync, now, over=over):
            return False
        self.publishing.on_jump(now)
        self._installed_sync()
        return True

    async def install_sync_in_slices(
        self, sync: CacheSync, *, slice_messages: int | None = None, over: bool = False
    ) -> bool:
        """:meth:`install_sync`, ``slice_messages`` cached messages (None:
        :data:`~cluster.cache_sync.SLICE_MESSAGES`) at a time with a turn
        of the event loop between slices (:class:`~cluster.cache_sync.SyncInstall`): the
        default CacheMemoryBudget's ~660,000 messages installed at once stopped the
        member ~1-2 s. Until the last slice the replica needs a sync (batches held
        back, not ready, no sync given to others). Shielded from cancellation: the sync
        is here whole, and a member left half-installed would need another. False,
        changing nothing, for a sync behind this member; False also when a later sync
        (a Raft dump) took its place halfway (that one did the rest). ``over``: as
        :meth:`install_sync`'s."""
        install = self.replica.begin_install(sync, over=over)
        if install is None:
            return False
        return await self.finish_install(install, slice_messages=slice_messages)

    async def finish_install(
        self, install: SyncInstall, *, slice_messages: int | None = None
    ) -> bool:
        """The slices of an install begun with ``replica.begin_install`` (from the
        moment it is begun, later batches are held back behind it: a seed begins the
        install of a Raft dump in the callback that hands it over, before the batches
        after the dump); as :meth:`install_sync_in_slices`."""
        replica, budget = self.replica, slice_messages or SLICE_MESSAGES
        with trio.CancelScope(shield=True):
            while not replica.install_slice(install, trio.current_time(), budget):
                await trio.sleep(0)
            if not install.done:
                return False
            now = trio.current_time()
            self.publishing.on_jump(now)
            self._installed_sync()
        return True

    def _installed_sync(self) -> None:
        """This member jumped to a sync: the ring no longer leads up to it, and
        followers behind the jump need it too."""
        self.ring.clear()
        applied = self.replica.applied_clsn
        for follower in self.followers.values():
            if follower.after < applied:
                follower.wants_sync = True
        self._serve_waiting()

    # --- followers ----------------------------------------------------------------

    def follow(
        self,
        name: str,
        from_clsn: int,
        full: bool,
        queue: trio.MemorySendChannel[Outbound],
        backlog: Backlog | None = None,
    ) -> None:
        """``name`` replicates from here, holding every batch up to ``from_clsn``;
        ``backlog``: what its writer has not taken from ``queue`` yet (None: a new one).

        A follower of that name on another link is dropped, its link closed: left open,
        it got no batch again but its writer's heartbeats, so its member -- hearing from
        this seed, "catching up" for ever -- never left it (a process restarted before its
        old link was noticed dead, or two processes claiming one name)."""
        earlier = self.followers.get(name)
        if earlier is not None and earlier.queue is not queue:
            log.warning("replica %s linked again; closing its earlier link", name)
            self._drop(earlier)
        self.unfollow(name)
        applied = self.replica.applied_clsn
        follower = Follower(name, queue, after=from_clsn, wants_sync=full,
                            backlog=Backlog() if backlog is None else backlog)
        self.followers[name] = follower
        if full or from_clsn >= applied:
            how = "sync" if full else ("ahead: live only" if from_clsn > applied else "live")
        elif (first := self.ring.first_clsn) is not None and first <= from_clsn + 1:
            how = "from the ring"
            for batch in self.ring.after(from_clsn):
                self._send(follower, BatchFrame(batch, live=False))
            follower.after = applied
        else:
            how = "sync (beyond the ring)"
            follower.wants_sync = True
        if follower.wants_sync:
            self._try_sync(follower)
        self._send(follower, self.heartbeat())
        log.info("replicating to %s from clsn %d (%s; here %d)", name, from_clsn, how, applied)

    def unfollow(self, name: str) -> None:
        self.followers.pop(name, None)

    def end_link(self, name: str, why: str) -> None:
        """End the link of follower ``name`` (if it follows), nothing more sent on it."""
        follower = self.followers.get(name)
        if follower is not None:
            log.warning("ending the link of replica %s: %s", name, why)
            self._drop(follower)

    def send_to(self, name: str, op: link.LinkOp) -> bool:
        """One operation to a follower (a forward's outcome); False if it is gone."""
        follower = self.followers.get(name)
        if follower is None:
            return False
        self._send(follower, link.encode_frame(op))
        return True

    def heartbeat(self) -> bytes:
        return link.encode_frame(link.Heartbeat(self.replica.applied_clsn, self.is_ready()))

    def sync_for(self, min_clsn: int) -> SyncFrames | link.SyncRefused:
        """A whole cache sync at ``min_clsn`` or later (built as it is written), or why
        not now."""
        replica = self.replica
        if replica.needs_sync:
            return link.SyncRefused(replica.applied_clsn, "this member is waiting for a sync")
        if replica.applied_clsn < min_clsn:
            return link.SyncRefused(
                replica.applied_clsn,
                f"this member is at clsn {replica.applied_clsn}, behind {min_clsn}",
            )
        if not self.is_ready():
            return link.SyncRefused(replica.applied_clsn, "this member is not ready")
        capture = replica.capture_sync()
        assert capture is not None
        return SyncFrames(capture)

    def _serve_waiting(self) -> None:
        for follower in list(self.followers.values()):
            if follower.wants_sync:
                self._try_sync(follower)

    def _try_sync(self, follower: Follower) -> None:
        replica = self.replica
        if replica.needs_sync or replica.applied_clsn < follower.after:
            return  # later: once this member is whole and has reached the follower
        capture = replica.capture_sync()
        assert capture is not None
        follower.wants_sync = False
        follower.after = capture.clsn
        # one queued item, built and written in parts by the link's writer
        self._send(follower, SyncFrames(capture))

    def _send(self, follower: Follower, item: Outbound) -> None:
        if self.followers.get(follower.name) is not follower:
            return  # dropped already (while its catch-up was being queued)
        backlog, size = follower.backlog, Backlog.size(item)
        try:
            if backlog.bytes and backlog.bytes + size > self.queue_bytes:
                raise trio.WouldBlock
            follower.queue.send_nowait(item)
            backlog.queued(item)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            log.warning("replica %s too slow or gone (%d bytes queued); dropping its link "
                        "(it will resume)", follower.name, backlog.bytes)
            self._drop(follower)

    def _drop(self, follower: Follower) -> None:
        """``follower`` no longer follows; its link ends."""
        follower.queue.close()
        if self.followers.get(follower.name) is follower:
            del self.followers[follower.name]
        if follower.backlog.on_drop is not None:
            follower.backlog.on_drop()
