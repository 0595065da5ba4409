"""Client connections open per front end, kept as they change (``GET /metrics``:
``migratory_frontend_connections``).

A scrape used to walk every connection to count them (and their outboxes: 25-45 ms
of the event loop at 100,000 connections, ``benchmarks/metrics_scrape.py``); now the
server counts a connection in when it accepts it, moves it when its front end changes
(an HTTP connection upgraded to a WebSocket, native or MQTT, or turned into a
Server-Sent Events stream: only before it is a client session) and counts it out when
it forgets it, so a scrape reads a few numbers.
"""

from __future__ import annotations

__all__ = ["FrontendCounts"]


class FrontendCounts:
    """``{front end: connections}``; a front end with none is absent."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def opened(self, frontend: str) -> None:
        self.counts[frontend] = self.counts.get(frontend, 0) + 1

    def closed(self, frontend: str) -> None:
        left = self.counts.get(frontend, 0) - 1
        if left > 0:
            self.counts[frontend] = left
        else:
            self.counts.pop(frontend, None)

    def moved(self, old: str, new: str) -> None:
        if old != new:
            self.closed(old)
            self.opened(new)
