"""The notification queue: bounded, never blocks the session, drops the oldest when full.

Notifications are informational (the messages carry the guarantee), so an application
that never reads them must not stall message delivery: when the queue is full the
oldest notification is discarded and counted in ``dropped``.

The session puts notifications here and messages into their subscriptions in the order
they came off the wire. A task that reads both can keep that order: :meth:`get` takes a
notification in the same scheduler step that returns it to the caller, and
:meth:`get_nowait` takes the ones already waiting (take them before handling a message,
and every notification that came before the message is handled first).
"""

from __future__ import annotations

from collections import deque

import trio

from migratory_client.errors import MigratoryError
from migratory_client.events import Notification

__all__ = ["NotificationQueue"]


class NotificationQueue:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("notification capacity must be >= 1")
        self._items: deque[Notification] = deque(maxlen=capacity)
        self._waiters = trio.lowlevel.ParkingLot()
        self._closed = False
        self._error: MigratoryError | None = None
        self.dropped = 0

    def put(self, notification: Notification) -> None:
        if self._closed:
            return
        if len(self._items) == self._items.maxlen:
            self.dropped += 1
        self._items.append(notification)
        self._waiters.unpark_all()

    def close(self, error: MigratoryError | None) -> None:
        """No more notifications; readers drain the queue, then get ``error`` or the end."""
        self._closed = True
        self._error = error
        self._waiters.unpark_all()

    @property
    def pending(self) -> int:
        """Notifications waiting to be taken."""
        return len(self._items)

    async def get(self) -> Notification:
        """The next notification; raises StopAsyncIteration (or the client's error) at the end.

        A checkpoint comes before the notification is taken, never after: the caller has
        it in the scheduler step that took it (see the module's docstring)."""
        await trio.lowlevel.checkpoint()
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._waiters.park()
        return self._items.popleft()

    def get_nowait(self) -> Notification:
        """The next notification if one is waiting; raises trio.WouldBlock if none is,
        StopAsyncIteration (or the client's error) once closed and drained."""
        if self._items:
            return self._items.popleft()
        if self._closed:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        raise trio.WouldBlock

    def __aiter__(self) -> NotificationQueue:
        return self

    async def __anext__(self) -> Notification:
        return await self.get()
