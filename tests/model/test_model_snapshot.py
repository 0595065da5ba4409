import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType, Qos
from migratory.model.snapshot import merge_snapshot

IBM = "/Stocks/NYSE/IBM"


def retained(content: bytes, seq: int, **fields: str) -> Message:
    return Message(IBM, content, fields, retained=True, epoch=9, seq=seq, closure=f"p{seq}")


# Seed Table 4.3: Examples of Snapshot Messages, row by row.
TABLE_4_3 = [
    ("10:12", retained(b"193", 1, volume="6.62M"), b"193", {"volume": "6.62M"}),
    ("10:13", retained(b"192", 2), b"192", {"volume": "6.62M"}),
    ("10:15", retained(b"195", 3, ask="190"), b"195", {"ask": "190", "volume": "6.62M"}),
    (
        "10:20",
        retained(b"193", 4, bid="194", ask="191"),
        b"193",
        {"bid": "194", "ask": "191", "volume": "6.62M"},
    ),
]


def test_seed_snapshot_table() -> None:
    snapshot: Message | None = None
    for time, incoming, content, fields in TABLE_4_3:
        snapshot = merge_snapshot(snapshot, incoming)
        assert snapshot == Message(
            IBM,
            content,
            fields,
            retained=True,
            qos=Qos.STANDARD,
            closure=None,
            epoch=9,
            seq=incoming.seq,
            type=MessageType.SNAPSHOT,
        ), time


def test_first_message_without_fields_is_the_snapshot() -> None:
    incoming = Message(IBM, b"1", retained=True, qos=Qos.GUARANTEED, epoch=3, seq=1)
    assert merge_snapshot(None, incoming) == incoming.as_type(MessageType.SNAPSHOT)


def test_non_retained_leaves_snapshot_unchanged() -> None:
    first = merge_snapshot(None, retained(b"1", 1, a="1"))
    live = Message(IBM, b"2", {"a": "2", "b": "2"}, epoch=9, seq=2)
    assert merge_snapshot(first, live) is first
    assert merge_snapshot(None, live) is None


def test_previous_fields_are_not_mutated() -> None:
    first = merge_snapshot(None, retained(b"1", 1, a="1"))
    assert first is not None
    merge_snapshot(first, retained(b"2", 2, a="2", b="2"))
    assert first.fields == {"a": "1"}


def test_other_subject_is_rejected() -> None:
    first = merge_snapshot(None, retained(b"1", 1))
    with pytest.raises(ValueError, match="/Other/X"):
        merge_snapshot(first, Message("/Other/X", b"2", retained=True))


small_fields = st.dictionaries(st.sampled_from("abcde"), st.text(max_size=3), max_size=3)
messages = st.lists(
    st.tuples(st.binary(max_size=4), small_fields, st.booleans()), min_size=1, max_size=20
)


@given(messages)
def test_snapshot_is_union_of_retained_fields(
    stream: list[tuple[bytes, dict[str, str], bool]],
) -> None:
    snapshot: Message | None = None
    for seq, (content, fields, is_retained) in enumerate(stream, start=1):
        message = Message(IBM, content, fields, retained=is_retained, epoch=1, seq=seq)
        snapshot = merge_snapshot(snapshot, message)
    kept = [(seq, c, f) for seq, (c, f, r) in enumerate(stream, start=1) if r]
    if not kept:
        assert snapshot is None
        return
    expected_fields: dict[str, str] = {}
    for _, _, fields in kept:
        expected_fields |= fields
    assert snapshot is not None
    assert snapshot.fields == expected_fields
    assert snapshot.content == kept[-1][1]
    assert snapshot.seq == kept[-1][0]
    assert snapshot.type is MessageType.SNAPSHOT


def test_on_a_reserved_subject_an_empty_field_removes_it() -> None:
    """The server's /$ subjects (MQTT session records saved in parts) can forget a field;
    any other subject keeps the seed's rule: an empty value is a value."""
    record = "/$mqtt-session/6465"
    first = Message(record, b"h", {"/a/b": "1:2:3", "/a/c": "1:2:4"}, retained=True)
    second = Message(record, b"h", {"/a/b": ""}, retained=True)
    merged = merge_snapshot(merge_snapshot(None, first), second)
    assert merged is not None and merged.fields == {"/a/c": "1:2:4"}
    ordinary = merge_snapshot(retained(b"1", 1, ask="190"), retained(b"2", 2, ask=""))
    assert ordinary is not None and ordinary.fields == {"ask": ""}


