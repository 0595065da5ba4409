"""A member's copy of the committed stream: its hub, fed batch by batch in CLSN order.

Pure and deterministic. Every member (seed or not) keeps a :class:`Replica` around its
:class:`~migratory.server.hub.Hub`. Committed batches are offered in cluster log
sequence number (CLSN) order; a batch that does not follow the last applied one is a
gap: the replica buffers it, applies nothing more and says it needs a cache sync
from a peer (:meth:`Replica.make_sync` there, :meth:`Replica.install_sync` here). A
member needing a sync must not serve clients. A sync never moves a replica backwards:
one older than what it applied (or began to install) is refused, changing nothing.

A large sync is installed a slice at a time (:meth:`Replica.begin_install`,
:meth:`Replica.install_slice`): until the last slice the replica needs a sync still,
so batches are held back, no peer is given a sync of its half-installed hub, and the
member serves no new client.

Every member's hub must be built with ``epoch=UNNUMBERED_EPOCH`` so that a subscriber
that saw nothing of a subject on one member resumes it on any other without a gap.
"""

from __future__ import annotations

import enum

from cluster.cache_sync import (
    SLICE_MESSAGES,
    CacheSync,
    SyncCapture,
    SyncInstall,
    capture_sync,
    export_sync,
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
        self._install: SyncInstall | None = None
        """The sync being installed a slice at a time (None: none)."""
        self._begun_clsn = 0
        """The latest sync that has changed the hub, installed whole or not: an older one
        would move some subjects back."""

    def __repr__(self) -> str:
        state = "needs sync" if self.needs_sync else "in sync"
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
        """Whether the hub must be synced from a peer before it applies or serves more
        (true while a sync is being installed)."""
        return self._needs_sync or self._install is not None

    @property
    def installing(self) -> SyncInstall | None:
        """The sync being installed a slice at a time, if any."""
        return self._install

    @property
    def sync_floor(self) -> int:
        """The oldest clsn a sync must stand at to be of use here: just before the
        first held-back batch, or the skipped batches, or what is applied."""
        floor = max(self._applied_clsn, self._skipped_to, self._begun_clsn)
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
        if self.needs_sync or batch.clsn != self._applied_clsn + 1:
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
        return self.needs_sync

    def _hold(self, batch: CommittedBatch) -> None:
        self._needs_sync = True
        buffered = self._buffered
        buffered[batch.clsn] = batch
        if self._install is not None:
            # a dump or a sync is being installed: what follows it is kept whole. A seed
            # restarted after a compaction installs its Raft dump while Raft replays the
            # log after it (bounded by the compaction thresholds); dropping the oldest
            # left a gap only a peer could fill -- none could once every member had
            # restarted (test_the_log_after_a_dump_is_held_whole_while_the_dump_installs)
            return
        if len(buffered) > self._max_buffered:  # the oldest: least likely to follow a sync
            for clsn in sorted(buffered)[: len(buffered) - self._max_buffered]:
                del buffered[clsn]

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
        if self.needs_sync:
            return None
        return capture_sync(self._hub, self._applied_clsn)

    def make_sync(self) -> CacheSync | None:
        """The hub's subjects at ``applied_clsn``, for a peer that needs a sync; None
        while this replica itself needs one (it has nothing whole to give)."""
        if self.needs_sync:
            return None
        return export_sync(self._hub, self._applied_clsn)

    def install_sync(self, sync: CacheSync, now: float, *, over: bool = False) -> bool:
        """Replace the hub's subjects with a peer's, then apply buffered batches after it.

        Returns False, changing nothing, for a sync older than ``applied_clsn`` (the peer
        is behind: installing it would move clients back). Still needs a sync
        afterwards if buffered batches are left that do not follow, or if it stops
        short of a :meth:`skip_to`. Raises ValueError, changing nothing, for a sync the
        hub rejects (a malformed record). All at once: :meth:`begin_install` for slices.
        ``over``: as :meth:`begin_install`'s.
        """
        install = self.begin_install(sync, over=over)
        if install is None:
            return False
        self.install_slice(install, now, budget=None)
        return True

    def begin_install(self, sync: CacheSync, *, over: bool = False) -> SyncInstall | None:
        """Start installing ``sync`` a slice at a time (:meth:`install_slice`); None,
        changing nothing, for a sync older than what this replica applied or began to
        install. A sync being installed is given up for this one. ``over``: ``sync`` is
        of another Raft history than what was applied here (:mod:`cluster.sync_history`):
        it is installed whatever its clsn, and what this replica held of the old one
        (its clsn, held-back batches) is forgotten; until it is whole it needs a sync."""
        if over:
            self._buffered.clear()
            self._applied_clsn = self._begun_clsn = self._skipped_to = 0
            self._needs_sync = True
        elif sync.clsn < max(self._applied_clsn, self._begun_clsn):
            return None
        self._install = SyncInstall(self._hub, sync.subjects, sync.clsn)
        return self._install

    def install_slice(
        self, install: SyncInstall, now: float, budget: int | None = SLICE_MESSAGES
    ) -> bool:
        """Install about ``budget`` cached messages of ``install`` (None: the rest); True
        once it is over: installed whole (this replica is at its clsn, the buffered
        batches after it applied), or given up for a later one (``install.done`` false).
        Raises ValueError, changing nothing, for a malformed record (they are all checked
        before the first change)."""
        if self._install is not install:
            return True  # a later sync took its place
        try:
            done = install.step(now, budget)
        except ValueError:
            self._install = None
            raise
        if install.changed:  # half-installed: only a sync as recent makes it whole
            self._begun_clsn = max(self._begun_clsn, install.clsn)
            self._needs_sync = True
        if not done:
            return False
        self._install = None
        self._applied_clsn = install.clsn
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
