"""A WebSocket session's acknowledgements: ``publish_ok`` queues the very frame
``publish_result`` queues for the same status; a close waits for the statuses of the
publishes in flight."""

from __future__ import annotations

from test_mqtt_session import make

from migratory.config import load_config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.websocket import (
    BinaryMessage,
    CloseReceived,
    FrameDecoder,
    encode_masked_binary,
)
from migratory.server.app import Server
from migratory.server.session import Session


class NullLink:
    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


def test_publish_ok_queues_what_publish_result_queues() -> None:
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    for closure, subject, epoch, seq in [
        ("c1", "/a/b", 7, 1), (None, "/a/é", 2**48 - 1, 70_000), ("x" * 300, "/s/t", 0, 0),
    ]:
        by_ok = Session(server.ctx, NullLink(), "peer")
        by_ok.publish_ok(closure, subject, epoch, seq)
        by_status = Session(server.ctx, NullLink(), "peer")
        by_status.publish_result(
            ops.PublishStatus(ops.Status.PUBLISH_OK, closure, subject, Position(epoch, seq))
        )
        assert by_ok.outbox.take() == by_status.outbox.take()


def test_a_publish_then_garbage_gets_its_status_before_the_close_frame() -> None:
    """A publish whose outcome comes later (a cluster's commit), then a malformed frame in
    the same read: the close frame waits for the status, which is queued exactly once
    (before: the close went at once and the status, arriving after, was dropped)."""
    ctx, held = make()
    session = Session(ctx, NullLink(), "peer")
    session.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key()), 0.0)
    session.outbox.take()
    publish = ops.Publish(Message("/a/b", b"x", closure="c1"))
    session.receive_data(masked(ops.Connect("p")) + masked(publish) + b"\xff\xff", 0.0)
    before = FrameDecoder(client_frames=False).events(session.outbox.take())
    assert [type(e) for e in before] == [BinaryMessage]  # CONNECTED; no close frame yet
    assert session.closing and session.settling
    held.settle()
    after = FrameDecoder(client_frames=False).events(session.outbox.take())
    status = ops.decode_server_op(after[0].data)  # type: ignore[union-attr]
    assert isinstance(status, ops.PublishStatus) and status.closure == "c1"
    assert isinstance(after[1], CloseReceived) and after[1].code == 1002 and len(after) == 2
    assert not session.settling


def masked(op: ops.ClientOp) -> bytes:
    return encode_masked_binary(ops.encode_client_op(op), b"abcd")
