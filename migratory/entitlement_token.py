"""``Entitlement = Token``: a JWT (PyJWT) says what a client may subscribe to and publish.

The server verifies the token's signature with an HS256 secret or RS256/ES256 public
keys (a PEM file, or a JWKS file whose keys are chosen by the token's ``kid``). Claims::

    {"sub": "alice", "exp": 1790000000,
     "subscribe": ["/Stocks/**", "/News/*/Headlines"], "publish": ["/Chat/alice"]}

Patterns: an exact subject; ``*`` as a whole segment matches one segment; a final
``**`` matches one or more segments (``/a/**`` is the subtree below ``/a``). An MQTT
topic filter is allowed only when one pattern covers everything it can match
(``/a/*`` allows ``a/+``, not ``a/#``). A token past its ``exp`` is refused at
``connect`` and, later, ends the session with close ``4503 TOKEN_EXPIRED`` (the SDK
asks its token provider for a fresh one and resumes). Verified tokens are cached
(bounded), so a session's checks cost a dictionary lookup.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

log = logging.getLogger("migratory.entitlement")

ALGORITHMS = ("HS256", "RS256", "ES256")
MAX_CACHED_TOKENS = 10_000
MAX_PATTERNS = 1000


@dataclass(frozen=True, slots=True)
class SubjectPatterns:
    """Subject patterns of one claim, matched segment by segment."""

    patterns: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, claim: Any) -> SubjectPatterns:
        if claim is None:
            return cls(())
        if not isinstance(claim, list) or not all(isinstance(p, str) for p in claim):
            raise ValueError("subject patterns must be a list of strings")
        if len(claim) > MAX_PATTERNS:
            raise ValueError(f"more than {MAX_PATTERNS} subject patterns")
        parsed = []
        for pattern in claim:
            if not pattern.startswith("/"):
                raise ValueError(f"pattern {pattern!r} does not start with '/'")
            segments = tuple(pattern[1:].split("/"))
            if "**" in segments[:-1]:
                raise ValueError(f"pattern {pattern!r}: '**' must be the last segment")
            parsed.append(segments)
        return cls(tuple(parsed))

    def match(self, subject: str) -> bool:
        segments = subject[1:].split("/")
        return any(_match(pattern, segments) for pattern in self.patterns)


def _match(pattern: tuple[str, ...], segments: Sequence[str]) -> bool:
    """Whether ``pattern`` covers every subject ``segments`` names: a subject, or an MQTT
    topic filter (``+`` one level, a final ``#`` any depth), which only ``*`` and a
    ``**`` tail cover -- a filter wider than the pattern would receive subjects the
    token does not grant."""
    tail = bool(pattern) and pattern[-1] == "**"
    head = pattern[:-1] if tail else pattern
    depth = len(head)
    for i, segment in enumerate(segments):
        if i == depth:
            # below the head only a '**' tail covers; a '#' here also matches the
            # subject of `depth` levels itself, which '**' does not (subjects have 2+)
            return tail and not (segment == "#" and depth >= 2)
        if segment == "#":
            return False  # any depth from here, which no pattern before a '**' covers
        allowed = head[i]
        if allowed != "*" and (allowed != segment or segment == "+"):
            return False
    return len(segments) == depth and not tail


@dataclass(frozen=True, slots=True)
class Grant:
    """What one verified token allows."""

    subscribe: SubjectPatterns
    publish: SubjectPatterns
    expires_at: float | None  # seconds since the epoch (the ``exp`` claim)


def load_keys(algorithm: str, key_file: str, jwks_file: str) -> Any:
    """The verification key(s): a secret (HS256), a PEM public key, or a JWKS."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"token algorithm must be one of {', '.join(ALGORITHMS)}")
    if bool(key_file) == bool(jwks_file):
        raise ValueError("set exactly one of EntitlementTokenKeyFile, EntitlementTokenJwksFile")
    if jwks_file:
        if algorithm == "HS256":
            raise ValueError("a JWKS file holds public keys: use RS256 or ES256")
        return jwt.PyJWKSet.from_dict(json.loads(Path(jwks_file).read_text()))
    data = Path(key_file).read_bytes()
    if algorithm == "HS256":
        secret = data.strip()
        if len(secret) < 32:
            raise ValueError("an HS256 secret must be at least 32 bytes")
        return secret
    return data  # PEM; PyJWT loads it with cryptography


class TokenEntitlement:
    name = "Token"

    def __init__(
        self,
        *,
        algorithm: str,
        keys: Any,
        issuer: str = "",
        audience: str = "",
        clock: Any = time.time,
    ) -> None:
        self._algorithm = algorithm
        self._keys = keys
        self._issuer = issuer or None
        self._audience = audience or None
        self._clock = clock
        self._grants: OrderedDict[str, Grant | None] = OrderedDict()

    def grant(self, token: str | None) -> Grant | None:
        """The verified grant of ``token`` (expired or not), None when it is not valid."""
        if not token:
            return None
        cached = self._grants.get(token, False)
        if cached is not False:
            self._grants.move_to_end(token)
            return cached  # type: ignore[return-value]
        grant = self._verify(token)
        self._grants[token] = grant
        if len(self._grants) > MAX_CACHED_TOKENS:
            self._grants.popitem(last=False)
        return grant

    def _verify(self, token: str) -> Grant | None:
        try:
            key = self._keys
            if isinstance(key, jwt.PyJWKSet):
                kid = jwt.get_unverified_header(token).get("kid")
                key = next(k for k in key.keys if k.key_id == kid).key
            claims = jwt.decode(
                token,
                key,
                algorithms=[self._algorithm],
                issuer=self._issuer,
                audience=self._audience,
                options={"verify_exp": False, "require": ["exp"]},
            )
            exp = claims["exp"]
            if not isinstance(exp, int | float):
                raise ValueError("'exp' is not a number")
            return Grant(
                SubjectPatterns.parse(claims.get("subscribe")),
                SubjectPatterns.parse(claims.get("publish")),
                float(exp),
            )
        except (jwt.PyJWTError, ValueError, StopIteration, KeyError, TypeError) as exc:
            log.info("token refused: %s", exc or type(exc).__name__)
            return None

    def _live(self, token: str | None) -> Grant | None:
        grant = self.grant(token)
        if grant is None or (grant.expires_at is not None and grant.expires_at <= self._clock()):
            return None
        return grant

    def expiry(self, client: Any) -> float | None:
        grant = self.grant(client.token)
        return None if grant is None else grant.expires_at

    def allow_connect(self, client: Any) -> bool:
        return self._live(client.token) is not None

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        grant = self._live(client.token)
        return grant is not None and grant.subscribe.match(subject)

    def allow_publish(self, client: Any, subject: str) -> bool:
        grant = self._live(client.token)
        return grant is not None and grant.publish.match(subject)
