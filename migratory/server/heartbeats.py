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
look (``Outbox.batch_taken``, cleared by each look) has written in the last half interval
and gets nothing; one that took none gets a ``pong`` (9 bytes, encoded once) -- so an
idle connection is written once per interval and a busy one never, and no connection
stays silent for longer than the interval (plus a tick). Pure bookkeeping: no trio, no
clock; the tick is the caller's.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final, Protocol

from migratory.config_keepalive import HEARTBEAT_CEILING_MS
from migratory.model.outbox import Outbox
from migratory.protocol import ops
from migratory.protocol import websocket as ws

__all__ = [
    "HEARTBEAT_FRAME", "MAX_INTERVAL_MS", "SWEEP_LIMIT", "HeartbeatStatistics", "Heartbeats",
    "SessionsDue",
]

HEARTBEAT_FRAME: Final = ws.encode_binary(ops.encode_server_op(ops.Pong()))
MAX_INTERVAL_MS: Final = HEARTBEAT_CEILING_MS  # the longest interval granted (an hour)
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
    heartbeat_slot: SessionsDue | None
    """The list of the wheel it waits in (None: not watched): the only state the
    heartbeats keep per session, one slot of the session (Session's size class holds it
    for free) instead of an object and a dict entry (94 bytes a session, measured)."""

    def deliver(self, frame: bytes) -> None:
        """Queue ``frame`` and have it written (at the next batch, bounded)."""


class SessionsDue(list["Beating"]):
    """The sessions of the wheel due at one tick and looked at every one period.
    ``stale``: entries of sessions forgotten (or watched again) since they were put here;
    once they are half the list it is compacted, so that a closed session is not held
    until the list comes due -- half an hour later for a client granted an hour, and a
    client that connects and closes in a loop held every one of them meanwhile."""

    __slots__ = ("stale",)

    def __init__(self) -> None:
        super().__init__()
        self.stale = 0


@dataclass(frozen=True, slots=True)
class HeartbeatStatistics:
    """What the heartbeats did, for ``/stats`` and ``/metrics`` (docs/monitoring.md)."""

    sessions: int  # watched now
    sent: int  # heartbeats queued so far
    looks: int  # sessions looked at so far (the sweeps' work)
    looks_late: int  # of them, looked at a tick or more after they were due
    overdue: int  # due and not looked at yet (left over by a sweep at its limit)
    lag_seconds: float  # how long the oldest of those has been due (0: none)


