"""Entitlement: who may connect, subscribe and publish.

``Entitlement = None`` allows everything; ``Basic`` lets anyone subscribe and
only holders of ``EntitlementAllowToken`` publish; ``Token`` verifies a JWT
(:mod:`migratory.entitlement_token`); ``Custom`` asks a Python plugin
(:mod:`migratory.entitlement_custom`). All behind the same interface.
Denials become statuses (``SUBSCRIBE_DENY``, ``PUBLISH_DENIED``) or the close
code ``4003 CONNECT_DENIED``; they are never silent.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from migratory.config import Config, ConfigError


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


class NoEntitlement:
    name = "None"

    def expiry(self, client: ClientIdentity) -> float | None:
        return None

    def allow_connect(self, client: ClientIdentity) -> bool:
        return True

    def allow_subscribe(self, client: ClientIdentity, subject: str) -> bool:
        return True

    def allow_publish(self, client: ClientIdentity, subject: str) -> bool:
        return True


class BasicEntitlement:
    name = "Basic"

    def __init__(self, allow_token: str) -> None:
        if not allow_token:
            raise ValueError("Basic entitlement needs a non-empty allow token")
        self._allow_token = allow_token.encode()

    def expiry(self, client: ClientIdentity) -> float | None:
        return None

    def allow_connect(self, client: ClientIdentity) -> bool:
        return True

    def allow_subscribe(self, client: ClientIdentity, subject: str) -> bool:
        return True

    def allow_publish(self, client: ClientIdentity, subject: str) -> bool:
        token = client.token
        return token is not None and hmac.compare_digest(token_bytes(token), self._allow_token)


def entitlement_from_config(config: Config) -> Entitlement:
    """The configured entitlement; ConfigError when its key file or plugin cannot load."""
    if config.entitlement == "Basic":
        return BasicEntitlement(config.entitlement_allow_token)
    if config.entitlement == "Token":
        from migratory.entitlement_token import TokenEntitlement, load_keys

        try:
            keys = load_keys(
                config.entitlement_token_algorithm,
                config.entitlement_token_key_file,
                config.entitlement_token_jwks_file,
            )
        except (OSError, ValueError) as exc:  # (the message names the key and its file)
            key, path = (("EntitlementTokenJwksFile", config.entitlement_token_jwks_file)
                         if config.entitlement_token_jwks_file else
                         ("EntitlementTokenKeyFile", config.entitlement_token_key_file))
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"Entitlement = Token: {key} {path}: {why}") from None
        return TokenEntitlement(
            algorithm=config.entitlement_token_algorithm,
            keys=keys,
            issuer=config.entitlement_token_issuer,
            audience=config.entitlement_token_audience,
        )
    if config.entitlement == "Custom":
        from migratory.entitlement_custom import CustomEntitlement, load_plugin

        try:
            plugin = load_plugin(config.entitlement_plugin, config.entitlement_plugin_options)
        except ValueError as exc:
            raise ConfigError(f"EntitlementPlugin: {exc}") from None
        return CustomEntitlement(plugin, timeout=config.entitlement_plugin_timeout / 1000)
    return NoEntitlement()
