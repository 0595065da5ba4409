"""Heartbeats of the native WebSocket sessions that asked for them (``connect``'s
``heartbeat``, docs/protocol.md "Heartbeats"): a member that goes silent without closing
-- a frozen VM, a lost node, a SIGSTOP, a proxy that eats the close -- is then noticed by
its clients from the silence alone, within about twice the interval, with no round trip.

A ping the client sends and times out on takes its interval plus its timeout (the SDKs'
15 + 10 s): at 110 messages/s that is 2,750 messages, past the 1,000 a subject caches by
default, and the client resumed with ``DATA_RESYNC`` although the cluster kept them all.

The cost is bounded by the idle connections alone. No timer per connection: the server's
tick calls :meth:`Heartbeats.sweep`, which looks at the sessions due that tick (a wheel of
tick slots, each session in one, every half interval) and at most ``SWEEP_LIMIT`` of them
(the rest wait for the next tick). A session whose outbox took a batch since its last
look has written in the last half interval and gets nothing; one that took none gets a
``pong`` (9 bytes, encoded once) -- so an idle connection is written once per interval
and a busy one never, and no connection stays silent for longer than the interval (plus
a tick). Pure bookkeeping: no trio, no clock; the tick is the caller's.
"""

from __future__ import annotations

from typing import Final, Protocol

from migratory.model.outbox import Outbox
from migratory.protocol import ops
from migratory.protocol import websocket as ws

__all__ = ["HEARTBEAT_FRAME", "SWEEP_LIMIT", "Heartbeats"]

HEARTBEAT_FRAME: Final = ws.encode_binary(ops.encode_server_op(ops.Pong()))
SWEEP_LIMIT: Final = 4096
"""Sessions looked at per tick, at most (10,000 connected at once with one interval land
in one slot: they are spread over the next few ticks instead of one long tick)."""
HEADROOM: Final = 4
"""The looks the sessions granted may ask for, at most one ``HEADROOM``-th of what the
sweep can do (``SWEEP_LIMIT`` a tick): :meth:`Heartbeats.grant` stretches the interval
of a newcomer so that, were every session on it, they would ask for no more than that.
Sessions granted earlier keep their shorter intervals, so a crowd that came one by one
asks for more -- the harmonic sum, ``1 + ln(N / N0)`` times the share, N0 the sessions
the share holds at the interval asked (10,240 asking for 2 s, with the defaults; 2 s
granted to the first 10,240, 20 s at 100,000) -- and the headroom keeps that within
the sweep's limit up to ``e**3`` times N0 (about 200,000 sessions): each idle session
is written once per interval, give or take a tick. Past it the sweep falls behind, the
looks come later, and a client takes a silence for a dead server only past twice its
interval: at ``e**7`` times N0 (millions)."""


class Beating(Protocol):
    """A session as the heartbeats see it."""

    outbox: Outbox
    closing: bool
    aborted: bool

    def deliver(self, frame: bytes) -> None:
        """Queue ``frame`` and have it written (at the next batch, bounded)."""


class _Watch:
    __slots__ = ("batches", "period", "session")

    def __init__(self, session: Beating, period: int) -> None:
        self.session: Beating | None = session  # None: forgotten, dropped when due
        self.period = period  # ticks between two looks (half the interval)
        self.batches = session.outbox.batches_taken


class Heartbeats:
    """The sessions that were granted a heartbeat, and the sweep that keeps them beating."""

    def __init__(self, minimum_ms: int, tick_seconds: float,
                 sweep_limit: int = SWEEP_LIMIT) -> None:
        """``minimum_ms``: ``ClientHeartbeatMinimum`` (0: none granted);
        ``tick_seconds``: how often :meth:`sweep` is called; ``sweep_limit``: the most
        sessions one sweep looks at."""
        self.minimum_ms = minimum_ms
        self._tick_ms = tick_seconds * 1000
        self._sweep_limit = sweep_limit
        self._tick = 0
        self._slots: dict[int, list[_Watch]] = {}
        self._late: list[_Watch] = []  # due, left over by a sweep at its limit
        self._watched: dict[object, _Watch] = {}
        self.sent = 0  # heartbeats queued so far
        self.looked = 0  # sessions looked at so far (the sweeps' work)

    def __len__(self) -> int:
        return len(self._watched)

    def grant(self, asked_ms: int | None) -> int | None:
        """The interval granted to a ``connect`` that asked for ``asked_ms``: at least
        ``ClientHeartbeatMinimum``, at least what the sessions already watched leave
        (:data:`HEADROOM`: 10 s at 100,000 sessions), at most an hour; None: none (not
        asked, or off). The client holds the server to the longer of what it asked and
        what it was granted, so a crowded server is never taken for a silent one."""
        if asked_ms is None or self.minimum_ms == 0:
            return None
        # every session looked at twice per interval: N + 1 of them at this interval ask
        # for 2 (N + 1) / interval looks, which must stay within limit / HEADROOM a tick
        crowd_ms = -(-2 * (len(self._watched) + 1) * HEADROOM * self._tick_ms
                     // self._sweep_limit)
        return int(min(max(asked_ms, self.minimum_ms, crowd_ms), 3_600_000))

    def start(self, session: Beating, asked_ms: int | None) -> int | None:
        """A ``connect`` that asked for ``asked_ms``: the interval granted (watched from
        now on), or None."""
        granted = self.grant(asked_ms)
        if granted is not None:
            self.watch(session, granted)
        return granted

    def watch(self, session: Beating, interval_ms: int) -> None:
        """Keep ``session`` beating at least every ``interval_ms`` (from :meth:`grant`)."""
        self.forget(session)
        period = max(1, int(interval_ms / 2 // self._tick_ms))
        watch = _Watch(session, period)
        self._watched[session] = watch
        self._slots.setdefault(self._tick + period, []).append(watch)

    def forget(self, session: object) -> None:
        """``session`` is over (its entry is dropped when next due)."""
        watch = self._watched.pop(session, None)
        if watch is not None:
            watch.session = None

    def sweep(self) -> int:
        """One tick: look at the sessions due (at most ``SWEEP_LIMIT``), queue a
        heartbeat to each that wrote nothing since its last look; the count queued."""
        self._tick += 1
        due = self._slots.pop(self._tick, None)
        if due is not None:
            if self._late:
                self._late.extend(due)
            else:
                self._late = due
        late = self._late
        if not late:
            return 0
        limit = self._sweep_limit
        now, self._late = late[:limit], late[limit:]
        self.looked += len(now)
        sent = 0
        slots = self._slots
        for watch in now:
            session = watch.session
            if session is None:
                continue
            if session.closing or session.aborted:
                self.forget(session)
                continue
            outbox = session.outbox
            taken = outbox.batches_taken
            if taken == watch.batches and not outbox:
                session.deliver(HEARTBEAT_FRAME)  # written at the next batch
                sent += 1
            watch.batches = taken
            slots.setdefault(self._tick + watch.period, []).append(watch)
        self.sent += sent
        return sent
