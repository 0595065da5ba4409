"""The notification queue: bounded, never blocks the session, drops the oldest when full.

Notifications are informational (the messages carry the guarantee), so an application
that never reads them must not stall message delivery: when the queue is full the
oldest notification is discarded and counted in ``dropped``.
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

    async def get(self) -> Notification:
        """The next notification; raises StopAsyncIteration (or the client's error) at the end."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._waiters.park()
        notification = self._items.popleft()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return notification

    def __aiter__(self) -> NotificationQueue:
        return self

    async def __anext__(self) -> Notification:
        return await self.get()
