"""cluster/standard_lineage.py: which forwards a Standard member may have missed, and
what its peer forwards again."""

from __future__ import annotations

from cluster.standard_lineage import Forward, ForwardLineage, ForwardNumbering, UnsentSubjects
from migratory.model.message import Message, MessageType

IBM, AAPL = "/Stocks/NYSE/IBM", "/Stocks/NASDAQ/AAPL"


def forwarded(subject: str, epoch: int, seq: int) -> Message:
    return Message(subject, b"x", epoch=epoch, seq=seq)


def test_forwards_one_after_another_follow_and_a_skipped_seq_is_a_gap() -> None:
    lineage = ForwardLineage()
    assert lineage.take("a", forwarded(IBM, 7, 1)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 7, 2)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 7, 4)) is Forward.GAP  # 3 never came
    assert lineage.take("a", forwarded(IBM, 7, 5)) is Forward.NEXT
    assert lineage.gaps == 1


def test_peers_and_subjects_are_counted_apart() -> None:
    lineage = ForwardLineage()
    assert lineage.take("a", forwarded(IBM, 7, 1)) is Forward.NEXT
    assert lineage.take("b", forwarded(IBM, 9, 1)) is Forward.NEXT
    assert lineage.take("a", forwarded(AAPL, 7, 1)) is Forward.NEXT
    assert lineage.take("b", forwarded(IBM, 9, 2)) is Forward.NEXT
    assert lineage.gaps == 0


def test_a_first_forward_after_the_start_of_its_lineage_is_a_gap() -> None:
    """This member started (or restarted) after the peer numbered the subject."""
    lineage = ForwardLineage()
    assert lineage.take("a", forwarded(IBM, 7, 57)) is Forward.GAP


def test_a_new_lineage_from_a_peer_is_a_gap() -> None:
    """The peer restarted (or forgot the subject): the end of its old lineage may be lost."""
    lineage = ForwardLineage()
    assert lineage.take("a", forwarded(IBM, 7, 1)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 8, 1)) is Forward.GAP
    assert lineage.take("a", forwarded(IBM, 8, 2)) is Forward.NEXT


def test_a_first_forward_of_a_subject_held_before_the_peers_process_was_met_is_a_gap() -> None:
    """Its seq 1 is the first of *this* life of the peer: an earlier life may have
    acknowledged a message of the subject that never came (its queue lost as it died).
    Before: taken as following on, the subject's subscribers here missed it silently."""
    lineage = ForwardLineage()
    lineage.met("a", "life-2", 5)  # 5 subjects made here when the link came up
    assert lineage.take("a", forwarded(IBM, 8, 1), incarnation="life-2", made=5) is Forward.GAP
    assert lineage.take("a", forwarded(IBM, 8, 2), incarnation="life-2", made=5) is Forward.NEXT
    # made after the meeting: every earlier life had ended before anyone here held it
    assert lineage.take("a", forwarded(AAPL, 9, 1), incarnation="life-2", made=6) is Forward.NEXT
    # held by nobody here: no one to miss anything
    assert lineage.take("a", forwarded("/a/1", 3, 1), incarnation="life-2") is Forward.NEXT
    assert lineage.gaps == 1


def test_a_peers_new_process_is_met_anew_and_the_same_one_again_changes_nothing() -> None:
    lineage = ForwardLineage()
    lineage.met("a", "life-1", 0)
    lineage.met("b", "other", 0)
    lineage.met("a", "life-2", 10)  # restarted: met when 10 subjects were made here
    lineage.met("a", "life-2", 20)  # a link again, either way: the same process
    lineage.met("a", None, 30)  # (a member that predates link settings: nothing learnt)
    assert lineage.take("a", forwarded(IBM, 8, 1), incarnation="life-2", made=7) is Forward.GAP
    assert lineage.take("a", forwarded(AAPL, 8, 1), incarnation="life-2", made=15) is Forward.NEXT
    assert lineage.take("b", forwarded(IBM, 4, 1), incarnation="other", made=7) is Forward.NEXT


def test_a_first_forward_on_a_link_of_another_or_an_unknown_process_is_a_gap() -> None:
    """A forward of the old life still on its way after the new one was met, or one from
    a member that predates link settings: nothing says no earlier life left one out."""
    lineage = ForwardLineage()
    lineage.met("a", "life-2", 0)
    assert lineage.take("a", forwarded(IBM, 7, 1), incarnation="life-1", made=1) is Forward.GAP
    assert lineage.take("a", forwarded(AAPL, 7, 1), incarnation=None, made=1) is Forward.GAP
    assert lineage.take("b", forwarded(IBM, 7, 1), incarnation="never-met", made=1) is Forward.GAP
    assert lineage.take("b", forwarded(AAPL, 7, 1), incarnation=None) is Forward.NEXT  # not held


def test_a_forward_at_or_before_the_last_one_is_seen_and_changes_nothing() -> None:
    lineage = ForwardLineage()
    for seq in (1, 2, 3):
        lineage.take("a", forwarded(IBM, 7, seq))
    assert lineage.take("a", forwarded(IBM, 7, 3)) is Forward.SEEN  # a needless repair
    assert lineage.take("a", forwarded(IBM, 7, 2)) is Forward.SEEN
    assert lineage.take("a", forwarded(IBM, 7, 4)) is Forward.NEXT
    assert lineage.gaps == 0


