"""The hub's message sinks: subscribers that encode whole messages themselves (MQTT
sessions), on exact subjects and on wildcard topic filters. A mixin of
:class:`~migratory.server.hub.Hub`, kept apart so that each file reads alone."""

from __future__ import annotations

from typing import Any

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.topic import FilterIndex, filter_matches
from migratory.server.format_sink import MessageSink
from migratory.server.subject_state import SubjectState


class MessageSinks:
    """Hub methods for :class:`MessageSink` subscribers."""

    _subjects: dict[str, SubjectState]
    _filters: FilterIndex[MessageSink]
    _fanned_out: int
    _sinks: int  # subscriptions to exact subjects, every kind (Hub.statistics)

    def _state(self, subject: str) -> SubjectState:
        raise NotImplementedError

    def _missed(self, state: SubjectState, position: Position) -> list[Message] | None:
        raise NotImplementedError

    def _tell_listeners(self, state: SubjectState, message: Message) -> None:
        """Each message sink once, at the highest QoS of its matching subscriptions."""
        listeners = state.listeners
        if not self._filters or state.subject.startswith("/$"):
            granted = tuple(listeners.items())
        else:
            best = dict(listeners)
            for sink, qos in self._filters.match(state.subject):
                if best.get(sink, -1) < qos:
                    best[sink] = qos
            granted = tuple(best.items())
        for sink, qos in granted:
            sink.deliver_message(message, qos)
        self._fanned_out += len(granted)

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
                del self._subjects[subject]

    def listen_filter(self, sink: MessageSink, levels: tuple[str, ...], qos: int) -> None:
        """Deliver every later message of every subject ``levels`` matches to ``sink``."""
        self._filters.add(levels, sink, qos)

    def unlisten_filter(self, sink: MessageSink, levels: tuple[str, ...]) -> None:
        self._filters.remove(levels, sink)

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

    def matching(self, levels: tuple[str, ...]) -> list[tuple[str, Position, Message | None]]:
        """``(subject, position, snapshot)`` of every subject a wildcard filter matches
        (never ``/$...`` ones)."""
        return [
            (state.subject, state.position, state.snapshot)
            for state in self._subjects.values()
            if not state.subject.startswith("/$") and filter_matches(levels, state.subject)
        ]

    def matching_any(
        self, index: FilterIndex[Any], *, retained: bool = False
    ) -> list[tuple[str, Position, Message | None, int]]:
        """``(subject, position, snapshot, value)`` of every subject one of ``index``'s
        filters matches, ``value`` the highest of theirs (never ``/$...`` subjects;
        ``retained``: only subjects with a snapshot). One pass over the subjects for all
        the filters (a SUBSCRIBE of 100 wildcard filters scanned them 100 times: 2.6 s
        of a stopped server with 50,000 subjects)."""
        found = []
        for state in self._subjects.values():
            if retained and state.snapshot is None:
                continue
            subject = state.subject
            if subject.startswith("/$"):
                continue
            best = -1
            for _, value in index.match(subject):
                if value > best:
                    best = value
            if best >= 0:
                found.append((subject, state.position, state.snapshot, best))
        return found
