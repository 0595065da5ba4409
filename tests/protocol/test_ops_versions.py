"""Protocol versions: a server sends a session only the operations of the version it
negotiated, and a client reads an operation of no version it knows as an
:class:`ops.UnknownOp` (it ignores it) instead of an error that would cost it its
session -- and, the next session getting the same operation, a reconnect loop."""

from __future__ import annotations

import itertools
import typing

import cbor2
import pytest

from migratory.model.message import Message, MessageType, Qos
from migratory.model.position import Position
from migratory.protocol import cbor_splice, ops

V1 = ops.SERVER_OPS_BY_VERSION[1]
UPDATE = Message("/a/b", b"x", epoch=7, seq=3, type=MessageType.UPDATE)
FULL = Message("/a/b", b"x", {"k": "v"}, True, Qos.GUARANTEED, epoch=7, seq=4,
               type=MessageType.SNAPSHOT)

SAMPLES: dict[type, list[ops.ServerOp]] = {
    ops.Connected: [ops.Connected("m"), ops.Connected("m", 1, max_subjects_per_subscribe=5),
                    ops.Connected("m", 1, heartbeat_ms=2000)],
    ops.Deliver: [ops.Deliver((UPDATE,)), ops.Deliver((FULL,)), ops.Deliver((UPDATE, FULL))],
    ops.SubjectStatus: [
        ops.SubjectStatus(status, "/a/b", Position(7, 3), "why")
        for status in sorted(ops.SUBJECT_STATUSES)  # (sorted: the same ids on every worker)
    ],
    ops.PublishStatus: [
        ops.PublishStatus(status, closure, "/a/b", position, reason)
        for status in sorted(ops.PUBLISH_STATUSES)
        for closure, position, reason in (("c1", Position(7, 3), None), (None, None, "no"))
    ],
    ops.Pong: [ops.Pong(), ops.Pong(3)],
}


def op_name(payload: bytes) -> str:
    name = cbor2.loads(payload)["op"]
    assert isinstance(name, str)
    return name


def test_every_kind_of_server_operation_has_a_sample() -> None:
    # a new ServerOp class must come with its samples here, and so with a version
    assert set(SAMPLES) == set(typing.get_args(ops.ServerOp))


@pytest.mark.parametrize(
    "op", [op for samples in SAMPLES.values() for op in samples], ids=repr
)
def test_every_server_operation_is_one_of_version_1(op: ops.ServerOp) -> None:
    assert op_name(ops.encode_server_op(op)) in V1


def test_the_spliced_encodings_are_of_version_1_too() -> None:
    # the hot paths write their bytes without a map: the same names
    assert op_name(ops.encode_message(UPDATE)) in V1
    assert op_name(ops.encode_publish_ok("c1", "/a/b", 7, 3)) in V1
    spliced = cbor_splice.plain_message("/a/b", b"x", 7, 3, "update")
    assert spliced is not None and op_name(spliced) in V1


def test_the_versions_are_cumulative_and_this_one_is_known() -> None:
    assert ops.PROTOCOL_VERSION in ops.SERVER_OPS_BY_VERSION
    versions = sorted(ops.SERVER_OPS_BY_VERSION)
    for older, newer in itertools.pairwise(versions):
        assert ops.SERVER_OPS_BY_VERSION[older] <= ops.SERVER_OPS_BY_VERSION[newer]


def test_the_samples_cover_version_1_and_read_back_as_known_operations() -> None:
    samples = [op for ops_ in SAMPLES.values() for op in ops_]
    assert {op_name(ops.encode_server_op(op)) for op in samples} == V1
    for op in samples:
        assert ops.decode_server_op(ops.encode_server_op(op)) == op


def test_an_operation_of_no_known_version_decodes_as_unknown_not_an_error() -> None:
    # was: OperationError "unknown op 'teleport'" -- the SDKs closed the session
    payload = cbor2.dumps({"op": "teleport", "subject": "/a/b", "anything": [1, 2]})
    assert ops.decode_server_op(payload) == ops.UnknownOp("teleport")


def test_a_long_unknown_name_is_cut() -> None:
    assert ops.decode_server_op(cbor2.dumps({"op": "x" * 1000})) == ops.UnknownOp("x" * 40)


def test_a_known_operation_that_is_malformed_still_is_an_error() -> None:
    # the client needs it: a 'batch' it cannot read would be messages lost
    with pytest.raises(ops.OperationError):
        ops.decode_server_op(cbor2.dumps({"op": "batch", "messages": "no"}))
    with pytest.raises(ops.OperationError):
        ops.decode_server_op(cbor2.dumps({"op": 7}))


def test_a_client_operation_of_no_version_still_closes_the_session() -> None:
    # the server is the side that knows the newest version: a client sends only
    # what the version it was answered with has
    with pytest.raises(ops.OperationError, match="unknown op 'teleport'"):
        ops.decode_client_op(cbor2.dumps({"op": "teleport"}))