def test_a_forgotten_subject_is_a_gap_never_a_silent_one() -> None:
    lineage = ForwardLineage(max_subjects=2)
    for subject in ("/a/1", "/a/2", "/a/3"):  # /a/1 forgotten
        assert lineage.take("a", forwarded(subject, 7, 1)) is Forward.NEXT
    assert lineage.take("a", forwarded("/a/1", 7, 2)) is Forward.GAP
    assert lineage.take("a", forwarded("/a/4", 7, 1)) is Forward.GAP  # may be one forgotten
    assert len(lineage._last["a"]) == 2


def test_a_dropped_forward_is_unsent_until_a_later_one_of_its_subject_is_queued() -> None:
    unsent = UnsentSubjects()
    unsent.dropped(IBM)
    unsent.dropped(AAPL)
    unsent.queued(AAPL)  # its arrival shows the receiver the gap
    assert unsent.repairs() == [IBM]
    assert unsent.repairs() == []


def test_what_a_broken_link_carried_is_unsent() -> None:
    unsent = UnsentSubjects()
    unsent.sent(IBM)
    unsent.sent(AAPL)
    unsent.link_lost()
    assert unsent.repairs() == [AAPL, IBM]
    unsent.link_lost()  # a link that carried nothing
    assert unsent.repairs() == []


def test_an_unnumbered_forward_is_taken_and_what_follows_it_checked_as_a_first_one() -> None:
    lineage = ForwardLineage()
    assert lineage.take("a", forwarded(IBM, 7, 1)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 0, 0)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 0, 0)) is Forward.NEXT
    assert lineage.take("a", forwarded(IBM, 7, 2)) is Forward.GAP


def test_a_members_forwards_are_numbered_per_subject_whatever_else_it_numbers() -> None:
    """Its hub's positions count the subject's publications of every member: forwarded
    at those, a peer saw a gap after each of the other publisher's messages."""
    numbering = ForwardNumbering()
    first = numbering.number(Message(IBM, b"1", closure="c", epoch=5, seq=1))
    other = numbering.number(Message(AAPL, b"x", epoch=5, seq=2))
    second = numbering.number(Message(IBM, b"2", epoch=5, seq=3))  # seq 2 was another's
    assert (first.seq, second.seq, other.seq) == (1, 2, 1)
    assert first.epoch == second.epoch != other.epoch
    assert (first.closure, first.type) == (None, MessageType.UPDATE)
    assert numbering.last(IBM) == second
    lineage = ForwardLineage()
    assert [lineage.take("a", m) for m in (first, other, second)] == [Forward.NEXT] * 3


def test_a_forgotten_subjects_next_forward_starts_a_new_epoch() -> None:
    numbering = ForwardNumbering(max_subjects=1)
    first = numbering.number(Message(IBM, b"1"))
    numbering.number(Message(AAPL, b"x"))  # IBM forgotten
    assert numbering.last(IBM) is None
    again = numbering.number(Message(IBM, b"2"))
    assert again.epoch != first.epoch  # never (first.epoch, 1) twice
    lineage = ForwardLineage()
    lineage.take("a", first)
    assert lineage.take("a", again) is Forward.GAP


def test_a_forgotten_subject_that_never_reached_the_peer_is_a_gap_there_too() -> None:
    """Its first forward was dropped (the peer's queue full), the sender forgot it (and
    so its repair) before the link came back: before, its next forward came at (a new
    epoch, seq 1), which a peer that had heard nothing of it took as the first -- the
    dropped message missing, no DATA_RESYNC."""
    numbering, unsent = ForwardNumbering(max_subjects=1), UnsentSubjects()
    lineage = ForwardLineage()
    lineage.met("a", "life", 0)  # (subjects made here after meeting the sender's process)
    numbering.number(Message(IBM, b"1"))
    unsent.dropped(IBM)
    aapl = numbering.number(Message(AAPL, b"x"))  # IBM forgotten
    unsent.queued(AAPL)
    assert lineage.take("a", aapl, incarnation="life", made=1) is Forward.NEXT
    assert [numbering.last(subject) for subject in unsent.repairs()] == [None]  # no repair
    again = numbering.number(Message(IBM, b"2"))
    assert lineage.take("a", again, incarnation="life", made=2) is Forward.GAP


def test_the_subjects_a_link_carried_are_bounded() -> None:
    """Before: every subject ever forwarded on a link was kept until it broke (a set:
    one-off subjects over days, without bound)."""
    unsent = UnsentSubjects(max_subjects=3)
    for n in range(10):
        unsent.sent(f"/device/{n}")
        unsent.dropped(f"/lost/{n}")
    assert len(unsent.on_link) == 3 and len(unsent.unsent) == 3
    unsent.link_lost()
    assert unsent.repairs() == ["/device/7", "/device/8", "/device/9"]  # the most recent


def test_the_last_forwards_kept_for_repairs_are_bounded_in_bytes() -> None:
    """Before: the last forward of each of up to 100,000 subjects was kept whole (up to
    100,000 x MaxMessageSize), after the hub's cache had let them go."""
    numbering = ForwardNumbering(max_bytes=3 * 1000)
    for n in range(10):
        numbering.number(Message(f"/big/{n}", b"x" * 994))  # 1,000 bytes with its subject
    assert numbering.kept_bytes == 3000
    assert [numbering.last(f"/big/{n}") is not None for n in range(10)] == [False] * 7 + [True] * 3
    again = numbering.number(Message("/big/0", b"y"))  # its position is still known
    assert (again.seq, numbering.kept_bytes) == (2, 2000 + again.size())
