"""Where a persistent MQTT session lives (migratory/server/mqtt_store.py): taking up
the stored session at CONNECT."""

from __future__ import annotations

import json

import pytest

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.snapshot import merge_snapshot
from migratory.server import mqtt_store
from migratory.server.mqtt_store import (
    DISCARD_WRITER,
    GENERATION,
    SAVED_AT,
    WRITER,
    SessionRecord,
    decode_record,
    expired,
    saved_at,
    session_subject,
    superseded,
    take_up,
)


def stored(generation: int) -> SessionRecord:
    return SessionRecord({"a/+": 1}, {"/a/b": Position(7, 3)}, generation)


def test_a_persistent_connection_keeps_the_stored_session_one_generation_later() -> None:
    snapshot = stored(4).message("dev")
    taken = take_up(snapshot, "dev", persistent=True)
    assert taken.stored is not None and taken.stored.filters == {"a/+": 1}
    assert taken.record is not None and taken.record.generation == 5
    assert taken.record.positions == {"/a/b": Position(7, 3)}
    assert taken.discard is None


def test_a_persistent_connection_without_a_stored_session_starts_a_new_one() -> None:
    taken = take_up(None, "dev", persistent=True)
    assert taken.stored is None and taken.discard is None
    assert taken.record == SessionRecord(generation=1)


def test_a_clean_session_discards_the_stored_one_and_keeps_nothing() -> None:
    taken = take_up(stored(2).message("dev"), "dev", persistent=False)
    assert taken.record is None and taken.discard is not None
    assert taken.discard.retained and decode_record(taken.discard) is None  # emptied
    fields = dict(taken.discard.fields)
    assert fields.pop(WRITER).startswith(DISCARD_WRITER)  # (a discard wins a tie)
    assert fields == {SAVED_AT: "", GENERATION: "3", "/a/b": ""}  # positions emptied
    assert take_up(None, "dev", persistent=False) == take_up(
        taken.discard, "dev", persistent=False
    ) == type(taken)(None, None, None)


def test_a_record_says_when_it_was_saved_and_an_empty_one_says_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: 1000.7)
    saved = stored(1).message("dev")
    assert saved.fields[SAVED_AT] == "1000" and saved_at(saved) == 1000
    empty = SessionRecord(generation=2).message("dev")
    assert empty.fields[SAVED_AT] == "" and saved_at(empty) is None  # replaces the field
    assert expired(saved, 1000 + 60, 60) is False  # the same second as the expiry: kept
    assert expired(saved, 1000 + 61, 60) and not expired(saved, 1e12, 0)
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: 1061.0)
    taken = take_up(saved, "dev", persistent=True, expiry=60)
    assert taken.expired and taken.stored is None
    assert taken.record == SessionRecord(generation=2)
    live = take_up(saved, "dev", persistent=True, live=stored(1), expiry=60)
    assert not live.expired and live.stored is not None  # a connection here: never stale


def test_a_record_saved_whole_by_an_earlier_version_is_read_and_written_in_parts() -> None:
    """Before, the positions were in the content; the first save after taking such a
    record up writes them all as fields (its content has none any more)."""
    whole = json.dumps({"generation": 4, "filters": {"a/+": 1},
                        "positions": {"/a/b": [7, 3], "/a/c": [7, 9]}}).encode()
    snapshot = Message(session_subject("dev"), whole, {SAVED_AT: "1000"}, retained=True)
    taken = take_up(snapshot, "dev", persistent=True)
    assert taken.record is not None and taken.record.generation == 5
    save = taken.record.message("dev")
    assert save.fields["/a/b"] == "5:7:3" and save.fields["/a/c"] == "5:7:9"
    read = decode_record(merge_snapshot(snapshot, save))
    assert read is not None and read.positions == {"/a/b": Position(7, 3), "/a/c": Position(7, 9)}
    assert taken.record.message("dev").fields.keys() == {SAVED_AT, GENERATION, WRITER}  # saved


def test_a_discard_empties_every_saved_position() -> None:
    """The discarded record keeps no position (a few dozen bytes), whichever lineage."""
    snapshot = merge_snapshot(None, stored(2).message("dev"))
    discard = take_up(snapshot, "dev", persistent=False).discard
    assert discard is not None
    emptied = merge_snapshot(snapshot, discard)
    assert emptied is not None and emptied.fields.keys() == {GENERATION, WRITER}
    assert decode_record(emptied) is None


