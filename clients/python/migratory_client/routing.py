"""Where server operations go: subject trackers and subscriptions, publish waiters,
notifications. Shared by every session of one client; survives reconnects.

The router never waits for the application: a session's reader must keep reading,
or it would not see the server's pongs, statuses and closes, and a connection that
died silently would stay "alive" for as long as the application is slow. A message
for a subscription whose buffer is full is not handed over; the subscription is
paused instead (its subjects are left at the server, their positions stay where the
application's messages end) and resumed from those positions once the application
has taken half of the buffer: the messages come again as ``recovered``.

A subscribe the server refuses whole because its answer would not fit in the client's
outbox (``SUBSCRIBE_DENY`` "subscribe answer too large" for every entry: a reconnect
that resumes many subjects with much to recover) does not deny those subjects: they
are asked for again one at a time, each once the answer before it is complete. A resume
refused so when alone could never be answered: the subject starts again from its
snapshot, announced as ``DATA_RESYNC`` (as when the cache no longer reaches back). Only
a first subscribe refused so when alone is denied.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import trio

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol.ops import (
    PROTOCOL_VERSION,
    SUBSCRIBE_TOO_LARGE,
    PublishStatus,
    Status,
    SubjectStatus,
    SubscriptionRequest,
)
from migratory_client.errors import MigratoryError
from migratory_client.events import Notification, NotificationStatus, PublishResult
from migratory_client.notifications import NotificationQueue
from migratory_client.resume import SubjectTracker, Verdict

log = logging.getLogger("migratory_client")

UNKNOWN_OPS_NAMED = 50
"""Distinct unknown operations counted by name; any further are counted together."""
OTHER_UNKNOWN_OPS = "(others)"

__all__ = ["Outlet", "PendingPublish", "Reaction", "Router"]

GIVEN_UP_REMEMBERED = 10_000
"""Closures of publishes given up (timed out) whose late status is still told."""


@dataclass(slots=True)
class PendingPublish:
    """A publish sent with ``closure`` whose status has not arrived yet."""

    subject: str
    closure: str
    done: trio.Event = field(default_factory=trio.Event)
    result: PublishResult | None = None
    lost: str | None = None


@dataclass(eq=False, slots=True)
class Outlet:
    """Where the messages of one subscription go: its bounded buffer."""

    channel: trio.MemorySendChannel[Message]
    paused: bool = False
    """The buffer was full: the subscription's subjects are left at the server until the
    application has taken half of it, then they resume from their positions."""

    def full(self) -> bool:
        stats = self.channel.statistics()
        return stats.current_buffer_used >= stats.max_buffer_size


@dataclass(frozen=True, slots=True)
class Reaction:
    """What the session must send after a batch of messages."""

    resubscribe: tuple[SubscriptionRequest, ...] = ()
    """Subjects with a gap, from their positions."""
    pause: tuple[str, ...] = ()
    """Subjects of subscriptions that were just paused (unsubscribe them)."""


class Router:
    def __init__(self, notifications: NotificationQueue) -> None:
        self.notifications = notifications
        self.trackers: dict[str, SubjectTracker] = {}
        self.pending: dict[str, PendingPublish] = {}
        self._given_up: dict[str, None] = {}
        """Closures of publishes whose ``publish()`` gave up waiting, oldest first."""
        self.stray_publish_statuses = 0
        self.unknown_ops: dict[str, int] = {}
        """Server operations of no protocol version this client knows, by ``op``:
        ignored (a newer server's; see :meth:`on_unknown_op`)."""
        self._outlets: dict[str, Outlet] = {}
        self._alone: list[str] = []
        """Subjects of a subscribe refused whole as too large, to ask for one at a time."""
        self._alone_due: str | None = None
        """The subject asked for alone whose answer is not complete yet."""

    # --- subscriptions -------------------------------------------------------

    def add(self, trackers: Sequence[SubjectTracker], outlet: Outlet) -> None:
        taken = [t.subject for t in trackers if t.subject in self.trackers]
        if taken:
            raise ValueError(f"already subscribed: {', '.join(taken)}")
        for tracker in trackers:
            self.trackers[tracker.subject] = tracker
            self._outlets[tracker.subject] = outlet

    def remove(self, subjects: Iterable[str]) -> None:
        for subject in subjects:
            self.trackers.pop(subject, None)
            outlet = self._outlets.pop(subject, None)
            if outlet is not None:
                outlet.channel.close()

    def requests_for(
        self, session_id: int, subjects: Iterable[str] | None = None
    ) -> list[SubscriptionRequest]:
        """Subscriptions not yet sent on session ``session_id``; marks them as sent."""
        chosen = self.trackers.values() if subjects is None else self._known(subjects)
        requests = []
        for tracker in chosen:
            paused = self._outlets[tracker.subject].paused
            if tracker.requested_in != session_id and not tracker.denied and not paused:
                tracker.requested_in = session_id
                requests.append(tracker.request())
        return requests

    def _known(self, subjects: Iterable[str]) -> list[SubjectTracker]:
        return [self.trackers[s] for s in subjects if s in self.trackers]

    def sent(self, session_id: int, requests: Iterable[SubscriptionRequest]) -> None:
        """These requests went out on session ``session_id`` (answers are now due)."""
        for request in requests:
            tracker = self.trackers.get(request.subject)
            if tracker is not None:
                tracker.sent(session_id)

    def resume(self, outlet: Outlet) -> tuple[str, ...]:
        """The application took half of a paused subscription's buffer: its subjects are
        to be subscribed again from their positions (returned)."""
        outlet.paused = False
        subjects = self._subjects_of(outlet)
        for subject in subjects:
            tracker = self.trackers[subject]
            tracker.recovering = True  # messages sent before the pause may still come
            tracker.requested_in = -1
        return subjects

    def _pause(self, outlet: Outlet) -> tuple[str, ...]:
        outlet.paused = True
        subjects = self._subjects_of(outlet)
        for subject in subjects:
            tracker = self.trackers[subject]
            tracker.skip()
            tracker.requested_in = -1
        return subjects

    def _subjects_of(self, outlet: Outlet) -> tuple[str, ...]:
        return tuple(s for s, o in self._outlets.items() if o is outlet)

    # --- server operations ----------------------------------------------------

    def on_messages(self, messages: Sequence[Message]) -> Reaction:
        """Hand over what is new, without waiting; say which subjects to resubscribe (a
        gap) and which to unsubscribe (their subscription's buffer is full)."""
        resubscribe: dict[str, SubscriptionRequest] = {}
        pause: list[str] = []
        for message in messages:
            tracker = self.trackers.get(message.subject)
            if tracker is None:
                continue  # unsubscribed meanwhile
            outlet = self._outlets[message.subject]
            if outlet.paused:
                continue  # comes again, as recovered, when the subscription resumes
            if outlet.full():
                pause += self._pause(outlet)
                continue
            verdict = tracker.on_message(message)
            if verdict is Verdict.DELIVER:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    outlet.channel.send_nowait(message)  # room checked; gone: unsubscribed
            elif verdict is Verdict.GAP:
                resubscribe[tracker.subject] = tracker.request()
        for subject in pause:
            resubscribe.pop(subject, None)
        return Reaction(tuple(resubscribe.values()), tuple(pause))

    def on_subject_status(
        self, op: SubjectStatus, server: str, session_id: int = -1
    ) -> tuple[SubscriptionRequest, ...]:
        """Apply a subject status; returns the subscription to send next, if any (a
        subject of a subscribe refused as too large, asked for alone)."""
        tracker = self.trackers.get(op.subject)
        lone = op.subject == self._alone_due
        if lone and (tracker is None or _answer_complete(op, tracker)):
            self._alone_due = None
        if tracker is None:
            return self.next_alone(session_id)
        before, restarting = tracker.position, tracker.restarting
        skipped = tracker.on_status(op.status, op.position, session_id)
        too_large = op.status is Status.SUBSCRIBE_DENY and _too_large(op.reason)
        if too_large and (not lone or before is not None):
            tracker.denied = False  # not refused: asked for again, alone
            if lone:  # a resume that can never fit: from the snapshot instead, next
                tracker.restart()
                self._alone.insert(0, op.subject)
            else:
                self._alone.append(op.subject)
            return self.next_alone(session_id)
        status, reason = NotificationStatus.of(op.status), op.reason
        if skipped:  # the server lost messages: say so, as a resync does
            status = NotificationStatus.DATA_RESYNC
            reason = (
                f"DATA_SYNC at {_at(op.position)} but the last message delivered was "
                f"{_at(before)}"
            )
        self.notifications.put(Notification(status, op.subject, op.position, reason, server))
        if restarting and op.status is Status.SUBSCRIBE_ALLOW:  # from the snapshot: say so
            tracker.restarting = False
            reason = f"{SUBSCRIBE_TOO_LARGE} to resume: the messages missed are left out"
            resync = NotificationStatus.DATA_RESYNC
            self.notifications.put(Notification(resync, op.subject, op.position, reason, server))
        return self.next_alone(session_id)

    def next_alone(self, session_id: int) -> tuple[SubscriptionRequest, ...]:
        """The next subject to ask for alone, once the answer before it is complete."""
        while self._alone_due is None and self._alone:
            subject = self._alone.pop(0)
            tracker = self.trackers.get(subject)
            if tracker is None or tracker.denied or self._outlets[subject].paused:
                continue  # unsubscribed, or asked for again when it resumes
            tracker.requested_in = session_id
            self._alone_due = subject
            return (tracker.request(),)
        return ()

    def given_up(self, closure: str) -> None:
        """:meth:`Client.publish` stopped waiting for ``closure``'s status (its timeout):
        should it come after all, it is told once, as a notification carrying the closure."""
        self._given_up[closure] = None
        while len(self._given_up) > GIVEN_UP_REMEMBERED:
            del self._given_up[next(iter(self._given_up))]

    def on_unknown_op(self, name: str, server: str) -> None:
        """A server operation of no version this client speaks: counted, logged the first
        time, otherwise ignored -- the session goes on (closing it would bring the same
        operation on the next session: a reconnect loop). Nothing can be lost by it
        unnoticed: a message it carried would leave a gap in its subject's positions,
        and a gap resumes the subject."""
        if name not in self.unknown_ops and len(self.unknown_ops) >= UNKNOWN_OPS_NAMED:
            name = OTHER_UNKNOWN_OPS  # a server making up names: bounded
        seen = self.unknown_ops.get(name, 0)
        self.unknown_ops[name] = seen + 1
        if not seen:
            log.warning("%s: ignored a server operation of no protocol version %d knows: %r",
                        server, PROTOCOL_VERSION, name)

    def on_publish_status(self, op: PublishStatus, server: str) -> None:
        """The one status of a publish: its ``publish()``'s result; a notification for a
        publish without closure (``publish_nowait``), or once for one given up. A status
        for a closure already answered, or never made by this client, is a server's
        mistake: dropped (counted in ``stray_publish_statuses``), never a second status."""
        closure = op.closure
        pending = self.pending.pop(closure, None) if closure is not None else None
        if pending is not None:
            pending.result = PublishResult(op.status, op.subject, op.position, op.reason)
            pending.done.set()
            return
        if closure is not None:
            if closure not in self._given_up:
                self.stray_publish_statuses += 1
                return
            del self._given_up[closure]  # told once
        status = NotificationStatus.of(op.status)
        note = Notification(status, op.subject, op.position, op.reason, server, closure)
        self.notifications.put(note)

    # --- session life ---------------------------------------------------------

    def session_lost(self, reason: str, *, untaken_failed: bool = False) -> None:
        """Every publish still waiting has an unknown outcome now, unless the server said
        (close 4502 DRAINED) that it answered every publish it took: then those still
        waiting were not taken and fail definitely."""
        for pending in self.pending.values():
            if untaken_failed:
                pending.result = PublishResult(
                    Status.PUBLISH_FAILED, pending.subject, None, f"not published: {reason}"
                )
            else:
                pending.lost = reason
            pending.done.set()
        self.pending.clear()
        self._alone.clear()  # the next session asks for every subject again
        self._alone_due = None
        for tracker in self.trackers.values():
            tracker.on_session_lost()

    def close(self, error: MigratoryError | None) -> None:
        """The client ended: subscriptions drain then end (with ``error`` if any)."""
        self.session_lost("the client ended")
        for outlet in {id(o): o for o in self._outlets.values()}.values():
            outlet.channel.close()
        self._outlets.clear()
        self.notifications.close(error)


def _too_large(reason: str | None) -> bool:
    return reason is not None and reason.startswith(SUBSCRIBE_TOO_LARGE)


def _answer_complete(op: SubjectStatus, tracker: SubjectTracker) -> bool:
    """Whether ``op`` ends the answer to a subscription of ``tracker``'s subject: its
    ``DATA_SYNC`` / ``DATA_RESYNC`` on a resume, a deny, or -- on a first subscribe, whose
    messages follow it at once -- the ``SUBSCRIBE_ALLOW``."""
    if op.status is Status.SUBSCRIBE_ALLOW:
        return tracker.position is None
    return True


def _at(position: Position | None) -> str:
    return "-" if position is None else f"{position.epoch}:{position.seq}"
