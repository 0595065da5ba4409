"""Where a persistent MQTT session (clean session = 0) lives: a retained message.

The session's subscriptions and, per subject, the position of the last message the
client has (acknowledged, for QoS 1) are the snapshot of the subject
``/$mqtt-session/<client id as hex>``, made of retained messages (saved in parts,
below). Each is published like any message --
in a Guaranteed cluster acknowledged once a majority of seeds holds it -- so its
snapshot is on every member, and a client that reconnects anywhere after a failover
resumes each subject from its position. Clients cannot subscribe or publish to
``/$...`` subjects (MQTT refuses topics starting with ``$``; the native protocol
refuses :data:`migratory.model.snapshot.RESERVED_PREFIX`).

A record carries, as the field :data:`SAVED_AT`, the wall-clock second it was saved
(an empty record: ""). A session not saved for ``MqttSessionExpiry`` seconds is
expired (see :mod:`migratory.server.mqtt_expiry`): a connected one is saved at least
every half of that, and its connection's end saves it, so only a session whose client
has been away that long is.

**Saved in parts.** The record's content is its *head*: generation, lineage and filters
(at most 1,000). Each position is a field of the record, named by its subject, whose
value is ``<lineage>:<epoch>:<seq>``; a save carries the head and only the positions
that changed since the last save (:attr:`SessionRecord.dirty`), and the snapshot --
which merges a retained message's fields into the earlier ones, on every member --
holds them all. A position that is gone is saved as an empty field, which removes it
from the snapshot (on ``/$`` subjects: :data:`migratory.model.snapshot.RESERVED_PREFIX`).
Saving the whole record at each save cost its size every second: 50 sessions of
10,000 positions, 1.2-1.3 s of CPU per second; now 12 ms
(``benchmarks/mqtt_session_save.py``).

The *lineage* is the generation that started the session: positions of another lineage
(a late save of a session since discarded, or replaced by an older record) are not
read. A discard empties every position field the snapshot holds. A record saved whole
by an earlier version (positions in the content) is read, and its first save here
writes all its positions as fields. A position field that cannot be read (a damaged
record) is refused with a warning: its subject is replayed from the start of its cache
at the resume (at least once, never a gap); a head that cannot be read refuses the
record (logged): the client starts a fresh session.

**Bounded** (``MqttSessionMaxSubjects``, :attr:`SessionRecord.max_subjects`): a record
names at most that many subjects. The positions are kept in the order of their last
delivery; one more forgets the subject delivered least recently (an implied position --
a subject never delivered -- first), never one a filter names exactly (a resume would
replay its whole cache). A forgotten subject is, at a
resume, a subject the record does not name: replayed from the start of its cache. Unbounded,
a persistent '#' session gained a position per subject it was ever delivered: a record of
30,000 fields (853 kB) for 30,000 subjects, on every member.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from migratory.config_mqtt import SESSION_MAX_SUBJECTS
from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.model.snapshot import GENERATION_FIELD, WRITER_FIELD, generation_key

log = logging.getLogger("migratory.mqtt")

SESSION_PREFIX = "/$mqtt-session/"
SESSION_CLOSURE = "$session"  # the closure of a session record's publish
SAVED_AT = "saved_at"  # the field of the wall-clock second a record was saved ("": empty)
GENERATION = GENERATION_FIELD  # the record's generation (read without decoding; a save of
# a lower generation than the stored record's does not change it: model/snapshot.py)
WRITER = WRITER_FIELD  # who wrote the record of its generation: ties of generations
# go to the higher (model/snapshot.py), and a discard's ranks above a connection's saves
SAVE_WRITER, DISCARD_WRITER = "0:", "1:"  # (a writer: the rank, then a random token)
EXPIRY_WRITER = "0"  # the expiry sweep's discard: below every connection's save (one that
# took the expired session up at the same generation knows better); the same on each member
POSITION_FIELD = "/"  # how position fields start: they are named by their subject
wall_clock = time.time  # the clock of SAVED_AT (tests replace it)


def session_subject(client_id: str) -> str:
    return SESSION_PREFIX + client_id.encode("utf-8").hex()


def new_writer(rank: str) -> str:
    """A writer of a generation (:data:`WRITER`): ``rank`` (:data:`SAVE_WRITER`,
    :data:`DISCARD_WRITER`) and a token no other connection has. Two CONNECTs of one
    client that read the same record at once -- the read barrier makes that rare, not
    impossible -- write one generation; a discard wins the tie: the persistent CONNECT
    then took up a session the clean one discarded after it (the order that CONNACK
    "session present" and an empty session later both fit)."""
    return rank + os.urandom(8).hex()


@dataclass(slots=True)
class SessionRecord:
    """A persistent session: topic filter -> granted QoS, subject -> position.

    ``generation`` counts the connections that took the session up: a connection saves
    only while the stored record is not of a later generation (a connection that was
    taken over on another member must not overwrite its successor's record).

    ``lineage``: the generation that started the session (0: not yet known, a record
    being made or read from an earlier version's whole record); ``dirty``: the subjects
    whose position changed (or went) since the last save, all of them by default;
    ``saving``: those of the save in flight. Change positions through
    :meth:`set_position` and :meth:`forget` so that the next save carries them.

    ``positions`` are in the order of their last change, the least recent first;
    ``max_subjects`` (MqttSessionMaxSubjects) bounds them (:meth:`bound`); ``forgotten``
    counts the positions it dropped, until :meth:`take_forgotten`; ``over_bound``: the
    connection that keeps the record has counted some (and logged it, once)."""

    filters: dict[str, int] = field(default_factory=dict)
    positions: OrderedDict[str, Position] = field(default_factory=OrderedDict)
    generation: int = 0
    lineage: int = field(default=0, compare=False)
    dirty: set[str] = field(default=None, compare=False)  # type: ignore[arg-type]
    saving: set[str] = field(default_factory=set, compare=False)
    max_subjects: int = field(default=SESSION_MAX_SUBJECTS, compare=False)
    forgotten: int = field(default=0, compare=False)
    over_bound: bool = field(default=False, compare=False)
    writer: str = field(default="", compare=False)  # (WRITER; "": none, a test's record)

    def __post_init__(self) -> None:
        if type(self.positions) is not OrderedDict:  # (given as a dict)
            self.positions = OrderedDict(self.positions)
        if self.dirty is None:  # (not given: every position is to be saved)
            self.dirty = set(self.positions)

    def set_position(self, subject: str, position: Position) -> None:
        """``subject`` was delivered up to ``position``: the most recent; past
        ``max_subjects``, the least recent is forgotten."""
        positions = self.positions
        positions[subject] = position
        positions.move_to_end(subject)
        self.dirty.add(subject)
        if len(positions) > self.max_subjects:
            self.bound()

    def imply_position(self, subject: str, position: Position) -> None:
        """``subject``, never delivered to the session, stands at ``position``: the
        first to be forgotten (:meth:`bound`)."""
        positions = self.positions
        positions[subject] = position
        positions.move_to_end(subject, last=False)
        self.dirty.add(subject)

    def bound(self) -> int:
        """Forget the least recent positions past ``max_subjects`` -- not those of the
        subjects a filter names exactly, moved to the back instead: a resume would replay
        such a subject's whole cache --; returns how many."""
        positions, filters, dirty = self.positions, self.filters, self.dirty
        over = len(positions) - self.max_subjects
        forgotten = kept = 0
        while over > forgotten and kept < len(positions):
            subject, position = positions.popitem(last=False)
            if subject[1:] in filters:
                positions[subject] = position
                kept += 1
                continue
            dirty.add(subject)
            forgotten += 1
        self.forgotten += forgotten
        return forgotten

    def take_forgotten(self) -> int:
        """The positions :meth:`bound` forgot since the last call."""
        forgotten, self.forgotten = self.forgotten, 0
        return forgotten

    def forget(self, subject: str) -> None:
        if self.positions.pop(subject, None) is not None:
            self.dirty.add(subject)

    def unsaved(self) -> set[str]:
        """The subjects whose positions the stored record may not hold yet."""
        return self.dirty | self.saving

    def head(self) -> bytes:
        """The content: generation, lineage, filters (and no positions: an earlier
        version reading it replays every subject from its cache, at least once)."""
        return json.dumps(
            {"generation": self.generation, "lineage": self.lineage,
             "filters": self.filters, "positions": {}},
            separators=(",", ":"),
        ).encode()

    def message(self, client_id: str) -> Message:
        """The next save: the head and the positions changed since the last one, which
        become :attr:`saving` until :meth:`saved` (a failed save gives them back)."""
        # an empty record says "" explicitly (which removes the field from the snapshot:
        # a snapshot keeps the fields it is not given)
        saved_at = str(int(wall_clock())) if self.filters else ""
        fields = {SAVED_AT: saved_at, GENERATION: str(self.generation)}
        if self.writer:
            fields[WRITER] = self.writer
        lineage, positions = self.lineage, self.positions
        dirty, self.dirty = self.dirty, set()
        for subject in dirty:
            position = positions.get(subject)
            fields[subject] = (
                "" if position is None else f"{lineage}:{position.epoch}:{position.seq}"
            )
        self.saving |= dirty
        return _record_message(client_id, self.head(), fields)

    def saved(self, *, ok: bool) -> None:
        """The save in flight is stored (``ok``) or failed: its positions are dirty again."""
        if not ok:
            self.dirty |= self.saving
        self.saving = set()


def _record_message(client_id: str, content: bytes, fields: dict[str, str]) -> Message:
    return Message(
        session_subject(client_id),
        content,
        fields,
        retained=True,
        qos=Qos.GUARANTEED,
        closure=SESSION_CLOSURE,
    )


def _position_fields(snapshot: Message | None) -> set[str]:
    """The names of the position fields ``snapshot`` holds (of any lineage)."""
    if snapshot is None:
        return set()
    return {name for name in snapshot.fields if name.startswith(POSITION_FIELD)}


def discard_message(
    client_id: str, generation: int, snapshot: Message | None, also: Iterable[str] = (),
    writer: str | None = None,
) -> Message:
    """The empty record of ``generation``, which discards the stored session: every
    position field of ``snapshot`` is emptied, and those of ``also`` (the subjects of
    saves still on their way). ``writer``: a clean CONNECT's by default."""
    fields = {SAVED_AT: "", GENERATION: str(generation),
              WRITER: writer or new_writer(DISCARD_WRITER)}
    for subject in _position_fields(snapshot).union(also):
        fields[subject] = ""
    return _record_message(client_id, SessionRecord(generation=generation).head(), fields)


def generation_floor() -> int:
    """The least generation a take-up on a Standard cluster's member writes: the
    wall-clock millisecond. Generations counted take-ups (the stored one's + 1), which
    orders the take-ups of members that read the same stored record -- a Guaranteed
    cluster's CONNECT reads what was committed before it (its read barrier). A Standard
    member reads what forwards brought it so far: a client whose newer record was on its
    way from member A (two more take-ups there) that connected on member B, which had
    the older record, took it up at a lower generation than A's; A's record then
    outranked B's on every member, B's connection was closed as taken over and the
    filter it had SUBACKed was gone
    (``tests/cluster/test_cluster_standard_session_moves.py``). With the clock the later
    take-up stands, give or take the members' clock skew; the stored one's + 1 still
    bounds it from below (a clock behind, a record of a member ahead)."""
    return int(wall_clock() * 1000)


def stored_generation(snapshot: Message | None) -> int:
    """The generation of the record a session subject's snapshot holds (0: none)."""
    if snapshot is None:
        return 0
    generation = snapshot.fields.get(GENERATION)
    if generation is not None:
        try:
            return int(generation)
        except ValueError:
            return 0
    if not snapshot.content:
        return 0
    try:  # a record of an earlier version: the generation only in the content
        return int(json.loads(snapshot.content).get("generation", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def superseded(snapshot: Message | None, record: SessionRecord) -> bool:
    """``snapshot`` holds a later writer's record than ``record`` (a later generation,
    or the same one written by a writer ranked above: :data:`WRITER`)."""
    if snapshot is None:
        return False
    key = generation_key(snapshot.fields)
    if key is None:  # (an earlier version's record)
        return stored_generation(snapshot) > record.generation
    return key > (record.generation, record.writer)


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


def is_empty_record(snapshot: Message | None) -> bool:
    """The snapshot is an empty record -- a session discarded, or left with no filter --:
    no SAVED_AT (its "" removed the field) and a head that names no filter. Not logged
    when the head cannot be read (then False: a record kept, as before)."""
    if snapshot is None or snapshot.fields.get(SAVED_AT):
        return False
    try:
        return json.loads(snapshot.content)["filters"] == {}  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError):
        return False


def expired(snapshot: Message | None, now: float, expiry: int) -> bool:
    """The record was saved more than ``expiry`` seconds before ``now`` (0: never)."""
    saved = saved_at(snapshot)
    return expiry > 0 and saved is not None and now - saved > expiry


def decode_record(snapshot: Message | None) -> SessionRecord | None:
    """The record a session subject's snapshot holds; None if none (or it is empty, or
    its head cannot be read: logged; a session that was cleaned is stored as an empty
    record). Position fields that cannot be read are left out, logged."""
    if snapshot is None or not snapshot.content:
        return None
    try:
        body = json.loads(snapshot.content)
        filters = {str(f): int(q) for f, q in body["filters"].items()}
        positions = OrderedDict(
            (str(s), Position(int(p[0]), int(p[1]))) for s, p in body["positions"].items()
        )
        lineage = body.get("lineage")  # None: saved whole, by an earlier version
        lineage = None if lineage is None else int(lineage)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        log.warning("session record %s cannot be read (%s: %s): refused, the client "
                    "starts a fresh session", snapshot.subject, type(exc).__name__, exc)
        return None
    if not filters:
        return None
    if lineage is not None:
        damaged = _read_positions(snapshot.fields, lineage, positions)
        if damaged:
            name, count = damaged[0], len(damaged)
            log.warning("session record %s: %d saved position(s) cannot be read (%r = %r "
                        "...): refused, their subjects are replayed from the start of "
                        "their cache", snapshot.subject, count, name,
                        snapshot.fields[name])
    return SessionRecord(filters, positions, stored_generation(snapshot), lineage or 0, set())


def _read_positions(
    fields: Mapping[str, str], lineage: int, positions: dict[str, Position]
) -> list[str]:
    """Add the position fields of ``lineage`` to ``positions``; the names of the fields
    that cannot be read."""
    damaged = []
    for name, value in fields.items():
        if not name.startswith(POSITION_FIELD):
            continue
        parts = value.split(":")
        try:
            of, epoch, seq = int(parts[0]), int(parts[1]), int(parts[2])
        except (ValueError, IndexError):
            damaged.append(name)
            continue
        if len(parts) != 3 or epoch < 0 or seq < 0:
            damaged.append(name)
        elif of == lineage:
            positions[name] = Position(epoch, seq)
    return damaged


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
    max_subjects: int = SESSION_MAX_SUBJECTS,
    standard: bool = False,
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
    starts afresh (session present 0) and saves over it.

    ``max_subjects`` (MqttSessionMaxSubjects) bounds the record kept: a stored one over it
    (a lower setting, an earlier version) is resumed whole and bounded at its first save.

    ``standard``: a member of a Standard cluster, where a record saved on another member
    reaches this one when its forward does, if ever (no read barrier orders it before the
    CONNECT): the generation is at least the wall-clock millisecond
    (:func:`generation_floor`), so that of two take-ups of a session on two members the
    later one stands, whichever record each member had when its CONNECT came."""
    stored, generation = decode_record(snapshot), stored_generation(snapshot)
    stale = False
    if live is not None and live.generation >= generation:
        stored = SessionRecord(
            dict(live.filters), OrderedDict(live.positions), 0, live.lineage, live.unsaved()
        ) if live.filters else None
        generation = live.generation
    elif stored is not None and expired(snapshot, wall_clock(), expiry):
        stored, stale = None, True
    generation = max(generation + 1, generation_floor() if standard else 0)
    if persistent:
        record = stored or SessionRecord()
        record.generation = generation
        record.writer = new_writer(SAVE_WRITER)
        record.max_subjects = max_subjects
        if not record.lineage:  # a new session, or one saved whole by an earlier version
            record.lineage = generation  # its first save writes every position, and
            record.dirty = set(record.positions) | _position_fields(snapshot)  # empties
        return TakenUp(stored, record, None, stale)
    if stored is not None or live is not None or stale:
        unsaved = live.unsaved() | set(live.positions) if live is not None else ()
        discard = discard_message(client_id, generation, snapshot, unsaved)
        return TakenUp(stored, None, discard, stale)
    return TakenUp(None, None, None)
