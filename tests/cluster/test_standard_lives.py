"""cluster/standard_lives.py: a Standard member's lives on its data directory, and the
chain a peer makes of them (``ForwardLineage.met`` / ``ended``): a cleanly drained
member's next life's seq 1 follows on only when no life between them can have published
and died without reaching the peer."""

from __future__ import annotations

from pathlib import Path

from cluster.standard import StandardNode
from cluster.standard_lineage import Forward, ForwardLineage
from cluster.standard_lives import (
    LifeRecord,
    clean_predecessor,
    life_id,
    new_incarnation,
    reads_goodbyes,
)
from migratory.config import Config
from migratory.model.message import Message

IBM, AAPL = "/Stocks/NYSE/IBM", "/Stocks/NASDAQ/AAPL"
PEER = "127.0.0.1:9011"


def forwarded(subject: str, epoch: int, seq: int) -> Message:
    return Message(subject, b"x", epoch=epoch, seq=seq)


# --- the record -----------------------------------------------------------------------


def test_a_life_ended_cleanly_is_named_by_the_next_one(tmp_path: Path) -> None:
    record = LifeRecord(tmp_path)
    first, incarnation = record.begin()
    assert clean_predecessor(incarnation) is None and reads_goodbyes(incarnation)
    assert life_id(incarnation) == first
    record.end_clean(first)
    second, incarnation = LifeRecord(tmp_path).begin()
    assert clean_predecessor(incarnation) == first and second != first


def test_a_life_that_did_not_end_cleanly_is_named_by_no_one(tmp_path: Path) -> None:
    """Killed (never ended), or a forward after a goodbye (ended unclean), or a life
    between that recorded itself and died: the next one names no predecessor."""
    record = LifeRecord(tmp_path)
    first, _ = record.begin()
    record.end_clean(first)
    _, incarnation = record.begin()  # the life between: recorded, then killed
    assert clean_predecessor(incarnation) == first
    _, incarnation = record.begin()
    assert clean_predecessor(incarnation) is None
    late, _ = record.begin()
    record.end_clean(late)
    record.end_unclean(late)
    assert clean_predecessor(record.begin()[1]) is None


def test_an_unreadable_record_or_another_members_names_no_predecessor(
    tmp_path: Path,
) -> None:
    (tmp_path / "standard-life").write_text("{not json")
    assert clean_predecessor(LifeRecord(tmp_path).begin()[1]) is None
    (tmp_path / "standard-life").write_text('{"life": 5, "clean": true}')
    assert clean_predecessor(LifeRecord(tmp_path).begin()[1]) is None
    copied = tmp_path / "copied"  # another member's record, copied here under this name
    other = LifeRecord(copied, "127.0.0.1:9002")
    other.end_clean(other.begin()[0])
    other.path.rename(copied / "standard-life-127.0.0.1_9001")
    assert clean_predecessor(LifeRecord(copied, "127.0.0.1:9001").begin()[1]) is None


def test_members_given_one_directory_keep_their_lives_apart(tmp_path: Path) -> None:
    one, two = LifeRecord(tmp_path, "127.0.0.1:9001"), LifeRecord(tmp_path, "127.0.0.1:9002")
    first = one.begin()[0]
    one.end_clean(first)
    two.begin()
    assert clean_predecessor(LifeRecord(tmp_path, "127.0.0.1:9001").begin()[1]) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "standard-life-127.0.0.1_9001", "standard-life-127.0.0.1_9002"]


def test_a_record_that_cannot_be_written_stops_the_start_naming_it(tmp_path: Path) -> None:
    (tmp_path / "standard-life.part").mkdir()  # (the write's temporary file: a directory)
    try:
        LifeRecord(tmp_path).begin()
    except OSError as exc:
        assert "cannot record this life in" in str(exc) and "standard-life" in str(exc)
    else:
        raise AssertionError("a life not recorded started")


def test_an_older_members_incarnation_reads_no_goodbye() -> None:
    assert not reads_goodbyes("ab12cd34") and not reads_goodbyes(None)
    assert clean_predecessor("ab12cd34") is None
    own, incarnation = new_incarnation("feed")
    assert incarnation == f"{own}/feed"


# --- the chain ------------------------------------------------------------------------


def _forwarded_by_first_life() -> ForwardLineage:
    """The peer's life x met (moment 0), IBM held here since moment 1, forwarded 1..3."""
    lineage = ForwardLineage()
    lineage.met(PEER, "x/", 0)
    for seq in (1, 2, 3):
        assert lineage.take(PEER, forwarded(IBM, 7, seq), incarnation="x/",
                            made=1) is Forward.NEXT
    return lineage


def test_the_next_life_of_a_peer_that_said_goodbye_follows_on() -> None:
    """Before (no chain): its seq 1 in a new epoch was a gap -- a resync of every
    subject the peer published, 50 for 50 (docs/cluster.md)."""
    lineage = _forwarded_by_first_life()
    lineage.ended(PEER, "x/")
    assert lineage.met(PEER, "y/x", 5)  # chained
    assert lineage.take(PEER, forwarded(IBM, 8, 1), incarnation="y/x", made=1) is Forward.NEXT
    assert lineage.take(PEER, forwarded(IBM, 8, 2), incarnation="y/x", made=1) is Forward.NEXT
    assert lineage.gaps == 0


