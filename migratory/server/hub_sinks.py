"""The hub's message sinks: subscribers that encode whole messages themselves (MQTT
sessions), on exact subjects and on wildcard topic filters. A mixin of
:class:`~migratory.server.hub.Hub`, kept apart so that each file reads alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.snapshot import RESERVED_PREFIX
from migratory.model.subject import is_valid_subject
from migratory.model.subject_index import SubjectIndex
from migratory.model.topic import FilterIndex
from migratory.server.format_sink import MessageSink
from migratory.server.subject_state import SubjectState


class MessageSinks:
    """Hub methods for :class:`MessageSink` subscribers."""

    _subjects: dict[str, SubjectState]
    _filters: FilterIndex[MessageSink]
    _filter_ages: FilterAges
    _session_holds: SessionHolds | None  # Hub(hold_sessions=True): a Standard member's
    holdings_made: int  # Hub.holdings_made
    _index: SubjectIndex[SubjectState]
    subjects_visited: int  # by SubjectScan, every one so far (tests count the work)
    _fanned_out: int
    _unnamable: int  # messages no filter was asked about: no MQTT topic (statistics)
    _sinks: int  # subscriptions to exact subjects, every kind (Hub.statistics)

    def _state(self, subject: str) -> SubjectState:
        raise NotImplementedError

    def _forget(self, state: SubjectState) -> None:
        raise NotImplementedError

    def _missed(self, state: SubjectState, position: Position) -> list[Message] | None:
        raise NotImplementedError

    def _tell_listeners(self, state: SubjectState, message: Message) -> None:
        """Each message sink once, at the highest QoS of its matching subscriptions."""
        granted = self._granted(state)
        for sink, qos in granted:
            sink.deliver_message(message, qos)
        self._fanned_out += len(granted)

    def _granted(self, state: SubjectState) -> tuple[tuple[MessageSink, int], ...]:
        """The message sinks of ``state``'s subject -- by name, or by a wildcard filter
        that matches it -- each once, at the highest QoS of its subscriptions.

        No filter matches an invalid subject: one can only be here as a committed
        message of an older member's Raft log, applied as committed (docs/cluster.md),
        and a subject of 70,000 bytes or with a NUL is no MQTT topic (the delivery raised
        in the hub; a NUL made the device drop its connection). Peers' and clients'
        publishes of one are refused (publish_rules.message_refusal). Nor a subject
        holding ``+`` or ``#`` (valid): a PUBLISH may not carry one as its topic name
        ([MQTT-3.3.2-2]; strict clients close the connection) -- counted,
        ``mqtt_unnamable_messages``. Before, ``#`` and ``a/+`` sent ``/a/x+y`` as is."""
        listeners = state.listeners
        subject = state.subject
        if (not self._filters or subject.startswith(RESERVED_PREFIX)
                or not is_valid_subject(subject)):
            return tuple(listeners.items())
        if "+" in subject or "#" in subject:  # no MQTT topic name (topic.names_a_topic)
            self._unnamable += 1
            return tuple(listeners.items())
        best = dict(listeners)
        for sink, qos in self._filters.match(subject):
            if best.get(sink, -1) < qos:
                best[sink] = qos
        return tuple(best.items())

    def listen(self, sink: MessageSink, subject: str, qos: int) -> None:
        """Deliver every later message of ``subject`` to ``sink`` (validated, entitled)."""
        state = self._state(subject)
        sinks = len(state.listeners)
        state.listeners[sink] = qos
        self._sinks += len(state.listeners) - sinks

    def unlisten(self, sink: MessageSink, subject: str) -> None:
        state = self._subjects.get(subject)
        if state is not None:
            if state.listeners.pop(sink, None) is not None:
                self._sinks -= 1
            if state.idle:
                self._forget(state)

    def listen_filter(self, sink: MessageSink, levels: tuple[str, ...], qos: int) -> None:
        """Deliver every later message of every subject ``levels`` matches to ``sink``."""
        count = self._filters.count
        self._filters.add(levels, sink, qos)
        if self._filters.count > count and self._filter_ages.held(levels, self.holdings_made + 1):
            self.holdings_made += 1

    def unlisten_filter(self, sink: MessageSink, levels: tuple[str, ...]) -> None:
        count = self._filters.count
        self._filters.remove(levels, sink)
        if self._filters.count < count:
            self._filter_ages.released(levels)

    def hold_session_filter(self, client_id: str, levels: tuple[str, ...]) -> None:
        """A persistent MQTT session of ``client_id`` holds ``levels`` (exact or wildcard)
        here, connected or away (:class:`SessionHolds`; nothing unless held), since now:
        the moment its live subscription was just registered at (or, held before by
        another, not later than a meeting since -- at a tie ``made`` says a gap)."""
        holds = self._session_holds
        if holds is not None:
            holds.hold(client_id, levels, self.holdings_made)

    def release_session_filters(self, client_id: str,
                                levels: tuple[str, ...] | None = None) -> None:
        """``client_id``'s session holds ``levels`` no more (None: none: discarded)."""
        if self._session_holds is not None:
            self._session_holds.release(client_id, levels)

    def keep_session_filters(self, client_id: str, levels: set[tuple[str, ...]]) -> None:
        """``client_id``'s session holds these filters and no others (a resume from a record
        another member saved later, which dropped some)."""
        holds = self._session_holds
        if holds is not None:
            for each in holds.held(client_id) - levels:
                holds.release(client_id, each)

    def _filters_held_since(self, subject: str) -> list[int]:
        """The moments (``Hub.holdings_made``) since which a wildcard filter matching
        ``subject`` has been held here without a break, the oldest, and a persistent
        session's filter (:class:`SessionHolds`) the same (empty: none matches)."""
        holds = self._session_holds
        if ((not self._filters and not holds) or subject.startswith(RESERVED_PREFIX)
                or not is_valid_subject(subject)):
            return []  # (as _granted: no filter is told of such a subject)
        ages = [self._filter_ages.oldest(subject)]
        if holds:
            ages.append(holds.oldest(subject))
        return [age for age in ages if age is not None]

    def subject_names(self) -> list[str]:
        """Every subject's name, a copy (one C-level pass: a sweep over them in slices)."""
        return list(self._subjects)

    def missed(self, subject: str, position: Position) -> list[Message] | None:
        """The cached messages of ``subject`` after ``position`` (oldest first), or None
        when the cache cannot tell them (another epoch, or it no longer reaches back)."""
        state = self._subjects.get(subject)
        if state is None:
            return [] if position.seq == 0 else None
        return self._missed(state, position)

    def matching_any(self, filters: FilterIndex[Any], *, retained: bool = False) -> SubjectScan:
        """The subjects one of ``filters`` matches (never ``/$...`` ones; ``retained``: only
        those with a snapshot), to be taken in slices of bounded work
        (:class:`SubjectScan`): the walk visits only the levels the filters can match
        (:mod:`migratory.model.subject_index`), not every subject -- a pass over all of
        them stopped the server 65 ms per SUBSCRIBE at 50,000 subjects, 670 ms at 500,000."""
        return SubjectScan(self, self._index.match(filters), retained=retained)


