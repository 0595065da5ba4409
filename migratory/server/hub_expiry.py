"""The hub's expiry: cached messages dropped after the cache expire time, and the
subjects left with nothing to serve forgotten. A mixin of
:class:`~migratory.server.hub.Hub`, kept apart so that each file reads alone."""

from __future__ import annotations

from migratory.model.subject_index import SubjectIndex
from migratory.server.subject_state import SubjectState

FORGOTTEN_MARKS = 1 << 23
"""Bits that mark, by the subject's hash, the numbered subjects a hub forgot (1 MiB, made
at the first one): a subject whose bit is clear was never forgotten here, so a resume of
it that finds no position here lags (``Hub._unplaced``). A million subjects forgotten set
about 11 % of the bits: a resume of a subject whose bit another set is told DATA_RESYNC
at once, as when every resume that found no position was."""


class SubjectExpiry:
    """Hub methods that drop expired messages and forget spent subjects."""

    _forgotten_marks: bytearray | None = None
    _subjects: dict[str, SubjectState]
    _index: SubjectIndex[SubjectState]
    _expire_queue: list[str]
    _cached: int
    _forgotten: int
    _forgotten_since_shrink: int

    def expire(self, now: float, *, budget: int | None = None) -> int:
        """Drop cached messages older than the cache expire time; forget the subjects
        left with nothing to serve. A subject created after one was forgotten starts a
        new epoch, so a position is never reused for another message; on a cluster
        member (positions numbered elsewhere) its next message brings its position back,
        and a resume meanwhile is told DATA_RESYNC and waits for it (``_unplaced``; a
        resume of a subject never forgotten here lags instead, and waits silently).

        ``budget``: look at no more than that many subjects, going on from where the last
        call stopped (a sweep of 200,000 subjects in one call stopped the loop ~200 ms);
        messages are then kept at least the expire time, a little longer."""
        if budget is None:
            subjects = list(self._subjects)
        else:
            if not self._expire_queue:
                self._expire_queue = list(self._subjects)
            subjects = self._expire_queue[-budget:]
            del self._expire_queue[-budget:]
        dropped = 0
        for subject in subjects:
            state = self._subjects.get(subject)
            if state is None:
                continue
            dropped += state.cache.expire(now)
            if state.seq and state.spent:
                self._forget(state)
        self._cached -= dropped
        if self._forgotten_since_shrink > len(self._subjects):  # a dict never shrinks itself
            self._subjects = dict(self._subjects)
            self._forgotten_since_shrink = 0
        return dropped

    def forget_unserved(self, subject: str) -> bool:
        """Forget ``subject`` as :meth:`expire` forgets a spent one, but for its snapshot,
        which its owner knows serves no one (an MQTT session's empty record: mqtt_expiry)."""
        state = self._subjects.get(subject)
        if state is None or not state.seq or state.cache or state.sinks:
            return False
        self._forget(state)
        return True

    @property
    def forgotten(self) -> int:
        """Spent subjects forgotten so far (see :meth:`expire`)."""
        return self._forgotten

    def _forget(self, state: SubjectState) -> None:
        del self._subjects[state.subject]
        self._index.remove(state.subject)
        if state.seq:  # numbered: a subject made again starts a new epoch (_state)
            self._forgotten += 1
            self._forgotten_since_shrink += 1
            marks = self._forgotten_marks
            if marks is None:
                marks = self._forgotten_marks = bytearray(FORGOTTEN_MARKS // 8)
            bit = hash(state.subject) & (FORGOTTEN_MARKS - 1)
            marks[bit >> 3] |= 1 << (bit & 7)

    def may_have_forgotten(self, subject: str) -> bool:
        """Whether ``subject`` may have been forgotten here (False: it never was)."""
        marks = self._forgotten_marks
        if marks is None:
            return False
        bit = hash(subject) & (FORGOTTEN_MARKS - 1)
        return bool(marks[bit >> 3] & 1 << (bit & 7))
