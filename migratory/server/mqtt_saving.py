"""Saving a persistent MQTT session's record (clean session = 0): when, and what.

A base of :class:`~migratory.server.mqtt_session.MqttSession` (after the delivery side),
kept apart so that each file reads alone. One save is in flight at a time; changes made
meanwhile go into the next. A change of filters (and a take-up, the connection's end)
is saved at once; a change of positions alone (a delivery, a PUBACK) at most once per
:data:`SAVE_INTERVAL`. What a save carries is the record's head and the positions that
changed since the last save (:mod:`migratory.server.mqtt_store`), so its cost is that
of the change, not of the session.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from migratory import client_lines
from migratory.protocol import close_codes, ops
from migratory.server.mqtt_delivery import MqttDelivery
from migratory.server.mqtt_store import (
    EXPIRY_WRITER,
    WRITER,
    SessionRecord,
    session_subject,
    stored_generation,
    superseded,
)

if TYPE_CHECKING:
    from migratory.model.message import Message
    from migratory.server.context import ServerContext

log = logging.getLogger("migratory.mqtt")

SAVE_INTERVAL = 1.0
"""Seconds a persistent session's record is saved at most once while only its positions
change: each save is a retained message (in a Guaranteed cluster a Raft entry) carrying
the positions that changed; saved at every delivery, a persistent '#' subscriber of a
busy server made a save per message delivered. After a member failure the resumed
session gets at most about this long of messages again (at least once)."""
clock = time.monotonic  # the clock of SAVE_INTERVAL (tests replace it)

BOUND_LOG_INTERVAL = 10.0
"""Seconds between two lines, over all sessions, saying a session's record reached
MqttSessionMaxSubjects (each session's first time only); the next line counts those not
logged: many '#' sessions reaching it together make one line, not one each."""


class _BoundLog:
    """When a line about a session over its bound may be logged (:data:`BOUND_LOG_INTERVAL`)."""

    __slots__ = ("next_at", "unlogged")

    def __init__(self) -> None:
        self.next_at = 0.0
        self.unlogged = 0

    def take(self, now: float) -> int | None:
        """None: not now (counted); else how many were not logged since the last line."""
        if now < self.next_at:
            self.unlogged += 1
            return None
        unlogged, self.unlogged = self.unlogged, 0
        self.next_at = now + BOUND_LOG_INTERVAL
        return unlogged


bound_log = _BoundLog()


SAVES_PER_TICK = 1000
"""Deferred saves one tick makes at most (the rest at the next ticks): 50,000 persistent
sessions given one message together were all due one SAVE_INTERVAL later, in one turn."""


def save_due_positions(due: dict[Any, None], most: int = SAVES_PER_TICK) -> int:
    """Save the positions of the sessions in ``due`` (``ServerContext.mqtt_saves_due``)
    whose SAVE_INTERVAL has passed since their last save: the server's tick. A change of
    positions within the interval was saved only with a later change or the
    connection's end: a device that acknowledged a burst and went quiet kept its saved
    positions before the burst -- a kill of its member an hour later replayed the whole
    burst, or, past the cache, resynced it. Taken in the order they were deferred, up to
    the first not due yet (a later one is due at most SAVE_INTERVAL after it), at most
    ``most``: the work is that of the saves, bounded per tick. Returns the sessions saved."""
    now = clock()
    saved = 0
    while due and saved < most:
        session = next(iter(due))
        if session.connected_for_saves() and session._next_save > now:
            break
        del due[session]
        if session.connected_for_saves() and session._save_again:
            session._changed(positions=True)
            saved += 1
    return saved


class MqttSaving(MqttDelivery):
    __slots__ = ("_discarding", "_next_save", "_record", "_save_again", "_saving",
                 "_subacks_saving", "_urgent", "_waiting_subacks")
    _ctx: ServerContext
    _discarding: Future[None] | None  # a clean CONNECT's discard in flight (its CONNACK held)
    _record: SessionRecord | None  # persistent sessions only
    _next_save: float  # clock() before which a change of positions alone waits
    _save_again: bool  # a change came while a save was in flight, or too soon after one
    _saving: bool  # a save is in flight
    _urgent: bool  # a change to save now: filters, take-up, the connection's end
    _waiting_subacks: list[bytes]  # sent once the record holding their filters is saved
    _subacks_saving: int  # how many of them the save in flight carries (the rest: the next)
    # (and a clean CONNECT's CONNACK once the empty record is)
    client_id: str

    def _send(self, packet: bytes) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def publish_result(self, status: ops.PublishStatus) -> None:
        raise NotImplementedError

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        raise NotImplementedError

    def discard_then_connack(self, discard: Message, connack: bytes, now: float) -> None:
        """A clean-session CONNECT over a stored session: its CONNACK waits until the
        empty record that discards the session is stored, and the connection's next
        packets with it (nothing may come before a CONNACK; :meth:`MqttInput.process`).
        Answered at once, a CONNECT with clean session 0 right after it -- the client
        reconnecting, through the shared port of Workers onto another worker, or onto
        another member -- could still find the session, filters and all, while the
        discard was on its way to the sequencer (2 of 23 such reconnects by hand), as a
        SUBACK waits for the record holding its filter (``tests/server/test_mqtt_session.py``).
        A discard that fails closes the connection without CONNACK (the client tries
        again)."""
        self._waiting_subacks.append(connack)
        self._saving = True
        self._subacks_saving = len(self._waiting_subacks)
        self._discarding = Future()
        self._ctx.publishing.submit(discard, self, now)

    def connected_for_saves(self) -> bool:
        """Its record is still this connection's to save (not closed, not taken over)."""
        return self._record is not None and not self.closing and not self.aborted

    def taken_over(self, where: str) -> None:
        raise NotImplementedError

    def save_record(self) -> None:
        """Save the persistent session's record now: the expiry sweep saves a connected
        session at least every half MqttSessionExpiry, so no member takes it for gone
        (one without filters has nothing to keep)."""
        if self._record is not None and self._record.filters:
            self._changed()

    def _changed(self, *, positions: bool = False) -> None:
        """The session changed: save its record (one save in flight at a time). A change
        of ``positions`` alone (a delivery, a PUBACK) waits until SAVE_INTERVAL after the
        last save; the next change after it, or the connection's end, saves it."""
        record = self._record
        if record is None:
            return
        if not positions:
            self._urgent = True
        elif not self._urgent and clock() < self._next_save:
            self._save_again = True
            self._ctx.mqtt_saves_due[self] = None  # saved once due (save_due_positions)
            return
        if self._superseded(record):
            return
        record.filters = self.subscriptions.filters()
        if self._saving:
            self._save_again = True
            return
        self._saving = True
        self._subacks_saving = len(self._waiting_subacks)  # (a SUBACK later: the next save)
        self._save_again = self._urgent = False
        self._next_save = clock() + SAVE_INTERVAL
        self._work += self.subscriptions.implied_positions(record)  # counted in the turn
        self._count_forgotten(record)
        self._ctx.publishing.submit(record.message(self.client_id), self, self._now)

    def _superseded(self, record: SessionRecord) -> bool:
        """Whether another connection's record holds the session now (a later CONNECT's,
        or one of two at once whose record outranks this one's): then this connection
        saves no more, and closes -- open, it would save nothing again, its SUBACKs lies
        (the takeover notices close it too, unless the two orders disagreed:
        mqtt_takeover)."""
        snapshot = self._ctx.hub.snapshot(session_subject(self.client_id))
        if not superseded(snapshot, record) or self._reclaim(snapshot, record):
            return False
        client_lines.lines.log(log, logging.INFO, "mqtt superseded", "%s: the session "
                               "was taken up by a later connection: not saved",
                               self.describe(), extra=self.log_fields())
        self._record = None
        if not (self.closing or self.aborted):
            self.taken_over("by another connection's record")
        return True

    def _reclaim(self, snapshot: Message | None, record: SessionRecord) -> bool:
        """Whether what outranks ``record`` is another member's expiry sweep discarding
        it -- its clock ahead of this one's by about half MqttSessionExpiry or more (or
        this member's sweep could not save it in time) -- while its client is connected
        here: then the record is taken back, saved whole at the discard's generation
        (which its writer outranks), and the clocks named. Before, the connection closed
        as taken over and the session was gone: with a member's clock 2 h behind, a
        client connected there lost it within a minute (``test_mqtt_clocks.py``)."""
        if snapshot is None or snapshot.fields.get(WRITER) != EXPIRY_WRITER:
            return False
        generation = stored_generation(snapshot)
        if generation != record.generation + 1:
            return False
        record.generation = generation
        record.dirty |= set(record.positions)  # the discard emptied every position field
        self._urgent = self._save_again = True
        self._ctx.stats.mqtt_sessions_reclaimed += 1
        expiry = self._ctx.config.mqtt_session_expiry
        client_lines.lines.log(
            log, logging.WARNING, "mqtt reclaimed", "%s: another member's expiry sweep "
            "discarded this connected session, which this member saves at least every "
            "half MqttSessionExpiry (%d s): that member's clock is ahead of this one's by "
            "about %d s or more (or this member's sweep did not run for that long). Saved "
            "again whole; synchronise the members' clocks (NTP): a client that moves "
            "there finds its session expired",
            self.describe(), expiry, expiry // 2, extra=self.log_fields())
        return True

    def _count_forgotten(self, record: SessionRecord) -> None:
        """Bound the record (one read from a record over MqttSessionMaxSubjects), count
        the positions it forgot since the last save, log the session's first time."""
        record.bound()
        forgotten = record.take_forgotten()
        if not forgotten:
            return
        stats = self._ctx.stats
        stats.mqtt_session_positions_forgotten += forgotten
        if record.over_bound:
            return
        record.over_bound = True
        stats.mqtt_sessions_over_subject_bound += 1
        unlogged = bound_log.take(clock())
        if unlogged is None:
            return
        more = f" ({unlogged} more sessions like it not logged)" if unlogged else ""
        log.warning("%s: the session's record names MqttSessionMaxSubjects (%d) subjects: "
                    "it forgets the positions of those delivered least recently, which a "
                    "resume replays from the start of their cache (counted in "
                    "mqtt_session_positions_forgotten; not logged again for this "
                    "connection)%s", self.describe(), record.max_subjects, more,
                    extra=self.log_fields())

    def _saved(self, status: ops.PublishStatus) -> None:
        """A save's outcome; a later change is saved now (even once the client is gone:
        its last positions must survive it). A failed save's positions are saved again
        with the next (the connection's end)."""
        self._saving = False
        discarding, self._discarding = self._discarding, None
        if discarding is not None:  # the connection reads on (a CONNACK, or the close)
            discarding.set_result(None)
        ok = status.status is ops.Status.PUBLISH_OK
        if self._record is not None:
            self._record.saved(ok=ok)
        if ok and self._record is not None and self._superseded(self._record):
            return  # stored, but another's record outranks it: its SUBACKs are not due
        if not ok:
            if not self.closing:
                client_lines.lines.log(log, logging.INFO, "mqtt not saved", "%s: session not "
                                       "saved (%s): closing", self.describe(), status.reason,
                                       extra=self.log_fields())
                self.close(close_codes.INTERNAL_ERROR.code, "session not saved")
            return
        carried, self._subacks_saving = self._subacks_saving, 0  # (one that came meanwhile
        # waits for the save that carries its filter: before, this one sent it)
        subacks, self._waiting_subacks = (self._waiting_subacks[:carried],
                                          self._waiting_subacks[carried:])
        for suback in subacks:
            self._send(suback)
        if self._save_again:
            self._changed(positions=True)  # now if urgent, else after SAVE_INTERVAL
        self.flush()
