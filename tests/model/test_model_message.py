import dataclasses
import gc
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.message import (
    PACKED_EPOCH,
    Message,
    MessageType,
    Qos,
    pack,
    packed_size,
    packed_sizes,
    unpack,
)
from migratory.model.position import EPOCH_LIMIT, Position, new_epoch


def test_defaults() -> None:
    message = Message("/a/b", b"x")
    assert message.fields == {}
    assert message.retained is False
    assert message.qos is Qos.STANDARD
    assert message.closure is None
    assert message.position == Position(0, 0)
    assert message.type is MessageType.UPDATE


def test_enum_values() -> None:
    assert [q.value for q in Qos] == ["standard", "guaranteed"]
    assert [t.value for t in MessageType] == ["snapshot", "update", "recovered", "historical"]
    assert Qos("guaranteed") is Qos.GUARANTEED


def test_frozen() -> None:
    message = Message("/a/b", b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.seq = 3  # type: ignore[misc]
    assert not hasattr(message, "__dict__")


def test_with_position_and_as_type_copy() -> None:
    message = Message("/a/b", b"x", {"k": "v"}, retained=True, closure="c1")
    placed = message.with_position(7, 3)
    assert placed.position == Position(7, 3)
    assert (placed.epoch, placed.seq) == (7, 3)
    assert message.position == Position(0, 0)
    recovered = placed.as_type(MessageType.RECOVERED)
    assert recovered.type is MessageType.RECOVERED
    assert recovered == dataclasses.replace(placed, type=MessageType.RECOVERED)


def test_size_counts_utf8_of_subject_and_fields() -> None:
    message = Message("/a/é", b"12345", {"ask": "192", "é": "ü"})
    assert message.size() == 5 + len("/a/é".encode()) + 3 + 3 + 2 + 2


def test_position_order() -> None:
    assert Position(1, 9) < Position(2, 0) < Position(2, 1)
    assert sorted([Position(2, 1), Position(1, 5), Position(2, 0)]) == [
        Position(1, 5),
        Position(2, 0),
        Position(2, 1),
    ]


def test_new_epoch_range() -> None:
    rng = random.Random(5)
    epochs = [new_epoch(rng) for _ in range(1000)]
    assert all(0 < epoch < EPOCH_LIMIT == 2**48 for epoch in epochs)
    assert len(set(epochs)) == len(epochs)
    assert 0 < new_epoch() < 2**48


messages = st.builds(
    Message,
    subject=st.text(min_size=1, max_size=20),
    content=st.binary(max_size=50),
    fields=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=4),
    retained=st.booleans(),
    qos=st.sampled_from(Qos),
    closure=st.none() | st.text(max_size=8),
    epoch=st.integers(0, 2**48 - 1),
    seq=st.integers(0, 2**62),
    type=st.sampled_from(MessageType),
)


@given(st.lists(messages, max_size=20))
def test_the_sizes_of_many_packed_messages_are_their_sum(batch: list[Message]) -> None:
    packed = [pack(m) for m in batch]
    assert packed_sizes(packed) == sum(map(packed_size, packed))


@given(messages)
def test_pack_unpack_round_trip(message: Message) -> None:
    assert unpack(pack(message)) == message
    assert pack(message)[PACKED_EPOCH] == message.epoch


def test_a_packed_message_is_not_tracked_by_the_collector() -> None:
    message = Message("/a/b", b"x" * 10, {"k": "v"}, True, Qos.GUARANTEED, "c1", 7, 9)
    packed = pack(message)
    gc.collect()  # untracks tuples of atoms
    assert gc.is_tracked(message)
    assert not gc.is_tracked(packed)


@pytest.mark.parametrize("subject", ["/a/b", "/a/é", "/a/\u4e2d\u6587"])
@pytest.mark.parametrize("fields", [{}, {"k": "v"}, {"é": "ü"}])
def test_size_with_and_without_fields(subject: str, fields: dict[str, str]) -> None:
    """The ASCII subject is counted inline (the publish path's case): same figure."""
    expected = 3 + len(subject.encode()) + sum(len(k.encode()) + len(v.encode())
                                               for k, v in fields.items())
    assert Message(subject, b"abc", fields).size() == expected


def test_unpacking_looks_the_enums_up_instead_of_calling_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seed taking a Raft dump unpacks every cached message (660,000 with the default
    CacheMemoryBudget) on its Raft thread, sharing the GIL with the event loop; calling
    ``Qos(...)`` and ``MessageType(...)`` was ~1.5 us of each ~2.8. Counted: enum calls
    while 100 messages are unpacked (200 before), and a bad value is still a ValueError."""
    import enum

    packed = [pack(Message("/a/b", b"x", {"k": "v"} if i % 2 else {}, epoch=3, seq=i + 1,
                           qos=Qos.GUARANTEED, type=MessageType.RECOVERED))
              for i in range(100)]
    calls = []
    enum_call = enum.EnumType.__call__

    def counted(cls: type, *args: object, **kwargs: object) -> object:
        calls.append(cls)
        return enum_call(cls, *args, **kwargs)

    monkeypatch.setattr(enum.EnumType, "__call__", counted)
    unpacked = [unpack(p) for p in packed]
    assert calls == []
    assert [m.seq for m in unpacked] == list(range(1, 101))
    assert {(m.qos, m.type) for m in unpacked} == {(Qos.GUARANTEED, MessageType.RECOVERED)}
    with pytest.raises(ValueError, match="not a packed message"):
        unpack((*packed[0][:3], "premium", *packed[0][4:]))
