"""A seed that starts on an empty disk votes only once it holds the cluster's log again.

Raft's safety rests on every seed remembering, across restarts, its log and the vote it
gave in each term. A seed whose ``ClusterDataDir`` was lost (a deleted volume, a disk
replaced, a pod rescheduled without its claim) comes back empty: it may have been one of
the majority that acknowledged a publication, and now holds nothing. If another seed is
down at that moment (the one that also held the publication), the empty seed's vote lets
the third seed -- which never received it -- become leader: an acknowledged message is
lost and its position given to another one. ``docs/cluster.md`` told operators never to
do that; :class:`EmptyStart` makes the seed refuse instead:

- a seed is *empty-started* when it starts without a journal (or with the marker file
  this module leaves until it has caught up, so a crash in between changes nothing);
- while empty-started it takes no part until the term query
  (:mod:`cluster.raft_term_query`) has heard from enough seeds that one of them holds
  whatever it acknowledged before; it then grants its vote only to a candidate whose
  log is at least as up-to-date as the most up-to-date log among the answers
  (:attr:`log_floor`), standing in for the vote of the seed that holds what it lost. A
  brand-new cluster, where every seed starts empty, is told apart by the same answers
  (none holds an entry of a leader) and its seeds vote as Raft says from the start;
- it does not stand for election: its log is empty, or a prefix of the leader's (the
  leader died while resending it) as long as the log of a seed that lacks what this one
  had acknowledged, which then voted for it
  (``test_an_empty_seed_that_holds_a_prefix_of_the_log_does_not_stand``);
- it has caught up once its log matches a leader's up to the leader's commit index and
  the entry there is of the leader's term (or it is itself the leader of a brand-new
  cluster): such a leader has committed every entry of the terms before its own, and an
  entry of its term once it counted this seed's lost acknowledgement. Holding merely
  *an* entry of a leader is not enough: the leader resends the log in several messages,
  or its dump then the entries after it, and a seed holding only a prefix must not vote
  (:meth:`cluster.raft_follower.FollowerSafeSyncObj._holds_the_leaders_commit`). From
  then on it votes as Raft says, except in the terms it may have voted in before it lost
  its disk (up to the term at which it caught up), where it might vote twice; the
  follower records a vote for no one in that term, so a restart keeps the floor.

The cost: with one seed of three down and another one empty-started, the cluster stays
without a leader (publishes fail, nothing acknowledged is lost) until the seed that was
down comes back. A seed that joins for the very first time after the others have
elected is empty-started too, for the fraction of a second until the leader reaches it
(it cannot tell a new disk from a lost one). Pure bookkeeping, no pysyncobj:
:class:`cluster.raft_follower.FollowerSafeSyncObj` asks it about each vote
(``tests/cluster/test_raft_votes.py``).

Test-only switch: with ``MIGRATORY_TEST_RAFT=votes-on-empty-disk`` in the environment
of a member process, this rule is off and an empty-started seed votes as pysyncobj does
(logged as a warning at start, "never use in production"). It exists so that the tests
and the chaos checker can be shown to catch the loss the rule prevents
(``tests/cluster/test_cluster_lost_disk.py``, docs/chaos.md); no config key turns it on.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from cluster import raft_durability
from cluster.raft_disk import RaftDiskFailure

log = logging.getLogger("migratory.raft")

MARKER_SUFFIX = ".empty-start"
TEST_SWITCH = "MIGRATORY_TEST_RAFT"
VOTES_ON_EMPTY_DISK = "votes-on-empty-disk"


def votes_on_empty_disk(environ: Mapping[str, str]) -> bool:
    """Whether the test-only switch turns this module's rule off (ValueError on any
    other value, so that a typo does not silently test the rule)."""
    value = environ.get(TEST_SWITCH, "")
    if value not in ("", VOTES_ON_EMPTY_DISK):
        raise ValueError(f"{TEST_SWITCH} must be {VOTES_ON_EMPTY_DISK!r} or unset, got {value!r}")
    return value == VOTES_ON_EMPTY_DISK


class EmptyStart:
    """Whether this seed started on an empty disk and has not caught up since."""

    def __init__(
        self, journal_file: str | None, environ: Mapping[str, str] | None = None
    ) -> None:
        """``journal_file``: pysyncobj's journal, looked at *before* pysyncobj opens it
        (None: an in-memory journal, which starts empty every time); ``environ``
        (default ``os.environ``): where the test-only switch is read."""
        self.planted = votes_on_empty_disk(os.environ if environ is None else environ)
        if self.planted:
            log.warning(
                "TEST RAFT SWITCH ON (%s=%s): a seed that starts with an empty "
                "ClusterDataDir votes as pysyncobj does and can lose acknowledged "
                "publications (never use in production)", TEST_SWITCH, VOTES_ON_EMPTY_DISK,
            )
        self.marker = None if journal_file is None else journal_file + MARKER_SUFFIX
        self.active = (
            journal_file is None
            or not os.path.exists(journal_file)
            or os.path.exists(journal_file + MARKER_SUFFIX)
        )
        self.vote_floor = 0  # no vote in a term at or below this one
        # while empty-started: (last log term, last log index) a candidate's log must
        # reach (cluster/raft_term_query.py); None: the term query has not settled
        self.log_floor: tuple[int, int] | None = None
        self.refusals = 0
        self._refused_terms: set[int] = set()
        self._held_back = False  # logged that it does not stand for election
        self._new_cluster = False  # its term query found a brand-new cluster
        if self.active and self.marker is not None:
            try:
                with open(self.marker, "wb") as f:
                    f.write(b"this seed started without a Raft journal and has not caught up\n")
                    f.flush()
                    os.fsync(f.fileno())
                raft_durability.synced_directory(os.path.dirname(self.marker))  # (its name)
            except OSError as exc:  # (a full disk: the member says which file)
                raise RaftDiskFailure(self.marker, exc) from exc

    def caught_up(self, last_log_term: int, current_term: int) -> None:
        """Called once the seed holds its leader's log up to the leader's commit index
        (see the module docstring), with the log's last term."""
        if not self.active or last_log_term <= 0:
            return
        self._done(current_term)
        if self.refusals:
            log.warning(
                "Raft: this seed has caught up with the cluster's log (term %d) after "
                "starting empty; it votes again from term %d on",
                current_term, current_term + 1,
            )

    def joined_a_new_cluster(self, current_term: int) -> None:
        """The term query settled on a brand-new cluster: ``ceil(n/2)`` other seeds
        answered and none holds an entry of a leader (cluster/raft_term_query.py), so
        nothing was ever committed -- any majority that committed an entry shares a
        seed with them -- and voting as Raft says from now on loses nothing. Waiting
        instead could wait for ever: the first leader of a new cluster of five, deposed
        before its followers caught up, stood with its entries; the empty-started seeds
        refused it, refused each other and those holding part of its log did not stand
        (``test_a_new_cluster_whose_first_leader_is_deposed_elects_again``)."""
        if self.active and not self.planted:
            self._done(current_term)
            self._new_cluster = True

    def _done(self, current_term: int) -> None:
        self.active = False
        self.vote_floor = current_term
        if self.marker is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.marker)
            # gone on the disk too: back after a power loss, it would keep this seed out
            # of elections it must stand in (tests/cluster/test_raft_power_loss.py)
            with contextlib.suppress(OSError):
                raft_durability.synced_directory(os.path.dirname(self.marker))

    def settled(self, log_floor: tuple[int, int], new_cluster: bool, term: int) -> None:
        """The term query's answers settled: ``log_floor`` is the (last log term, last
        log index) of the most up-to-date log among them; ``new_cluster``: none holds
        an entry of a leader; ``term``: this seed's current term now."""
        self.log_floor = log_floor
        if new_cluster:
            self.joined_a_new_cluster(term)

    def may_vote(self, request: dict[str, Any]) -> bool:
        """Whether to answer this ``request_vote`` as pysyncobj would."""
        if self.planted:
            return True
        if self.active:
            if self.log_floor is None:
                return False  # (not settled: the request is ignored before this anyway)
            candidate = (request.get("last_log_term", 0), request.get("last_log_index", 0))
            return bool(candidate >= self.log_floor)
        return bool(request.get("term", 0) > self.vote_floor)

    def may_stand(self, last_log_term: int) -> bool:
        """Whether to stand for election: not while empty-started. Its log is empty --
        and a seed that was down while the others committed has an empty log too, whose
        vote would elect it -- or a prefix of the leader's, as long as the log of a seed
        that lacks what this one had acknowledged."""
        if self.planted or not self.active:
            return True
        if last_log_term > 0 and not self._held_back:
            self._held_back = True
            log.warning(
                "Raft: this seed started with an empty ClusterDataDir and holds only part "
                "of the cluster's log: it does not stand for election until a leader has "
                "sent it the rest (with the leader down as well, the cluster waits for it)"
            )
        return False

    def refused(self, candidate: Any, request: dict[str, Any]) -> None:
        self.refusals += 1
        term = request.get("term", 0)
        if term in self._refused_terms or len(self._refused_terms) > 1000:
            return
        self._refused_terms.add(term)
        if self.active and self.log_floor is None:  # (a pre-vote: cluster/raft_prevote.py)
            log.warning(
                "Raft: this seed started with an empty ClusterDataDir and has not heard "
                "the current term from enough seeds yet (cluster/raft_term_query.py): it "
                "does not vote for %s (term %s) until it has (with a seed down as well, "
                "the cluster waits for that seed)", candidate, term,
            )
        elif self.active:
            log.warning(
                "Raft: this seed started with an empty ClusterDataDir and has not caught "
                "up: it does not vote for %s (term %s), whose log (term %s, index %s) is "
                "behind the longest the other seeds told (term %s, index %s) and may lack "
                "what this seed acknowledged before; it votes once a leader has sent it "
                "the log (with a seed down as well, the cluster waits for that seed)",
                candidate, term, request.get("last_log_term"), request.get("last_log_index"),
                *(self.log_floor or ("?", "?")),
            )
        elif self._new_cluster:  # the usual first election of a new cluster: no fault
            log.info(
                "Raft: no vote for %s in term %s: this seed started with an empty "
                "ClusterDataDir and votes only after term %s, the one it found (a brand-new "
                "cluster: the next term elects)", candidate, term, self.vote_floor,
            )
        else:
            log.warning(
                "Raft: no vote for %s in term %s: this seed started with an empty "
                "ClusterDataDir and votes only after term %s, the one it caught up in (it "
                "may have voted in that term before it lost its disk)",
                candidate, term, self.vote_floor,
            )
