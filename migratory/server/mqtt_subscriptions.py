"""An MQTT session's subscriptions: topic filters registered with the hub, the
retained messages a new subscription gets, the position reached on each subject
(so nothing is delivered twice when two filters match, and a persistent session
resumes from it), and the resume itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from migratory import client_lines
from migratory.entitlement_decisions import ClientIdentity
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.topic import (
    FilterIndex,
    InvalidTopicError,
    filter_levels,
    filter_matches,
    is_wildcard,
)
from migratory.protocol import mqtt
from migratory.server.admission import total_subscriptions_limit
from migratory.server.format_sink import MessageSink
from migratory.server.hub_sinks import SubjectScan
from migratory.server.mqtt_resume import NOTHING_SEEN, Resume
from migratory.server.mqtt_store import SessionRecord

if TYPE_CHECKING:
    from migratory.server.context import ServerContext
    from migratory.server.mqtt_session import MqttSession

log = logging.getLogger("migratory.mqtt")



MAX_SCAN = 20_000
"""Levels and subjects a save looks at at most to find the subjects wildcard filters
match (:meth:`Hub.matching_any`) for their implied positions: what one save may cost."""
SCAN_SLICE = 2000
"""Visits per slice of a scan: a SUBSCRIBE's retained messages are sent one slice per
turn of the loop (:meth:`Subscriptions.send_retained`), and a resume's catch-up (its
units: subjects, messages, visits), the other clients' turn between."""
MAX_FILTERS = 1000
"""Topic filters one session holds at most; a SUBSCRIBE beyond gets 0x80 for them."""
MAX_WILDCARD_FILTERS = 100
"""Of which with ``+`` or ``#`` (each one is in the walk of every published message's
levels, and of the subject index for a SUBSCRIBE's retained messages)."""


def _catch_up_from(record: SessionRecord) -> dict[str, Position]:
    """Where a resume catches up each subject it must: the record's positions, and the
    subject of every exact filter the record names no position of -- one that could not
    be read, or that was forgotten -- from the start of its cache (NOTHING_SEEN: at least
    once, or its snapshot). Left out, such a subject was never caught up: its next live
    message came with nothing before it, a gap the client could not see (seed 1176,
    docs/chaos.md), where the wildcard filters' subjects the record does not name are
    found by the resume's scan."""
    positions = dict(record.positions)
    for name in record.filters:
        if not is_wildcard(name):
            positions.setdefault("/" + name, NOTHING_SEEN)  # (a dormant or invalid
            # filter's: no QoS when caught up, skipped there)
    return positions


@dataclass(frozen=True, slots=True)
class _Filter:
    qos: int
    levels: tuple[str, ...]
    subject: str | None  # the subject of a filter without wildcards


