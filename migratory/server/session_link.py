"""What a session asks of its transport (:class:`Link`): the connection that writes
its outbox (``migratory.server.connection``), or a test's stand-in.

The sessions (native and SSE: ``session``, ``session_stream``, ``run_output``; MQTT:
``mqtt_session``, ``mqtt_delivery``) name it here, below all of them.
"""

from __future__ import annotations

from typing import Protocol


class Link(Protocol):
    """What a session asks of its transport."""

    writing: bool  # a partially written batch heads the outbox

    def mark_dirty(self) -> None: ...

    def flush_now(self) -> None: ...
