"""A subscription: the application's end of the messages of some subjects.

Both an async iterator of :class:`~migratory.model.Message` and an async context
manager that unsubscribes on exit. Messages wait in a bounded buffer; when the
application does not read and the buffer is full, the subscription pauses: its
subjects are left at the server, and once the application has taken half of the
buffer they are subscribed again from the last message put into it, so the rest
comes as ``recovered``: nothing is lost or duplicated, it only arrives later (a
snapshot or historical message that arrives during the pause is not sent again).
The connection keeps being read meanwhile, so a dead one is still noticed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType

import trio

from migratory.model.message import Message
from migratory_client.errors import MigratoryError
from migratory_client.routing import Outlet

__all__ = ["Subscription"]


class Subscription:
    """Messages of ``subjects``, in order per subject, without duplicates or gaps."""

    def __init__(
        self,
        subjects: tuple[str, ...],
        receive: trio.MemoryReceiveChannel[Message],
        outlet: Outlet,
        unsubscribe: Callable[[Subscription], Awaitable[None]],
        resume: Callable[[Outlet], None],
        client_error: Callable[[], MigratoryError | None],
    ) -> None:
        self._subjects = subjects
        self._receive = receive
        self._outlet = outlet
        self._unsubscribe = unsubscribe
        self._resume = resume
        self._client_error = client_error
        self._active = True

    @property
    def subjects(self) -> tuple[str, ...]:
        return self._subjects

    @property
    def active(self) -> bool:
        return self._active

    async def unsubscribe(self) -> None:
        """Stop the subjects' messages; buffered messages are discarded. Idempotent."""
        if not self._active:
            return
        self._active = False
        self._receive.close()
        await self._unsubscribe(self)

    async def next_message(self) -> Message:
        """The next message; raises StopAsyncIteration after unsubscribe or client close,
        or the client's error if it ended with one (after the buffer is drained)."""
        try:
            message = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            error = self._client_error()
            if error is not None:
                raise error from None
            raise StopAsyncIteration from None
        if self._outlet.paused and self._half_empty():
            self._resume(self._outlet)
        return message

    def _half_empty(self) -> bool:
        stats = self._receive.statistics()
        return stats.current_buffer_used <= stats.max_buffer_size // 2

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        return await self.next_message()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            await self.unsubscribe()

    def __repr__(self) -> str:
        state = "active" if self._active else "closed"
        return f"<Subscription {' '.join(self._subjects)} {state}>"
