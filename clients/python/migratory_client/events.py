"""What the application receives besides messages: notifications and publish results."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from migratory.model.position import Position
from migratory.protocol.ops import Status

__all__ = ["Notification", "NotificationStatus", "PublishResult"]


class NotificationStatus(enum.StrEnum):
    """Client notifications (MigratoryData names); equal to the protocol's status strings."""

    SERVER_UP = "SERVER_UP"
    """A session with a server is open (``server`` is its URL)."""
    SERVER_DOWN = "SERVER_DOWN"
    """A session was lost or could not be opened (``reason`` says why)."""
    DATA_SYNC = "DATA_SYNC"
    DATA_RESYNC = "DATA_RESYNC"
    SUBSCRIBE_ALLOW = "SUBSCRIBE_ALLOW"
    SUBSCRIBE_DENY = "SUBSCRIBE_DENY"
    PUBLISH_OK = "PUBLISH_OK"
    PUBLISH_FAILED = "PUBLISH_FAILED"
    """Only for publishes without a closure (``publish_nowait``): errors are never silent."""
    PUBLISH_DENIED = "PUBLISH_DENIED"
    MESSAGE_SIZE_LIMIT_EXCEEDED = "MESSAGE_SIZE_LIMIT_EXCEEDED"

    @classmethod
    def of(cls, status: Status) -> NotificationStatus:
        return cls(status.value)


@dataclass(frozen=True, slots=True)
class Notification:
    """One client notification; ``subject`` and ``position`` are None for server events.
    ``closure`` is set on the status of a publish that :meth:`Client.publish` gave up
    waiting for (the closure of its ``PublishOutcomeUnknown``): its outcome after all."""

    status: NotificationStatus
    subject: str | None = None
    position: Position | None = None
    reason: str | None = None
    server: str | None = None
    closure: str | None = None


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The server's answer to one publish: ``position`` is set when ``status`` is PUBLISH_OK."""

    status: Status
    subject: str
    position: Position | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.PUBLISH_OK
