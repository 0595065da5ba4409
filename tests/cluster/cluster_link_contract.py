"""What a member may send a peer that follows it or asks it for a sync (test helper).

Pure. The committed stream (``cluster/stream.py``) promises a follower that asked to
be caught up from what it holds: every batch after that exactly once, in order, or a
whole cache sync at or after it followed by the batches after the sync -- never a
batch it has, never a hole, never a sync behind it. A member asked for a sync gives a
whole one at or after the floor asked for, or refuses (``SyncRefused``) -- in
particular while it needs a sync itself: never an empty or partial one.

These are checked on every frame, so a fault that a later layer would repair (the
replica ignores a duplicate, a gap makes the non-seed ask for a sync) is still seen.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster_checker import CommittedLog, check_sync_is_whole

from cluster import link


@dataclass
class LinkContract:
    """One follower's link, from the follower's side."""

    follower: str
    after: int
    """The follower holds every batch up to here (what it applied when it asked)."""
    max_cached: int

    def check(self, op: link.LinkOp, log: CommittedLog) -> None:
        if isinstance(op, link.Batch):
            clsn = op.batch.clsn
            assert clsn > self.after, f"{self.follower} was sent batch {clsn} again"
            assert clsn == self.after + 1, (
                f"{self.follower} was sent batch {clsn} after {self.after}: a hole"
            )
            assert op.batch == log.batches[clsn - 1], f"batch {clsn} is not the committed one"
            self.after = clsn
        elif isinstance(op, link.Sync):
            clsn = op.sync.clsn
            assert clsn >= self.after, (
                f"{self.follower} was sent a sync at clsn {clsn}, behind its {self.after}"
            )
            check_sync_is_whole(op.sync, log, self.max_cached)
            self.after = clsn


def check_sync_answer(
    answer: link.LinkOp,
    *,
    floor: int,
    giver_needed_sync: bool,
    log: CommittedLog,
    max_cached: int,
) -> None:
    """The answer to ``SyncRequest(floor)`` from a member that did or did not need a sync."""
    if isinstance(answer, link.SyncRefused):
        return
    assert isinstance(answer, link.Sync), f"{answer} answers a sync request"
    assert not giver_needed_sync, (
        f"a member that needs a sync gave one (clsn {answer.sync.clsn}) instead of SyncRefused"
    )
    assert answer.sync.clsn >= floor, (
        f"a sync at clsn {answer.sync.clsn} answers a request for clsn {floor} or later"
    )
    check_sync_is_whole(answer.sync, log, max_cached)
