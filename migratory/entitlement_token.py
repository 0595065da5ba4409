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
asks its token provider for a fresh one and resumes); one whose ``nbf`` is still ahead
(past ``NOT_BEFORE_LEEWAY``) with ``4504 TOKEN_NOT_YET_VALID`` (the SDK backs off and
asks again). Verified tokens are cached
(bounded), so a session's checks cost a dictionary lookup.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from migratory import client_lines
from migratory.entitlement_decisions import MAX_TOKEN_CHARS

log = logging.getLogger("migratory.entitlement")

ALGORITHMS = ("HS256", "RS256", "ES256")
MAX_CACHED_TOKENS = 10_000
MAX_PATTERNS = 1000
NOT_BEFORE_LEEWAY = 30.0
"""Seconds an ``nbf`` may lie ahead of this server's clock (the issuer's runs ahead);
also how far ahead an ``iat`` may be before a warning says the clocks disagree."""


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
    not_before: float | None = None  # the ``nbf`` claim: refused until then


def _time_claim(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name!r} is not a finite number")
    try:  # a JSON whole number of 400 digits is a Python int past any float
        seconds = float(value)
    except OverflowError:
        raise ValueError(f"{name!r} is not a finite number") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{name!r} is not a finite number")
    return seconds


PRIVATE_KEY_HELD = (
    "the server verifies tokens with the public key alone, and whoever reads a private "
    "key in its configuration can sign any token; give it the public key"
)
"""PyJWT takes a private key and verifies with its public half: such a file was taken."""