class FilterAges:
    """Since when each wildcard filter has been held here (by any sink), as the hub's
    moment (``Hub.holdings_made``) it was first added at; kept while some sink holds it
    -- a session handing its filters over (an MQTT resume's catch-up to the session, the
    new one added before the old one removed) keeps the age. A Standard member asks it
    whether a wildcard subscriber may have missed a peer's forward (``Hub.made``)."""

    __slots__ = ("_ages", "_holders")

    def __init__(self) -> None:
        self._ages: FilterIndex[tuple[str, ...]] = FilterIndex()
        self._holders: dict[tuple[str, ...], int] = {}

    def held(self, levels: tuple[str, ...], moment: int) -> bool:
        """One more sink holds ``levels``; whether it was not held before (its age is
        then ``moment``)."""
        holders = self._holders.get(levels, 0)
        self._holders[levels] = holders + 1
        if holders:
            return False
        self._ages.add(levels, levels, moment)
        return True

    def released(self, levels: tuple[str, ...]) -> None:
        holders = self._holders.pop(levels, 0) - 1
        if holders > 0:
            self._holders[levels] = holders
        else:
            self._ages.remove(levels, levels)

    def oldest(self, subject: str) -> int | None:
        """The age of the oldest filter matching ``subject`` (None: none matches)."""
        return min((age for _, age in self._ages.match(subject)), default=None)


