"""Entitlement: who may connect, subscribe and publish.

``Entitlement = None`` allows everything; ``Basic`` lets anyone subscribe and
only holders of ``EntitlementAllowToken`` publish; ``Token`` verifies a JWT
(:mod:`migratory.entitlement_token`); ``Custom`` asks a Python plugin
(:mod:`migratory.entitlement_custom`). All behind the same interface
(:mod:`migratory.entitlement_decisions`, below all three).
Denials become statuses (``SUBSCRIBE_DENY``, ``PUBLISH_DENIED``) or a close code
(``entitlement_decisions.connect_refusal``): ``4003 CONNECT_DENIED`` (terminal),
``4503 TOKEN_EXPIRED`` or ``4504 TOKEN_NOT_YET_VALID`` (the client reconnects, with
a fresh token or later); they are never silent.
"""

from __future__ import annotations

import hmac

from migratory.config import Config, ConfigError
from migratory.entitlement_decisions import ClientIdentity, Entitlement, token_bytes


class NoEntitlement:
    name = "None"

    def expiry(self, client: ClientIdentity) -> float | None:
        return None

    def not_yet_valid(self, client: ClientIdentity) -> float | None:
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

    def not_yet_valid(self, client: ClientIdentity) -> float | None:
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
            if isinstance(exc, PermissionError):
                why += " (give this server's user read access to it)"
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
