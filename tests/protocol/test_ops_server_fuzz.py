"""Hypothesis against ``ops.decode_server_op`` (what the Python SDK reads a server's
frames with), as a hostile server would write them (tests/hostile_server_frames.py). The
property: the SDK's documented protocol error
(:class:`~migratory.protocol.ops.OperationError`, which ends the session) or an operation
that holds what docs/protocol.md promises -- never another exception, never a message
whose position or content a server could not have sent.

``tests/client/test_sdk_decoder_fuzz.py`` plays such frames at a whole client."""

from __future__ import annotations

import cbor2
from hostile_server_frames import MESSAGE, OPERATIONS, hostile_payloads
from hypothesis import HealthCheck, example, given, settings

from migratory.model.message import Message
from migratory.model.position import EPOCH_LIMIT, Position
from migratory.protocol import ops
from migratory.protocol.cbor_reader import MAX_INTEGER


def _sent_by_a_server(position: Position | None) -> bool:
    return position is None or (
        type(position.epoch) is int and 1 <= position.epoch < EPOCH_LIMIT
        and type(position.seq) is int and 0 <= position.seq <= MAX_INTEGER)


def _holds(op: ops.ServerOp | ops.UnknownOp) -> None:
    """What a decoded operation promises its reader (the SDK's session)."""
    if isinstance(op, ops.Deliver):
        assert type(op.messages) is tuple
        for message in op.messages:
            assert type(message) is Message
            assert type(message.subject) is str and type(message.content) is bytes
            assert all(type(k) is str and type(v) is str for k, v in message.fields.items())
            assert _sent_by_a_server(Position(message.epoch, message.seq))
    elif isinstance(op, (ops.SubjectStatus, ops.PublishStatus)):
        assert type(op.subject) is str and isinstance(op.status, ops.Status)
        assert op.reason is None or type(op.reason) is str
        assert _sent_by_a_server(op.position)
    elif isinstance(op, ops.UnknownOp):
        assert type(op.name) is str and len(op.name) <= 40


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_payloads())
@example(cbor2.dumps({"op": "message", **MESSAGE, "epoch": 0}))  # (was taken: fa3c801)
@example(cbor2.dumps({**OPERATIONS[2], "epoch": EPOCH_LIMIT}))
def test_a_hostile_frame_is_a_protocol_error_or_an_operation_a_server_could_send(
    payload: bytes,
) -> None:
    try:
        op = ops.decode_server_op(payload)
    except ops.OperationError as error:
        assert error.reason  # said why: the SERVER_DOWN reason the application reads
        return
    _holds(op)
