"""The QoS 1 deliveries of an MQTT session that wait behind a cluster cache sync's jump.

A member installing a peer's cache sync gives its live subscribers the messages the sync
jumped over (``Hub._catch_up_live``). A session at QoS 1 takes each with a packet
identifier of its own, so nothing is shared: 10,000 sessions and a jump of 400 were
4,000,000 deliveries in the install's step, 18.8-20.7 s of CPU during which no client
was served (``benchmarks/hub_waiting_resumes.py live-sessions --front mqtt-qos1``).

The jump now waits in the session's :class:`Backlog` and is delivered in the session's
own turns of the loop -- by its writer as the socket drains (``refill``, as an SSE
stream's backlog), or by its reader before the next packet it handles -- each message
through ``deliver_message`` as before, so the packet identifiers, the in-flight window
and a persistent session's record move exactly as one delivery at a time moved them.
Whatever the hub gives the session meanwhile (live messages, a resync, a retained
message) waits behind it, in order; and no packet the client sends is handled before
the jump is all delivered, as none was before (a PUBACK included: the in-flight window
is the same at each delivery). The live messages held so count against
ClientMaxPendingBytes with the outbox, as if queued there (:meth:`Backlog.held_bytes`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from migratory.model.message import Message
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT

Delivery = Callable[[], None]

HELD_OVERHEAD = 64
"""Bytes a delivery held behind a jump counts besides its content (its PUBLISH's header
and topic, the entry itself): a client that reads nothing, sent live messages without
content, held them all, none counted against its limit."""


class Backlog:
    """The messages of a jump not delivered yet, then the deliveries that came after;
    :attr:`draining` while it makes them (the session's deliveries then go through)."""

    __slots__ = ("_after", "_at", "_deliver", "_messages", "_qos", "draining", "held_bytes")

    def __init__(self, messages: Sequence[Message], qos: int,
                 deliver: Callable[[Message, int], None]) -> None:
        self._messages = messages
        self._qos = qos
        self._at = 0
        self._deliver = deliver
        self._after: deque[tuple[Delivery, int]] = deque()
        self.draining = False
        self.held_bytes = 0  # contents of the deliveries held after the jump

    def __len__(self) -> int:
        return len(self._messages) - self._at + len(self._after)

    def hold(self, delivery: Delivery, size: int) -> None:
        """A delivery that came after the jump (``size``: its content's bytes): made in
        its turn, in order."""
        size += HELD_OVERHEAD
        self._after.append((delivery, size))
        self.held_bytes += size

    def drain(self, units: int, stopped: Callable[[], bool]) -> int:
        """Deliver about ``units`` x MESSAGES_PER_UNIT of what waits, oldest first (until
        ``stopped``: the session closing); the units of work done."""
        most = max(1, units) * MESSAGES_PER_UNIT
        done = 0
        messages, deliver, qos, after = self._messages, self._deliver, self._qos, self._after
        self.draining = True
        try:
            while self._at < len(messages) and done < most and not stopped():
                self._at += 1
                deliver(messages[self._at - 1], qos)
                done += 1
            while after and done < most and not stopped():
                delivery, size = after.popleft()
                self.held_bytes -= size
                delivery()
                done += 1
        finally:
            self.draining = False
        return 1 + done // MESSAGES_PER_UNIT
