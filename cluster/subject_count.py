"""The seeds keep every subject ever published: say so as their number grows.

:class:`~cluster.coordination.Coordinator` keeps one seq per subject for ever
(``seqs``), and the replicated caches keep each retained subject's snapshot for ever:
nothing forgets a subject that stopped publishing (docs/cluster.md, "Subjects the seeds
keep for ever"). An application with one subject per device, devices coming and
going, grows both without bound: every seed's memory, every Raft dump (pysyncobj pickles
the whole state at each compaction) and the catch-up of a seed that lost its disk.
``benchmarks/coordinator_subjects.py`` measures what each subject costs.

The count is in ``GET /cluster`` (``raft_subjects``, ``raft_snapshots``) and
``/metrics`` (``migratory_raft_subjects``, ``migratory_raft_snapshots``);
:class:`SubjectCountWarning` makes the Raft thread log one WARNING when the count first
reaches :data:`SUBJECTS_WARNING`, then at each doubling. Pure: the caller logs.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SUBJECTS_WARNING", "SubjectCountWarning"]

SUBJECTS_WARNING: Final = 1_000_000
"""Subjects numbered by the seeds at which the first WARNING is logged."""


class SubjectCountWarning:
    """One warning when the count first reaches ``first``, then ``2 * first``, ``4 *
    first`` ...: a count that jumps past several (a seed restored from a dump) is
    told once, at its value."""

    __slots__ = ("_next",)

    def __init__(self, first: int = SUBJECTS_WARNING) -> None:
        if first < 1:
            raise ValueError(f"first must be >= 1, got {first}")
        self._next = first

    @property
    def next_at(self) -> int:
        """The count of the next warning."""
        return self._next

    def observe(self, subjects: int, snapshots: int) -> str | None:
        """The line to log for ``subjects`` numbered (``snapshots`` of them retained),
        or None."""
        if subjects < self._next:
            return None
        while self._next <= subjects:
            self._next *= 2
        return (
            f"Raft: the seeds hold {subjects:,} subjects ({snapshots:,} retained "
            "snapshots): every subject ever published is kept for ever, in every "
            "seed's memory and in every Raft dump, which pysyncobj pickles whole at each "
            "compaction (about 130 bytes of memory and 13 of dump per subject for its "
            "numbering alone; benchmarks/coordinator_subjects.py). Watch "
            "migratory_raft_subjects and size the seeds for it (docs/cluster.md, "
            f"'Subjects the seeds keep for ever'); next warning at {self._next:,}"
        )
