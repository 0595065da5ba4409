"""pysyncobj with the Raft follower rule for AppendEntries (paper §5.3, steps 3 and 4).

pysyncobj 0.3.17's follower deletes every entry after ``prevLogIdx`` before appending
the new ones, even entries it already holds from the same leader and has acknowledged.
Its leader re-sends overlapping ranges all the time (each success reply rewinds its
``nextIndex``), and a re-send may be cut into several messages by
``appendEntriesBatchSizeBytes``. Between two such messages the follower's log is
shorter than what it acknowledged; if the leader dies (or is paused, or partitioned)
right then, an election can pick a log without an entry that a majority had
acknowledged: a committed publication lost, and its position later given to another
message. The chaos suite found exactly that (two messages at one position).

:class:`FollowerSafeSyncObj` handles ordinary AppendEntries itself, as the paper says:

- an entry already held with the same term is kept, not deleted and re-added;
- only at the first entry whose term differs is the log truncated;
- entries beyond the message are kept (they may be the leader's too);
- the commit index advances only up to the last entry this message vouched for, so
  an unverified tail is never applied.

It handles the leader's dump (InstallSnapshot) too. pysyncobj 0.3.17 sends a dump as
AppendEntries without ``prevLogIdx``, in parts (or, while the dump is being written, with
``serialized: None``), and its follower moves the commit index to ``min(leader's commit,
own log end)`` on *every* such message: a deposed leader whose log still ends in entries
of its own term that never committed -- the usual reason it needs the dump -- applies
them, and hands their positions to its clients, before the dump replaces them. The chaos
suite found that (an acknowledged position later delivered with another message, right
after a leader change). Here such a message vouches for no entry: the commit index moves
only once the dump is loaded, to the dump's last entry, which the leader had committed.
At start-up it loads its own dump before it applies any entry, and keeps the journal's
entries after it (``_load_own_dump_first``, ``_keep_journal_after_dump``).

A seed that started on an empty disk neither votes nor stands where that could lose
what it had acknowledged (:mod:`cluster.raft_votes`); it asks for pre-votes before it
stands, and answers them (:mod:`cluster.raft_prevote`). Every other message goes to
pysyncobj unchanged, through its private attributes by their mangled names (so its
version is pinned in ``pyproject.toml``; ``tests/cluster/test_raft_follower.py`` checks
the bug in the base class and the fix, so a new pysyncobj shows up there).

**An applied entry is never replaced** (docs/cluster.md, "Why an applied Raft entry is
never replaced", has the argument with its tests), so neither pysyncobj's
"truncating already-applied log entries" CRITICAL nor this module's "state machine
diverged" one can be logged:

1. pysyncobj's own AppendEntries handling only ever sees messages of an older term
   (ignored); a dump replaces the whole state at once, with entries the leader committed,
   and only a state that has not applied its last entry (raft_dump_chunks.held_dump_end);
2. :meth:`FollowerSafeSyncObj._merge` removes entries only from the first index where
   the leader's entry has another term;
3. :meth:`FollowerSafeSyncObj._advance_commit` moves the commit index only over entries
   this message vouched for, so an applied entry is a committed one;
4. pysyncobj's leader (up-to-date votes, term and vote written before answering,
   commit by counting only entries of its own term) never sends a different entry at a
   committed index: so step 2 never removes an applied entry.

``tests/cluster/test_raft_applied_entry.py`` shows pysyncobj's follower dropping an
applied entry until the re-send completes (losing an acknowledged command if the leader
dies meanwhile); ``test_raft_safety.py`` searches schedules of real nodes for any
violation. Large entries come in parts, more than one marked ``finish``
(:mod:`cluster.raft_entry_parts`). A loaded dump restarts the election timeout.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE, monotonicTime

from cluster import raft_data_dir, raft_disk, raft_durability, raft_term_query
from cluster.raft_answer_terms import AnswersOfTheirTerm
from cluster.raft_compaction import CompactionWaitsForDumps
from cluster.raft_dump_chunks import UNREADABLE, dumps_sent_and_received, held_dump_end
from cluster.raft_dump_files import DumpRetries
from cluster.raft_election_timer import ElectionBackoff, deadline_after_joining, poll_timeout
from cluster.raft_entry_parts import LargeEntryParts
from cluster.raft_held_answers import HeldAnswers
from cluster.raft_own_state import NotInDumps, own_state_only
from cluster.raft_prevote_node import PreVote
from cluster.raft_stale_answers import StaleAnswersAfterADump
from cluster.raft_transport import KEEPALIVE
from cluster.raft_votes import MARKER_SUFFIX, EmptyStart
from cluster.raft_waiting import AnswersLostEntries

log = logging.getLogger("migratory.raft")

NO_VOTE_AFTER_EMPTY_START = "(caught up after an empty start: no vote in this term)"
"""Recorded as the vote of the term in which an empty-started seed caught up."""


class FollowerSafeSyncObj(HeldAnswers, ElectionBackoff, PreVote, CompactionWaitsForDumps,
                          AnswersOfTheirTerm, StaleAnswersAfterADump, AnswersLostEntries,
                          LargeEntryParts):
    """A ``SyncObj`` whose follower never drops entries it holds from the leader, nor,
    at start-up, those its journal holds after its dump (pysyncobj's private state it
    writes, annotated for mypy:)"""
    _SyncObj__raftLeader: Any
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftElectionDeadline: float
    _SyncObj__connectedNodes: set[Any]
    _linked_once = False  # a link has come up since this process started (class default)
    _SyncObj__transferInProgress: bool
    _SyncObj__leaderCommitIndex: int | None
    _SyncObj__serializer: Any
    _SyncObj__raftLog: Any
    _SyncObj__raftState: int
    _SyncObj__votedForNodeId: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        conf = kwargs.get("conf")
        if conf is not None and conf.dynamicMembershipChange:
            raise ValueError("FollowerSafeSyncObj does not support dynamicMembershipChange")
        # (term, index): the leader of that term goes back at least to this index (set
        # before SyncObj.__init__, so never in a dump)
        self._catch_up_floor: tuple[int, int] | None = None
        # (leader, term) whose dump it receives, from its first part on this link; None:
        # no part but a first one is taken (see _install_dump)
        self._dump_source: tuple[Any, int] | None = None
        self._last_dump_entry: Any = None  # of the dump read last (here: never dumped)
        self._peeked_dump: Any = None  # a dump read to see where it ends (read once)
        self._dump_retries = DumpRetries()  # dumps failed, not for the disk (their count)
        journal = None if conf is None else conf.journalFile
        if conf is not None and journal is not None:  # damage refused (raft_data_dir.py)
            self._check_data_dir(journal, conf.fullDumpFile)
        # looked at before pysyncobj creates the journal (cluster/raft_votes.py)
        self._empty_start = EmptyStart(journal)
        raft_durability.install()  # (once) what it answers is on the disk first
        others = args[1] if len(args) > 1 else kwargs.get("otherNodes", ())
        self._term_quorum = raft_term_query.TermQuorum(  # (not with the test-only switch)
            others=len(others),
            waiting=self._empty_start.active and not self._empty_start.planted,
        )
        if not others:  # a lone seed: nothing another seed could hold (raft_votes.py)
            self._empty_start.joined_a_new_cluster(0)
        super().__init__(*args, **kwargs)
        self._SyncObj__properies = NotInDumps()  # this process's state stays out of dumps
        # forwarded commands' ids unique across restarts (test_raft_forwarded_commands)
        self._SyncObj__commandsLocalCounter = secrets.randbits(62)
        serializer = self._SyncObj__serializer
        dumps_sent_and_received(serializer, self._dump_retries)  # (raft_dump_chunks.py)
        read_dump = serializer.deserialize

        def deserialize() -> Any:
            self._last_dump_entry = None
            data, self._peeked_dump = self._peeked_dump or read_dump(), None
            data = own_state_only(data)  # (an older version's dump: raft_own_state.py)
            self._last_dump_entry = data[1]
            return data

        serializer.deserialize = deserialize

    def _check_data_dir(self, journal_file: str, dump_file: str | None) -> None:
        raft_data_dir.check(journal_file, dump_file, journal_file + MARKER_SUFFIX)

    def _caught_up(self) -> None:
        """This empty-started seed holds what it may have acknowledged before: it is
        the leader (elected with an empty log), or :meth:`_holds_the_leaders_commit`."""
        if self._empty_start.active:
            term = self._SyncObj__raftCurrentTerm
            self._empty_start.caught_up(self._SyncObj__getCurrentLogTerm(), term)
            if not self._empty_start.active and self._SyncObj__votedForNodeId is None:
                # the vote floor, on disk: no vote in this term after a restart either
                # (pysyncobj grants none while a vote is recorded for the current term)
                self._SyncObj__setCurrentTerm(term, NO_VOTE_AFTER_EMPTY_START)

    def _holds_the_leaders_commit(self, message: dict[str, Any], vouched: int) -> None:
        """An empty-started seed has caught up once its log matches the leader's up to
        the leader's commit index *and* the entry there is of the leader's term.

        Holding *an* entry of a leader is not enough: the leader sends the log from the
        start in several messages (``appendEntriesBatchSizeBytes``), or its dump and then
        the entries after it; a seed that voted after the first of them, while it held
        only a prefix, let a seed without what it had acknowledged before its disk was
        lost become leader (``test_raft_votes.py``,
        ``test_an_empty_seed_that_holds_a_prefix_of_the_log_does_not_vote``). A leader
        that committed an entry of its own term holds every entry committed before its
        term, below that entry; an entry of its term that this seed acknowledged before
        is below the leader's commit index once the leader counted it."""
        if not self._empty_start.active:
            return
        commit, term = message["commit_index"], message["term"]
        held = self._SyncObj__getEntries(commit, 1) if vouched >= commit else []
        if held and held[0][2] == term:
            self._caught_up()

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        if not clearJournal:
            self._keep_journal_after_dump()
        with raft_disk.not_swallowed():  # pysyncobj logs any error of it and goes on
            super()._SyncObj__loadDumpFile(clearJournal)  # (raft_waiting.py, then pysyncobj)

    def _keep_journal_after_dump(self) -> None:
        """Start-up found a dump and a journal that still holds entries before it.

        pysyncobj writes a compaction's dump, and only once it sees the dump written
        does it drop the journal entries the dump replaces. A node SIGKILLed in between
        restarts with both; pysyncobj 0.3.17 then sees a journal that does not start at
        the dump and *clears it*, dropping every entry after the dump too -- entries
        this node had acknowledged to the leader. When every seed is killed during a
        compaction (they compact at about the same time), a committed publication is
        lost and its position given to another message (the chaos suite saw exactly
        that). Here the journal is trimmed to start at the dump, as a finished
        compaction leaves it, so pysyncobj keeps the entries after it.
        """
        journal = self._SyncObj__raftLog
        try:
            data = self._SyncObj__serializer.deserialize()
            before_last, last = data[2], data[1]
            self._peeked_dump = data  # the load next takes it
            offset = before_last[1] - journal[0][1]
        except Exception:  # no readable dump or empty journal: pysyncobj decides
            return
        if offset <= 0 or offset + 1 >= len(journal):
            return
        if journal[offset] == before_last and journal[offset + 1] == last:
            log.warning(
                "Raft: the journal still holds %d entries the dump at %d replaces "
                "(stopped mid-compaction): dropping those, keeping the %d after it",
                offset, last[1], len(journal) - offset - 2,
            )
            self._SyncObj__deleteEntriesTo(journal[offset][1])  # (raft_compaction.py)

    def _load_own_dump_first(self) -> None:
        """pysyncobj loads it once its transport is ready, applying the journal's committed
        entries at each tick before: with the Raft port held and the journal still holding
        what the dump replaces, every batch was applied, then the dump loaded, then those
        after it again (``test_raft_dump_restart.py``)."""
        dump = self._SyncObj__conf.fullDumpFile
        if dump is not None and os.path.isfile(dump):
            self._SyncObj__loadDumpFile(clearJournal=False)
        self._SyncObj__needLoadDumpFile = False  # (after it, as pysyncobj: a failure retries)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self._SyncObj__needLoadDumpFile:
            self._load_own_dump_first()
        # a leader counts its own entries towards a commit in this tick: on the disk first
        raft_durability.journal_durable(self._SyncObj__raftLog)
        quorum = self._term_quorum
        if quorum.waiting:  # an empty-started seed asks for the current term
            for node in quorum.due(monotonicTime(), self._SyncObj__connectedNodes):
                self._SyncObj__transport.send(node, quorum.query())
        if self._empty_start.active and self._SyncObj__raftState == _RAFT_STATE.LEADER:
            self._caught_up()  # a leader holds its own log (once it wrote an entry)
        # pysyncobj checks the deadline first, then polls: wake just past it (raft_election_timer)
        super()._onTick(poll_timeout(
            timeToWait, self._SyncObj__raftElectionDeadline, monotonicTime(),
            leader=self._SyncObj__raftState == _RAFT_STATE.LEADER,
        ))

    def _SyncObj__connectedToAnyone(self) -> bool:
        """pysyncobj asks this only when its election deadline has passed, and stands at
        once if True: not with part of the log (raft_votes.py). Checked earlier in the
        tick, a deadline that passed in between (the process stopped there) let an
        empty-started seed stand (``test_raft_votes.py``); then the pre-vote
        (cluster/raft_prevote_node.py)."""
        if not self._empty_start.may_stand(self._SyncObj__getCurrentLogTerm()):
            self._SyncObj__raftElectionDeadline = monotonicTime() + 0.1
            return False
        return bool(super()._SyncObj__connectedToAnyone())

    def _checkCommandsToApply(self) -> None:
        super()._checkCommandsToApply()
        # a leader's new entries are on their way to the followers (sent at once):
        # synced meanwhile, so the next tick's count does not wait for this disk
        raft_durability.journal_durable(self._SyncObj__raftLog)

    def _SyncObj__onNodeConnected(self, node: Any) -> None:
        SyncObj._SyncObj__onNodeConnected(self, node)
        self._SyncObj__raftElectionDeadline = deadline_after_joining(  # raft_election_timer
            self._SyncObj__raftElectionDeadline, monotonicTime(),
            self._SyncObj__generateRaftTimeout(), links=len(self._SyncObj__connectedNodes),
            first=not self._linked_once,
            follower=self._SyncObj__raftState == _RAFT_STATE.FOLLOWER,
        )
        self._linked_once = True

    def _may_grant_pre_vote(self, candidate: Any, request: dict[str, Any]) -> bool:
        """A pre-vote as a vote (cluster/raft_prevote.py): not before the term query
        settled, and only as the empty-start rules allow (raft_votes.py); a refusal is
        said as a vote's is (a candidate refused its pre-vote never asks the vote)."""
        if self._term_quorum.waiting or not self._empty_start.may_vote(request):
            self._empty_start.refused(candidate, request)
            return False
        return True

    def _term_message(self, node: Any, message: dict[str, Any]) -> bool:
        """Handle the term query and its answer (cluster/raft_term_query.py); True when
        ``message`` is done with: one of those, or one a seed still waiting ignores."""
        kind = message.get("type")
        if kind == raft_term_query.QUERY:
            self._SyncObj__transport.send(node, {
                "type": raft_term_query.ANSWER,
                "term": self._SyncObj__raftCurrentTerm,
                "last_log_term": self._SyncObj__getCurrentLogTerm(),
                "last_log_index": self._SyncObj__getCurrentLogIndex(),
                # its log vouches for nothing it acknowledged before (raft_term_query.py)
                "empty_start": self._empty_start.active and not self._empty_start.planted,
                "ask": message.get("ask"),  # the round it answers (raft_term_query.py)
            })
            return True
        quorum = self._term_quorum
        if kind == raft_term_query.ANSWER:
            term = quorum.hear(node, message)
            if term is not None:  # settled: (raft_votes.py) nothing to protect if new
                self._empty_start.settled(quorum.log_floor, quorum.new_cluster,
                                          max(term, self._SyncObj__raftCurrentTerm))
            if term is not None and term > self._SyncObj__raftCurrentTerm:
                self._SyncObj__setCurrentTerm(term, None)
                self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
                self._SyncObj__raftLeader = None
            return True
        # not in the cluster before it knows the term: a deposed leader would find term 0
        return quorum.waiting and kind in ("append_entries", "request_vote")

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        if message.get("type") == KEEPALIVE:  # its arrival was the point (raft_transport.py)
            return
        if self._term_message(node, message) or self._pre_vote_message(node, message):
            return
        kind = message.get("type")
        if kind == "append_entries" and message["term"] >= self._SyncObj__raftCurrentTerm:
            if "prevLogIdx" in message:
                self._append_entries(node, message)
            else:
                self._install_dump(node, message)
            return
        if kind == "request_vote" and not self._empty_start.may_vote(message):
            self._empty_start.refused(node, message)  # as if the request was lost
            return
        SyncObj._SyncObj__onMessageReceived(self, node, self._answer_heard(node, message))

    def _follow(self, node: Any, message: dict[str, Any]) -> None:
        """What any AppendEntries from a current leader does (as pysyncobj does it)."""
        self._heard_leader()  # no pre-vote granted for a while (cluster/raft_prevote.py)
        if message["term"] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                monotonicTime() + self._SyncObj__generateRaftTimeout()
            )
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if message["term"] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(message["term"], None)
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__leaderCommitIndex = message["commit_index"]

    def _append_entries(self, node: Any, message: dict[str, Any]) -> None:
        self._follow(node, message)
        entries = self._received_entries(node, message)
        if entries is None:
            return
        prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        held = self._SyncObj__getEntries(prev_idx)
        if not held:
            back = self._go_back(message["term"], self._SyncObj__getCurrentLogIndex() + 1)
            self._hold_answer(node, back, success=False, reset=True, term=message["term"])
            return
        if held[0][2] != prev_term:
            back = self._go_back(message["term"], self._first_of_term(prev_idx, held[0][2]))
            self._hold_answer(node, back, success=False, reset=True, term=message["term"])
            return
        self._merge(held[1:], entries)
        vouched = entries[-1][1] if entries else prev_idx
        floor = self._catch_up_floor
        if floor is not None and (floor[0] != message["term"] or floor[1] <= vouched):
            self._catch_up_floor = None  # the log matches the leader's past the floor
        # "I hold them" once on the disk, with the others of this poll (raft_held_answers)
        self._hold_answer(node, vouched + 1, success=True, term=message["term"])
        self._advance_commit(message["commit_index"], vouched)
        self._holds_the_leaders_commit(message, vouched)

    def _first_of_term(self, index: int, term: int) -> int:
        """The first index of the run of ``term`` entries that ends at ``index`` (not
        below the commit index + 1: committed entries are the leader's too)."""
        journal = self._SyncObj__raftLog
        first_held = journal[0][1]
        lowest = max(first_held + 1, self._SyncObj__raftCommitIndex + 1)
        first = index
        while first > lowest and journal[first - 1 - first_held][2] == term:
            first -= 1
        return first

    def _go_back(self, term: int, hint: int) -> int:
        """Where the leader should resend from after a mismatch: ``hint``, never above
        an earlier mismatch of this leader's term.

        pysyncobj's leader sends everything from ``nextIndex`` on in several messages
        when it is large, and takes each failure's answer as the new ``nextIndex``: the
        *last* answer of a round wins. A follower answering each message on its own (as
        pysyncobj's does) sent it back up past the conflict every round -- a livelock
        in which a deposed leader never caught up and, with a third seed down, nothing
        committed until the leader compacted its log (up to 120 s;
        ``tests/cluster/test_raft_catch_up.py``). A run of entries of one conflicting term
        is skipped at once (Raft's usual optimisation) instead of one index per round.
        """
        floor = self._catch_up_floor
        if floor is not None and floor[0] == term:
            hint = min(hint, floor[1])
        self._catch_up_floor = (term, hint)
        return hint

    def _install_dump(self, node: Any, message: dict[str, Any]) -> None:
        """A part of the leader's dump, or word that it is still being written. Nothing
        this follower holds is vouched for until the whole dump is loaded; then the log
        is the dump's last two entries, committed by the leader."""
        self._follow(node, message)
        serialized = message.get("serialized")
        if serialized is None or not self._part_of_the_dump_begun(node, message):
            return
        if not self._SyncObj__serializer.setTransmissionData(serialized):
            return
        self._dump_source = None
        self._last_dump_entry = None
        kept = self._holds_the_dumps_end()
        if kept == UNREADABLE:
            return  # vouches for nothing: the leader sends its dump again
        if kept is not None:
            self._send_answer(node, kept + 1, success=True, term=message["term"])
            self._advance_commit(message["commit_index"], kept)
            self._holds_the_leaders_commit(message, kept)
            return
        self._SyncObj__loadDumpFile(clearJournal=True)  # logs and swallows any error
        last = self._last_dump_entry
        if last is None or self._SyncObj__raftLog[-1] != last:
            # not loaded: a success would move the commit index over this node's own log (a
            # deposed leader's uncommitted tail); the leader sends its dump again (dump_chunks)
            log.warning("Raft: the leader's dump could not be loaded: asking for it again")
            return
        raft_durability.journal_durable(self._SyncObj__raftLog)  # (the dump is, its replace)
        self._follow(node, message)  # again: a new election timeout from the load's end
        self._send_answer(node, None, success=True, term=message["term"])  # (its log's end)
        self._advance_commit(message["commit_index"], self._SyncObj__getCurrentLogIndex())
        self._holds_the_leaders_commit(message, self._SyncObj__getCurrentLogIndex())

    def _holds_the_dumps_end(self) -> int | None:
        """:func:`cluster.raft_dump_chunks.held_dump_end` of this follower."""
        return held_dump_end(self)

    def _part_of_the_dump_begun(self, node: Any, message: dict[str, Any]) -> bool:
        """Whether this part continues the dump whose first part came from the same
        leader, in the same term, on a link not broken since.

        pysyncobj's follower appends every part that is not a first one to the file it
        is receiving, whatever sent it, and its leader keeps its place in a follower's
        transmission when the link breaks and is made again between two of its rounds
        (it cancels one only if the follower is disconnected when it sends), or when it
        leads again after another leader began sending its own dump. The parts lost in
        flight, or another dump's start, were then spliced in: "failed to load full
        dump", the follower's dump file replaced by the corrupt one, and the follower
        answering success and moving its commit index over its own log
        (``tests/cluster/test_raft_dump_chunks.py``). A part that does not continue is
        dropped; the leader finishes that transmission and starts a new one, from its
        first part, at its next round.
        """
        serialized = message["serialized"]
        source = (node, message["term"])
        if serialized[1]:  # the first part
            self._dump_source = source
            return True
        return self._dump_source == source

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        if self._dump_source is not None and self._dump_source[0] == node:
            self._dump_source = None
        super()._SyncObj__onNodeDisconnected(node)  # (raft_waiting.py, then pysyncobj)

    def _merge(self, held: list[Any], entries: list[Any]) -> None:
        """Keep what matches, truncate at the first conflict, append the rest."""
        same = 0
        for have, new in zip(held, entries, strict=False):
            if have[1] != new[1] or have[2] != new[2]:
                break
            same += 1
        if same < len(held) and same < len(entries):
            conflict = entries[same][1]
            if conflict <= self._SyncObj__raftLastApplied:
                log.critical(
                    "Raft: the leader replaces applied entry %d (last applied %d): "
                    "state machine diverged",
                    conflict,
                    self._SyncObj__raftLastApplied,
                )
            self._SyncObj__deleteEntriesFrom(conflict)
        for entry in entries[same:]:
            self._SyncObj__raftLog.add(*entry)

    def _advance_commit(self, leader_commit: int, vouched: int) -> None:
        commit = self._SyncObj__raftCommitIndex
        last = self._SyncObj__getCurrentLogIndex()
        if commit > last:
            commit = last
        if leader_commit > commit:
            commit = max(commit, min(leader_commit, vouched))
        self._SyncObj__raftCommitIndex = commit
        self._SyncObj__raftLog.setRaftCommitIndex(commit)