def test_a_life_between_that_never_reached_this_member_breaks_the_chain() -> None:
    """The unsafe interleaving: x said goodbye; l started (it names x), published IBM,
    died without reaching this member; y names l -- not clean -- so nothing is chained:
    y's seq 1 of IBM is a gap (l's message missing, told)."""
    lineage = _forwarded_by_first_life()
    lineage.ended(PEER, "x/")
    assert not lineage.met(PEER, "y/", 5)  # l's record was not clean: y names none
    assert lineage.take(PEER, forwarded(IBM, 9, 1), incarnation="y/", made=1) is Forward.GAP


def test_a_clean_predecessor_whose_goodbye_never_came_here_is_no_chain() -> None:
    lineage = _forwarded_by_first_life()
    lineage.met(PEER, "y/x", 5)  # x said goodbye to others, not here (its link was down)
    assert lineage.take(PEER, forwarded(IBM, 8, 1), incarnation="y/x", made=1) is Forward.GAP


def test_a_goodbye_after_a_refused_forward_or_before_a_late_one_says_nothing() -> None:
    refused = _forwarded_by_first_life()
    refused.refused(PEER, "x/")  # a forward not taken here
    refused.ended(PEER, "x/")
    refused.met(PEER, "y/x", 5)
    assert refused.take(PEER, forwarded(IBM, 8, 1), incarnation="y/x", made=1) is Forward.GAP
    late = _forwarded_by_first_life()
    late.ended(PEER, "x/")
    assert late.take(PEER, forwarded(AAPL, 7, 1), incarnation="x/", made=None) is Forward.NEXT
    late.met(PEER, "y/x", 5)  # (its record: not clean; here the forward alone decides)
    assert late.take(PEER, forwarded(IBM, 8, 1), incarnation="y/x", made=1) is Forward.GAP


def test_a_goodbye_of_a_life_not_met_last_is_ignored() -> None:
    lineage = _forwarded_by_first_life()
    lineage.met(PEER, "y/", 5)  # y met first (x's goodbye still on its way)
    lineage.ended(PEER, "x/")
    lineage.met(PEER, "z/x", 6)
    assert lineage.take(PEER, forwarded(IBM, 9, 1), incarnation="z/x", made=1) is Forward.GAP


def test_a_chain_broken_later_forgets_what_the_clean_life_forwarded() -> None:
    """x said goodbye, y chained and killed before it forwarded IBM, z names no
    predecessor: z's seq 1 of IBM is a gap (y may have published it)."""
    lineage = _forwarded_by_first_life()
    lineage.ended(PEER, "x/")
    lineage.met(PEER, "y/x", 5)
    lineage.met(PEER, "z/", 6)
    assert lineage.take(PEER, forwarded(IBM, 9, 1), incarnation="z/", made=1) is Forward.GAP


def test_a_subject_held_before_the_chain_and_never_forwarded_in_it_is_still_a_gap() -> None:
    """AAPL held here before x was met; x never forwarded it (a life before x may have
    published it and died): y's seq 1 of it is a gap, as x's would have been."""
    lineage = _forwarded_by_first_life()
    lineage.ended(PEER, "x/")
    lineage.met(PEER, "y/x", 5)
    assert lineage.take(PEER, forwarded(AAPL, 8, 1), incarnation="y/x", made=0) is Forward.GAP
    assert lineage.take(PEER, forwarded("/new/one", 8, 1), incarnation="y/x",
                        made=6) is Forward.NEXT


# --- the member -----------------------------------------------------------------------


def _member(directory: Path) -> StandardNode:
    return StandardNode(Config.from_mapping({
        "Listen": "127.0.0.1:0",
        "ClusterMembers": f"127.0.0.1:9001, {PEER}",
        "ClusterMemberListen": "127.0.0.1:9001",
        "ClusterDeliveryMode": "Standard",
        "ClusterPassword": "a-cluster-password",
        "ClusterDataDir": str(directory),
    }, source="test"))


def test_a_member_names_its_clean_predecessor_in_its_link_settings(tmp_path: Path) -> None:
    first = _member(tmp_path)
    assert clean_predecessor(first.settings.incarnation) is None
    first.lives.end_clean(first.life)  # type: ignore[union-attr]  # (what leave() does)
    second = _member(tmp_path)
    assert clean_predecessor(second.settings.incarnation) == first.life


def test_a_forward_numbered_after_a_goodbye_leaves_the_life_unclean(tmp_path: Path) -> None:
    """The peer that got the goodbye did not get this forward: the next life must not
    name this one (before its goodbye went out, a forward is sent ahead of it)."""
    first = _member(tmp_path)
    first.goodbyes.add(PEER)
    first.lives.end_clean(first.life)  # type: ignore[union-attr]
    first.forward(Message(IBM, b"late"))
    assert first.late
    assert clean_predecessor(_member(tmp_path).settings.incarnation) is None
