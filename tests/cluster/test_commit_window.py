"""The commit window: a seed keeps at most ``size`` Raft commands in flight, and the
publishes that arrive meanwhile share the next command (group commit)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from cluster.commit_window import COMMIT_WINDOW, MAX_COMMAND_BYTES, CommitWindow
from cluster.coordination import PublishRequest
from cluster.node import GuaranteedNode
from cluster.raft import RaftStatus
from cluster.raft_forward import HOLD_MARGIN
from cluster.tooling import free_base_port, member_settings
from migratory.config import load_config
from migratory.model.message import Message


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_window_holds_size_slots_and_a_release_makes_room() -> None:
    clock = Clock()
    window = CommitWindow(2, clock=clock)
    first, second = window.try_acquire(), window.try_acquire()
    assert first is not None and second is not None and first != second
    assert window.try_acquire() is None and window.in_flight == 2
    window.release(first)
    window.release(first)  # a second release of the same slot is a no-op
    assert window.in_flight == 1
    third = window.try_acquire()
    assert third is not None and window.try_acquire() is None


def test_a_slot_whose_callback_never_comes_is_reclaimed_after_the_timeout() -> None:
    clock = Clock()
    window = CommitWindow(1, slot_timeout=2.0, clock=clock)
    lost = window.try_acquire()
    assert lost is not None
    clock.now += 1.9
    assert window.try_acquire() is None
    clock.now += 0.2
    fresh = window.try_acquire()
    assert fresh is not None and window.reclaimed == 1
    window.release(lost)  # the late callback of a reclaimed slot frees nothing
    assert window.in_flight == 1


def test_a_window_of_size_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="commit window size must be >= 1"):
        CommitWindow(0)


def test_acquire_waits_for_a_release() -> None:
    trio.run(acquire_waits_for_a_release)


async def acquire_waits_for_a_release() -> None:
    window = CommitWindow(1)
    held = await window.acquire()
    got: list[int] = []

    async def second() -> None:
        got.append(await window.acquire())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        window.release(held)
    assert len(got) == 1 and window.in_flight == 1


def test_acquire_goes_on_when_the_slot_times_out() -> None:
    trio.run(acquire_goes_on_when_the_slot_times_out,
             clock=trio.testing.MockClock(autojump_threshold=0))


async def acquire_goes_on_when_the_slot_times_out() -> None:
    window = CommitWindow(1, slot_timeout=2.0)
    await window.acquire()  # never released
    start = trio.current_time()
    await window.acquire()
    assert trio.current_time() - start == pytest.approx(2.0)
    assert window.reclaimed == 1


def request(ref: int, size: int) -> PublishRequest:
    return PublishRequest("m0", ref, Message("/a/b", b"x" * size))


def test_take_outgoing_bounds_the_content_bytes_and_always_takes_one(tmp_path: Path) -> None:
    node = node_at(tmp_path)
    publishing = node.publishing
    publishing._outgoing = [request(1, 600), request(2, 600), request(3, 3000), request(4, 1)]
    assert [r.ref for r in publishing.take_outgoing(1000)] == [1]
    assert [r.ref for r in publishing.take_outgoing(1000)] == [2]
    assert [r.ref for r in publishing.take_outgoing(1000)] == [3]  # too big alone: still one
    assert [r.ref for r in publishing.take_outgoing(1000)] == [4]
    assert publishing.take_outgoing(1000) == []


def node_at(tmp_path: Path) -> GuaranteedNode:
    settings = member_settings(
        0, members=3, seeds=3, mode="Guaranteed", base_port=free_base_port(3),
        password="commit-window", data_dir=tmp_path / "data",
    )
    return GuaranteedNode(load_config(overrides=settings, environ={}))


class FakeRaft:
    """Records each command; the test answers it (from another thread, as pysyncobj)."""

    def __init__(self) -> None:
        self.commands: list[tuple[list[int], Any]] = []
        self.send_by: list[float | None] = []
        self.address = "fake"
        self.snapshot = RaftStatus()  # what the seed polls (a Raft that stopped: never)

    def submit(
        self, epoch: int, requests: list[PublishRequest], on_done: Any,
        *, send_by: float | None = None,
    ) -> None:
        self.commands.append(([r.ref for r in requests], on_done))
        self.send_by.append(send_by)

    def close(self) -> None:
        pass


def seed_with_fake_raft(tmp_path: Path) -> tuple[Any, Any, FakeRaft]:
    """A seed member's publishing and seed role, its Raft replaced by a :class:`FakeRaft`."""
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    raft = FakeRaft()
    seed._build_raft = lambda: raft  # type: ignore[assignment,return-value]
    return node.publishing, seed, raft


