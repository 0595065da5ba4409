"""Raft pre-vote (Raft thesis section 9.6): a seed that cannot hear a live leader does
not depose it.

pysyncobj 0.3.17 has no pre-vote: a follower whose election timeout passed raises its
term and asks for votes, and its higher term makes every seed that hears it -- the
leader too -- drop the leader, even when the leader lives and the others hear it. Two
cases made that happen with every seed alive:

- a partial partition: a seed that cannot hear the leader (one link cut, the others up)
  stood again and again; five seeds deposed their leader 1-4 times in 10 s
  (``tests/cluster/test_raft_partial_partitions.py``);
- a follower process the kernel froze (a pod over its CPU limit) past its election
  timeout: it stood when it thawed (``benchmarks/cluster_spurious_elections.py --load
  throttle``), and each election failed the publishes in flight ("the Raft leader
  changed").

The rule, as the thesis gives it:

- **The candidate.** A follower (or a candidate whose election failed) whose election
  timeout passed first asks every seed it is linked to whether it would vote for it in
  term + 1 (:data:`REQUEST`, with its last log term and index) *without raising its own
  term*, and waits one more election timeout (a *round*; then it asks again). It stands
  -- term + 1, the real RequestVote, unchanged -- as soon as the seeds whose latest
  answer about that term is yes make a majority with it (answers hold across the rounds
  of a term: a starved seed's yes that comes just after a round still counts). A follower
  that went a whole round without a word from its leader forgets it, as its candidacy
  did before: its member is then not ready while it gets no log.
- **The voter.** A seed answers (:data:`ANSWER`) yes only if it leads no one and has not
  heard a live leader within the minimum election timeout (*leader stickiness*), the
  proposed term is above its own, and the candidate's log is at least as up to date as
  its own (:func:`grants`). The empty-start rules of :mod:`cluster.raft_votes` apply as to
  a real vote. Answering changes nothing in the voter: no term, no vote, no timer.
- A "no" carries the voter's term; a candidate behind it takes that term (as any Raft
  message would make it), so its next round proposes one above it.

**Seeds of the version before** (a rolling upgrade) do not know the request: pysyncobj
ignores a message of a type it does not know, so they never answer. Each answer, and each
request, shows that the seed at the other end of that link runs this rule; a link made
again is not known until it speaks again. A round that ends with too few yes counts every
seed it asked that did not answer and has never shown the rule on its link as a yes (it
would have voted as pysyncobj does), and stands if that makes a majority
(:meth:`Campaign.at_deadline`, logged): a mixed cluster elects whichever seeds are old,
one election timeout later at worst. A seed that shows the rule but stays silent (slow,
frozen) is a no: that is the case pre-vote is for.

**What it costs.** A round trip on a failover: the followers heard the dead leader last
at the same moment, so when the first one's timeout passes (at least the minimum) none
hears a leader and they all say yes at once. In a three-seed partial
partition (the leader's link to one follower cut), the cut-off seed no longer moves the
lead to the seed that reaches both: the leader stays, and the cut-off seed gets no log
until the link is back (it is not ready meanwhile); the cluster commits with the other
two, and loses no more to a further failure than with the lead moved.

The decision to stand is taken where pysyncobj takes it (it asks whether the seed is
linked to anyone only then, :class:`cluster.raft_prevote_node.PreVote`): a check earlier
in the tick let a process stopped in between stand without asking.

Pure bookkeeping, no pysyncobj, no clock of its own: :class:`cluster.raft_prevote_node.PreVote`
sends and answers the messages (``tests/cluster/test_raft_prevote.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANSWER", "REQUEST", "Campaign", "Decision", "LogEnd", "grants", "well_formed"]

REQUEST = "migratory_pre_vote"
ANSWER = "migratory_pre_vote_answer"

LogEnd = tuple[int, int]
"""(last log term, last log index): the larger is the more up to date (Raft section 5.4.1)."""


def well_formed(message: dict[str, Any]) -> bool:
    """Whether a :data:`REQUEST` or :data:`ANSWER` has the integers it must have (one
    that has not is ignored, as a lost one: a later version may send more, never less)."""
    fields = ("term", "last_log_term", "last_log_index") if message.get("type") == REQUEST \
        else ("term", "proposed_term")
    return all(type(message.get(name)) is int for name in fields)


def grants(*, proposed_term: int, candidate_log: LogEnd, current_term: int,
           own_log: LogEnd, leading: bool, heard_leader_at: float | None, now: float,
           min_timeout: float) -> bool:
    """Whether a seed answers yes to a pre-vote for ``proposed_term``.

    ``heard_leader_at``: when it last took a live leader's AppendEntries (None: never
    since it started); ``min_timeout``: the minimum election timeout (raftMinTimeout)."""
    if leading:
        return False
    if heard_leader_at is not None and now - heard_leader_at < min_timeout:
        return False
    if proposed_term <= current_term:
        return False
    return candidate_log >= own_log


class Decision(enum.Enum):
    STAND = "stand"  # the real election now (term + 1, RequestVote)
    ASK = "ask"  # a new round: send REQUEST to every seed linked


@dataclass
class Campaign:
    """A seed's pre-vote rounds: who was asked, what each answered, who shows the rule.

    ``cluster_size`` counts every seed, this one included. The answers for one proposed
    term hold across its rounds (a seed's latest answer counts): a starved process
    answers late, and a yes that came just after its round ended still counts in the
    next; a seed that said no and then lost its leader says yes."""

    cluster_size: int
    round: int = 0
    proposed_term: int | None = None  # the term the current rounds ask for
    asked: set[Hashable] = field(default_factory=set)
    answers: dict[Hashable, bool] = field(default_factory=dict)  # for proposed_term
    speaks_prevote: set[Hashable] = field(default_factory=set)  # per link: shown the rule
    fallbacks: int = 0  # rounds that stood on the silence of seeds presumed old

    def majority(self, yes: int) -> bool:
        """Whether ``yes`` other seeds and this one make a majority."""
        return (yes + 1) * 2 > self.cluster_size

    def granted(self) -> int:
        """How many seeds said yes to the proposed term (their latest answer)."""
        return sum(self.answers.values())

    def at_deadline(self, current_term: int, linked: Collection[Hashable]) -> Decision:
        """The election timeout passed (no leader heard): stand, or ask (again).

        Stands when the seeds said yes to term + 1 make a majority, or, at the end of a
        round, with the seeds it asked that never showed the rule on their link and did
        not answer counted as yes -- even if the term moved on meanwhile: a seed of the
        version before that stands again and again (and loses: its log is behind) raises
        the term within every round; otherwise a new round begins (:meth:`ask`). A lone
        seed stands."""
        if self.majority(0):
            return Decision.STAND
        if self.proposed_term is None:
            return Decision.ASK
        yes = self.granted() if self.proposed_term == current_term + 1 else 0
        if self.majority(yes):
            return Decision.STAND
        presumed_old = {
            seed for seed in self.asked
            if seed in linked and seed not in self.answers and seed not in self.speaks_prevote
        }
        if presumed_old and self.majority(yes + len(presumed_old)):
            self.fallbacks += 1
            return Decision.STAND
        return Decision.ASK

    def ask(self, current_term: int, linked: Collection[Hashable]) -> tuple[int, int]:
        """Begin a round asking ``linked`` about ``current_term + 1``: (proposed term,
        round number), which the requests carry and the answers repeat."""
        self.round += 1
        if self.proposed_term != current_term + 1:
            self.proposed_term = current_term + 1
            self.answers = {}
        self.asked = set(linked)
        return self.proposed_term, self.round

    def hear(self, seed: Hashable, *, proposed_term: int, granted: bool) -> bool:
        """An answer from ``seed``; True when it completes a majority of yes for the
        proposed term (then the seed may stand at once). An answer about another term
        only shows that ``seed`` runs the rule."""
        self.speaks_prevote.add(seed)
        if proposed_term != self.proposed_term or seed not in self.asked:
            return False
        before = self.majority(self.granted())
        self.answers[seed] = granted
        return not before and self.majority(self.granted())

    def requested_by(self, seed: Hashable) -> None:
        """``seed`` asked for a pre-vote: it runs the rule."""
        self.speaks_prevote.add(seed)

    def link_lost(self, seed: Hashable) -> None:
        """The link to ``seed`` went down: what comes back on a new one may be another
        version (a restart is an upgrade or a downgrade), and what it answered is void."""
        self.speaks_prevote.discard(seed)
        self.asked.discard(seed)
        self.answers.pop(seed, None)

    def stood(self) -> None:
        """This seed stood (or heard a leader): the rounds are over."""
        self.proposed_term = None
        self.asked = set()
        self.answers = {}
