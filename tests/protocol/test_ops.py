"""Native operations: round trips and strict decoding that names the bad key."""

from __future__ import annotations

import contextlib

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType, Qos
from migratory.model.position import Position
from migratory.protocol import close_codes, ops

texts = st.text(max_size=20)
subjects = st.lists(st.text("abcXYZ", min_size=1, max_size=5), min_size=2, max_size=4).map(
    lambda parts: "/" + "/".join(parts)
)
messages = st.builds(
    Message,
    subject=subjects,
    content=st.binary(max_size=50),
    fields=st.dictionaries(texts, texts, max_size=3),
    retained=st.booleans(),
    qos=st.sampled_from(Qos),
    closure=st.none() | texts,
)
positions = st.builds(Position, st.integers(1, 2**48 - 1), st.integers(0, 2**40))


@given(messages)
def test_publish_round_trip(message: Message) -> None:
    assert ops.decode_client_op(ops.encode_client_op(ops.Publish(message))) == ops.Publish(message)


@given(
    st.lists(
        st.builds(
            ops.SubscriptionRequest,
            subject=subjects,
            position=st.none() | positions,
            history=st.integers(0, 1000),
            conflation_ms=st.integers(0, 10_000),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_subscribe_round_trip(requests: list[ops.SubscriptionRequest]) -> None:
    op = ops.Subscribe(tuple(requests))
    assert ops.decode_client_op(ops.encode_client_op(op)) == op


@given(messages, positions, st.sampled_from(MessageType))
def test_delivery_round_trip(message: Message, position: Position, kind: MessageType) -> None:
    delivered = Message(
        message.subject,
        message.content,
        message.fields,
        message.retained,
        message.qos,
        epoch=position.epoch,
        seq=position.seq,
        type=kind,
    )
    decoded = ops.decode_server_op(ops.encode_message(delivered))
    assert decoded == ops.Deliver((delivered,))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"op": "publish", "content": b"x"}, "missing key 'subject'"),
        ({"op": "publish", "subject": "/a/b", "content": b"x", "fields": {"a": 1}}, "'fields'"),
        ({"op": "publish", "subject": "/a/b", "content": b"x", "qos": "gold"}, "'qos'"),
        ({"op": "subscribe", "subjects": []}, "'subjects' must not be empty"),
        ({"op": "subscribe", "subjects": [{"subject": "/a/b", "epoch": 1}]}, "together"),
        ({"op": "subscribe", "subjects": [{"subject": "/a/b", "history": -1}]}, "'history'"),
        ({"op": "subscribe", "subjects": [{"subject": "/a/b", "history": True}]}, "'history'"),
        ({"op": "teleport"}, "unknown op 'teleport'"),
        ({"subject": "/a/b"}, "missing text key 'op'"),
    ],
)
def test_bad_operations_name_the_key(body: dict[str, object], fragment: str) -> None:
    with pytest.raises(ops.OperationError) as raised:
        ops.decode_client_op(cbor2.dumps(body))
    assert raised.value.close is close_codes.BAD_OPERATION
    assert fragment in raised.value.reason


def test_not_cbor_is_invalid_payload() -> None:
    with pytest.raises(ops.OperationError) as raised:
        ops.decode_client_op(b"\xff\x00")
    assert raised.value.close is close_codes.INVALID_PAYLOAD


def test_server_frame_with_unknown_qos_is_an_operation_error() -> None:
    body = {"op": "message", "subject": "/a/b", "content": b"", "qos": "gold", "seq": 1}
    with pytest.raises(ops.OperationError):
        ops.decode_server_op(cbor2.dumps(body))


@given(st.binary(max_size=200))
def test_garbage_never_raises_anything_but_operation_error(data: bytes) -> None:
    with contextlib.suppress(ops.OperationError):
        ops.decode_client_op(data)


def test_reconnect_rule() -> None:
    assert close_codes.should_reconnect(None)
    assert close_codes.should_reconnect(1005)
    assert close_codes.should_reconnect(1001)
    assert close_codes.should_reconnect(4599)
    assert not close_codes.should_reconnect(4499)
    assert not close_codes.should_reconnect(1000)
    assert not close_codes.should_reconnect(1002)