class Heartbeats:
    """The sessions that were granted a heartbeat, and the sweep that keeps them beating.

    The wheel: ``tick -> {period: sessions}``, the sessions due at that tick that are
    looked at every ``period`` ticks (sessions granted one interval share their lists, so
    a session's period is its list's). A session is in the list its ``heartbeat_slot``
    names; an entry in any other list (it was forgotten, or watched again) is stale and
    skipped when that list comes due."""

    def __init__(self, minimum_ms: int, tick_seconds: float,
                 sweep_limit: int = SWEEP_LIMIT) -> None:
        """``minimum_ms``: ``ClientHeartbeatMinimum`` (0: none granted);
        ``tick_seconds``: how often :meth:`sweep` is called; ``sweep_limit``: the most
        sessions one sweep looks at."""
        self.minimum_ms = minimum_ms
        self._tick_ms = tick_seconds * 1000
        self._sweep_limit = sweep_limit
        self._tick = 0
        self._slots: dict[int, dict[int, SessionsDue]] = {}
        # (due tick, period, sessions): due, not all looked at yet (a sweep at its limit
        # leaves the rest to the next); the first from index ``_late_from`` on
        self._late: deque[tuple[int, int, SessionsDue]] = deque()
        self._late_from = 0
        self._overdue = 0  # entries in _late not looked at yet
        self._watched = 0
        self.sent = 0  # heartbeats queued so far
        self.looked = 0  # sessions looked at so far (the sweeps' work)
        self.looked_late = 0  # of them, a tick or more after they were due

    def __len__(self) -> int:
        return self._watched

    def grant(self, asked_ms: int | None) -> int | None:
        """The interval granted to a ``connect`` that asked for ``asked_ms``: at least
        ``ClientHeartbeatMinimum``, at least two ticks (the sweep looks at a session at
        most once a tick, twice per interval: a shorter grant would be a promise the
        sweep cannot keep), at least what the sessions already watched leave
        (:data:`HEADROOM`: 10 s at 100,000 sessions), at most an hour; None: none (not
        asked, or off). The client holds the server to the longer of what it asked and
        what it was granted, so a crowded server is never taken for a silent one."""
        if asked_ms is None or self.minimum_ms == 0:
            return None
        # every session looked at twice per interval: N + 1 of them at this interval ask
        # for 2 (N + 1) / interval looks, which must stay within limit / HEADROOM a tick
        crowd_ms = -(-2 * (self._watched + 1) * HEADROOM * self._tick_ms
                     // self._sweep_limit)
        floor_ms = math.ceil(2 * self._tick_ms)
        return int(min(max(asked_ms, self.minimum_ms, floor_ms, crowd_ms), MAX_INTERVAL_MS))

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
        sessions = self._slot(period)
        sessions.append(session)
        session.heartbeat_slot = sessions
        self._watched += 1

    def _slot(self, period: int) -> SessionsDue:
        """The list of the sessions looked at every ``period`` ticks, due ``period`` ticks
        from now."""
        due = self._slots.setdefault(self._tick + period, {})
        sessions = due.get(period)
        if sessions is None:
            sessions = due[period] = SessionsDue()
        return sessions

    def forget(self, session: object) -> None:
        """``session`` (any client session) is over; if it was watched, its entry is
        dropped when next due, or before, with the other stale entries of its list once
        they are half of it (not the list the sweep is going through)."""
        sessions: SessionsDue | None = getattr(session, "heartbeat_slot", None)
        if sessions is None:
            return
        session.heartbeat_slot = None  # type: ignore[attr-defined]
        self._watched -= 1
        sessions.stale += 1
        if sessions.stale * 2 > len(sessions) and not (
                self._late and self._late[0][2] is sessions):
            sessions[:] = [kept for kept in sessions if kept.heartbeat_slot is sessions]
            sessions.stale = 0

    def statistics(self) -> HeartbeatStatistics:
        lag = 0.0
        if self._late:
            lag = (self._tick - self._late[0][0]) * self._tick_ms / 1000
        return HeartbeatStatistics(self._watched, self.sent, self.looked, self.looked_late,
                                   self._overdue, lag)

    def sweep(self) -> int:
        """One tick: look at the sessions due (at most ``SWEEP_LIMIT``), queue a
        heartbeat to each that wrote nothing since its last look; the count queued."""
        self._tick += 1
        tick = self._tick
        late = self._late
        due = self._slots.pop(tick, None)
        if due is not None:
            for period, sessions in due.items():
                late.append((tick, period, sessions))
                self._overdue += len(sessions)
        budget = self._sweep_limit
        sent = 0
        while late and budget > 0:
            due_tick, period, sessions = late[0]
            start = self._late_from
            end = min(len(sessions), start + budget)
            if end == len(sessions):
                late.popleft()
                self._late_from = 0
            else:
                self._late_from = end
            budget -= end - start
            self._overdue -= end - start
            if due_tick != tick:
                self.looked_late += end - start
            sent += self._look(sessions, start, end, period)
        self.sent += sent
        return sent

    def _look(self, sessions: SessionsDue, start: int, end: int, period: int) -> int:
        """Look at ``sessions[start:end]`` (due, every ``period`` ticks); the count sent."""
        self.looked += end - start
        after: SessionsDue | None = None  # where they go next (made at the first)
        sent = 0
        for index in range(start, end):
            session = sessions[index]
            if session.heartbeat_slot is not sessions:
                continue  # forgotten, or watched again (then it is in its new list)
            if session.closing or session.aborted:
                session.heartbeat_slot = None
                self._watched -= 1
                continue
            outbox = session.outbox
            if not outbox.batch_taken and not outbox:
                session.deliver(HEARTBEAT_FRAME)  # written at the next batch
                sent += 1
            outbox.batch_taken = False
            if after is None:
                after = self._slot(period)
            after.append(session)
            session.heartbeat_slot = after
        return sent
