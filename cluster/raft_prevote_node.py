"""The pysyncobj end of pre-vote (:mod:`cluster.raft_prevote` has the rule).

:class:`PreVote` sits between :class:`cluster.raft_election_timer.ElectionBackoff` (which
reads what came before a deadline is checked) and pysyncobj's ``SyncObj``: when the
election deadline of a follower or candidate has passed -- at the moment pysyncobj decides
to stand -- it lets it stand only if the pre-votes said so, and otherwise sends the
requests and moves the deadline one election timeout on. It answers the requests; the follower
(:class:`cluster.raft_follower.FollowerSafeSyncObj`) hands it the pre-vote messages, tells
it when a leader was heard and whether the empty-start rules allow a vote. pysyncobj's
real vote path is not touched.
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import syncobj as syncobj_module
from pysyncobj.syncobj import _RAFT_STATE

from cluster.raft_prevote import ANSWER, REQUEST, Campaign, Decision, grants, well_formed

__all__ = ["PreVote"]

log = logging.getLogger("migratory.raft")


class PreVote(SyncObj):  # type: ignore[misc]
    """``SyncObj`` that asks for pre-votes before it stands, and answers them."""

    pre_vote_enabled = True
    """False: behave as the version before pre-vote (ignore its messages, stand at the
    deadline) -- for the tests of a mixed cluster only."""
    _SyncObj__raftState: int
    _SyncObj__raftCurrentTerm: int
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftLeader: Any
    _SyncObj__connectedNodes: set[Any]
    _SyncObj__otherNodes: Any
    _SyncObj__transferInProgress: bool
    _SyncObj__selfNode: Any
    _pre_vote: Campaign | None = None
    _heard_leader_at: float | None = None

    def pre_vote_campaign(self) -> Campaign:
        """This seed's rounds (made at first use: the seeds are known then)."""
        if self._pre_vote is None:
            self._pre_vote = Campaign(cluster_size=len(self._SyncObj__otherNodes) + 1)
        return self._pre_vote

    def _heard_leader(self) -> None:
        """A live leader's AppendEntries was taken: no pre-vote is granted for a while,
        and a round of this seed's own is over."""
        self._heard_leader_at = syncobj_module.monotonicTime()
        if self._pre_vote is not None:
            self._pre_vote.stood()

    def _may_grant_pre_vote(self, candidate: Any, request: dict[str, Any]) -> bool:
        """Whether rules beside pre-vote's allow a vote for ``request`` (its term is the
        proposed one): the follower's empty-start rules (cluster/raft_votes.py)."""
        return True

    def _SyncObj__connectedToAnyone(self) -> bool:
        """pysyncobj asks this only when the election deadline of a follower or candidate
        has passed, and stands at once if it is True: the one moment to decide. A check
        earlier in the tick (as this module first did) let a process stopped between it
        and pysyncobj's own (SIGSTOP, a CPU limit) stand without pre-vote when it ran
        again (``test_raft_prevote_node.py``)."""
        if not super()._SyncObj__connectedToAnyone():
            return False
        if not self.pre_vote_enabled or self._SyncObj__transferInProgress:
            return True  # (a leadership transfer: the leader asked it to stand)
        return self._before_standing()

    def _before_standing(self) -> bool:
        """Whether to stand now; if not, a round of requests is sent and the deadline
        moved one election timeout on."""
        campaign = self.pre_vote_campaign()
        term = self._SyncObj__raftCurrentTerm
        linked = [n for n in self._SyncObj__otherNodes if n in self._SyncObj__connectedNodes]
        fallbacks = campaign.fallbacks
        if campaign.at_deadline(term, linked) is Decision.STAND:
            if campaign.fallbacks > fallbacks:
                (log.warning if fallbacks == 0 else log.info)(
                    "Raft: no answer to this seed's pre-vote from %d linked seed(s) that "
                    "never answered one (a version before pre-vote?): standing for election "
                    "in term %d as if they said yes", len(campaign.asked - set(campaign.answers)),
                    term + 1,
                )
            elif campaign.asked:
                log.info("Raft: pre-vote: %d of %d seed(s) asked said yes to term %d: "
                         "standing for election", campaign.granted(), len(campaign.asked),
                         term + 1)
            campaign.stood()
            return True
        if campaign.proposed_term == term + 1 and self._SyncObj__raftLeader is not None:
            # a whole round without a word from its leader: it has none (as pysyncobj's
            # candidacy said), so that the seed is not ready while it gets no log
            self._SyncObj__raftLeader = None
            self._SyncObj__onLeaderChanged()
        proposed, round_number = campaign.ask(term, linked)
        for node in linked:
            self._SyncObj__transport.send(node, {
                "type": REQUEST, "term": proposed, "round": round_number,
                "last_log_term": self._SyncObj__getCurrentLogTerm(),
                "last_log_index": self._SyncObj__getCurrentLogIndex(),
            })
        self._SyncObj__raftElectionDeadline = (
            syncobj_module.monotonicTime() + self._SyncObj__generateRaftTimeout()
        )
        return False

    def _pre_vote_message(self, node: Any, message: dict[str, Any]) -> bool:
        """Handle a pre-vote request or answer; True when ``message`` was one."""
        kind = message.get("type")
        if kind not in (REQUEST, ANSWER):
            return False
        if not self.pre_vote_enabled or not well_formed(message):
            return True  # (the version before ignores what it does not know)
        if kind == REQUEST:
            self._answer_pre_vote(node, message)
        else:
            self._hear_pre_vote(node, message)
        return True

    def _answer_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        self.pre_vote_campaign().requested_by(node)
        granted = grants(
            proposed_term=message["term"],
            candidate_log=(message["last_log_term"], message["last_log_index"]),
            current_term=self._SyncObj__raftCurrentTerm,
            own_log=(self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex()),
            leading=self._SyncObj__raftState == _RAFT_STATE.LEADER,
            heard_leader_at=self._heard_leader_at,
            now=syncobj_module.monotonicTime(),
            min_timeout=self.conf.raftMinTimeout,
        ) and self._may_grant_pre_vote(node, message)
        self._SyncObj__transport.send(node, {
            "type": ANSWER, "term": self._SyncObj__raftCurrentTerm,
            "proposed_term": message["term"], "round": message.get("round"), "granted": granted,
        })

    def _hear_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        campaign = self.pre_vote_campaign()
        if message["term"] > self._SyncObj__raftCurrentTerm:  # as any Raft message does
            self._SyncObj__setCurrentTerm(message["term"], None)
            self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
            self._SyncObj__raftLeader = None
        complete = campaign.hear(
            node, proposed_term=message["proposed_term"], granted=message.get("granted") is True,
        )
        if complete and campaign.proposed_term == self._SyncObj__raftCurrentTerm + 1:
            self._SyncObj__raftElectionDeadline = 0.0  # stand at the next tick

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        if self._pre_vote is not None:
            self._pre_vote.link_lost(node)
        super()._SyncObj__onNodeDisconnected(node)
