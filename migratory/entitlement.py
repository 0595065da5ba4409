"""Entitlement: who may connect, subscribe and publish.

``Entitlement = None`` allows everything; ``Basic`` lets anyone subscribe and
only holders of ``EntitlementAllowToken`` publish. Token and Custom (a Python
plugin implementing :class:`Entitlement`) plug in behind the same interface.
Denials become statuses (``SUBSCRIBE_DENY``, ``PUBLISH_DENIED``) or the close
code ``4003 CONNECT_DENIED``; they are never silent.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Protocol

from migratory.config import Config


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


class NoEntitlement:
    name = "None"

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

    def allow_connect(self, client: ClientIdentity) -> bool:
        return True

    def allow_subscribe(self, client: ClientIdentity, subject: str) -> bool:
        return True

    def allow_publish(self, client: ClientIdentity, subject: str) -> bool:
        token = client.token
        return token is not None and hmac.compare_digest(token.encode(), self._allow_token)


def entitlement_from_config(config: Config) -> Entitlement:
    if config.entitlement == "Basic":
        return BasicEntitlement(config.entitlement_allow_token)
    return NoEntitlement()
