"""LocalPublishing: a single node's publish path, and how it times publishes."""

from __future__ import annotations

import trio
import trio.testing

from migratory.config import load_config
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.app import build_hub
from migratory.server.context import TRIO_CLOCK, LocalPublishing


class Reply:
    def __init__(self) -> None:
        self.results: list[ops.PublishStatus] = []

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.results.append(status)

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
