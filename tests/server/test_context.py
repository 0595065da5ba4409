"""LocalPublishing: a single node's publish path, and how it times publishes."""

from __future__ import annotations

import trio
import trio.testing

from migratory.config import load_config
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.app import build_hub
from migratory.server.context import TRIO_CLOCK, LocalPublishing, publish_ok_status


class Reply:
    def __init__(self) -> None:
        self.results: list[ops.PublishStatus] = []
        self.oks: list[tuple[str | None, str, int, int]] = []

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.results.append(status)

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self.oks.append((closure, subject, epoch, seq))
        self.publish_result(publish_ok_status(closure, subject, epoch, seq))

    def flush(self) -> None:
        pass


def test_the_running_trio_clock_times_each_publish_from_its_read() -> None:
    publishing = LocalPublishing(build_hub(load_config()), clock=TRIO_CLOCK)
    reply = Reply()

    async def main() -> None:
        read_at = trio.current_time()
        await trio.sleep(0.25)  # the publish waited a quarter second after its read
        publishing.submit(Message("/a/b", b"x", closure="c1"), reply, read_at)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert publishing.timings.fanout.count == 1
    assert publishing.timings.ack.count == 1
    assert publishing.timings.ack.sum == 0.25
    [result] = reply.results
    assert (result.status, result.closure, result.position.seq) == (
        ops.Status.PUBLISH_OK, "c1", 1
    )


def test_outside_trio_nothing_is_timed_and_publishes_still_go_through() -> None:
    publishing = LocalPublishing(build_hub(load_config()), clock=TRIO_CLOCK)
    reply = Reply()
    publishing.submit(Message("/a/b", b"x", closure="c1"), reply, 0.0)
    assert publishing.timings.ack.count == 0
    assert reply.results[0].status is ops.Status.PUBLISH_OK
    assert reply.results[0].position.seq == 1


def test_an_acknowledged_publish_is_told_with_publish_ok_at_its_position() -> None:
    """The local path acknowledges with ``publish_ok`` (no PublishStatus made), the
    closure the client gave and the position the hub gave."""
    hub = build_hub(load_config())
    publishing = LocalPublishing(hub)
    reply = Reply()
    publishing.submit(Message("/a/b", b"x", closure="c1"), reply, 0.0)
    publishing.submit(Message("/a/b", b"y", closure="c2"), reply, 0.0)
    position = hub.position("/a/b")
    assert position is not None
    assert reply.oks == [("c1", "/a/b", position.epoch, 1), ("c2", "/a/b", position.epoch, 2)]
