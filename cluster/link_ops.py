"""The cluster link's operations and framing (see ``cluster/link.py`` for the wire format).

Pure: encode and strictly decode the frames members exchange once authenticated.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, assert_never, cast

import cbor2

from cluster.agreement import MemberLimits, MemberSettings
from cluster.agreement_keys import keys_from_wire
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.coordination import CommittedBatch, PublishRequest, new_publish_request
from cluster.link_faults import LinkError as LinkError  # (re-exported: the link's error)
from cluster.link_faults import is_u64, kind
from cluster.link_messages import decode_message, message_item
from migratory.model.message import Message
from migratory.protocol.ops import Status

MAX_FRAME: Final = 64 * 1024 * 1024
"""Largest frame payload, in bytes (an acceptor takes less: cluster/link_limits.py)."""
MAX_HANDSHAKE_FRAME: Final = 4096
"""Largest frame payload before the peer is authenticated."""
NONCE_SIZE: Final = 16
MAX_MEMBER_BYTES: Final = 1024
_HEADER: Final = 4
_MAC_SIZE: Final = 32


# --- events and operations ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outgoing:  # handshake bytes to write to the peer
    data: bytes


@dataclass(frozen=True, slots=True)
class Authenticated:  # the handshake is complete; ``peer``: the peer's member name
    peer: str


@dataclass(frozen=True, slots=True)
class Forward:
    """Non-seed -> seed: please submit these publications to Raft."""

    requests: tuple[PublishRequest, ...]


@dataclass(frozen=True, slots=True)
class ForwardFailed:
    """Seed -> non-seed: Raft refused these requests, or their outcome is ``unknown``;
    ``status``: what their publishers are answered (a publish the seed's check refuses
    for its size is ``MESSAGE_SIZE_LIMIT_EXCEEDED``, as on a client's own member). On
    the wire as ``"s"``, left out for ``PUBLISH_FAILED`` (the frame of an older member)."""

    origins: tuple[tuple[str, int], ...]
    reason: str
    unknown: bool
    status: Status = Status.PUBLISH_FAILED


@dataclass(frozen=True, slots=True)
class Replicate:
    """Non-seed -> seed: stream the committed batches after ``from_clsn``.

    ``full`` asks for a whole cache sync first: after a gap the non-seed can apply nothing
    until it has one, whatever ``from_clsn`` says.
    """

    from_clsn: int
    full: bool = False


@dataclass(frozen=True, slots=True)
class Batch:  # seed -> non-seed: one committed batch
    batch: CommittedBatch


@dataclass(frozen=True, slots=True)
class SyncRequest:
    """Member -> seed: send your whole message cache, as of batch ``min_clsn`` or later
    (an older one would move the asking member back)."""

    min_clsn: int = 0


@dataclass(frozen=True, slots=True)
class SyncRefused:
    """Seed -> member: no cache sync from here now (this member stands at ``clsn``, it
    is behind the one asked for, or is itself waiting for a sync): ask another."""

    clsn: int
    reason: str


@dataclass(frozen=True, slots=True)
class Sync:  # seed -> non-seed: the whole cache as of ``sync.clsn``
    sync: CacheSync


@dataclass(frozen=True, slots=True)
class SyncPart:
    """Seed -> member: one part of a cache sync too large for one frame
    (:mod:`cluster.link_sync`); the part marked ``last`` completes it. A subject may
    go on from one part into the next (the same subject, epoch and seq; more cached
    messages). :class:`~cluster.link.LinkConnection` puts the parts together and
    yields one :class:`Sync`: no caller sees a part."""

    clsn: int
    subjects: tuple[SubjectSync, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class StandardPublish:
    """Standard delivery mode: a publication forwarded to every member."""

    message: Message


@dataclass(frozen=True, slots=True)
class StandardGoodbye:
    """Standard delivery mode, the last frame of a drained member's link: every forward
    this process numbered went before it on this link or an earlier one (or was told as
    a gap), and it numbers no more (:mod:`cluster.standard_lives`). Sent only to a peer
    whose incarnation says it reads it."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Seed -> non-seed: the seed's last applied clsn and whether it is ready itself
    (a seed replaying its log or cut off from the Raft majority is not); sent after
    the catch-up of a Replicate and every 250 ms of an idle link."""

    clsn: int
    ready: bool = True


@dataclass(frozen=True, slots=True)
class Settings:
    """Either side, first thing after authentication: the cluster settings the two
    members must agree on (:mod:`cluster.agreement`)."""

    settings: MemberSettings


LinkOp = (
    Settings
    | Forward
    | ForwardFailed
    | Replicate
    | Batch
    | SyncRequest
    | SyncRefused
    | Sync
    | SyncPart
    | StandardPublish
    | StandardGoodbye
    | Heartbeat
)
LinkEvent = Outgoing | Authenticated | LinkOp


# --- encoding --------------------------------------------------------------------


def _origin_items(origins: tuple[tuple[str, int], ...]) -> list[list[Any]]:
    return [[origin, ref] for origin, ref in origins]


def _op_map(op: LinkOp) -> dict[str, Any]:
    match op:
        case Forward(requests=requests):
            return {"t": "fw", "r": [[r.origin, r.ref, message_item(r.message)] for r in requests]}
        case ForwardFailed(origins=origins, reason=reason, unknown=unknown, status=status):
            failed = {"t": "ff", "o": _origin_items(origins), "r": reason, "u": unknown}
            if status is not Status.PUBLISH_FAILED:  # only then: see ForwardFailed
                failed["s"] = status.value
            return failed
        case Replicate(from_clsn=from_clsn, full=full):
            return {"t": "rp", "c": from_clsn, "f": full}
        case Batch(batch=b):
            messages = [message_item(m) for m in b.messages]
            body = {"t": "b", "c": b.clsn, "m": messages, "o": _origin_items(b.origins)}
            if b.repeats:  # only then: a batch without is the frame an older member reads
                body["a"] = [list(repeat) for repeat in b.repeats]
            if b.overtaken:  # (the same)
                body["x"] = _origin_items(b.overtaken)
            return body
        case SyncRequest(min_clsn=min_clsn):
            return {"t": "sq", "c": min_clsn}
        case SyncRefused(clsn=clsn, reason=reason):
            return {"t": "sn", "c": clsn, "r": reason}
        case Sync(sync=sync):
            return {"t": "s", "c": sync.clsn, "s": [_subject_sync_item(s) for s in sync.subjects]}
        case SyncPart(clsn=clsn, subjects=subjects, last=last):
            return {"t": "sp", "c": clsn, "s": [_subject_sync_item(s) for s in subjects],
                    "l": last}
        case StandardPublish(message=message):
            return {"t": "p", "m": message_item(message)}
        case StandardGoodbye():
            return {"t": "gb"}
        case Heartbeat(clsn=clsn, ready=ready):
            return {"t": "hb", "c": clsn, "r": ready}
        case Settings(settings=m):
            settings = {"t": "cf", "m": m.member, "l": list(m.members), "k": m.seed_count,
                        "d": m.delivery_mode, "g": m.group_count, "c": m.max_cached,
                        "i": m.incarnation, "n": m.server_name}
            if m.limits is not None:  # only then: without, the frame an older member reads
                settings |= {"mm": m.limits.max_message_size, "mf": m.limits.max_frame_size,
                             "e": m.limits.entitlement, "sx": m.limits.mqtt_session_expiry}
            if m.entitlement_keys is not None:  # (the same: agreement_keys.py)
                settings["ek"] = [list(pair) for pair in m.entitlement_keys]
            return settings
        case _:
            assert_never(op)


def _subject_sync_item(s: SubjectSync) -> list[Any]:
    snapshot = None if s.snapshot is None else message_item(s.snapshot)
    return [s.subject, s.epoch, s.seq, snapshot, [message_item(m) for m in s.cached]]


def _frame(body: dict[str, Any]) -> bytes:
    payload = cbor2.dumps(body)
    if len(payload) > MAX_FRAME:
        raise LinkError(f"frame of {len(payload)} bytes exceeds MAX_FRAME ({MAX_FRAME})")
    return len(payload).to_bytes(_HEADER, "big") + payload


def encode_frame(op: LinkOp) -> bytes:
    """One operation as a whole frame (length prefix included).

    Frames do not depend on the connection: encode once, write to every link.
    Raises :class:`LinkError` when the frame would exceed :data:`MAX_FRAME`.
    """
    return _frame(_op_map(op))


# --- decoding --------------------------------------------------------------------


def _load_map(payload: bytes) -> dict[Any, Any]:
    """Exactly one CBOR map, nothing after it; map keys are text or bytes only."""
    stream = io.BytesIO(payload)
    try:
        item = cbor2.CBORDecoder(
            stream, max_depth=16, allow_duplicate_keys=False, strict_hashable_types=True
        ).decode()
    except Exception as exc:  # cbor2 raises several types; all mean "not one CBOR item"
        raise LinkError(f"frame is not valid CBOR: {str(exc)[:200]}") from None
    if stream.tell() != len(payload):
        raise LinkError(f"frame has {len(payload) - stream.tell()} bytes after its CBOR item")
    if type(item) is not dict:
        raise LinkError(f"frame must be a CBOR map, got {kind(item)}")
    return item


def _tag(body: dict[Any, Any]) -> str:
    tag = body.get("t")
    if type(tag) is not str:
        raise LinkError("frame has no text key 't'")
    return tag


class _Body:
    """Typed access to one frame map that must hold exactly ``keys`` besides ``t``."""

    __slots__ = ("body", "tag")

    def __init__(self, body: dict[Any, Any], tag: str, keys: tuple[str, ...]) -> None:
        self.body = body
        self.tag = tag
        if len(body) != len(keys) + 1 or not all(key in body for key in keys):
            missing = [key for key in keys if key not in body]
            extra = len(body) - 1 - (len(keys) - len(missing))
            raise LinkError(f"{tag!r} frame: missing keys {missing}, {extra} unknown keys")

    def _get(self, key: str, valid: Callable[[Any], bool], what: str) -> Any:
        value = self.body[key]
        if not valid(value):
            raise LinkError(f"{self.tag!r} frame: {key!r} must be {what}")
        return value

    def uint(self, key: str) -> int:
        return cast(int, self._get(key, is_u64, "an unsigned integer < 2**64"))

    def text(self, key: str) -> str:
        return cast(str, self._get(key, lambda v: type(v) is str, "a text string"))

    def binary(self, key: str, size: int) -> bytes:
        valid: Callable[[Any], bool] = lambda v: type(v) is bytes and len(v) == size  # noqa: E731
        return cast(bytes, self._get(key, valid, f"a byte string of {size} bytes"))

    def boolean(self, key: str) -> bool:
        return cast(bool, self._get(key, lambda v: type(v) is bool, "a boolean"))

    def array(self, key: str) -> list[Any]:
        return cast(list[Any], self._get(key, lambda v: type(v) is list, "an array"))

    def member(self, key: str) -> str:
        value = self.text(key)
        if not value or len(value.encode("utf-8")) > MAX_MEMBER_BYTES:
            raise LinkError(f"{self.tag!r} frame: {key!r} must be a member name (host:port)")
        return value

    def message(self, key: str) -> Message:
        return decode_message(self.body[key], f"{self.tag!r} frame: {key!r}")

    def messages(self, key: str) -> tuple[Message, ...]:
        where = f"{self.tag!r} frame: {key!r}"
        return tuple([decode_message(item, where) for item in self.array(key)])

    def origins(self, key: str) -> tuple[tuple[str, int], ...]:
        items = self.array(key)
        for item in items:
            if not (type(item) is list and len(item) == 2 and type(item[0]) is str):
                raise LinkError(f"{self.tag!r} frame: {key!r} must hold [origin, ref] pairs")
            if not is_u64(item[1]):
                raise LinkError(f"{self.tag!r} frame: {key!r}: ref must be an unsigned integer")
        return tuple([(origin, ref) for origin, ref in items])


def _forward(r: _Body) -> Forward:
    requests = []
    for item in r.array("r"):
        if not (type(item) is list and len(item) == 3 and type(item[0]) is str):
            raise LinkError("'fw' frame: 'r' must hold [origin, ref, message] triples")
        origin, ref, message = item
        if not is_u64(ref):
            raise LinkError("'fw' frame: 'r': ref must be an unsigned integer < 2**64")
        where = "'fw' frame: 'r'"
        requests.append(new_publish_request(origin, ref, decode_message(message, where)))
    return Forward(tuple(requests))


def _subject_sync(item: Any, tag: str = "s") -> SubjectSync:
    where = f"{tag!r} frame: 's'"
    if not (type(item) is list and len(item) == 5):
        raise LinkError(f"{where} must hold [subject, epoch, seq, snapshot, cached] arrays")
    subject, epoch, seq, snapshot, cached = item
    if type(subject) is not str or not is_u64(epoch) or not is_u64(seq):
        raise LinkError(f"{where}: bad subject, epoch or seq")
    if type(cached) is not list:
        raise LinkError(f"{where}: cached messages must be an array")
    return SubjectSync(
        subject=subject,
        epoch=epoch,
        seq=seq,
        snapshot=None if snapshot is None else decode_message(snapshot, where),
        cached=tuple([decode_message(m, where) for m in cached]),
    )


def _sync(r: _Body) -> Sync:
    subjects = tuple([_subject_sync(item) for item in r.array("s")])
    return Sync(CacheSync(clsn=r.uint("c"), subjects=subjects))


def _sync_part(r: _Body) -> SyncPart:
    subjects = tuple([_subject_sync(item, "sp") for item in r.array("s")])
    return SyncPart(r.uint("c"), subjects, r.boolean("l"))


def _batch(r: _Body) -> Batch:
    repeats = []
    for item in r.array("a") if "a" in r.body else ():
        if not (type(item) is list and len(item) == 4 and type(item[0]) is str
                and all(is_u64(n) for n in item[1:])):
            raise LinkError("'b' frame: 'a' must hold [origin, ref, epoch, seq] arrays")
        repeats.append((item[0], item[1], item[2], item[3]))
    overtaken = r.origins("x") if "x" in r.body else ()
    return Batch(CommittedBatch(r.uint("c"), r.messages("m"), r.origins("o"), tuple(repeats),
                                overtaken))


FORWARD_FAILED_STATUSES: Final = (
    Status.PUBLISH_FAILED, Status.PUBLISH_DENIED, Status.MESSAGE_SIZE_LIMIT_EXCEEDED)
"""What a ``ForwardFailed`` may answer a publisher (never ``PUBLISH_OK``: that comes
from the committed stream)."""
_FORWARD_FAILED_STATUS: Final = {status.value: status for status in FORWARD_FAILED_STATUSES}


def _forward_failed(r: _Body) -> ForwardFailed:
    status = Status.PUBLISH_FAILED
    if "s" in r.body:
        name = r.text("s")
        if name not in _FORWARD_FAILED_STATUS:
            raise LinkError(f"'ff' frame: 's' must be one of {sorted(_FORWARD_FAILED_STATUS)}")
        status = _FORWARD_FAILED_STATUS[name]
    return ForwardFailed(origins=r.origins("o"), reason=r.text("r"), unknown=r.boolean("u"),
                         status=status)


def _settings(r: _Body) -> Settings:
    members = r.array("l")
    if not all(type(m) is str and m for m in members):
        raise LinkError("'cf' frame: 'l' must hold member names")
    return Settings(MemberSettings(
        member=r.member("m"), members=tuple(members), seed_count=r.uint("k"),
        delivery_mode=r.text("d"), max_cached=r.uint("c"), incarnation=r.text("i"),
        group_count=r.uint("g"), server_name=r.text("n"),
        limits=MemberLimits(r.uint("mm"), r.uint("mf"), r.text("e"), r.uint("sx"))
        if "mm" in r.body else None, entitlement_keys=_keys(r) if "ek" in r.body else None))


def _keys(r: _Body) -> tuple[tuple[str, str], ...]:
    try:
        return keys_from_wire(r.body["ek"])
    except ValueError as exc:
        raise LinkError(f"'cf' frame: 'ek' must be {exc}") from None


_OPS: Final[dict[str, tuple[tuple[str, ...], Callable[[_Body], LinkOp]]]] = {
    "fw": (("r",), _forward),
    "ff": (("o", "r", "u"), _forward_failed),
    "rp": (("c", "f"), lambda r: Replicate(r.uint("c"), r.boolean("f"))),
    "b": (("c", "m", "o"), _batch),
    "sq": (("c",), lambda r: SyncRequest(r.uint("c"))),
    "sn": (("c", "r"), lambda r: SyncRefused(r.uint("c"), r.text("r"))),
    "s": (("c", "s"), _sync),
    "sp": (("c", "s", "l"), _sync_part),
    "p": (("m",), lambda r: StandardPublish(r.message("m"))),
    "gb": ((), lambda r: StandardGoodbye()),
    "hb": (("c", "r"), lambda r: Heartbeat(r.uint("c"), r.boolean("r"))),
    "cf": (("m", "l", "k", "d", "g", "c", "i", "n"), _settings),
}
_HANDSHAKE_KEYS: Final = {"challenge": ("n", "m"), "auth": ("m", "n", "mac"), "welcome": ("mac",)}


def _decode(payload: bytes) -> tuple[str, dict[Any, Any]]:
    body = _load_map(payload)
    return _tag(body), body


def decode_op(payload: bytes) -> LinkOp:
    """One operation from a frame payload (without its length prefix); strict."""
    tag, body = _decode(payload)
    return _op(tag, body)


def _op(tag: str, body: dict[Any, Any]) -> LinkOp:
    if tag not in _OPS:
        if tag in _HANDSHAKE_KEYS:
            raise LinkError(f"handshake frame {tag!r} after authentication")
        raise LinkError(f"unknown frame {tag[:40]!r}")
    keys, build = _OPS[tag]
    if tag == "b":  # the repeats, the overtaken: only in a batch that has some
        keys = ("c", "m", "o", *(k for k in ("a", "x") if k in body))
    elif tag == "ff" and "s" in body:  # the status, only when not PUBLISH_FAILED
        keys = ("o", "r", "u", "s")
    elif tag == "cf":  # the limits, the entitlement's keys: from a member that knows them
        keys = (*keys, *(("mm", "mf", "e", "sx") if "mm" in body else ()),
                *(("ek",) if "ek" in body else ()))
    return build(_Body(body, tag, keys))


# --- the connection ----------------------------------------------------------------
