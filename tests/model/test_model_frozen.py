"""Positional constructors of the hot path build exactly what the dataclass does."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.frozen import positional_constructor
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position, new_position
from migratory.protocol import ops

_message_args = st.tuples(
    st.text(max_size=10), st.binary(max_size=10),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3),
    st.booleans(), st.sampled_from(Qos), st.none() | st.text(max_size=5),
    st.integers(0, 2**48), st.integers(0, 2**62), st.sampled_from(MessageType),
)


@given(_message_args)
def test_new_message_is_the_dataclass_s_message(args: tuple[object, ...]) -> None:
    made = new_message(*args)
    assert type(made) is Message
    assert made == Message(*args)  # type: ignore[arg-type]
    assert dataclasses.astuple(made) == dataclasses.astuple(Message(*args))  # type: ignore[arg-type]


@given(st.integers(0, 2**48), st.integers(0, 2**62))
def test_new_position_orders_and_hashes_like_position(epoch: int, seq: int) -> None:
    made = new_position(epoch, seq)
    assert made == Position(epoch, seq) and hash(made) == hash(Position(epoch, seq))
    assert not made < Position(epoch, seq)


def test_publish_status_and_publish() -> None:
    status = ops.new_publish_status(ops.Status.PUBLISH_OK, "c", "/a/b", Position(1, 2), None)
    assert status == ops.PublishStatus(ops.Status.PUBLISH_OK, "c", "/a/b", Position(1, 2))
    message = Message("/a/b", b"x")
    assert ops.new_publish(message) == ops.Publish(message)


def test_what_it_builds_stays_frozen() -> None:
    made = new_message("/a/b", b"x", {}, False, Qos.STANDARD, None, 1, 1, MessageType.UPDATE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.seq = 2  # type: ignore[misc]


def test_every_field_is_required() -> None:
    with pytest.raises(TypeError):
        new_position(1)  # type: ignore[call-arg]


def test_refuses_classes_it_would_build_wrongly() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        positional_constructor(Unslotted)
    with pytest.raises(TypeError, match="__post_init__"):
        positional_constructor(Checked)
