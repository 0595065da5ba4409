"""Whether a seed's cache sync, behind what a non-seed applied, is of another Raft history.

Every seed losing its ``ClusterDataDir`` (or every one moved aside, docs/cluster.md
"What to do") starts a new cluster: clsn from 1 again, every subject group a new random
epoch. A non-seed that lived through it still stands at the old history's clsn, ahead of
the new seeds: they took it for a member ahead in their own history (a seed restarted
and still replaying) and sent it only batches past that clsn. It said it was ready and
its subscribers got nothing of the new history -- every acknowledged message since the
seeds' restart, for as long as the new cluster stayed below the old clsn
(``test_cluster_restart_combinations.py``).

A sync at clsn ``M`` of this member's own history holds a prefix of what it applied up to
its clsn ``N >= M``: each subject at the epoch it has here (a subject group's epoch never
changes within one history) and at a seq no further than here. So a subject of the sync
at another epoch than here, or than the subjects of its group here, or further on, proves
another history; then the sync replaces this member's state whatever its clsn (its
subscribers are told ``DATA_RESYNC``, as a new cluster promises). A sync that proves
nothing (every subject as here, or in groups unknown here) is refused, as any sync
behind this member is.
"""

from __future__ import annotations

from collections.abc import Iterable

from cluster.cache_sync import CacheSync
from cluster.numbering_state import subject_group
from migratory.model.position import Position


def another_history(sync: CacheSync, held: Iterable[tuple[str, Position]]) -> str | None:
    """Why ``sync`` cannot be of the history whose subjects stand at ``held`` here
    (subject, position; numbered subjects only), or None when it may be."""
    here = dict(held)
    groups = {subject_group(subject): position.epoch for subject, position in here.items()}
    for record in sync.subjects:
        ours = here.get(record.subject)
        if ours is not None and ours.epoch != record.epoch:
            return f"{record.subject} at epoch {record.epoch} there, {ours.epoch} here"
        if ours is not None and record.seq > ours.seq:
            return (f"{record.subject} at seq {record.seq} there, {ours.seq} here, at the "
                    f"clsn {sync.clsn} behind this member's")
        group_epoch = groups.get(subject_group(record.subject))
        if ours is None and group_epoch is not None and group_epoch != record.epoch:
            return (f"{record.subject} at epoch {record.epoch} there, its subject group's "
                    f"{group_epoch} here")
    return None
