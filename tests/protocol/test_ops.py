"""Native operations: round trips and strict decoding that names the bad key."""

from __future__ import annotations

import contextlib

import cbor2
import pytest
from hypothesis import example, given, settings
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


def test_heartbeat_keys_round_trip_and_are_left_out_when_none() -> None:
    connect = ops.Connect(client="c", heartbeat_ms=2000)
    assert cbor2.loads(ops.encode_client_op(connect))["heartbeat"] == 2000
    assert ops.decode_client_op(ops.encode_client_op(connect)) == connect
    assert "heartbeat" not in cbor2.loads(ops.encode_client_op(ops.Connect(client="c")))
    connected = ops.Connected("m", 1, max_subjects_per_subscribe=5, heartbeat_ms=2000)
    assert cbor2.loads(ops.encode_server_op(connected))["heartbeat"] == 2000
    assert ops.decode_server_op(ops.encode_server_op(connected)) == connected
    assert "heartbeat" not in cbor2.loads(ops.encode_server_op(ops.Connected("m")))


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
        ({"op": "connect", "heartbeat": 0}, "'heartbeat'"),
        ({"op": "connect", "heartbeat": 1.5}, "'heartbeat'"),
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


@given(st.binary(max_size=200))
def test_server_garbage_never_raises_anything_but_operation_error(data: bytes) -> None:
    # the SDK's reader ends the session on an OperationError; anything else would end
    # the whole client with an exception out of connect()
    with contextlib.suppress(ops.OperationError):
        ops.decode_server_op(data)


def test_reconnect_rule() -> None:
    assert close_codes.should_reconnect(None)
    assert close_codes.should_reconnect(1005)
    assert close_codes.should_reconnect(1001)
    assert close_codes.should_reconnect(4599)
    assert not close_codes.should_reconnect(4499)
    assert not close_codes.should_reconnect(1000)
    assert not close_codes.should_reconnect(1002)
    # codes no table names: the ranges decide
    assert close_codes.should_reconnect(1012)  # service restart
    assert close_codes.should_reconnect(3000)
    assert close_codes.should_reconnect(4999)
    assert not close_codes.should_reconnect(4100)


_odd_values = (
    st.sampled_from(["best", "x" * 1100, "/a/b", 1, None])
    | st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(
        st.text(max_size=2) | st.integers(0, 2), st.text(max_size=2) | st.integers(0, 2),
        max_size=2,
    )
)
_valid_publish = st.fixed_dictionaries(
    {"op": st.just("publish"), "subject": st.sampled_from(["/a/b", "/c/d/e"]),
     "content": st.binary(max_size=8)},
    optional={
        "fields": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3),
        "retained": st.booleans(),
        "qos": st.sampled_from(["standard", "guaranteed"]),
        "closure": st.text(max_size=4),
    },
)
_DROP = object()


@st.composite
def _publish_keys(draw: st.DrawFn) -> dict[str, object]:
    """A valid publish with at most one key dropped or given an odd value."""
    body = draw(_valid_publish)
    key = draw(st.sampled_from(["", "subject", "content", "fields", "retained", "qos", "closure"]))
    if key:
        value = draw(_odd_values | st.just(_DROP))
        if value is _DROP:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def _outcome(payload: bytes) -> object:
    try:
        return ops.decode_client_op(payload)
    except ops.OperationError as exc:
        return ("refused", exc.close, exc.reason)


@settings(max_examples=400)
@given(_publish_keys())
@example({"op": "publish", "subject": "/a/b", "content": b"", "qos": "best"})
@example({"op": "publish", "subject": "/a/b", "content": b"", "retained": 1})
@example({"op": "publish", "subject": "/a/b", "content": b"", "closure": None})
@example({"op": "publish", "subject": "/a/b", "content": b"", "fields": {"a": 1}})
@example({"op": "publish", "subject": "x" * 1100, "content": b""})
def test_the_fast_publish_decoder_agrees_with_the_checked_one(body: dict[str, object]) -> None:
    """The publish fast path (a few lookups) decodes exactly what the key-by-key checks
    accept, and leaves everything else to them (same refusal, same close code)."""
    payload = cbor2.dumps(body)
    fast = _outcome(payload)
    original = ops._fast_publish
    ops._fast_publish = lambda body: None  # type: ignore[assignment]
    try:
        checked = _outcome(payload)
    finally:
        ops._fast_publish = original
    assert fast == checked