async def raft_built(seed: Any) -> None:
    with trio.fail_after(5):
        while seed.raft is None:
            await trio.sleep(0.01)


def answer(on_done: Any) -> None:
    thread = threading.Thread(target=on_done, args=(None, "NOT_LEADER", False))
    thread.start()
    thread.join()


def test_publishes_arriving_while_a_command_is_in_flight_share_the_next_one(
    tmp_path: Path,
) -> None:
    trio.run(publishes_share_the_next_command, tmp_path)


async def publishes_share_the_next_command(tmp_path: Path) -> None:
    assert COMMIT_WINDOW == 1  # the measured choice (docs/benchmarks.md)
    publishing, seed, raft = seed_with_fake_raft(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.run)
        await raft_built(seed)
        publishing.submit(Message("/a/b", b"1"), None, trio.current_time())
        await trio.testing.wait_all_tasks_blocked()
        assert [refs for refs, _ in raft.commands] == [[1]]  # idle: submitted at once
        for n in (2, 3, 4):
            publishing.submit(Message("/a/b", str(n).encode()), None, trio.current_time())
        await trio.testing.wait_all_tasks_blocked()
        assert len(raft.commands) == 1  # the window is full: they wait together
        answer(raft.commands[0][1])
        await trio.sleep(0.05)
        assert [refs for refs, _ in raft.commands] == [[1], [2, 3, 4]]
        assert seed.commit_statistics() == {
            "commands": 2, "publishes": 4, "in_flight": 1, "window": 1, "slots_reclaimed": 0,
        }
        nursery.cancel_scope.cancel()


def test_one_command_carries_at_most_max_command_bytes(tmp_path: Path) -> None:
    trio.run(one_command_carries_at_most_max_command_bytes, tmp_path)


async def one_command_carries_at_most_max_command_bytes(tmp_path: Path) -> None:
    publishing, seed, raft = seed_with_fake_raft(tmp_path)
    big = b"x" * (MAX_COMMAND_BYTES // 2 + 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.run)
        await raft_built(seed)
        for _ in range(3):
            publishing.submit(Message("/a/b", big), None, trio.current_time())
        for expected in ([1], [2], [3]):
            await trio.sleep(0.05)
            assert raft.commands[-1][0] == expected
            answer(raft.commands[-1][1])
        nursery.cancel_scope.cancel()


def test_a_command_is_never_sent_after_its_oldest_publish_timed_out(tmp_path: Path) -> None:
    trio.run(a_command_is_never_sent_late, tmp_path)


async def a_command_is_never_sent_late(tmp_path: Path) -> None:
    """The seed gives each command the time after which, held for want of a link to the
    Raft leader, it is never sent (cluster/raft_forward.py): HOLD_MARGIN before the
    publish timeout of its oldest publish, on the Raft thread's clock."""
    publishing, seed, raft = seed_with_fake_raft(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.run)
        await raft_built(seed)
        # published 4 s ago (as by a client whose publish waited): 5 s of its 10 left
        publishing.submit(Message("/a/b", b"1"), None, trio.current_time() - 4.0)
        await trio.testing.wait_all_tasks_blocked()
        send_by = raft.send_by[0]
        assert send_by is not None
        left = send_by - time.monotonic()  # the clocks differ: trio's is not monotonic()
        expected = publishing.publish_timeout - 4.0 - HOLD_MARGIN
        assert expected - 1.0 < left <= expected
        nursery.cancel_scope.cancel()


def test_a_forward_is_settled_once_raft_answers_its_command(tmp_path: Path) -> None:
    """What a seed's link waits on before it reads more forwards (cluster/peers.py
    FORWARD_WINDOW): the event take_forward returns is set by Raft's answer."""
    trio.run(a_forward_is_settled_once_raft_answers, tmp_path)


async def a_forward_is_settled_once_raft_answers(tmp_path: Path) -> None:
    _, seed, raft = seed_with_fake_raft(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.run)
        await raft_built(seed)
        settled = seed.take_forward("127.0.0.1:9", [request(1, 10)])
        assert settled is not None and not settled.is_set()
        answer(raft.commands[-1][1])
        with trio.fail_after(5):
            await settled.wait()
        nursery.cancel_scope.cancel()
