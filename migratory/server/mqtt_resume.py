"""A persistent MQTT session's resume, in slices of bounded work.

A session resumed with wildcard filters may have missed messages on every subject of the
server; replaying them all as its CONNECT was handled stopped the server for everyone
(1.1 s for a '#' session on 50,000 subjects). :class:`Resume` replays a slice per turn of
the loop (:meth:`Resume.work`): first the subjects the session's record names, from
their recorded positions (and each exact filter's subject it names no position of, from
the start of its cache: ``mqtt_subscriptions._catch_up_from``), then the subjects its
wildcard filters match that the record does not name (they appeared after the save:
their whole cache is missed), found by a scan of the hub's subject index in slices.

Meanwhile the hub delivers the session's live messages to the :class:`Resume` (it stands
in for the session with the hub): a live message of a subject not caught up yet first
catches that subject up, so the session gets its messages in order, none twice, none
missing. A subject counts as caught up once the session has a position for it
(``settle_reached``). When the work is done the session takes its subscriptions back.

The work is counted as a WebSocket resume's (``session_subscriptions``): a message
delivered weighs :data:`MESSAGE_VISITS`, so that a slice (``SCAN_SLICE`` units) holds
about as many messages as a WebSocket's (``SLICE_MESSAGES``) and counts as much in the
loop's turn. (A message counted one visit: a slice delivered 2,000 messages and counted
9 operations of the turn, where a WebSocket's 2,000 count 126; 2,000 persistent sessions
reconnecting ~50 messages back on 10 subjects held the loop 1.4 s: docs/benchmarks.md.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.hub import Hub
from migratory.server.hub_sinks import SubjectScan
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT

if TYPE_CHECKING:
    from migratory.server.mqtt_session import MqttSession
    from migratory.server.mqtt_subscriptions import Subscriptions

log = logging.getLogger("migratory.mqtt")

NOTHING_SEEN = Position(0, 0)
"""Recorded for a subject that had no message when it was subscribed: on resume, every
message of it the cache holds is missed."""

RESYNCS_LOGGED = 10
"""Subjects a resume logs one by one as resumed from their snapshot; the others are
counted (``mqtt_resyncs``) under one line: a '#' session on a server whose caches no
longer reached back logged 400,000 warnings, ~50 ms of a slice's turn per 2,000."""

SCAN_UNIT = 250
"""Subjects (or recorded positions) matched against a session's filters -- a SUBSCRIBE's
retained messages, a resumed session's subjects, a persistent session's record after a
change of its filters -- that count as one more packet of the per-turn budget (~1 ms of
CPU): one client's SUBSCRIBE / UNSUBSCRIBE flood on a server of many subjects waits for
the others' turn. A SUBSCRIBE's retained messages and a resume's catch-up go a slice
(SCAN_SLICE) per turn (mqtt_input)."""

MESSAGE_VISITS = SCAN_UNIT // MESSAGES_PER_UNIT
"""What a message a resume delivers counts for, in visits: MESSAGES_PER_UNIT of them
count as one operation of the turn, as a WebSocket resume's recovered messages."""

CURRENT_LOGGED = 20
"""Subjects a resume found up to date (nothing missed) named with their position in its
summary line (``Resume.summary``); only counted past that."""

SCAN_CHUNK = 256
"""Visits of the subject index asked for at a time between catch-ups (a slice's bound
is checked between chunks)."""