class SessionHolds:
    """The filters of the persistent MQTT sessions this member served, kept while their
    client is away too, with since when each is held (as :class:`FilterAges`). An away
    session holds nothing else in the hub -- no subject state, no wildcard filter -- yet
    its resume replays what the caches hold since its record's positions, and a subject
    it has none of from the start of its cache. A Standard member asks ``Hub.made``
    whether anyone here may have missed a peer's forward: without these, a peer's new
    life's seq 1 of a subject only an away session wanted was taken as the first, and the
    session came back to it alone, the forwards lost with the peer's earlier life unseen.

    Released by an UNSUBSCRIBE, a clean session of that client id here, the expiry sweep
    here finding the record discarded, or a resume here from a record that no longer
    names the filter (UNSUBSCRIBEd on another member). A session that moved on to
    another member is still held here until then: a needless resync at a peer's restart,
    never a silent gap (its client's filters are held per client id, each once)."""

    __slots__ = ("_ages", "_clients")

    def __init__(self) -> None:
        self._ages = FilterAges()
        self._clients: dict[str, set[tuple[str, ...]]] = {}

    def hold(self, client_id: str, levels: tuple[str, ...], moment: int) -> bool:
        """Whether ``levels`` was held by no session here before (its age ``moment``)."""
        held = self._clients.setdefault(client_id, set())
        if levels in held:
            return False
        held.add(levels)
        return self._ages.held(levels, moment)

    def release(self, client_id: str, levels: tuple[str, ...] | None) -> None:
        held = self._clients.get(client_id)
        if held is None:
            return
        for each in (tuple(held) if levels is None else (levels,) if levels in held else ()):
            held.discard(each)
            self._ages.released(each)
        if not held:
            del self._clients[client_id]

    def held(self, client_id: str) -> set[tuple[str, ...]]:
        return set(self._clients.get(client_id, ()))

    def oldest(self, subject: str) -> int | None:
        """Since when a session's filter matching ``subject`` is held (None: none)."""
        return self._ages.oldest(subject) if self._clients else None

    def __len__(self) -> int:
        return len(self._clients)


class SubjectScan:
    """A pass over the subjects some filters match, in slices: :meth:`take` works at most
    ``limit`` visits (levels and subjects looked at) and may be called again, at a later
    turn of the loop, until :attr:`done`. A slice sees each subject as it stands then."""

    __slots__ = ("_found", "_sinks", "done", "retained", "visited")

    def __init__(
        self, sinks: MessageSinks, found: Iterator[tuple[SubjectState, int] | int],
        *, retained: bool,
    ) -> None:
        self._sinks = sinks
        self._found = found
        self.retained = retained
        self.done = False
        self.visited = 0

    def take(self, limit: int) -> list[tuple[str, Position, Message | None, int]]:
        """``(subject, position, snapshot, value)`` of the next subjects found within
        ``limit`` visits, ``value`` the highest of the filters matching it."""
        found = []
        visits = 0
        retained = self.retained
        for item in self._found:
            if isinstance(item, int):
                visits += item
            else:
                visits += 1
                state, value = item
                if not retained or state.snapshot is not None:
                    found.append((state.subject, state.position, state.snapshot, value))
            if visits >= limit:
                break
        else:
            self.done = True
        self.visited += visits
        self._sinks.subjects_visited += visits
        return found

    def rest(self) -> list[tuple[str, Position, Message | None, int]]:
        """All the subjects left, whatever the work (tests; a bounded caller uses take)."""
        found = []
        while not self.done:
            found += self.take(1 << 30)
        return found
