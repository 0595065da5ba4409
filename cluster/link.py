"""The cluster link: the sans-I/O codec of the TCP link between cluster members.

Bytes in, events out, and back; no sockets, no trio (``cluster/link_io.py`` is the
adapter). One :class:`LinkConnection` per TCP connection.

Framing: every frame is a 4-byte big-endian payload length followed by exactly one
CBOR map whose ``"t"`` key names the frame. Payloads above the connection's
``max_frame`` (at most :data:`MAX_FRAME`; an acceptor's
:func:`cluster.link_limits.accepted_frame_limit`, a connector's
:func:`cluster.link_limits.connected_frame_limit`) and, before authentication, above
:data:`MAX_HANDSHAKE_FRAME` are refused from their length prefix.

Handshake (``ClusterPassword``, HMAC-SHA256, 16-byte nonces; members are ``host:port``;
``v`` the link protocol version, :data:`cluster.link_limits.LINK_VERSION`)::

    acceptor  -> {"t": "challenge", "n": nonce_a, "m": member_a[, "v": v]}
    connector -> {"t": "auth", "m": member_c, "n": nonce_c[, "v": v],
                  "mac": HMAC(pw, b"migratory-link-<v>|accept|" + nonce_a + member_c)}
    acceptor  -> {"t": "welcome",
                  "mac": HMAC(pw, b"migratory-link-<v>|connect|" + nonce_c + member_a)}

``"v"`` is left out for version 1 (the members before versions, byte for byte). The
connector refuses a challenge of another version, the acceptor an auth of another
version (:class:`~cluster.link_limits.VersionMismatch`, saying both versions).

Operations, once authenticated (every key always present, no other keys)::

    {"t": "fw", "r": [[origin, ref, M], ...]}                 Forward
    {"t": "ff", "o": [[origin, ref], ...], "r": reason, "u": unknown}   ForwardFailed
          (+ "s": status when it is not PUBLISH_FAILED, and only then)
    {"t": "rp", "c": from_clsn, "f": full}                     Replicate
    {"t": "b",  "c": clsn, "m": [M, ...], "o": [[origin, ref], ...]}    Batch
          (+ "a": [[origin, ref, epoch, seq], ...] when it has repeats, and only then)
          (+ "x": [[origin, ref], ...] when it has overtaken requests, and only then)
    {"t": "sq", "c": min_clsn}                                 SyncRequest
    {"t": "sn", "c": clsn, "r": reason}                        SyncRefused
    {"t": "s",  "c": clsn, "s": [[subject, epoch, seq, M | null, [M, ...]], ...]}  Sync
    {"t": "sp", "c": clsn, "s": [...as in "s"...], "l": last}  SyncPart (cluster/link_sync.py)
    {"t": "p",  "m": M}                                        StandardPublish
    {"t": "gb"}             StandardGoodbye (only to a peer that reads it: standard_lives)
    {"t": "hb", "c": clsn, "r": ready}                         Heartbeat
    {"t": "cf", "m": member, "l": [member, ...], "k": seed_count, "d": delivery_mode,
     "g": group_count, "c": max_cached, "i": incarnation, "n": server_name}  Settings
          (+ "mm": MaxMessageSize, "mf": MaxFrameSize, "e": Entitlement,
           "sx": MqttSessionExpiry, all or none:
           a connector sends them, an acceptor only to a connector that sent them)
          (+ "ek": [[key, digest], ...], the entitlement's keys (cluster/agreement_keys.py),
           sent as the limits are)

``Settings`` is the first operation each side sends (the connector first, the acceptor
in answer); each compares the other's with its own (:func:`cluster.agreement.disagreement`)
and closes the link when they disagree. An acceptor takes a link whose first operation
is another one as from an older migratory (nothing compared).

A message ``M`` is an 8-item array
``[subject, content, fields, flags, closure | null, epoch, seq, type]``: ``content`` a
byte string, ``fields`` a map of text to text, ``flags`` bit 0 retained and bit 1
guaranteed qos, ``type`` 0 update, 1 snapshot, 2 recovered, 3 historical. Integers
(clsn, ref, epoch, seq) are unsigned and below 2**64.

Decoding is strict: anything else is a :class:`LinkError` naming what is wrong.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from collections.abc import Callable
from typing import Any, Final, Literal

from cluster.link_limits import (
    FORWARD_BYTES,
    LINK_VERSION,
    TLS_PROBE_ALPN,
    FrameTooLarge,
    LinkViolation,
    TlsProbe,
    VersionMismatch,
    accepted_frame_limit,
    connected_frame_limit,
    mac_label,
    version_refusal,
)
from cluster.link_ops import (
    _HANDSHAKE_KEYS,
    _HEADER,
    _MAC_SIZE,
    MAX_FRAME,
    MAX_HANDSHAKE_FRAME,
    MAX_MEMBER_BYTES,
    NONCE_SIZE,
    Authenticated,
    Batch,
    Forward,
    ForwardFailed,
    Heartbeat,
    LinkError,
    LinkEvent,
    LinkOp,
    Outgoing,
    Replicate,
    Settings,
    StandardGoodbye,
    StandardPublish,
    Sync,
    SyncPart,
    SyncRefused,
    SyncRequest,
    _Body,
    _decode,
    _frame,
    decode_op,
    encode_frame,
)
from cluster.link_sync import SyncAssembly, sync_frames

__all__ = [
    "FORWARD_BYTES",
    "LINK_VERSION",
    "MAX_FRAME",
    "MAX_HANDSHAKE_FRAME",
    "TLS_PROBE_ALPN",
    "Authenticated",
    "Batch",
    "Forward",
    "ForwardFailed",
    "FrameTooLarge",
    "Heartbeat",
    "LinkConnection",
    "LinkError",
    "LinkEvent",
    "LinkOp",
    "LinkViolation",
    "Outgoing",
    "Replicate",
    "Settings",
    "StandardGoodbye",
    "StandardPublish",
    "Sync",
    "SyncPart",
    "SyncRefused",
    "SyncRequest",
    "TlsProbe",
    "VersionMismatch",
    "accepted_frame_limit",
    "connected_frame_limit",
    "decode_op",
    "encode_frame",
    "sync_frames",
]


class _State(enum.Enum):
    IDLE = "idle"
    AWAIT_CHALLENGE = "await_challenge"
    AWAIT_AUTH = "await_auth"
    AWAIT_WELCOME = "await_welcome"
    OPEN = "open"
    FAILED = "failed"


# Handshake transitions: state -> (the one frame accepted there, the state after it).
_HANDSHAKE: Final = {
    _State.AWAIT_CHALLENGE: ("challenge", _State.AWAIT_WELCOME),
    _State.AWAIT_AUTH: ("auth", _State.OPEN),
    _State.AWAIT_WELCOME: ("welcome", _State.OPEN),
}
_FIRST_STATE: Final = {"accept": _State.AWAIT_AUTH, "connect": _State.AWAIT_CHALLENGE}
_PROBE: Final = TLS_PROBE_ALPN.encode()  # in a probe's ClientHello (its ALPN list)


def _mac(key: bytes, label: bytes, nonce: bytes, member: str) -> bytes:
    return hmac.new(key, label + nonce + member.encode("utf-8"), hashlib.sha256).digest()


class LinkConnection:
    """One side of one cluster link.

    Call :meth:`initiate` once and write what it returns; feed received bytes to
    :meth:`receive_data`; drain :meth:`next_event` until it returns None. During the
    handshake it yields :class:`Outgoing` (bytes to write) and then
    :class:`Authenticated`; after that, operations. :meth:`send` encodes operations
    once authenticated. A :class:`LinkError` from :meth:`next_event` is final: close.
    """

    def __init__(
        self,
        *,
        role: Literal["accept", "connect"],
        member: str,
        password: str,
        nonce_source: Callable[[int], bytes] = os.urandom,
        max_frame: int = MAX_FRAME,
        version: int = LINK_VERSION,
    ) -> None:
        """``max_frame``: the largest frame taken once authenticated; ``version``: the
        link protocol version spoken (another only in tests: an older or newer member)."""
        if role not in _FIRST_STATE:
            raise ValueError(f"role must be 'accept' or 'connect', not {role!r}")
        if not password:
            raise ValueError("the cluster link needs a non-empty ClusterPassword")
        if not member or len(member.encode("utf-8")) > MAX_MEMBER_BYTES:
            raise ValueError(f"member must be a host:port name, not {member!r}")
        if not 0 < max_frame <= MAX_FRAME:
            raise ValueError(f"max_frame must be from 1 to {MAX_FRAME}, not {max_frame}")
        self.role = role
        self.member = member
        self.max_frame = max_frame
        self.version = version
        self._key = password.encode("utf-8")
        self._nonce_source = nonce_source
        self._nonce = b""
        self._state = _State.IDLE
        self._buffer = bytearray()
        self._pending: list[LinkEvent] = []
        self._peer: str | None = None
        self._challenger = ""
        self._failure: LinkError | None = None
        self._assembly = SyncAssembly()  # a cache sync in parts (cluster/link_sync.py)

    @property
    def authenticated(self) -> bool:
        """Whether :class:`Authenticated` has been returned (ops may be sent)."""
        return self._peer is not None

    @property
    def peer(self) -> str | None:
        """The authenticated peer's member name."""
        return self._peer

    def initiate(self) -> bytes:
        """Start the handshake: the acceptor's challenge; b"" for the connector."""
        if self._state is not _State.IDLE:
            raise ValueError("initiate() was already called")
        self._state = _FIRST_STATE[self.role]
        if self.role == "connect":
            return b""
        self._nonce = self._fresh_nonce()
        return _frame(self._versioned({"t": "challenge", "n": self._nonce, "m": self.member}))

    def receive_data(self, data: bytes) -> None:
        """Bytes received from the peer."""
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as whole frames (a frame begun, when not 0
        and :meth:`next_event` returned None)."""
        return len(self._buffer)

    def next_event(self) -> LinkEvent | None:
        """The next event, or None until more data arrives; raises :class:`LinkError`."""
        if self._pending:
            return self._pop_pending()
        if self._failure is not None:
            raise self._failure
        if self._state is _State.IDLE:
            raise ValueError("call initiate() before next_event()")
        try:
            while True:
                payload = self._next_payload()
                if payload is None:
                    return None
                if self._state is not _State.OPEN:
                    return self._handshake(payload)
                op = decode_op(payload)
                if type(op) is not SyncPart:
                    if self._assembly.open:
                        raise LinkError(
                            f"{type(op).__name__} in the middle of a cache sync in parts"
                        )
                    return op
                sync = self._assembly.add(op)  # LinkError if the part does not fit
                if sync is not None:
                    return Sync(sync)
        except LinkError as exc:
            self._state = _State.FAILED
            self._failure = exc
            raise

    def send(self, op: LinkOp) -> bytes:
        """The frame of ``op``; only once authenticated."""
        if not self.authenticated or self._state is not _State.OPEN:
            raise ValueError(f"cannot send {type(op).__name__}: the link is not authenticated")
        return encode_frame(op)

    def send_encoded(self, frame: bytes) -> bytes:
        """``frame`` (from :func:`encode_frame`, shared by every link); only once
        authenticated."""
        if not self.authenticated or self._state is not _State.OPEN:
            raise ValueError("cannot send a frame: the link is not authenticated")
        return frame

    def _pop_pending(self) -> LinkEvent:
        event = self._pending.pop(0)
        if isinstance(event, Authenticated):
            self._peer = event.peer
        return event

    def _fresh_nonce(self) -> bytes:
        nonce = self._nonce_source(NONCE_SIZE)
        if type(nonce) is not bytes or len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce_source must return {NONCE_SIZE} bytes")
        return nonce

    def _next_payload(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) < _HEADER:
            return None
        size = int.from_bytes(buffer[:_HEADER], "big")
        limit = self.max_frame if self._state is _State.OPEN else MAX_HANDSHAKE_FRAME
        if size > limit:
            what = "frame" if self._state is _State.OPEN else "authentication failed: frame"
            tls = ""
            if self._state is not _State.OPEN and buffer[:2] == b"\x16\x03":  # a ClientHello
                if _PROBE in buffer:
                    raise TlsProbe("a TLS probe: a member that heard nothing from this one "
                                   "asked whether its cluster links are TLS (they are not)")
                tls = (" (a TLS handshake: ClusterTlsCertificate, ClusterTlsKey and "
                       "ClusterTlsCa are set on that member, not here)")
            raise FrameTooLarge(f"{what} of {size} bytes exceeds the limit of {limit}{tls}",
                                size, limit)
        end = _HEADER + size
        if len(buffer) < end:
            return None
        payload = bytes(buffer[_HEADER:end])
        del buffer[:end]
        return payload

    def _handshake(self, payload: bytes) -> LinkEvent:
        expected, next_state = _HANDSHAKE[self._state]
        try:
            tag, body = _decode(payload)
            if tag != expected:
                raise LinkError(f"expected {expected!r}, got {tag[:40]!r}")
            keys = _HANDSHAKE_KEYS[tag]
            if tag != "welcome" and "v" in body:
                keys = (*keys, "v")
            r = _Body(body, tag, keys)
            if tag == "challenge":
                self._on_challenge(r)
            elif tag == "auth":
                self._on_auth(r)
            else:
                self._on_welcome(r)
        except VersionMismatch:
            raise
        except LinkError as exc:
            raise LinkError(f"authentication failed: {exc.reason}") from None
        self._state = next_state
        return self._pop_pending()

    def _versioned(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.version != 1:  # version 1 leaves it out: what members before versions read
            body["v"] = self.version
        return body

    def _check_version(self, r: _Body, peer: str) -> None:
        theirs = r.uint("v") if "v" in r.body else 1
        if theirs != self.version:
            raise VersionMismatch(version_refusal(peer[:80], theirs, self.version))

    def _on_challenge(self, r: _Body) -> None:
        """Connector: answer the acceptor's challenge, remember who it claims to be."""
        nonce_a = r.binary("n", NONCE_SIZE)
        self._challenger = r.member("m")
        self._check_version(r, self._challenger)
        self._nonce = self._fresh_nonce()
        mac = _mac(self._key, mac_label(self.version, b"accept"), nonce_a, self.member)
        auth = {"t": "auth", "m": self.member, "n": self._nonce, "mac": mac}
        self._pending.append(Outgoing(_frame(self._versioned(auth))))

    def _on_auth(self, r: _Body) -> None:
        """Acceptor: check the connector's proof, prove ourselves back."""
        member_c, nonce_c = r.member("m"), r.binary("n", NONCE_SIZE)
        self._check_version(r, member_c)
        expected = _mac(self._key, mac_label(self.version, b"accept"), self._nonce, member_c)
        if not hmac.compare_digest(r.binary("mac", _MAC_SIZE), expected):
            raise LinkError(f"bad mac from {member_c[:80]!r} (wrong ClusterPassword or replay)")
        mac = _mac(self._key, mac_label(self.version, b"connect"), nonce_c, self.member)
        self._pending += [Outgoing(_frame({"t": "welcome", "mac": mac})), Authenticated(member_c)]

    def _on_welcome(self, r: _Body) -> None:
        """Connector: check the acceptor's proof."""
        expected = _mac(self._key, mac_label(self.version, b"connect"), self._nonce,
                        self._challenger)
        if not hmac.compare_digest(r.binary("mac", _MAC_SIZE), expected):
            raise LinkError(
                f"bad mac from {self._challenger[:80]!r} (wrong ClusterPassword or replay)"
            )
        self._pending.append(Authenticated(self._challenger))
