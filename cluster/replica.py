"""A member's copy of the committed stream: its hub, fed batch by batch in CLSN order.

Pure and deterministic. Every member (seed or not) keeps a :class:`Replica` around its
:class:`~migratory.server.hub.Hub`. Committed batches are offered in cluster log
sequence number (CLSN) order; a batch that does not follow the last applied one is a
gap: the replica buffers it, applies nothing more and says it needs a cache sync
from a peer (:meth:`Replica.make_sync` there, :meth:`Replica.install_sync` here). A
member needing a sync must not serve clients. A sync never moves a replica backwards:
one older than what it applied is refused, changing nothing.

Every member's hub must be built with ``epoch=UNNUMBERED_EPOCH`` so that a subscriber
that saw nothing of a subject on one member resumes it on any other without a gap.
"""

from __future__ import annotations

import enum

from cluster.cache_sync import (
    CacheSync,
    SyncCapture,
    capture_sync,
    check_sync,
    export_sync,
    install_sync,
)
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch
from migratory.server.hub import Hub

__all__ = ["Offer", "Replica"]

DEFAULT_MAX_BUFFERED = 1024
"""Batches kept while waiting for a sync; older ones are dropped first."""


class Offer(enum.Enum):
    """What the replica did with an offered batch."""

    APPLIED = "applied"
    """It was the next batch: its messages are in the hub and fanned out."""
    DUPLICATE = "duplicate"
    """Already applied (CLSN at or below the applied one): ignored."""
    GAP = "gap"
    """Buffered, not applied: batches are missing before it, or a sync is pending."""


class Replica:
    """Applies the committed stream to ``hub`` and keeps track of where it stands."""

    def __init__(self, hub: Hub, *, max_buffered: int = DEFAULT_MAX_BUFFERED) -> None:
        if hub.epoch != UNNUMBERED_EPOCH:
            raise ValueError(
                f"a cluster member's hub must have epoch UNNUMBERED_EPOCH ({UNNUMBERED_EPOCH}),"
                f" got {hub.epoch}"
            )
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        hub.numbered_elsewhere = True  # positions come from the coordination, via apply()
        self._hub = hub
        self._applied_clsn = 0
        self._needs_sync = False
        self._skipped_to = 0
        """Batches up to here will not be offered: only a sync can bring them."""
        self._max_buffered = max_buffered
        self._buffered: dict[int, CommittedBatch] = {}
        """Batches held back until a sync, by CLSN."""

    def __repr__(self) -> str:
        state = "needs sync" if self._needs_sync else "in sync"
        return f"<Replica at clsn {self._applied_clsn}, {state}, {len(self._buffered)} buffered>"

    @property
    def hub(self) -> Hub:
        return self._hub

    @property
    def applied_clsn(self) -> int:
        """CLSN of the last batch applied to the hub (0: none)."""
        return self._applied_clsn

    @property
    def needs_sync(self) -> bool:
        """Whether the hub must be synced from a peer before it applies or serves more."""
        return self._needs_sync

    @property
    def sync_floor(self) -> int:
        """The oldest clsn a sync must stand at to be of use here: just before the
        first held-back batch, or the skipped batches, or what is applied."""
        floor = max(self._applied_clsn, self._skipped_to)
        if self._buffered:
            floor = max(floor, min(self._buffered) - 1)
        return floor

    @property
    def buffered(self) -> int:
        """Batches held back until a sync."""
        return len(self._buffered)

    def offer(self, batch: CommittedBatch, now: float) -> Offer:
        """Apply ``batch`` if it is the next one; buffer it on a gap."""
        if batch.clsn <= self._applied_clsn:
            return Offer.DUPLICATE
        if self._needs_sync or batch.clsn != self._applied_clsn + 1:
            self._hold(batch)
            return Offer.GAP
        if not self._apply(batch, now):
            self._hold(batch)
            return Offer.GAP
        return Offer.APPLIED

    def skip_to(self, clsn: int) -> bool:
        """The batches up to ``clsn`` will not be offered; returns ``needs_sync``.

        For a stream that goes on after ``clsn`` (Raft gave a state dump instead of the
        log, the upstream no longer has them): a replica behind it needs a sync.
        """
        if clsn > self._applied_clsn:
            self._skipped_to = max(self._skipped_to, clsn)
            self._needs_sync = True
        return self._needs_sync

    def _hold(self, batch: CommittedBatch) -> None:
        self._needs_sync = True
        buffered = self._buffered
        buffered[batch.clsn] = batch
        if len(buffered) > self._max_buffered:
            del buffered[min(buffered)]  # the oldest is the least likely to follow a sync

    def _apply(self, batch: CommittedBatch, now: float) -> bool:
        """Apply the next batch; False if the hub found a gap in a subject (sync needed)."""
        hub = self._hub
        try:
            for message in batch.messages:
                hub.apply(message, now)
        except ValueError:
            return False
        self._applied_clsn = batch.clsn
        return True

    def capture_sync(self) -> SyncCapture | None:
        """:meth:`make_sync`, its cached messages rebuilt only when read."""
        if self._needs_sync:
            return None
        return capture_sync(self._hub, self._applied_clsn)

    def make_sync(self) -> CacheSync | None:
        """The hub's subjects at ``applied_clsn``, for a peer that needs a sync; None
        while this replica itself needs one (it has nothing whole to give)."""
        if self._needs_sync:
            return None
        return export_sync(self._hub, self._applied_clsn)

    def install_sync(self, sync: CacheSync, now: float) -> bool:
        """Replace the hub's subjects with a peer's, then apply buffered batches after it.

        Returns False, changing nothing, for a sync older than ``applied_clsn`` (the peer
        is behind: installing it would move clients back). Still needs a sync
        afterwards if buffered batches are left that do not follow, or if it stops
        short of a :meth:`skip_to`. Raises ValueError, changing nothing, for a sync the
        hub rejects (a malformed record).
        """
        if sync.clsn < self._applied_clsn:
            return False
        check_sync(sync.subjects)
        install_sync(self._hub, sync.subjects, now)
        self._applied_clsn = sync.clsn
        self._needs_sync = False
        self._catch_up(now)
        return True

    def _catch_up(self, now: float) -> None:
        """Apply the buffered batches that follow ``applied_clsn``; any left mean a gap."""
        buffered = self._buffered
        for clsn in [c for c in buffered if c <= self._applied_clsn]:
            del buffered[clsn]
        while (batch := buffered.get(self._applied_clsn + 1)) is not None:
            if not self._apply(batch, now):
                self._needs_sync = True
                return
            del buffered[batch.clsn]
        self._needs_sync = bool(buffered) or self._applied_clsn < self._skipped_to
