"""A large batch decoded for a client: bytes counted with tracemalloc, not time. The
plain decode built every message's map first (about 670 bytes each) and the messages
beside them: 848 bytes per small message at the peak, 326 kept; through cbor2's
object_hook, with the subject, the epoch and empty fields shared, 190 and 181."""

from __future__ import annotations

import gc
import tracemalloc

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType, Qos
from migratory.protocol import message_batch, ops

COUNT = 20_000


def batch_frame(count: int, subject: str = "/a/b") -> bytes:
    messages = tuple(
        Message(subject, b"%08d" % i, epoch=123456789, seq=i + 1, type=MessageType.RECOVERED)
        for i in range(count)
    )
    return ops.encode_server_op(ops.Deliver(messages))


def measured(payload: bytes) -> tuple[ops.ServerOp | ops.UnknownOp, int, int]:
    gc.collect()
    tracemalloc.start()
    try:
        op = ops.decode_server_op(payload)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return op, kept, peak


def test_a_large_batch_peaks_near_what_its_messages_keep() -> None:
    payload = batch_frame(COUNT)
    assert len(payload) > message_batch.HOOKED_FROM_BYTES
    op, kept, peak = measured(payload)
    assert isinstance(op, ops.Deliver) and len(op.messages) == COUNT
    # was: 848 and 326 bytes per message (the maps of the whole frame, then messages)
    assert peak / COUNT < 300, peak / COUNT
    assert kept / COUNT < 250, kept / COUNT
    assert [m.seq for m in op.messages] == list(range(1, COUNT + 1))


def test_what_repeats_is_one_object() -> None:
    op = ops.decode_server_op(batch_frame(COUNT))
    assert isinstance(op, ops.Deliver)
    first = op.messages[0]
    assert all(m.subject is first.subject for m in op.messages)
    assert all(m.epoch is first.epoch for m in op.messages)
    assert all(m.fields is message_batch.EMPTY_FIELDS for m in op.messages)
    with pytest.raises(TypeError):
        first.fields["k"] = "v"  # type: ignore[index]


def big(*messages: dict[str, object]) -> bytes:
    """A batch of ``messages`` padded past HOOKED_FROM_BYTES with valid ones."""
    pad = {"subject": "/p/q", "content": b"x" * 1000, "epoch": 1, "seq": 1}
    count = message_batch.HOOKED_FROM_BYTES // 1000 + 1
    return cbor2.dumps({"op": "batch", "messages": [*messages, *([pad] * count)]})


def plain(payload: bytes) -> ops.ServerOp | ops.UnknownOp:
    """The decode without the hook (as small frames are decoded)."""
    original = message_batch.HOOKED_FROM_BYTES
    message_batch.HOOKED_FROM_BYTES = len(payload) + 1
    try:
        return ops.decode_server_op(payload)
    finally:
        message_batch.HOOKED_FROM_BYTES = original


@pytest.mark.parametrize(
    "odd",
    [
        {"subject": "/a/b", "content": b"x", "epoch": 1, "seq": "2"},  # a key of the wrong kind
        {"subject": "/a/b", "content": b"x", "type": "future"},  # an unknown type
        {"subject": "/a/b", "content": b"x", "fields": {"content": "y", "subject": "/c/d"}},
        {"subject": "/a/b", "content": b"x", "fields": {"k": {"content": b"z", "subject": "/c/d"}}},
        {"subject": "/a/b", "content": b"x", "op": "message", "epoch": 2, "seq": 3},
        {"content": b"x", "epoch": 2, "seq": 3},  # no subject
        {"subject": "/a/b", "content": b"x", "seq": 3},  # no epoch (was: read as epoch 0)
        {"subject": "/a/b", "content": b"x"},  # no position (was: read as 0:0)
    ],
)
def test_odd_messages_in_a_large_batch_read_as_in_a_small_one(odd: dict[str, object]) -> None:
    assert_read_as_a_small_one(big(odd))


def assert_read_as_a_small_one(payload: bytes) -> None:
    """``payload`` decodes (or is refused, for the same reason) as with no hook."""
    try:
        expected: object = plain(payload)
    except ops.OperationError as error:
        with pytest.raises(ops.OperationError) as raised:
            ops.decode_server_op(payload)
        assert (raised.value.close, raised.value.reason) == (error.close, error.reason)
    else:
        assert ops.decode_server_op(payload) == expected


text = st.text(max_size=8)
message_maps = st.fixed_dictionaries(
    {
        "subject": st.sampled_from(["/a/b", "/c/d"]),
        "content": st.binary(max_size=20),
        "epoch": st.integers(0, 2**48),
        "seq": st.integers(0, 2**40),
    },
    optional={
        "fields": st.dictionaries(text, text, max_size=2),
        "retained": st.booleans(),
        "qos": st.sampled_from([q.value for q in Qos]),
        "type": st.sampled_from([t.value for t in MessageType]),
    },
)


@settings(max_examples=30)
@given(st.lists(message_maps, max_size=5))
def test_a_large_batch_decodes_as_a_small_one(maps: list[dict[str, object]]) -> None:
    assert_read_as_a_small_one(big(*maps))  # (epoch 0 and 2**48 are refused by both)


SHARED_TWICE = (
    cbor2.dumps({"op": "batch", "messages": [1, 1]})[:-2]  # the map, the array's head
    + b"\xd8\x1c" + cbor2.dumps({"subject": "/a/b", "content": b"x", "epoch": 1, "seq": 1})
    + b"\xd8\x1d\x00"
)
"""A batch whose second message is a shared reference to its first (tags 28, 29)."""


@pytest.mark.parametrize(
    "payload",
    [
        cbor2.dumps({"op": "pong"}) + b"\x00",
        big() + b"\x00",
        SHARED_TWICE,
        b"\xa1\x62op" + b"\x81" * 20 + b"\x00",
    ],
    ids=["trailing-byte", "large-frame-trailing-byte", "shared-reference", "nested-deep"],
)
def test_a_server_frame_is_one_strictly_read_cbor_map(payload: bytes) -> None:
    # was: the SDK read server frames with plain cbor2.loads: bytes after the map were
    # ignored, and shared references decoded (the client's frames were strict already)
    with pytest.raises(ops.OperationError) as raised:
        ops.decode_server_op(payload)
    assert raised.value.close.code == 1007
