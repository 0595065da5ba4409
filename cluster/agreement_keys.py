"""The entitlement's keys as a member tells them to the others: a keyed digest of each.

Two members with one ``Entitlement`` but another token key, issuer, audience, plugin or
``MonitorToken`` accept or deny different clients: a client's rights depend on the
member it lands on. The link's ``Settings`` carry, for each key that decides rights
(:func:`entitlement_keys`), an HMAC-SHA256 of its value -- a key file's *contents*, not
its path; a Custom plugin's module source too -- keyed by ``ClusterPassword`` and cut to
64 bits: enough to tell a difference, nothing to read a secret from (a short
``EntitlementAllowToken`` hashed without the key could be guessed by anyone who reads
the link, which is not encrypted without cluster TLS). The comparison is
:func:`cluster.agreement.entitlement_key_difference`: logged at warning, not refused
(a key rotation rolls out pod by pod).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from migratory.config import Config

DIGEST_HEX = 16  # 64 bits of each HMAC
MAX_KEYS = 16  # what a peer's Settings may carry (the link refuses more)
PLUGIN_CODE = "EntitlementPlugin's code"  # its module's source, when it is a file


def _file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:  # (checked at start: the entitlement could not load without)
        return f"unreadable: {exc.strerror}".encode()


def _plugin_code(plugin: str) -> bytes:
    module = plugin.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = None if spec is None else spec.origin
    return _file(origin) if origin and Path(origin).is_file() else b""


def _values(config: Config) -> dict[str, bytes]:
    """The values that decide a client's rights under this member's ``Entitlement``."""
    values = {"MonitorToken": config.monitor_token.encode()}
    if config.entitlement == "Basic":
        values["EntitlementAllowToken"] = config.entitlement_allow_token.encode()
    elif config.entitlement == "Token":
        values |= {
            "EntitlementTokenAlgorithm": config.entitlement_token_algorithm.encode(),
            "EntitlementTokenKeyFile": (_file(config.entitlement_token_key_file)
                                        if config.entitlement_token_key_file else b""),
            "EntitlementTokenJwksFile": (_file(config.entitlement_token_jwks_file)
                                         if config.entitlement_token_jwks_file else b""),
            "EntitlementTokenIssuer": config.entitlement_token_issuer.encode(),
            "EntitlementTokenAudience": config.entitlement_token_audience.encode(),
        }
    elif config.entitlement == "Custom":
        values |= {
            "EntitlementPlugin": config.entitlement_plugin.encode(),
            "EntitlementPluginOptions": config.entitlement_plugin_options.encode(),
            PLUGIN_CODE: _plugin_code(config.entitlement_plugin),
        }
    return values


def digest(password: str, name: str, value: bytes) -> str:
    mac = hmac.new(password.encode(), b"migratory entitlement key\0" + name.encode() + b"\0",
                   hashlib.sha256)
    mac.update(value)
    return mac.hexdigest()[:DIGEST_HEX]


def entitlement_keys(config: Config) -> tuple[tuple[str, str], ...]:
    """Each key that decides a client's rights here, with its digest, sorted by name."""
    password = config.cluster_password
    return tuple(sorted((name, digest(password, name, value))
                        for name, value in _values(config).items()))


def keys_from_wire(value: object) -> tuple[tuple[str, str], ...]:
    """A peer's ``"ek"`` (``[[name, digest], ...]``), checked; ValueError when malformed."""
    if type(value) is not list or len(value) > MAX_KEYS or not all(
        type(pair) is list and len(pair) == 2
        and all(type(v) is str and 0 < len(v) <= 64 for v in pair) for pair in value
    ):
        raise ValueError(f"at most {MAX_KEYS} [name, digest] pairs of short texts")
    return tuple((name, hexed) for name, hexed in value)
