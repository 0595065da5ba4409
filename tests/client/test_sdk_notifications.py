"""The SDK's notification queue (``migratory_client.notifications``): bounded, oldest
dropped, and readable in the wire's order beside the messages: ``get`` takes a
notification in the scheduler step that hands it to the caller, ``get_nowait`` takes
the ones waiting."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing
from sdk_fake_server import trio_test

from migratory_client.errors import MigratoryError
from migratory_client.events import Notification, NotificationStatus
from migratory_client.notifications import NotificationQueue


def note(subject: str) -> Notification:
    return Notification(NotificationStatus.DATA_RESYNC, subject)


class StepsOf(trio.abc.Instrument):
    """After each scheduler step of ``task_name``: (the queue's pending count, done)."""

    def __init__(self, task_name: str, queue: NotificationQueue, done: list[bool]) -> None:
        self.task_name, self.queue, self.done = task_name, queue, done
        self.steps: list[tuple[int, bool]] = []

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.task_name:
            self.steps.append((self.queue.pending, bool(self.done)))


@trio_test
async def test_get_takes_a_notification_in_the_step_that_returns_it() -> None:
    """Otherwise a task reading messages could run between the take and the return, and
    handle a message that came after the notification before it (the chaos workload's
    DATA_RESYNC recorded after the next live message)."""
    queue = NotificationQueue(10)
    queue.put(note("/a/b"))
    done: list[bool] = []
    got: list[Notification] = []

    async def reader() -> None:
        got.append(await queue.get())
        done.append(True)

    steps = StepsOf("reader", queue, done)
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, name="reader")
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert [n.subject for n in got] == ["/a/b"]
    # every step that ended with the notification taken is the one that finished
    assert all(finished for pending, finished in steps.steps if pending == 0), steps.steps
    assert steps.steps[-1] == (0, True)
    assert len(steps.steps) >= 2  # get() is still a checkpoint: it yielded once before


@trio_test
async def test_get_parked_then_woken_by_put() -> None:
    queue = NotificationQueue(10)
    got: list[str | None] = []

    async def reader() -> None:
        got.append((await queue.get()).subject)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        queue.put(note("/x/y"))
    assert got == ["/x/y"]


@trio_test
async def test_a_cancelled_get_loses_nothing() -> None:
    queue = NotificationQueue(10)
    queue.put(note("/a/b"))
    with trio.CancelScope() as scope:
        scope.cancel()
        await queue.get()
    assert queue.pending == 1
    assert (await queue.get()).subject == "/a/b"


def test_get_nowait_takes_what_waits_in_order() -> None:
    queue = NotificationQueue(10)
    with pytest.raises(trio.WouldBlock):
        queue.get_nowait()
    for s in ("/a/1", "/a/2"):
        queue.put(note(s))
    assert [queue.get_nowait().subject, queue.get_nowait().subject] == ["/a/1", "/a/2"]
    with pytest.raises(trio.WouldBlock):
        queue.get_nowait()


def test_get_nowait_after_close_drains_then_ends() -> None:
    queue = NotificationQueue(10)
    queue.put(note("/a/1"))
    queue.close(None)
    assert queue.get_nowait().subject == "/a/1"
    with pytest.raises(StopAsyncIteration):
        queue.get_nowait()
    failed = NotificationQueue(10)
    failed.close(MigratoryError("gone"))
    with pytest.raises(MigratoryError, match="gone"):
        failed.get_nowait()


def test_a_full_queue_drops_the_oldest() -> None:
    queue = NotificationQueue(2)
    for s in ("/a/1", "/a/2", "/a/3"):
        queue.put(note(s))
    assert queue.dropped == 1
    assert [queue.get_nowait().subject, queue.get_nowait().subject] == ["/a/2", "/a/3"]