def test_a_record_forgets_the_least_recently_delivered_past_its_bound() -> None:
    """MqttSessionMaxSubjects: a delivery makes a subject the most recent; past the bound
    the least recent goes -- an implied position (never delivered) first, never a subject
    a filter names exactly -- and the next save empties its field."""
    record = SessionRecord({"a/+": 0, "k/x": 0}, max_subjects=3)
    record.set_position("/k/x", Position(1, 1))  # named by a filter: kept
    record.set_position("/a/1", Position(1, 1))
    record.set_position("/a/2", Position(1, 1))
    record.set_position("/a/1", Position(1, 2))  # /a/1 delivered again: /a/2 is older
    record.imply_position("/a/0", Position(1, 5))  # never delivered: the first to go
    assert list(record.positions) == ["/a/0", "/k/x", "/a/2", "/a/1"]  # (bound at a save)
    assert record.bound() == 1 and list(record.positions) == ["/k/x", "/a/2", "/a/1"]
    record.set_position("/a/3", Position(1, 1))
    assert list(record.positions) == ["/a/1", "/a/3", "/k/x"]  # /k/x kept, moved back
    assert record.take_forgotten() == 2 and record.take_forgotten() == 0
    save = record.message("dev")
    assert save.fields["/a/0"] == save.fields["/a/2"] == ""  # removed from the snapshot
    assert save.fields["/a/1"].endswith(":1:2") and save.fields["/k/x"].endswith(":1:1")


def test_take_up_bounds_the_record_it_keeps() -> None:
    many = SessionRecord({"a/+": 1}, {f"/a/{i}": Position(7, 3) for i in range(1500)}, 2)
    taken = take_up(many.message("dev"), "dev", persistent=True, max_subjects=1000)
    assert taken.record is not None and taken.record.max_subjects == 1000
    assert len(taken.record.positions) == 1500  # resumed whole, bounded at its first save
    assert taken.record.bound() == 500 and len(taken.record.positions) == 1000


def test_a_clean_discard_wins_a_tie_with_a_persistent_take_up_of_the_same_record() -> None:
    """Two CONNECTs read the same stored record at once (two workers, two members): a
    persistent one and a clean one write the same generation. Whichever is applied
    first, the session ends discarded (the persistent connection's saves are
    superseded): the order in which CONNACK "session present" and the empty session
    after it both fit. Before, both wrote generation 3 with no writer, and the later
    applied merged over the earlier: the discard undone when it came first."""
    snapshot = stored(2).message("dev")
    resumed = take_up(snapshot, "dev", persistent=True)
    clean = take_up(snapshot, "dev", persistent=False)
    assert resumed.record is not None and clean.discard is not None
    save = resumed.record.message("dev")
    assert save.fields[GENERATION] == clean.discard.fields[GENERATION] == "3"
    for first, second in ((save, clean.discard), (clean.discard, save)):
        after = merge_snapshot(merge_snapshot(snapshot, first), second)
        assert decode_record(after) is None
        assert superseded(after, resumed.record)
    assert not superseded(merge_snapshot(snapshot, save), resumed.record)  # its own save


def test_on_a_standard_member_the_later_take_up_outranks_a_record_it_had_not_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Standard member reads what forwards brought it: member B, holding generation 1,
    takes the session up after member A took it up twice more (generation 3, its record
    still on its way to B). Before, B wrote generation 2: A's record outranked it on every
    member, and what B's connection subscribed (SUBACKed) was gone. Now B's take-up (and
    a clean one's discard) is of the wall-clock millisecond: later take-ups stand. A clock
    behind the stored record's generation still gives one more than it."""
    first = stored(1).message("dev")
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: 1_000.0)
    on_a = take_up(take_up(first, "dev", persistent=True, standard=True).record.message(  # type: ignore[union-attr]
        "dev"), "dev", persistent=True, standard=True).record
    assert on_a is not None and on_a.generation == 1_000_001  # (its stored one's + 1)
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: 1_000.25)
    for persistent in (True, False):
        on_b = take_up(first, "dev", persistent=persistent, standard=True)
        record = on_b.record.message("dev") if on_b.record else on_b.discard
        assert record is not None
        after = merge_snapshot(merge_snapshot(first, record), on_a.message("dev"))
        assert after is not None and after.fields[GENERATION] == "1000250"
        assert superseded(after, on_a)  # A's connection stops saving, found out
        if on_b.record is not None:
            assert not superseded(after, on_b.record)  # B's goes on
    assert take_up(first, "dev", persistent=True).record.generation == 2  # type: ignore[union-attr]
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: 0.5)  # a clock behind
    assert take_up(on_a.message("dev"), "dev", persistent=True, standard=True
                   ).record.generation == 1_000_002  # type: ignore[union-attr]
