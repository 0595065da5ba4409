"""A seed that starts on an empty disk learns the cluster's current term before it takes
part in anything.

Losing its ClusterDataDir, a seed also lost its current term: it restarts at term 0, so
pysyncobj takes AppendEntries of *any* term. A leader deposed while it was cut off (its
term is old, it has not noticed yet: ``leaderFallbackTimeout``) can then count the empty
seed's acknowledgements as its majority and commit entries at positions the new leader
had already committed others at (``tests/cluster/test_raft_votes.py``,
``test_an_empty_seed_does_not_make_a_majority_for_a_deposed_leader``). The vote rule of
:mod:`cluster.raft_votes` cannot see that: no vote is involved.

So an empty-started seed (see :class:`cluster.raft_votes.EmptyStart`) first asks the
other seeds their current term (a ``migratory_term_query`` message; every seed answers
with ``migratory_term``: its current term and the term of its last log entry), and
ignores AppendEntries and RequestVote until the answers settle it:

- answers from ``ceil(n / 2)`` of the other seeds (3 seeds: both others; 5: three of
  four): any majority this seed was part of before -- an election it voted in, an entry
  it acknowledged -- shares at least one seed with them, so the highest term among them
  is at least that majority's; the seed takes it as its own current term, and an older
  leader's messages are refused as Raft refuses them;
- or answers from ``floor(n / 2)`` of the others whose logs hold nothing of a leader
  (last log term 0): a brand-new cluster, where every seed starts empty, so that two of
  three new seeds still form a cluster without waiting for the third. The seed is then
  done with its empty start at once and votes as Raft says
  (:meth:`cluster.raft_votes.EmptyStart.joined_a_new_cluster` says why that is safe).

Until then the seed is not part of the cluster (it cannot be elected either: its log is
empty). Every seed must run this version: an older one ignores the query, and an
empty-started seed then waits until it is upgraded. Pure bookkeeping here;
:class:`cluster.raft_follower.FollowerSafeSyncObj` sends and answers the messages.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("migratory.raft")

QUERY = "migratory_term_query"
ANSWER = "migratory_term"
QUERY_SECONDS = 0.1
"""How often a seed still waiting asks the seeds that have not answered."""
WARN_SECONDS = 10.0
"""How often a seed still waiting says so in its log."""


class TermQuorum:
    """An empty-started seed's wait for the current term of enough other seeds."""

    def __init__(self, *, others: int, waiting: bool) -> None:
        """``others``: the other seeds; ``waiting``: the seed started empty."""
        self.others = others
        self.waiting = waiting and others > 0
        self.heard: dict[Any, tuple[int, int]] = {}  # seed -> (current term, last log term)
        self.new_cluster = False  # settled by seeds none of which holds a log
        self._next_query = 0.0
        self._next_warning = 0.0

    def due(self, now: float, connected: Any) -> list[Any]:
        """The connected seeds to ask now (none once settled)."""
        if not self.waiting or now < self._next_query:
            return []
        self._next_query = now + QUERY_SECONDS
        if now >= self._next_warning:  # at once (INFO: a new cluster looks the same), then
            first = self._next_warning == 0.0  # every WARN_SECONDS while it lasts (WARNING)
            self._next_warning = now + WARN_SECONDS
            n = self.others + 1
            log.log(
                logging.INFO if first else logging.WARNING,
                "Raft: this seed started with an empty ClusterDataDir (or none yet): it "
                "takes no part in the cluster until %d of the %d other seeds have told it "
                "their current term (%d so far)", n - n // 2, self.others, len(self.heard),
            )
        return [node for node in connected if node not in self.heard]

    def hear(self, seed: Any, answer: dict[str, Any]) -> int | None:
        """Take one seed's answer; the term to adopt once the answers settle it (then
        :attr:`waiting` is False), else None."""
        if not self.waiting:
            return None
        try:
            term, last_log_term = int(answer["term"]), int(answer["last_log_term"])
        except (KeyError, TypeError, ValueError):
            return None
        self.heard[seed] = (term, last_log_term)
        n = self.others + 1
        enough = len(self.heard) >= n - n // 2
        new_cluster = len(self.heard) >= n // 2 and all(
            last == 0 for _, last in self.heard.values()
        )
        if not (enough or new_cluster):
            return None
        self.waiting = False
        highest = max(term for term, _ in self.heard.values())
        self.new_cluster = all(last == 0 for _, last in self.heard.values())
        if self.new_cluster:
            log.info("Raft: a new cluster (%d other seed(s) answered, none holds a log)",
                     len(self.heard))
        else:
            log.warning(
                "Raft: this seed started with an empty ClusterDataDir; %d other seed(s) "
                "told their current terms: it continues from term %d", len(self.heard),
                highest,
            )
        return highest
