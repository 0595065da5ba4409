"""Exceptions of the SDK, each with the structured fields an application acts on."""

from __future__ import annotations

__all__ = [
    "ClientClosedError",
    "ConnectionClosedError",
    "MigratoryError",
    "NotConnectedError",
    "PublishOutcomeUnknown",
    "ServerUnavailableError",
]


class MigratoryError(Exception):
    """Base class of every error the SDK raises on purpose."""


class ConnectionClosedError(MigratoryError):
    """A server closed the session with a terminal close code; the client gave up.

    ``code`` and ``reason`` are the WebSocket close frame's; ``server`` is the URL.
    Retrying cannot help (see ``migratory.protocol.close_codes``).
    """

    def __init__(self, code: int, reason: str | None, server: str) -> None:
        super().__init__(code, reason, server)
        self.code = code
        self.reason = reason
        self.server = server

    def __str__(self) -> str:
        from migratory.protocol import close_codes

        known = close_codes.BY_CODE.get(self.code)
        name = f" {known.name}" if known else ""
        return f"{self.server} closed the session with {self.code}{name}: {self.reason or '-'}"


class ServerUnavailableError(MigratoryError):
    """No server accepted a session within ``attempts`` consecutive attempts."""

    def __init__(self, attempts: int, last_reason: str) -> None:
        super().__init__(attempts, last_reason)
        self.attempts = attempts
        self.last_reason = last_reason

    def __str__(self) -> str:
        return f"no server reachable after {self.attempts} attempts; last: {self.last_reason}"


class ClientClosedError(MigratoryError):
    """The client was closed by the application; it cannot be used any more."""

    def __str__(self) -> str:
        return "the client is closed"


class NotConnectedError(MigratoryError):
    """No session came up within ``timeout`` seconds; the message was **not** sent.
    ``last_reason``: why the last attempt failed (or the last session ended), if any."""

    def __init__(self, subject: str, timeout: float, last_reason: str | None = None) -> None:
        super().__init__(subject, timeout, last_reason)
        self.subject = subject
        self.timeout = timeout
        self.last_reason = last_reason

    def __str__(self) -> str:
        last = f"; last: {self.last_reason}" if self.last_reason else ""
        return f"not published to {self.subject}: no server session within {self.timeout} s{last}"


class PublishOutcomeUnknown(MigratoryError):
    """A publish was sent but its status never came back (connection lost, timeout).

    The message may or may not have been published. The SDK does not retry on its
    own because a retry could publish it twice; the application decides.
    """

    def __init__(self, subject: str, closure: str, reason: str) -> None:
        super().__init__(subject, closure, reason)
        self.subject = subject
        self.closure = closure
        self.reason = reason

    def __str__(self) -> str:
        return f"outcome of publish {self.closure} to {self.subject} unknown: {self.reason}"
