"""The one table of WebSocket close codes used by server and SDKs.

Rule shared with every SDK: a client reconnects after a close whose code has
``reconnect=True`` (and after any connection loss without a close frame,
1006); it gives up on the others, because retrying cannot help.
Application codes: 4000-4499 are terminal, 4500-4999 ask for a reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CloseCode:
    code: int
    name: str
    reconnect: bool
    meaning: str


NORMAL = CloseCode(1000, "NORMAL", False, "the client or server closed the session on purpose")
GOING_AWAY = CloseCode(1001, "GOING_AWAY", True, "the server is shutting down")
PROTOCOL_ERROR = CloseCode(1002, "PROTOCOL_ERROR", False, "malformed WebSocket frame")
UNSUPPORTED_DATA = CloseCode(
    1003, "UNSUPPORTED_DATA", False, "a text frame: the native protocol is binary CBOR"
)
ABNORMAL = CloseCode(1006, "ABNORMAL", True, "connection lost without a close frame (never sent)")
INVALID_PAYLOAD = CloseCode(
    1007, "INVALID_PAYLOAD", False, "frame payload is not one well-formed CBOR item"
)
POLICY_VIOLATION = CloseCode(
    1008, "POLICY_VIOLATION", False, "a message in more than MaxFragmentsPerMessage fragments"
)
MESSAGE_TOO_BIG = CloseCode(1009, "MESSAGE_TOO_BIG", False, "a frame larger than MaxFrameSize")
INTERNAL_ERROR = CloseCode(1011, "INTERNAL_ERROR", True, "unexpected server error (logged)")
TRY_AGAIN_LATER = CloseCode(
    1013,
    "TRY_AGAIN_LATER",
    True,
    "the server cannot take clients yet (starting, syncing), or holds too many incomplete "
    "frames (IncompleteFrameBudget)",
)
BAD_OPERATION = CloseCode(
    4000, "BAD_OPERATION", False, "CBOR is valid but not a valid operation (reason names the key)"
)
NOT_CONNECTED = CloseCode(
    4001, "NOT_CONNECTED", False, "an operation before `connect`, or a second `connect`"
)
CONNECT_DENIED = CloseCode(4003, "CONNECT_DENIED", False, "entitlement refused the connection")
SLOW_CONSUMER = CloseCode(
    4500, "SLOW_CONSUMER", True, "the client read too slowly; its outbox passed the limit"
)
CONNECT_TIMEOUT = CloseCode(
    4501, "CONNECT_TIMEOUT", True, "no `connect` operation within HandshakeTimeout"
)
DRAINED = CloseCode(
    4502,
    "DRAINED",
    True,
    "the server is leaving (drained): every publish it took has its status before this close; "
    "a publish still without one was not taken",
)
TOKEN_EXPIRED = CloseCode(
    4503,
    "TOKEN_EXPIRED",
    True,
    "Entitlement = Token: the session's token expired; reconnect with a fresh one",
)
TOKEN_NOT_YET_VALID = CloseCode(
    4504,
    "TOKEN_NOT_YET_VALID",
    True,
    "Entitlement = Token: the token's nbf is more than 30 s ahead of this server's clock "
    "(the issuer's clock runs ahead); reconnect: it is accepted once its time comes",
)

ALL: tuple[CloseCode, ...] = (
    NORMAL,
    GOING_AWAY,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    ABNORMAL,
    INVALID_PAYLOAD,
    POLICY_VIOLATION,
    MESSAGE_TOO_BIG,
    INTERNAL_ERROR,
    TRY_AGAIN_LATER,
    BAD_OPERATION,
    NOT_CONNECTED,
    CONNECT_DENIED,
    SLOW_CONSUMER,
    CONNECT_TIMEOUT,
    DRAINED,
    TOKEN_EXPIRED,
    TOKEN_NOT_YET_VALID,
)
BY_CODE: dict[int, CloseCode] = {c.code: c for c in ALL}


def should_reconnect(code: int | None) -> bool:
    """Whether a client should reconnect after the server closed with ``code``."""
    if code is None or code == 1005:  # 1005: a close frame without a code
        return True
    known = BY_CODE.get(code)
    if known is not None:
        return known.reconnect
    if 4000 <= code <= 4499:
        return False
    return not (code == 1000 or 1002 <= code <= 1010)
