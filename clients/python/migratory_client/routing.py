"""Where server operations go: subject trackers and subscriptions, publish waiters,
notifications. Shared by every session of one client; survives reconnects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import trio

from migratory.model.message import Message
from migratory.protocol.ops import PublishStatus, Status, SubjectStatus, SubscriptionRequest
from migratory_client.errors import MigratoryError
from migratory_client.events import Notification, NotificationStatus, PublishResult
from migratory_client.notifications import NotificationQueue
from migratory_client.resume import SubjectTracker, Verdict

__all__ = ["PendingPublish", "Router"]


@dataclass(slots=True)
class PendingPublish:
    """A publish sent with ``closure`` whose status has not arrived yet."""

    subject: str
    closure: str
    done: trio.Event = field(default_factory=trio.Event)
    result: PublishResult | None = None
    lost: str | None = None


class Router:
    def __init__(self, notifications: NotificationQueue) -> None:
        self.notifications = notifications
        self.trackers: dict[str, SubjectTracker] = {}
        self.pending: dict[str, PendingPublish] = {}
        self._outlets: dict[str, trio.MemorySendChannel[Message]] = {}
        self.delivering = False
        """True while waiting for the application to take a message (buffer full)."""

    # --- subscriptions -------------------------------------------------------

    def add(
        self, trackers: Sequence[SubjectTracker], outlet: trio.MemorySendChannel[Message]
    ) -> None:
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
                outlet.close()

    def requests_for(
        self, session_id: int, subjects: Iterable[str] | None = None
    ) -> list[SubscriptionRequest]:
        """Subscriptions not yet sent on session ``session_id``; marks them as sent."""
        chosen = self.trackers.values() if subjects is None else self._known(subjects)
        requests = []
        for tracker in chosen:
            if tracker.requested_in != session_id and not tracker.denied:
                tracker.requested_in = session_id
                requests.append(tracker.request())
        return requests

    def _known(self, subjects: Iterable[str]) -> list[SubjectTracker]:
        return [self.trackers[s] for s in subjects if s in self.trackers]

    # --- server operations ----------------------------------------------------

    async def on_messages(self, messages: Sequence[Message]) -> list[SubscriptionRequest]:
        """Deliver what is new; return the resubscriptions that gaps call for."""
        resubscribe: list[SubscriptionRequest] = []
        for message in messages:
            tracker = self.trackers.get(message.subject)
            if tracker is None:
                continue  # unsubscribed meanwhile
            verdict = tracker.on_message(message)
            if verdict is Verdict.DELIVER:
                await self._hand_over(message)
            elif verdict is Verdict.GAP:
                resubscribe.append(tracker.request())
        return resubscribe

    async def _hand_over(self, message: Message) -> None:
        outlet = self._outlets.get(message.subject)
        if outlet is None:
            return
        self.delivering = True
        try:
            await outlet.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the application unsubscribed while we waited
        finally:
            self.delivering = False

    def on_subject_status(self, op: SubjectStatus, server: str) -> None:
        tracker = self.trackers.get(op.subject)
        if tracker is None:
            return
        tracker.on_status(op.status, op.position)
        self.notifications.put(
            Notification(
                NotificationStatus.of(op.status), op.subject, op.position, op.reason, server
            )
        )

    def on_publish_status(self, op: PublishStatus, server: str) -> None:
        pending = self.pending.pop(op.closure, None) if op.closure is not None else None
        if pending is None:  # a publish without closure, or one we stopped waiting for
            self.notifications.put(
                Notification(
                    NotificationStatus.of(op.status), op.subject, op.position, op.reason, server
                )
            )
            return
        pending.result = PublishResult(op.status, op.subject, op.position, op.reason)
        pending.done.set()

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
        for tracker in self.trackers.values():
            tracker.on_session_lost()

    def close(self, error: MigratoryError | None) -> None:
        """The client ended: subscriptions drain then end (with ``error`` if any)."""
        self.session_lost("the client ended")
        for outlet in {id(o): o for o in self._outlets.values()}.values():
            outlet.close()
        self._outlets.clear()
        self.notifications.close(error)