def load_keys(algorithm: str, key_file: str, jwks_file: str) -> Any:
    """The verification key(s): a secret (HS256), a PEM public key, or a JWKS."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"token algorithm must be one of {', '.join(ALGORITHMS)}")
    if bool(key_file) == bool(jwks_file):
        raise ValueError("set exactly one of EntitlementTokenKeyFile, EntitlementTokenJwksFile")
    if jwks_file:
        if algorithm == "HS256":
            raise ValueError("a JWKS file holds public keys: use RS256 or ES256")
        try:  # (json's own words were all it said: 'Expecting value: line 1 column 1')
            jwks = json.loads(Path(jwks_file).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                             "a JWKS is a JSON object with 'keys'") from None
        if not isinstance(jwks, dict):
            raise ValueError("a JWKS is a JSON object with 'keys'")
        keys = jwks.get("keys")
        if isinstance(keys, list) and any(isinstance(k, dict) and "d" in k for k in keys):
            raise ValueError(f"holds a private key ('d'): {PRIVATE_KEY_HELD}")
        try:
            return jwt.PyJWKSet.from_dict(jwks)
        except jwt.PyJWTError as exc:  # no keys, none usable: a traceback at start-up
            raise ValueError(str(exc)) from None
    data = Path(key_file).read_bytes()
    if algorithm != "HS256" and b"PRIVATE KEY-----" in data:
        raise ValueError(f"holds a private key: {PRIVATE_KEY_HELD} (openssl pkey -in "
                         f"{key_file} -pubout -out public.pem)")
    if algorithm == "HS256":
        data = data.strip()
        if len(data) < 32:
            raise ValueError("an HS256 secret must be at least 32 bytes")
    # loaded once here, not at every token -- and a key PyJWT cannot use for the
    # algorithm (garbage, an EC key for RS256, a public key as the HS256 secret) stops
    # start-up: at every token it was refused with one INFO line, and nobody connected
    try:
        return jwt.get_algorithm_by_name(algorithm).prepare_key(data)
    except (jwt.InvalidKeyError, ValueError, TypeError):
        if algorithm == "HS256":
            raise ValueError("the HS256 secret is a key (PEM or SSH), not a shared secret: "
                             "set EntitlementTokenAlgorithm to RS256 or ES256 and give its "
                             "public key") from None
        raise ValueError(f"holds no {algorithm} public key (PEM)") from None


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
        # keyed by the token's SHA-256: 10,000 junk tokens of 64 kB cost 32 bytes each
        self._grants: OrderedDict[bytes, Grant | None] = OrderedDict()

    def grant(self, token: str | None) -> Grant | None:
        """The verified grant of ``token`` (expired or not), None when it is not valid."""
        if not token:
            return None
        if len(token) > MAX_TOKEN_CHARS:
            client_lines.lines.log(log, logging.INFO, "token refused", "token refused: "
                                   "longer than %d characters", MAX_TOKEN_CHARS)
            return None
        digest = hashlib.sha256(token.encode(errors="surrogatepass")).digest()
        cached = self._grants.get(digest, False)
        if cached is not False:
            self._grants.move_to_end(digest)
            return cached  # type: ignore[return-value]
        grant = self._verify(token)
        self._grants[digest] = grant
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
                # exp and nbf are checked at each use (_live), never cached as a
                # refusal; iat says nothing of validity (an issuer's clock ahead of ours)
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                         "require": ["exp"]},
            )
            grant = Grant(
                SubjectPatterns.parse(claims.get("subscribe")),
                SubjectPatterns.parse(claims.get("publish")),
                _time_claim(claims, "exp"),
                _time_claim(claims, "nbf"),
            )
            self._check_issued_at(claims)
            return grant
        except (jwt.PyJWTError, ValueError, StopIteration, KeyError, TypeError) as exc:
            client_lines.lines.log(log, logging.INFO, "token refused", "token refused: %s",
                                   exc or type(exc).__name__)
            return None

    def _check_issued_at(self, claims: dict[str, Any]) -> None:
        """An ``iat`` ahead of this clock past the leeway says this server's clock is
        behind the issuer's -- tokens are then accepted that long past their ``exp`` --
        or the issuer's ahead: said (``iat`` decides nothing; one that is no number is
        ignored, as before)."""
        try:
            issued = _time_claim(claims, "iat")
        except ValueError:
            return
        ahead = None if issued is None else issued - self._clock()
        if ahead is not None and ahead > NOT_BEFORE_LEEWAY:
            client_lines.lines.log(
                log, logging.WARNING, "token iat ahead", "token issued (iat) %.0f s ahead of "
                "this server's clock: this server's clock is behind the issuer's (tokens "
                "are accepted that long past their exp), or the issuer's is ahead; check "
                "both (NTP)", ahead)

    def _live(self, token: str | None) -> Grant | None:
        grant = self.grant(token)
        if grant is None:
            return None
        now = self._clock()
        if grant.expires_at is not None and grant.expires_at <= now:
            return None
        early = _early(grant, now)
        if early is not None:
            client_lines.lines.log(
                log, logging.WARNING, "token nbf ahead", "token refused: not valid before "
                "(nbf) %.0f s from now by this server's clock, past the %.0f s leeway: the "
                "issuer's clock is ahead of this server's, or this one is behind; check "
                "both (NTP)", early, NOT_BEFORE_LEEWAY)
            return None
        return grant

    def expiry(self, client: Any) -> float | None:
        grant = self.grant(client.token)
        return None if grant is None else grant.expires_at

    def not_yet_valid(self, client: Any) -> float | None:
        """Seconds the token's ``nbf`` lies ahead of this clock when past the leeway
        (refused now, accepted once its time comes: close 4504), else None."""
        grant = self.grant(client.token)
        return None if grant is None else _early(grant, self._clock())

    def allow_connect(self, client: Any) -> bool:
        return self._live(client.token) is not None

    def allow_subscribe(self, client: Any, subject: str) -> bool:
        grant = self._live(client.token)
        return grant is not None and grant.subscribe.match(subject)

    def allow_publish(self, client: Any, subject: str) -> bool:
        grant = self._live(client.token)
        return grant is not None and grant.publish.match(subject)


def _early(grant: Grant, now: float) -> float | None:
    """Seconds ``grant``'s ``nbf`` lies ahead of ``now`` when past the leeway (the one
    rule that refuses it, :meth:`TokenEntitlement._live`, and says so, ``not_yet_valid``),
    else None."""
    if grant.not_before is None:
        return None
    ahead = grant.not_before - now
    return ahead if ahead > NOT_BEFORE_LEEWAY else None
