"""What the Raft leader learns of the other seeds' progress: a seed that applies nothing.

A seed can take and acknowledge its leader's entries and apply none: one started on a
dump another version wrote (a 524f73f seed on this version's dump: docs/cluster.md,
"Downgrading to 524f73f"). Raft cannot tell the leader -- pysyncobj's followers answer
with the index of their log, not with what they applied --, so the seed was never ready
and the leader said nothing. The leader's agreement probe (``cluster/agreement_probe.py``,
every 10 s) now asks each seed where it stands (a ``SyncRequest`` no seed can serve: the
``SyncRefused`` names the seed's applied clsn; 524f73f answers it too) and tells
:class:`SeedProgress`, which says when a seed has stood at one clsn for
:data:`STUCK_SECONDS` while the leader had applied more: a WARNING naming it, again every
:data:`REPEAT` seconds while it stays, and ``GET /cluster`` ``seeds_not_applying``.
Pure: no sockets, no trio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STUCK_SECONDS = 30.0
"""How long a seed may stand at one clsn behind the leader before the leader names it
(a seed that catches up moves within a second; a large dump installs in seconds)."""
REPEAT = 300.0
"""Seconds between two warnings about one seed while it stays where it is."""


@dataclass
class _Seen:
    clsn: int
    since: float  # when it was first seen at this clsn
    warned_at: float | None = None


@dataclass
class SeedProgress:
    """The other seeds' applied clsn as the leader's probes found them."""

    stuck_seconds: float = STUCK_SECONDS
    seen: dict[str, _Seen] = field(default_factory=dict)

    def observe(self, seed: str, clsn: int, leader_clsn: int, now: float) -> str | None:
        """``seed`` stands at ``clsn``, this leader at ``leader_clsn``: the warning to
        log now, if one is due."""
        seen = self.seen.get(seed)
        if seen is None or seen.clsn != clsn or leader_clsn <= clsn:
            self.seen[seed] = _Seen(clsn, now)
            return None
        if now - seen.since < self.stuck_seconds:
            return None
        if seen.warned_at is not None and now - seen.warned_at < REPEAT:
            return None
        seen.warned_at = now
        return (
            f"seed {seed} applies nothing: it has stood at clsn {clsn} for "
            f"{now - seen.since:.0f} s while this Raft leader applied up to {leader_clsn}; "
            "it acknowledges the log but is not ready. Started on a dump another version "
            "wrote (its log says 'failed to load full dump' at its start)? Stop it, rewrite "
            "its dump or start the version that wrote it (docs/cluster.md, \"Downgrading "
            "to 524f73f\"). (A very large dump still being sent to it moves it later.)"
        )

    def forget(self, seed: str) -> None:
        """``seed`` could not be asked, or this member no longer leads."""
        self.seen.pop(seed, None)

    def stuck(self) -> dict[str, int]:
        """The seeds named, still where they were at the last probe: seed -> its clsn."""
        return {seed: seen.clsn for seed, seen in self.seen.items()
                if seen.warned_at is not None}
