"""A seed stopping: what its Raft node answers while and after it closes.

The seed closes its Raft node last (cluster/seed.py, ``run``), in a worker thread; the
answers the Raft thread handed over before it stopped are taken on the trio thread
after that, and a submit then is answered at once (``RAFT_STOPPED``,
cluster/raft.py). Nothing the seed starts from such an answer may need its task
group, which is gone by then: a ``start_soon`` into a closed nursery inside a
``run_sync_soon`` callback is a ``TrioInternalError`` -- the member's exit a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from test_commit_window import FakeRaft, node_at, raft_built

from cluster import link
from cluster.coordination import Coordinator, PublishRequest
from cluster.raft import CLOSED_NAME
from cluster.stream import wire_bytes
from migratory.model.message import Message

RUNS = 30
"""Member lifetimes tried: which of two ready tasks trio runs first is random."""


class ClosingRaft(FakeRaft):
    """Answers the command in flight as the Raft thread does at a leader's change just as
    the node closes (outcome unknown: a barrier must settle it), and every submit after
    close at once with ``RAFT_STOPPED``, as :class:`cluster.raft.RaftCoordination`."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.barriers = 0

    def submit(
        self, epoch: int, requests: list[PublishRequest], on_done: Any,
        *, send_by: float | None = None,
    ) -> None:
        if self.closed:
            self.barriers += not requests
            on_done(None, CLOSED_NAME, False)
            return
        super().submit(epoch, requests, on_done, send_by=send_by)

    def close(self) -> None:  # (in a worker thread, as the real one)
        self.closed = True  # first, as the real one: a barrier from the answers below is
        for _, on_done in self.commands:  # refused -- else, taken on the trio thread
            on_done(None, "LEADER_CHANGED", True)  # before this thread set it, it was
        # queued as a command (the path not taken: 1 CI run in ~30 lifetimes)


def test_a_barrier_refused_by_the_closed_raft_node_is_not_retried_into_a_closed_seed(
    tmp_path: Path,
) -> None:
    """A forward whose outcome the Raft thread left unknown as the node closed: its
    barrier, refused at once by the closed node, must not start a retry in the seed's
    task group, which has ended. Before: ``RuntimeError: Nursery is closed to new
    arrivals`` in a ``run_sync_soon`` callback (TrioInternalError) in some of the runs."""
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    async def lifetime(ref: int) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.run)
            await raft_built(seed)
            request = PublishRequest("127.0.0.1:9#n", ref, Message("/a/b", b"x"))
            seed.take_forward("127.0.0.1:9", [request])
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        for _ in range(10):  # the callbacks left over, after the seed's run
            await trio.sleep(0)

    for run in range(RUNS):
        raft = ClosingRaft()
        seed.raft = None
        seed._build_raft = lambda raft=raft: raft  # type: ignore[method-assign,misc]
        # (the real clock: a MockClock jumps its 5 s while the seed builds its Raft in a
        # worker thread, all tasks blocked, and raft_built failed TooSlowError at once)
        trio.run(lifetime, run + 1)
        assert raft.barriers >= 1  # (the path taken: a barrier submitted to the closed node)


def test_what_the_raft_thread_hands_over_once_the_seed_stopped_is_left(tmp_path: Path) -> None:
    """A seed stopped while its Raft thread replayed a long journal took every batch
    handed over into its hub before it could exit (each an apply on the event loop,
    seconds of them at start-up): the member is going, its hub with it."""
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    seed._build_raft = lambda: ClosingRaft()  # type: ignore[method-assign]

    async def lifetime() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.run)
            await raft_built(seed)
            hand_over = seed._from_raft_thread(seed._committed)
            nursery.cancel_scope.cancel()
        coordinator = Coordinator()
        batch = coordinator.apply_batch(7, [PublishRequest("o", 1, Message("/a/b", b"x"))])
        hand_over(batch)
        for _ in range(10):
            await trio.sleep(0)

    trio.run(lifetime)
    assert node.replica.applied_clsn == 0


def test_a_forward_to_a_seed_whose_raft_is_not_built_yet_goes_elsewhere(
    tmp_path: Path,
) -> None:
    """A seed waiting for the other seeds' agreement (or loading its log) has no Raft
    node: a non-seed's forward there was never submitted. It was failed at once
    ("Raft is starting": ``PUBLISH_FAILED`` while the other seeds could take it); now
    the link ends unanswered and the non-seed forwards it through another seed."""
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None and seed.raft is None

    async def forward() -> tuple[list[bytes], bool]:
        send, receive = trio.open_memory_channel[Any](10)
        node.stream.follow("edge", 0, False, send)
        seed.take_forward("edge", [PublishRequest("edge#1", 1, Message("/a/b", b"x"))])
        frames = []
        while True:
            try:
                frames.append(wire_bytes(receive.receive_nowait()))
            except trio.WouldBlock:
                return frames, False
            except trio.EndOfChannel:
                return frames, True

    frames, closed = trio.run(forward)
    assert [type(link.decode_op(frame[4:])) for frame in frames] == [
        link.Heartbeat]  # the catch-up's heartbeat, and no ForwardFailed
    assert closed and "edge" not in node.stream.followers