def test_a_reserved_record_of_a_lower_generation_leaves_the_snapshot_as_it_is() -> None:
    """A late write of a record's replaced writer (model/snapshot.py, GENERATION_FIELD);
    equal or higher generations merge, and so does a record that names none."""
    subject = "/$mqtt-session/6465"

    def record(seq: int, content: bytes, **fields: str) -> Message:
        return Message(subject, content, fields, retained=True, epoch=9, seq=seq)

    snapshot = merge_snapshot(None, record(1, b"head2", generation="2", **{"/a/b": "2:9:5"}))
    later = merge_snapshot(snapshot, record(2, b"head1", generation="1", **{"/a/c": "1:9:1"}))
    assert later == snapshot
    same = merge_snapshot(snapshot, record(3, b"head2'", generation="2", **{"/a/b": "2:9:6"}))
    assert same is not None and same.content == b"head2'" and same.fields["/a/b"] == "2:9:6"
    unnamed = merge_snapshot(snapshot, record(4, b"whole"))
    assert unnamed is not None and unnamed.content == b"whole"
    elsewhere = Message(IBM, b"x", {"generation": "1"}, retained=True, epoch=9, seq=5)
    previous = retained(b"y", 4, generation="2")
    merged = merge_snapshot(previous, elsewhere)
    assert merged is not None and merged.content == b"x"  # only reserved subjects


def test_records_of_one_generation_are_ordered_by_their_writer_whichever_comes_first() -> None:
    """Two writers of one generation (two CONNECTs that read the same record at once):
    the higher writer's record is the snapshot in either order of application (before:
    the later merged over the earlier, so the order they were numbered in decided); the
    same writer's saves merge."""
    subject = "/$mqtt-session/6465"

    def record(seq: int, content: bytes, **fields: str) -> Message:
        return Message(subject, content, fields, retained=True, epoch=9, seq=seq)

    low = record(1, b"resumed", generation="3", writer="0:aa", **{"/a/b": "1:9:5"})
    high = record(2, b"discarded", generation="3", writer="1:bb", saved_at="")
    for first, second in ((low, high), (high, low)):
        snapshot = merge_snapshot(merge_snapshot(None, first), second)
        assert snapshot is not None and snapshot.content == b"discarded", first.content
    again = merge_snapshot(merge_snapshot(None, low), record(3, b"again", generation="3",
                                                             writer="0:aa"))
    assert again is not None and again.content == b"again"  # the same writer
    unnamed = merge_snapshot(merge_snapshot(None, low), record(4, b"old", generation="3"))
    assert unnamed is not None and unnamed.content == b"resumed"  # no writer: the lowest


def test_the_saves_of_a_writer_of_524f73f_merge_after_a_writer_of_today() -> None:
    """A rolling upgrade from 524f73f, whose records name no writer: one of its
    connections takes a session a connection of today held (a later generation, no
    ``writer`` field), then saves positions in that generation. Its saves merge, on
    every member of today, as 524f73f's members merge them. Before, the snapshot kept the
    earlier writer's name beside the new generation, every later save of the 524f73f
    connection ranked below it and was dropped: a device that moved on to a member of
    today was given again what it had acknowledged there."""
    subject = "/$mqtt-session/6465"

    def record(seq: int, **fields: str) -> Message:
        return Message(subject, b"head", fields, retained=True, epoch=9, seq=seq)

    today = record(1, generation="2", writer="0:aa", **{"/a/b": "1:9:19"})
    taken_up = record(2, generation="3", saved_at="100", **{"/a/b": "1:9:19"})
    saved = record(3, generation="3", saved_at="101", **{"/a/b": "1:9:39"})
    snapshot = None
    for message in (today, taken_up, saved):
        snapshot = merge_snapshot(snapshot, message)
    assert snapshot is not None and snapshot.fields["/a/b"] == "1:9:39"
    assert "writer" not in snapshot.fields  # 524f73f's record of generation 3: no writer
    # the race the writer settles is still settled: a writer of today of generation 3
    # ranks above 524f73f's, whichever comes first
    rival = record(4, generation="3", writer="0:bb", **{"/a/b": "1:9:25"})
    for first, second in ((saved, rival), (rival, saved)):
        merged = merge_snapshot(merge_snapshot(merge_snapshot(None, today), first), second)
        assert merged is not None and merged.fields["/a/b"] == "1:9:25"
