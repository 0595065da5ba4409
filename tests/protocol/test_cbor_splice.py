"""The spliced ``message`` and ``publish_status`` payloads are byte for byte what
``cbor2.dumps`` makes of the same maps (or the encoders fall back to it)."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType, Qos
from migratory.model.position import Position
from migratory.protocol import cbor_splice, ops

# across every head size: 1-byte, +1, +2, +4, +8 bytes of argument
BOUNDARIES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**48, 2**64 - 1]
integers = st.sampled_from(BOUNDARIES) | st.integers(0, 2**64 - 1)
lengths = st.sampled_from([0, 1, 23, 24, 255, 256, 65535, 65536])
any_text = st.text(max_size=40)  # surrogates included: cbor2 raises, so must the encoder


def _message_payload(message: Message) -> bytes:
    return cbor2.dumps({"op": "message", **ops.message_map(message)})


def _same_or_same_error(encode, reference) -> None:  # type: ignore[no-untyped-def]
    try:
        expected = reference()
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            encode()
        return
    assert encode() == expected


@settings(max_examples=300)
@given(
    subject=any_text, content=st.binary(max_size=300), epoch=integers, seq=integers,
    kind=st.sampled_from(MessageType),
)
@example(subject="/a/" + "é" * 200, content=b"x" * 100, epoch=2**48 - 1, seq=1,
         kind=MessageType.UPDATE)
def test_a_plain_message_is_spliced_as_cbor2_encodes_it(
    subject: str, content: bytes, epoch: int, seq: int, kind: MessageType
) -> None:
    message = Message(subject, content, {}, False, Qos.STANDARD, None, epoch, seq, kind)
    _same_or_same_error(lambda: ops.encode_message(message), lambda: _message_payload(message))


@pytest.mark.parametrize("size", [0, 1, 23, 24, 255, 256, 65535, 65536])
def test_content_and_subject_of_every_head_size(size: int) -> None:
    message = Message("/s/" + "x" * size, b"c" * size, epoch=size, seq=size)
    spliced = cbor_splice.plain_message(message.subject, message.content, size, size, "update")
    assert spliced is not None
    assert spliced == _message_payload(message)


def test_what_the_splice_does_not_cover_goes_to_cbor2() -> None:
    assert cbor_splice.plain_message("/a/b", b"x", 2**64, 1, "update") is None
    assert cbor_splice.plain_message("/a/b", b"x", 1, -1, "update") is None
    assert cbor_splice.plain_message("/a/b", bytearray(b"x"), 1, 1, "update") is None  # type: ignore[arg-type]
    assert cbor_splice.plain_message("/a/\ud800", b"x", 1, 1, "update") is None
    for message in (
        Message("/a/b", b"x", {"k": "v"}, epoch=1, seq=2),
        Message("/a/b", b"x", retained=True, epoch=1, seq=2),
        Message("/a/b", b"x", qos=Qos.GUARANTEED, epoch=1, seq=2),
        Message("/a/b", b"x", epoch=2**64, seq=2),
    ):
        assert ops.encode_message(message) == _message_payload(message)


@settings(max_examples=300)
@given(
    status=st.sampled_from(ops.Status), subject=any_text, closure=st.none() | any_text,
    position=st.none() | st.builds(Position, integers, integers),
    reason=st.none() | any_text,
)
@example(status=ops.Status.PUBLISH_OK, subject="/bench/s/1", closure="12",
         position=Position(2**48 - 1, 1), reason=None)
def test_a_publish_status_is_spliced_as_cbor2_encodes_it(
    status: ops.Status, subject: str, closure: str | None, position: Position | None,
    reason: str | None,
) -> None:
    op = ops.PublishStatus(status, closure, subject, position, reason)
    _same_or_same_error(
        lambda: ops.encode_server_op(op), lambda: cbor2.dumps(ops.publish_status_map(op))
    )


def test_a_publish_status_beyond_the_splice_goes_to_cbor2() -> None:
    op = ops.PublishStatus(ops.Status.PUBLISH_OK, "c", "/a/b", Position(2**64, 1), None)
    assert cbor_splice.publish_status("PUBLISH_OK", "/a/b", "c", 2**64, 1, None) is None
    assert ops.encode_server_op(op) == cbor2.dumps(ops.publish_status_map(op))


def test_the_map_heads_count_the_keys() -> None:
    spliced = cbor_splice.publish_status("PUBLISH_FAILED", "/a/b", "c", 7, 8, "why")
    assert spliced is not None
    assert cbor2.loads(spliced) == {
        "op": "publish_status", "status": "PUBLISH_FAILED", "subject": "/a/b",
        "closure": "c", "epoch": 7, "seq": 8, "reason": "why",
    }


def test_past_the_remembered_epochs_positions_are_still_right() -> None:
    for epoch in range(1, 2 * cbor_splice._EPOCH_PARTS_LIMIT, 7):
        message = Message("/a/b", b"x", epoch=epoch * 65_537, seq=epoch)
        assert ops.encode_message(message) == _message_payload(message)
    assert len(cbor_splice._EPOCH_PARTS) <= cbor_splice._EPOCH_PARTS_LIMIT


@settings(max_examples=200)
@given(closure=st.none() | any_text, subject=any_text, epoch=integers | st.just(2**64),
       seq=integers)
def test_publish_ok_is_the_publish_status_it_stands_for(
    closure: str | None, subject: str, epoch: int, seq: int
) -> None:
    op = ops.PublishStatus(ops.Status.PUBLISH_OK, closure, subject, Position(epoch, seq))
    _same_or_same_error(
        lambda: ops.encode_publish_ok(closure, subject, epoch, seq),
        lambda: ops.encode_server_op(op),
    )


@pytest.mark.parametrize("seq", [0, 23, 24, 255, 256, 65536, 2**64 - 1])
def test_a_remembered_epoch_splices_the_same_bytes_as_a_new_one(seq: int) -> None:
    # the message and PUBLISH_OK splices write the remembered epoch's part inline
    epoch = 2**40 + seq % 1000
    cbor_splice._EPOCH_PARTS.pop(epoch, None)
    message = Message("/a/b", b"x", epoch=epoch, seq=seq)
    op = ops.PublishStatus(ops.Status.PUBLISH_OK, "c", "/a/b", Position(epoch, seq))
    for _ in ("new", "remembered"):
        assert ops.encode_message(message) == _message_payload(message)
        assert cbor_splice.publish_ok("c", "/a/b", epoch, seq) == cbor2.dumps(
            ops.publish_status_map(op)
        )
    assert epoch in cbor_splice._EPOCH_PARTS
    assert cbor_splice.publish_ok(None, "/a/b", epoch, seq) is None  # no closure: the map
