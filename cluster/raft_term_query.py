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
with ``migratory_term``: its current term and the term and index of its last log entry),
and ignores AppendEntries and RequestVote until answers from ``ceil(n / 2)`` of the other
seeds (3 seeds: both others; 5: three of four) settle it -- answers of seeds that are not
empty-started themselves (each answer says, ``empty_start``; such a seed is asked again),
or else of *every* other seed. Any majority this seed was part of before -- an election
it voted in, an entry it acknowledged -- shares at least one seed with them, so:

- the highest term among them is at least that majority's; the seed takes it as its
  own current term, and an older leader's messages are refused as Raft refuses them;
- the most up-to-date log among them (:attr:`TermQuorum.log_floor`) holds every entry
  this seed acknowledged before it lost its disk, and every entry committed before the
  answers: until it has caught up, the seed votes only for a candidate whose log is at
  least as up-to-date as that one (:meth:`cluster.raft_votes.EmptyStart.may_vote`) --
  it stands in for the vote of the seed that holds what it lost;
- if none of them holds an entry of a leader (last log term 0), nothing was ever
  committed: a brand-new cluster, and the seed votes as Raft says from the start.

There is no shorter way to a new cluster. Until 2026-11-28 ``floor(n / 2)`` answers
with no log settled it too (two of three new seeds formed a cluster without the third),
but an empty log answers the same whether the cluster is new or the seed was down (or
cut off) while the others committed: a seed that lost its disk took that for a new
cluster, voted as Raft says, and elected the seed that had been down over the entries
it had acknowledged with the third (``test_raft_safety.py`` found the schedule; see
``test_raft_votes.py``, ``test_an_empty_seed_does_not_elect_a_seed_that_was_cut_off``).
An empty-started seed's answer is no witness either: its empty log is its lost disk's.
With five seeds, two that lost their disks at once (two faults: what five seeds
tolerate) heard each other and the two seeds that had been down during the commits --
three of four, no log -- took it for a new cluster and elected a seed without the
entries they had acknowledged with the fifth, up all along but slower to answer
(``test_raft_empty_start_five.py``, until 2026-11-28 evening). Every seed of a new cluster
is empty-started, so its seeds settle only once *all* the others answered: the first
leader of a new cluster needs all its seeds up (3 of 3, 5 of 5) -- once; after that a
majority is enough as always.

An empty-started seed's answer is taken as it was when given: a seed that later
settles as a new cluster answers ``empty_start`` False from then on, but an answer it gave
before is still the one heard. A brand-new cluster's third seed, linked to one seed a
round before the other (:data:`QUERY_SECONDS`), heard the first say ``empty_start``; the
two then heard the third, settled, elected, and the leader's entry came in the third's
next round before the follower's new answer: "every other seed answered, one kept its
log" -- a CRITICAL "a majority of the seeds lost their log" on a first start (2026-11-29,
``test_raft_term_query.py``, its late seed's test).
So each query carries its round (``ask``, echoed in the answer) and an empty-started
seed's answer counts towards settling on every answer only if asked *after* the last
answer showing a leader's entry arrived: that leader was elected before, so such an
answer was given after any seed that voted for it had settled. It costs one round where a
majority did lose its logs; an answer without ``ask`` (an older seed) counts as before.

Until then the seed is not part of the cluster (it does not stand for election either).
Every seed must run this version: an older one ignores the query, and an empty-started
seed then waits until it is upgraded; an answer without the index (the first version of
this query) counts as a log longer than any of its term. Pure bookkeeping here;
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
UNKNOWN_INDEX = 2**62
"""The last log index of an answer that does not tell it (an older seed)."""


