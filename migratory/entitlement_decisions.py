"""What every entitlement shares: the client it judges, the interface, and how a
decision is asked (answered at once, or deferred: :class:`DecisionPending`).

The entitlements themselves (:mod:`migratory.entitlement` and the ``Token`` and
``Custom`` ones beside it) build on this module; it imports none of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from migratory.protocol import close_codes
from migratory.protocol.close_codes import CloseCode


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """What the entitlement knows about a client."""

    name: str
    token: str | None
    peer: str


class Entitlement(Protocol):
    name: str

    def allow_connect(self, client: ClientIdentity) -> bool: ...

    def allow_subscribe(self, client: ClientIdentity, subject: str) -> bool: ...

    def allow_publish(self, client: ClientIdentity, subject: str) -> bool: ...

    def expiry(self, client: ClientIdentity) -> float | None:
        """When the client's rights end (seconds since the epoch), or None."""
        ...

    def not_yet_valid(self, client: ClientIdentity) -> float | None:
        """Seconds the client's rights lie in the future when that alone refuses it (a
        token's ``nbf`` past the leeway: asking again later helps), else None."""
        ...


def connect_refusal(entitlement: Entitlement, client: ClientIdentity) -> tuple[CloseCode, str]:
    """The close code and reason of a refused ``connect``: an expired token and one not
    valid yet ask for a reconnect (4503, 4504), anything else ends the client (4003)."""
    expiry = entitlement.expiry(client)
    if expiry is not None and expiry <= time.time():
        return close_codes.TOKEN_EXPIRED, "the token expired"
    early = entitlement.not_yet_valid(client)
    if early is not None:
        return close_codes.TOKEN_NOT_YET_VALID, (
            f"the token is not valid before (nbf) {early:.0f} s from now by this server's "
            "clock: the issuer's clock is ahead of this server's, or this one is behind; "
            "reconnect later")
    return close_codes.CONNECT_DENIED, "entitlement refused the connection"


class DecisionPending(Exception):
    """A decision asked inside :func:`deferred_decisions` is not in yet (Custom: the
    plugin is still answering in its thread). The caller puts its operation back, waits
    for ``future`` until ``deadline`` (``time.monotonic()``) without holding the event
    loop, then asks again: the answer, or a denial once past the deadline."""

    def __init__(self, future: Future[Any], deadline: float) -> None:
        super().__init__("entitlement decision pending")
        self.future = future
        self.deadline = deadline


_DEFERRED: ContextVar[str] = ContextVar("entitlement_deferred", default="")


@contextmanager
def deferred_decisions(*, ahead: bool = False) -> Iterator[None]:
    """Within it, an entitlement may raise :class:`DecisionPending` instead of waiting
    (the native WebSocket session: it can put an operation back and wait). Outside, a
    decision is answered before the call returns. ``ahead``: the decisions are asked
    before the operation, which asks them again outside (MQTT): one that failed is
    denied then without asking again."""
    reset = _DEFERRED.set("ahead" if ahead else "deferred")
    try:
        yield
    finally:
        _DEFERRED.reset(reset)


def decisions_deferred() -> bool:
    return bool(_DEFERRED.get())


def decisions_asked_ahead() -> bool:
    return _DEFERRED.get() == "ahead"


MAX_TOKEN_CHARS = 65_536
"""A longer token is refused unread by Token and Custom (a JWT of 1,000 patterns fits in
~40 kB): a 1 MiB token on a native connect would otherwise be hashed at each decision."""


def token_bytes(token: str) -> bytes:
    """A token as bytes to compare: a lone surrogate (JSON's ``"\\udcff"``) never matches
    a configured token, and must not raise."""
    return token.encode("utf-8", "surrogatepass")