class Resume:
    """The catch-up of one resumed session; the hub's sink for it until :attr:`done`."""

    __slots__ = (
        "_current", "_hub", "_messages", "_owner", "_pending", "_replayed", "_resynced",
        "_scan", "_subscriptions", "_unsent", "_up_to_date",
    )

    def __init__(
        self, subscriptions: Subscriptions, owner: MqttSession, hub: Hub,
        positions: dict[str, Position],
    ) -> None:
        self._subscriptions = subscriptions
        self._owner = owner
        self._hub = hub
        self._pending = positions  # the record's subjects not caught up yet
        self._scan: SubjectScan | None = None
        self._resynced = 0  # subjects resumed from their snapshot
        self._unsent = 0  # ... of which without one to send (an empty RETAIN instead)
        self._replayed = 0  # subjects given what they missed from the cache
        self._messages = 0  # ... so many messages in all
        self._up_to_date = 0  # subjects that had missed nothing
        self._current: list[str] = []  # ... the first few as "subject@seq"

    @property
    def done(self) -> bool:
        owner = self._owner
        if owner.closing or owner.aborted:
            return True
        return not self._pending and self._scan is not None and self._scan.done

    def deliver_message(self, message: Message, qos: int) -> None:
        """A live message (the hub's call): its subject caught up first."""
        subject = message.subject
        if subject not in self._owner.settle_reached():
            self._catch_up(subject, self._pending.pop(subject, NOTHING_SEEN))
        self._owner.deliver_message(message, qos)

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        """The hub moved ``subject`` past its cache (a cache sync) during the resume: a
        subject not caught up yet is caught up now (its record's position against where
        the hub is: a replay, or the resume's resync); one caught up is the session's."""
        if subject not in self._owner.settle_reached():
            self._catch_up(subject, self._pending.pop(subject, NOTHING_SEEN))
        else:
            self._owner.resync(subject, position, snapshot, qos)

    def summary(self) -> str:
        """What the resume did, for its log line (once done): a chaos run's session that
        resumed "up to date" past what its client had (seed 1176, docs/chaos.md) left no
        line to tell which positions its record named."""
        unsent = f" ({self._unsent} with none: an empty RETAIN)" if self._unsent else ""
        return (f"{self._replayed} subject(s) replayed ({self._messages} messages), "
                f"{self._resynced} from their snapshot{unsent}, {self._up_to_date} up to date"
                + (f" ({', '.join(self._current)})" if self._current else ""))

    def work(self, limit: int) -> int:
        """Catch up subjects for about ``limit`` units of work (a subject, a visit of the
        subject index; a message delivered: MESSAGE_VISITS); the units done."""
        owner = self._owner
        done = 0
        pending = self._pending
        while pending and done < limit:
            if owner.closing or owner.aborted:
                return done
            subject, position = pending.popitem()
            if subject not in owner.settle_reached():
                done += MESSAGE_VISITS * self._catch_up(subject, position)
            done += 1
        if pending:
            return done
        scan = self._scan
        if scan is None:
            scan = self._scan = self._hub.matching_any(self._subscriptions.wildcards)
        while not scan.done and done < limit and not (owner.closing or owner.aborted):
            visited = scan.visited
            for subject, _, _, _ in scan.take(min(SCAN_CHUNK, limit - done)):
                if subject not in owner.settle_reached():
                    done += MESSAGE_VISITS * self._catch_up(subject, NOTHING_SEEN)
            done += scan.visited - visited
        return done

    def _catch_up(self, subject: str, position: Position) -> int:
        """Deliver what ``subject`` has after ``position`` (its snapshot when the cache
        cannot tell); the messages delivered."""
        qos = self._subscriptions.qos_for(subject)
        if qos is None:
            return 0  # no filter matches it any more
        hub = self._hub
        owner = self._owner
        reached = owner.settle_reached()
        if position == NOTHING_SEEN:
            current = hub.position(subject)
            if current is None:
                return 0
            reached[subject] = Position(current.epoch, 0)  # caught up, from its start
            missed = hub.missed(subject, Position(current.epoch, 0))
        else:
            reached[subject] = position
            missed = hub.missed(subject, position)
        if missed is None:
            self._resynced += 1
            snapshot = hub.snapshot(subject)
            unsent = snapshot is None or not snapshot.content  # (then an empty RETAIN)
            self._unsent += unsent
            owner.resynced(subject, quiet=self._resynced > RESYNCS_LOGGED, unsent=unsent)
            if self._resynced == RESYNCS_LOGGED + 1:
                log.warning("%s: more subjects resumed from their snapshot: counted "
                            "(mqtt_resyncs), not logged one by one", owner.describe(),
                            extra=owner.log_fields())
            if snapshot is not None and snapshot.content:
                owner.deliver_retained(snapshot, qos, hub.position(subject))
            else:  # the empty RETAIN: reset, no snapshot (docs/mqtt.md)
                owner.deliver_reset(subject, hub.position(subject), qos)
            return 1
        if position != NOTHING_SEEN:
            owner.synced(subject)
        if missed:
            self._replayed += 1
            self._messages += len(missed)
        else:
            self._up_to_date += 1
            if len(self._current) < CURRENT_LOGGED:
                self._current.append(f"{subject}@{reached[subject].seq}")
        for message in missed:
            if owner.closing:
                break
            owner.deliver_message(message, qos)
        return len(missed)