class TermQuorum:
    """An empty-started seed's wait for the current term of enough other seeds."""

    def __init__(self, *, others: int, waiting: bool) -> None:
        """``others``: the other seeds; ``waiting``: the seed started empty."""
        self.others = others
        self.waiting = waiting and others > 0
        # seed -> (current term, (last log term, last log index), empty-started there)
        self.heard: dict[Any, tuple[int, tuple[int, int], bool]] = {}
        self.new_cluster = False  # settled by seeds none of which holds a log
        # settled by every other seed's answer, with fewer than ceil(n/2) seeds that kept
        # their log: a majority of the seeds lost it (beyond the tolerance), not new
        self.majority_lost = False
        self.log_floor = (0, 0)  # the most up-to-date log of those that answered
        self.round = 0  # of the queries sent so far (each query carries it: ``ask``)
        self._asked: dict[Any, int | None] = {}  # seed -> the round its answer answers
        # the round when an answer of a seed not empty-started with a leader's entry
        # came last: an empty-started seed's answer to that round or before may be stale
        self._leader_seen = 0
        self._next_query = 0.0
        self._next_warning = 0.0

    def due(self, now: float, connected: Any) -> list[Any]:
        """The connected seeds to ask now (none once settled)."""
        if not self.waiting or now < self._next_query:
            return []
        self._next_query = now + QUERY_SECONDS
        self.round += 1
        if now >= self._next_warning:  # at once (INFO: a new cluster looks the same), then
            first = self._next_warning == 0.0  # every WARN_SECONDS while it lasts (WARNING)
            self._next_warning = now + WARN_SECONDS
            n = self.others + 1
            log.log(
                logging.INFO if first else logging.WARNING,
                "Raft: this seed started with an empty ClusterDataDir (or none yet): it "
                "takes no part in the cluster until %d of the %d other seeds have told it "
                "their current term (%d so far; an answer from an empty-started seed counts "
                "only once every other seed has answered)", n - n // 2, self.others,
                len(self.heard),
            )
        # (an empty-started seed is asked again: it may have caught up since)
        return [node for node in connected if node not in self.heard or self.heard[node][2]]

    def query(self) -> dict[str, Any]:
        """The query to send to the seeds :meth:`due` named."""
        return {"type": QUERY, "ask": self.round}

    def _stale(self) -> bool:
        """Whether an empty-started seed's answer heard was asked before the last answer
        showing a leader's entry came (see the module docstring): it is asked again."""
        return any(
            empty and (asked := self._asked[seed]) is not None and asked <= self._leader_seen
            for seed, (_, _, empty) in self.heard.items()
        )

    def hear(self, seed: Any, answer: dict[str, Any]) -> int | None:
        """Take one seed's answer; the term to adopt once the answers settle it (then
        :attr:`waiting` is False), else None: ``ceil(n/2)`` answers of seeds not
        empty-started (witnesses of what they acknowledged), or every other seed's."""
        if not self.waiting:
            return None
        try:
            term, last_log_term = int(answer["term"]), int(answer["last_log_term"])
            last_log_index = int(answer.get("last_log_index", UNKNOWN_INDEX))
            asked = None if answer.get("ask") is None else int(answer["ask"])
        except (KeyError, TypeError, ValueError):
            return None
        empty_start = answer.get("empty_start") is True
        self.heard[seed] = (term, (last_log_term, last_log_index), empty_start)
        self._asked[seed] = asked
        if not empty_start and last_log_term > 0:
            self._leader_seen = self.round  # (re-asked from the next round on)
        n = self.others + 1
        witnesses = sum(not empty for _, _, empty in self.heard.values())
        if witnesses < n - n // 2 and (len(self.heard) < self.others or self._stale()):
            return None
        self.waiting = False
        highest = max(term for term, _, _ in self.heard.values())
        self.log_floor = max(last for _, last, _ in self.heard.values())
        self.new_cluster = self.log_floor[0] == 0
        self.majority_lost = not self.new_cluster and witnesses < n - n // 2
        if self.new_cluster:
            log.info("Raft: a new cluster (%d other seed(s) answered, none holds a log)",
                     len(self.heard))
        elif self.majority_lost:
            log.critical(
                "Raft: only %d of the %d seeds kept their Raft log: this one and %d other(s) "
                "started with an empty ClusterDataDir and have not caught up, a majority of "
                "the seeds, beyond what %d seeds tolerate. The cluster goes on from the "
                "longest log left (term %d, index %d): publications a majority of seeds "
                "acknowledged together may be lost, and their positions given to other "
                "messages; subscribers that got them are not told (docs/cluster.md, \"A "
                "whole cluster restarted at once\")",
                witnesses, n, len(self.heard) - witnesses, n, *self.log_floor,
            )
        else:
            log.warning(
                "Raft: this seed started with an empty ClusterDataDir; %d other seed(s) "
                "told their current terms: it continues from term %d, and votes only for "
                "a seed whose log reaches term %d, index %d until it has caught up",
                len(self.heard), highest, *self.log_floor,
            )
        return highest
