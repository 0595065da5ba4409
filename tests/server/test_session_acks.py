"""A WebSocket session's acknowledgements: ``publish_ok`` queues the very frame
``publish_result`` queues for the same status."""

from __future__ import annotations

from migratory.config import load_config
from migratory.model.position import Position
from migratory.protocol import ops
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
