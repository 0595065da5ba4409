"""Where a persistent MQTT session (clean session = 0) lives: a retained message.

The session's subscriptions and, per subject, the position of the last message the
client has (acknowledged, for QoS 1) are the content of a retained message on the
subject ``/$mqtt-session/<client id as hex>``. It is published like any message --
in a Guaranteed cluster acknowledged once a majority of seeds holds it -- so its
snapshot is on every member, and a client that reconnects anywhere after a failover
resumes each subject from its position. Clients cannot subscribe or publish to
``/$...`` subjects (MQTT refuses topics starting with ``$``; the native protocol
refuses :data:`RESERVED_PREFIX`).

A record carries, as the field :data:`SAVED_AT`, the wall-clock second it was saved
(an empty record: ""). A session not saved for ``MqttSessionExpiry`` seconds is
expired (see :mod:`migratory.server.mqtt_expiry`): a connected one is saved at least
every half of that, and its connection's end saves it, so only a session whose client
has been away that long is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from migratory.model.message import Message, Qos
from migratory.model.position import Position

RESERVED_PREFIX = "/$"
SESSION_PREFIX = "/$mqtt-session/"
SESSION_CLOSURE = "$session"  # the closure of a session record's publish
SAVED_AT = "saved_at"  # the field of the wall-clock second a record was saved ("": empty)
wall_clock = time.time  # the clock of SAVED_AT (tests replace it)


def session_subject(client_id: str) -> str:
    return SESSION_PREFIX + client_id.encode("utf-8").hex()


@dataclass(slots=True)
class SessionRecord:
    """A persistent session: topic filter -> granted QoS, subject -> position.

    ``generation`` counts the connections that took the session up: a connection saves
    only while the stored record is not of a later generation (a connection that was
    taken over on another member must not overwrite its successor's record)."""

    filters: dict[str, int] = field(default_factory=dict)
    positions: dict[str, Position] = field(default_factory=dict)
    generation: int = 0

    def encode(self) -> bytes:
        return json.dumps(
            {
                "generation": self.generation,
                "filters": self.filters,
                "positions": {s: [p.epoch, p.seq] for s, p in self.positions.items()},
            },
            separators=(",", ":"),
        ).encode()

    def message(self, client_id: str) -> Message:
        # an empty record says "" explicitly: a snapshot keeps the fields it is not given
        saved_at = str(int(wall_clock())) if self.filters else ""
        return Message(
            session_subject(client_id),
            self.encode(),
            {SAVED_AT: saved_at},
            retained=True,
            qos=Qos.GUARANTEED,
            closure=SESSION_CLOSURE,
        )


def stored_generation(snapshot: Message | None) -> int:
    """The generation of the record a session subject's snapshot holds (0: none)."""
    if snapshot is None or not snapshot.content:
        return 0
    try:
        return int(json.loads(snapshot.content).get("generation", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def saved_at(snapshot: Message | None) -> int | None:
    """When the record a session subject's snapshot holds was saved (wall-clock seconds);
    None for no record, an empty one, or one saved before records said it."""
    if snapshot is None:
        return None
    try:
        return int(snapshot.fields.get(SAVED_AT, ""))
    except ValueError:
        return None


def holds_session(snapshot: Message | None) -> bool:
    """The snapshot holds a session (not none, not an empty record); from its fields, with
    no JSON decoding, except for a record of a version before SAVED_AT."""
    if snapshot is None:
        return False
    if SAVED_AT in snapshot.fields:
        return bool(snapshot.fields[SAVED_AT])
    return decode_record(snapshot) is not None


def expired(snapshot: Message | None, now: float, expiry: int) -> bool:
    """The record was saved more than ``expiry`` seconds before ``now`` (0: never)."""
    saved = saved_at(snapshot)
    return expiry > 0 and saved is not None and now - saved > expiry


def decode_record(snapshot: Message | None) -> SessionRecord | None:
    """The record a session subject's snapshot holds; None if none (or it is empty or
    unreadable: a session that was cleaned is stored as an empty record)."""
    if snapshot is None or not snapshot.content:
        return None
    try:
        body = json.loads(snapshot.content)
        filters = {str(f): int(q) for f, q in body["filters"].items()}
        positions = {
            str(s): Position(int(p[0]), int(p[1])) for s, p in body["positions"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    if not filters:
        return None
    return SessionRecord(filters, positions, stored_generation(snapshot))


@dataclass(frozen=True, slots=True)
class TakenUp:
    """A CONNECT's view of the client id's stored session (see :func:`take_up`)."""

    stored: SessionRecord | None  # the session as stored; None: none (or cleaned)
    record: SessionRecord | None  # what this connection keeps and saves (persistent only)
    discard: Message | None  # clean session over a stored one: the empty record to publish
    expired: bool = False  # the stored session was older than MqttSessionExpiry: not taken up


def take_up(
    snapshot: Message | None,
    client_id: str,
    *,
    persistent: bool,
    live: SessionRecord | None = None,
    expiry: int = 0,
) -> TakenUp:
    """A new connection of ``client_id`` takes up the session that ``snapshot`` (its
    session subject's) stores, one generation later: a persistent session keeps it (or
    a new one); a clean session has a stored one discarded.

    ``live``: the record of the client's connection this one just took over on this
    member. Its saves may still be in flight (a Guaranteed cluster's commit), so the
    snapshot can be older than it: the later of the two is taken up, and a clean
    session discards whatever those saves will store.

    ``expiry`` (MqttSessionExpiry): a stored session saved longer ago than that is
    expired -- whether or not a sweep has discarded it yet --, a persistent session
    starts afresh (session present 0) and saves over it."""
    stored, generation = decode_record(snapshot), stored_generation(snapshot)
    stale = False
    if live is not None and live.generation >= generation:
        stored = SessionRecord(dict(live.filters), dict(live.positions)) if live.filters else None
        generation = live.generation
    elif stored is not None and expired(snapshot, wall_clock(), expiry):
        stored, stale = None, True
    generation += 1
    if persistent:
        record = stored or SessionRecord()
        record.generation = generation
        return TakenUp(stored, record, None, stale)
    if stored is not None or live is not None or stale:
        discard = SessionRecord(generation=generation).message(client_id)
        return TakenUp(stored, None, discard, stale)
    return TakenUp(None, None, None)