class Subscriptions:
    def __init__(self, owner: MqttSession, ctx: ServerContext) -> None:
        """At most MaxSubscriptionsPerConnection filters, never more than MAX_FILTERS; the
        filters registered with the hub count in MaxSubscriptions (``subscriptions_open``)."""
        self._owner = owner
        self._ctx = ctx
        hub, max_filters = ctx.hub, ctx.config.max_subscriptions_per_connection
        self._resume: Resume | None = None  # a resume's catch-up, while it goes on
        self._dropped = False  # a filter the resume left dormant (not entitled now)
        self._listener: MessageSink = owner  # the hub's sink: the resume's meanwhile
        self._hub = hub
        self._max_filters = min(max_filters, MAX_FILTERS)
        self._filters: dict[str, _Filter] = {}
        # the wildcard ones of _filters, as a tree: which match a subject, in O(levels)
        self._wildcards: FilterIndex[str] = FilterIndex()
        # subject -> the last message delivered (or the Position of where it stands):
        # only its epoch and seq are read -- storing the message saves a Position per
        # delivery on the fan-out path. Read it through owner.settle_reached(): the
        # owner keeps its last delivery's subject apart, and at most
        # MqttSessionMaxSubjects of them, the oldest dropped first (bound_positions)
        self.reached: dict[str, Position | Message] = {}
        self._attached = True
        # wildcard filters just added whose retained messages are still to be sent
        # (send_retained: one pass over the subjects for all of a SUBSCRIBE's filters)
        self._retain_due: FilterIndex[str] | None = None
        self._retaining: SubjectScan | None = None  # their scan (send_retained)
        # the subjects delivered live since that scan began (send_retained)
        self._live_meanwhile: set[str] | None = None
        self._filters_changed = True  # since the last implied_positions
        # filters of a resumed record the entitlement refused (another token, a plugin
        # failing): kept in the record, given nothing, asked again at the next resume --
        # a plugin's outage at a reconnect must not wipe a device's subscriptions
        self._dormant: dict[str, int] = {}

    def filters(self) -> dict[str, int]:
        """Every filter of the session, the dormant ones (:meth:`resume`) too."""
        return {**self._dormant, **{name: f.qos for name, f in self._filters.items()}}

    def take(self, message: Message) -> bool:
        """Whether ``message`` is new to this session (then it counts as delivered)."""
        subject = message.subject
        positions = self._owner.settle_reached()
        reached = positions.get(subject)
        if reached is not None and reached.epoch == message.epoch and message.seq <= reached.seq:
            return False
        positions[subject] = message
        return True

    # --- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------

    def add(self, name: str, qos: int, identity: ClientIdentity, now: float) -> int:
        """Subscribe to one filter; the SUBACK return code."""
        granted = min(qos, 1)
        try:
            levels = filter_levels(name)
        except InvalidTopicError as exc:
            client_lines.lines.log(log, logging.INFO, "mqtt subscribe refused",
                                   "%s: SUBSCRIBE refused: %s", self._owner.describe(), exc,
                                   extra=self._owner.log_fields())
            return mqtt.SUBACK_FAILURE
        subject = None if is_wildcard(name) else "/" + name
        refusal = None if name in self._filters else self._limit(wildcard=subject is None)
        if refusal is not None:
            client_lines.lines.log(log, logging.INFO, "mqtt subscribe refused",
                                   "%s: SUBSCRIBE of %r refused: %s", self._owner.describe(),
                                   name, refusal, extra=self._owner.log_fields())
            return mqtt.SUBACK_FAILURE
        if not self._owner.entitlement_allows_subscribe("/" + name):
            client_lines.lines.log(log, logging.INFO, "mqtt subscribe denied",
                                   "%s: not entitled to subscribe to %r",
                                   self._owner.describe(), name, extra=self._owner.log_fields())
            return mqtt.SUBACK_FAILURE
        self._drop(name, again=True)
        entry = _Filter(granted, levels, subject)
        self._put(name, entry)
        self._register(entry)
        if subject is not None:
            position = self._hub.position(subject)
            if position is None or position.seq == 0:
                position = NOTHING_SEEN
            self._owner.note_position(subject, position)
            snapshot = self._hub.snapshot(subject)
            if snapshot is not None:
                self._owner.deliver_retained(snapshot, granted)
        else:
            if self._retain_due is None:
                self._retain_due = FilterIndex()
            self._retain_due.add(levels, name, granted)
        return granted

    def _limit(self, *, wildcard: bool) -> str | None:
        """Why one more filter is refused (a limit, counted by name), or None."""
        stats = self._ctx.stats
        if len(self._filters) >= self._max_filters:
            stats.count(stats.subscriptions_refused, "MaxSubscriptionsPerConnection")
            return (f"MaxSubscriptionsPerConnection ({self._max_filters}; an MQTT session "
                    f"holds at most {MAX_FILTERS} filters) reached")
        if wildcard and self._wildcards.count >= MAX_WILDCARD_FILTERS:
            stats.count(stats.subscriptions_refused, "MAX_WILDCARD_FILTERS")
            return f"at most {MAX_WILDCARD_FILTERS} filters with wildcards (MAX_WILDCARD_FILTERS)"
        return total_subscriptions_limit(self._ctx, 1)

    def start_retained(self) -> None:
        """Start sending the retained messages of the wildcard filters just added
        (:meth:`add`): one scan for all of them, each subject once, at the highest QoS
        granted, in slices (:meth:`send_retained`) while :attr:`retaining`."""
        due, self._retain_due = self._retain_due, None
        if due is not None:
            self._retaining = self._hub.matching_any(due, retained=True)
            self._live_meanwhile = self._owner.watch_live(True)

    @property
    def retaining(self) -> bool:
        """A SUBSCRIBE's retained messages are still being sent (its SUBACK waits)."""
        return self._retaining is not None

    def send_retained(self, limit: int) -> int:
        """Send the next retained messages of the scan :meth:`start_retained` began,
        within ``limit`` visits; returns the visits. A subject that had a live message
        meanwhile (between two slices) gets no older retained message after it."""
        scan = self._retaining
        if scan is None:
            return 0
        owner = self._owner
        live = self._live_meanwhile
        visited = scan.visited
        for subject, _, snapshot, qos in scan.take(limit):
            if snapshot is None or owner.closing:
                continue
            if live and subject in live:
                continue  # delivered live since the scan began: newer than this
            owner.deliver_retained(snapshot, qos)
        if scan.done or owner.closing or owner.aborted:
            self._retaining = None
            self._live_meanwhile = owner.watch_live(False)
        return scan.visited - visited

    def remove(self, names: tuple[str, ...]) -> None:
        for name in names:
            self._drop(name)

    def _drop(self, name: str, *, again: bool = False) -> None:
        """Drop the filter ``name`` (``again``: subscribed again at once: a persistent
        session's hold keeps its age, SessionHolds)."""
        self._dormant.pop(name, None)
        entry = self._filters.pop(name, None)
        self._filters_changed = True
        if entry is not None and entry.subject is None:
            self._wildcards.remove(entry.levels, name)
        if entry is not None and self._attached:
            self._unregister(entry)
        if entry is not None and self._owner.persistent and not again:  # (SessionHolds)
            self._hub.release_session_filters(self._owner.client_id, entry.levels)

    def _put(self, name: str, entry: _Filter) -> None:
        self._filters[name] = entry
        self._filters_changed = True
        if entry.subject is None:
            self._wildcards.add(entry.levels, name, entry.qos)

    def _register(self, entry: _Filter) -> None:
        self._ctx.stats.subscriptions_open += 1  # (MaxSubscriptions)
        owner = self._listener
        if entry.subject is not None:
            self._hub.listen(owner, entry.subject, entry.qos)
        else:
            self._hub.listen_filter(owner, entry.levels, entry.qos)
        if self._owner.persistent:  # held while its client is away too (a Standard member)
            self._hub.hold_session_filter(self._owner.client_id, entry.levels)

    def _unregister(self, entry: _Filter) -> None:
        self._ctx.stats.subscriptions_open -= 1
        if entry.subject is not None:
            self._hub.unlisten(self._listener, entry.subject)
        else:
            self._hub.unlisten_filter(self._listener, entry.levels)

    def detach(self) -> None:
        """Stop every delivery (the connection is gone); the filters are kept."""
        if self._attached:
            self._attached = False
            for entry in self._filters.values():
                self._unregister(entry)

    # --- resuming a persistent session ---------------------------------------------

    def resume(self, record: SessionRecord, now: float) -> None:
        """Subscribe again to the record's filters and deliver, per subject, what came
        after its recorded position (or its snapshot when the cache cannot tell), in
        slices while :attr:`busy` (:mod:`migratory.server.mqtt_resume`). A subject a
        wildcard filter matches that the record does not name appeared after the record
        was saved: all of it the cache holds is missed. A filter the entitlement does not
        allow now (the client came back with another token, a plugin failed) is dormant,
        logged and counted: it gets nothing, not even what it missed, stays in the record
        and is asked again at the next resume (a SUBSCRIBE or UNSUBSCRIBE of it decides
        at once)."""
        self._resume = Resume(self, self._owner, self._hub, _catch_up_from(record))
        self._listener = self._resume  # the hub's sink until the catch-up is done
        self._dropped = False
        named: set[tuple[str, ...]] = set()  # (dormant ones too: SessionHolds keeps them)
        for name, qos in record.filters.items():
            try:
                levels = filter_levels(name)
            except InvalidTopicError:
                continue
            named.add(levels)
            if not self._owner.entitlement_allows_subscribe("/" + name):
                client_lines.lines.log(
                    log, logging.INFO, "mqtt dormant", "%s: resumed session: not entitled "
                    "to %r: the filter is dormant", self._owner.describe(), name,
                    extra=self._owner.log_fields())
                self._dormant[name] = qos
                self._dropped = True
                continue
            entry = _Filter(qos, levels, None if is_wildcard(name) else "/" + name)
            self._put(name, entry)
            self._register(entry)
        self._hub.keep_session_filters(self._owner.client_id, named)  # (UNSUBSCRIBEd
        # on another member, whose newer record this is: held here no more)

    @property
    def resuming(self) -> bool:
        """A resume's catch-up goes on: the session's positions say which subjects it
        caught up (none is dropped meanwhile)."""
        return self._resume is not None

    @property
    def busy(self) -> bool:
        """A SUBSCRIBE's retained messages or a resume's catch-up still to send: the
        connection's next packets wait (:meth:`work`)."""
        return self._retaining is not None or self._resume is not None

    def work(self, limit: int) -> int:
        """The next slice of what :attr:`busy` says, about ``limit`` units of work; the
        units done. A resume done, the session takes its subscriptions back."""
        if self._retaining is not None:
            return self.send_retained(limit)
        resume = self._resume
        if resume is None:
            return 0
        done = resume.work(limit)
        if resume.done:
            self._resume = None
            client_lines.lines.log(log, logging.INFO, "mqtt resumed", "%s: session resumed: %s",
                                   self._owner.describe(), resume.summary(),
                                   extra=self._owner.log_fields())
            # caught up with the record's filters: every subject they match has a
            # position now, none to imply (a pass over all of them at the next save)
            self._filters_changed = self._dropped
            if self._attached:
                for entry in self._filters.values():  # the session's, then not the resume's
                    self._listener = self._owner
                    self._register(entry)
                    self._listener = resume
                    self._unregister(entry)
            self._listener = self._owner
            self._owner.bound_positions()  # what the catch-up held past the bound
        return done

    @property
    def wildcards(self) -> FilterIndex[str]:
        return self._wildcards

    def implied_positions(self, record: SessionRecord) -> int:
        """Before a save: the subjects wildcard filters match that this session was
        never sent a message of are at their current position (while the record names
        fewer than MqttSessionMaxSubjects, the first it forgets); the subjects no filter
        matches any more are forgotten. Scans only when the filters
        changed: a subject recorded once keeps a valid position until a message of it
        reaches this session, and a subject created while the session is attached gets
        its messages delivered (their positions recorded) or has none to miss -- a
        resume replays a subject the record does not name from the start of its cache.
        (Rescanning whenever the hub had a new subject cost a pass over every subject at
        each save: 73 ms per one-off publish to a persistent '+/+' session at 20,000.)
        Returns the positions and subjects looked at (mqtt_input.SCAN_UNIT)."""
        if not self._filters_changed or self._resume is not None:
            return 0  # (a resume not caught up yet: its subjects would count as seen)
        looked = len(record.positions)
        dormant = self._dormant_levels()
        for subject in [s for s in record.positions if self.qos_for(s) is None]:
            if not any(filter_matches(levels, subject) for levels in dormant):
                record.forget(subject)
        self._filters_changed = False
        reached = self._owner.settle_reached()
        if not self._wildcards.count:
            return looked
        scan = self._hub.matching_any(self._wildcards)
        most = record.max_subjects
        while not scan.done and len(record.positions) < most and scan.visited < MAX_SCAN:
            for subject, position, _, _ in scan.take(SCAN_SLICE):
                if len(record.positions) >= most:
                    break
                if subject not in record.positions and subject not in reached:
                    record.imply_position(subject, position if position.seq else NOTHING_SEEN)
        return looked + scan.visited

    def _dormant_levels(self) -> list[tuple[str, ...]]:
        """The dormant filters' levels: their subjects keep their positions (forgotten,
        a later resume with the right replayed nothing of an exact filter's subject --
        all it missed lost --, or the whole cache of a wildcard's)."""
        levels = []
        for name in self._dormant:
            try:
                levels.append(filter_levels(name))
            except InvalidTopicError:
                continue
        return levels

    def qos_for(self, subject: str) -> int | None:
        """The highest QoS of the filters matching ``subject`` (None: none), in O(levels):
        looking at every filter cost 1.3 s to resume a session of 1,000 filters and
        10,000 positions, and 0.6 s at each change of its filters."""
        exact = self._filters.get(subject[1:])
        best = exact.qos if exact is not None and exact.subject is not None else None
        for _, qos in self._wildcards.match(subject):
            if best is None or qos > best:
                best = qos
        return best
