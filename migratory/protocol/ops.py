"""Native protocol operations: CBOR maps carried in binary WebSocket frames.

Sans-I/O: bytes in, frozen operation objects out, and back. Every frame
carries exactly one CBOR map whose ``"op"`` key names the operation; the
specification with byte-exact examples is ``docs/protocol.md``.

Decoding is strict: a peer that sends something which is not a valid
operation gets an :class:`OperationError` carrying the close code to answer
with and a reason that names the offending key.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import cbor2

from migratory.model.frozen import positional_constructor
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.model.subject import MAX_SUBJECT_BYTES
from migratory.protocol import close_codes

PROTOCOL_VERSION = 1


class OperationError(Exception):
    """The peer sent a frame that is not a valid operation."""

    def __init__(self, close: close_codes.CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.close = close
        self.reason = reason


class Status(StrEnum):
    """Client notifications and publish statuses (MigratoryData names)."""

    DATA_SYNC = "DATA_SYNC"
    DATA_RESYNC = "DATA_RESYNC"
    SUBSCRIBE_ALLOW = "SUBSCRIBE_ALLOW"
    SUBSCRIBE_DENY = "SUBSCRIBE_DENY"
    PUBLISH_OK = "PUBLISH_OK"
    PUBLISH_FAILED = "PUBLISH_FAILED"
    PUBLISH_DENIED = "PUBLISH_DENIED"
    MESSAGE_SIZE_LIMIT_EXCEEDED = "MESSAGE_SIZE_LIMIT_EXCEEDED"


SUBJECT_STATUSES = frozenset(
    {Status.DATA_SYNC, Status.DATA_RESYNC, Status.SUBSCRIBE_ALLOW, Status.SUBSCRIBE_DENY}
)
PUBLISH_STATUSES = frozenset(Status) - SUBJECT_STATUSES


# --- client -> server -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    client: str = ""
    token: str | None = None
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    subject: str
    position: Position | None = None
    history: int = 0
    conflation_ms: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    subscriptions: tuple[SubscriptionRequest, ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    subjects: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Publish:
    message: Message


new_publish = positional_constructor(Publish)


@dataclass(frozen=True, slots=True)
class Ping:
    id: int | None = None


ClientOp = Connect | Subscribe | Unsubscribe | Publish | Ping


# --- server -> client -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connected:
    server: str
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Deliver:
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class SubjectStatus:
    status: Status
    subject: str
    position: Position | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PublishStatus:
    status: Status
    closure: str | None
    subject: str
    position: Position | None = None
    reason: str | None = None


new_publish_status = positional_constructor(PublishStatus)
"""``PublishStatus(...)`` with all five fields, for the publish path (see
:mod:`migratory.model.frozen`)."""


@dataclass(frozen=True, slots=True)
class Pong:
    id: int | None = None


ServerOp = Connected | Deliver | SubjectStatus | PublishStatus | Pong


# --- encoding ---------------------------------------------------------------


def message_map(message: Message) -> dict[str, Any]:
    """The CBOR map of a delivered message (no ``op`` key)."""
    body: dict[str, Any] = {"subject": message.subject, "content": message.content}
    if message.fields:
        body["fields"] = dict(message.fields)
    if message.retained:
        body["retained"] = True
    if message.qos is Qos.GUARANTEED:
        body["qos"] = "guaranteed"
    body["epoch"] = message.epoch
    body["seq"] = message.seq
    body["type"] = message.type._value_
    return body


def encode_message(message: Message) -> bytes:
    """One delivered message as a frame payload: the server's hot path, done once."""
    body = message_map(message)
    return cbor2.dumps({"op": "message", **body})


def _position_keys(body: dict[str, Any], position: Position | None) -> None:
    if position is not None:
        body["epoch"] = position.epoch
        body["seq"] = position.seq


def encode_server_op(op: ServerOp) -> bytes:
    body: dict[str, Any]
    match op:
        case Connected(server=server, version=version):
            body = {"op": "connected", "server": server, "version": version}
        case Deliver(messages=(single,)):
            return encode_message(single)
        case Deliver(messages=messages):
            body = {"op": "batch", "messages": [message_map(m) for m in messages]}
        case SubjectStatus(status=status, subject=subject, position=position, reason=reason):
            body = {"op": "status", "status": status._value_, "subject": subject}
            _position_keys(body, position)
            if reason is not None:
                body["reason"] = reason
        case PublishStatus(status=status, closure=closure, subject=subject):
            body = {"op": "publish_status", "status": status._value_, "subject": subject}
            if closure is not None:
                body["closure"] = closure
            _position_keys(body, op.position)
            if op.reason is not None:
                body["reason"] = op.reason
        case Pong(id=ping_id):
            body = {"op": "pong"}
            if ping_id is not None:
                body["id"] = ping_id
    return cbor2.dumps(body)


def encode_client_op(op: ClientOp) -> bytes:
    body: dict[str, Any]
    match op:
        case Connect(client=client, token=token, version=version):
            body = {"op": "connect", "version": version, "client": client}
            if token is not None:
                body["token"] = token
        case Subscribe(subscriptions=subscriptions):
            body = {"op": "subscribe", "subjects": [_subscription_map(s) for s in subscriptions]}
        case Unsubscribe(subjects=subjects):
            body = {"op": "unsubscribe", "subjects": list(subjects)}
        case Publish(message=message):
            body = {"op": "publish", "subject": message.subject, "content": message.content}
            if message.fields:
                body["fields"] = dict(message.fields)
            if message.retained:
                body["retained"] = True
            if message.qos is Qos.GUARANTEED:
                body["qos"] = "guaranteed"
            if message.closure is not None:
                body["closure"] = message.closure
        case Ping(id=ping_id):
            body = {"op": "ping"}
            if ping_id is not None:
                body["id"] = ping_id
    return cbor2.dumps(body)


def _subscription_map(request: SubscriptionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"subject": request.subject}
    _position_keys(body, request.position)
    if request.history:
        body["history"] = request.history
    if request.conflation_ms:
        body["conflation"] = request.conflation_ms
    return body


# --- decoding ---------------------------------------------------------------


def _bad(reason: str) -> OperationError:
    return OperationError(close_codes.BAD_OPERATION, reason)


MAX_SUBSCRIPTIONS_PER_OP = 10_000
MAX_INTEGER = 2**63 - 1
MAX_CONFLATION_MS = 3_600_000
"""A conflation period longer than an hour is refused (4000)."""


def _refuse_tag(decoder: Any) -> Any:
    raise ValueError("CBOR tags are not allowed in operations")


# Tags a client never needs and an attacker would use: shared values and string
# references (a small frame that decodes to megabytes). Bignums stay: an integer of
# 10**400 is then refused by the key that reads it (4000), naming the key.
_REFUSED_TAGS = {tag: _refuse_tag for tag in (25, 28, 29, 256)}
_MAX_DEPTH = 8  # an operation map, an array of subscription maps, a fields map
# Decoders are reused (building one costs as much as a decode); a pop/append pool gives
# each concurrent caller its own (list.pop and list.append are atomic).
_decoders: list[cbor2.CBORDecoder] = []


def _strict_decoder() -> cbor2.CBORDecoder:
    try:
        return _decoders.pop()
    except IndexError:
        return cbor2.CBORDecoder(
            io.BytesIO(b""),
            semantic_decoders=_REFUSED_TAGS,
            max_depth=_MAX_DEPTH,
            strict_hashable_types=True,
        )


def _load_map(payload: bytes, *, whole: bool = False) -> dict[Any, Any]:
    """The one CBOR map of a frame; ``whole`` (client frames): strictly decoded, and
    nothing may follow the item (1007)."""
    try:
        if whole:
            decoder = _strict_decoder()
            decoder.fp = fp = io.BytesIO(payload)
            try:
                item = decoder.decode()
            finally:
                _decoders.append(decoder)
            if fp.tell() != len(payload):
                raise ValueError(f"{len(payload) - fp.tell()} bytes follow the CBOR item")
        else:
            item = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises several types; all mean "not CBOR"
        raise OperationError(close_codes.INVALID_PAYLOAD, f"not a CBOR item: {exc}") from None
    if not isinstance(item, dict):
        raise _bad(f"expected a CBOR map, got {type(item).__name__}")
    return item


class _Reader:
    """Typed access to one operation map; errors name the key."""

    __slots__ = ("body", "where")

    def __init__(self, body: Mapping[Any, Any], where: str) -> None:
        self.body = body
        self.where = where

    def _get(self, key: str, kinds: type | tuple[type, ...], kind_name: str, default: Any) -> Any:
        if key not in self.body:
            if default is _REQUIRED:
                raise _bad(f"{self.where}: missing key {key!r}")
            return default
        value = self.body[key]
        if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
            raise _bad(f"{self.where}: key {key!r} must be {kind_name}")
        return value

    def text(self, key: str, default: Any = None) -> Any:
        return self._get(key, str, "a text string", default)

    def subject(self) -> str:
        """The ``subject`` key; one obviously too long is refused before anything reads it."""
        value: str = self._get("subject", str, "a text string", _REQUIRED)
        if len(value) > MAX_SUBJECT_BYTES:
            raise _bad(f"{self.where}: key 'subject' is longer than {MAX_SUBJECT_BYTES} bytes")
        return value

    def bytes_(self, key: str) -> bytes:
        value: bytes = self._get(key, bytes, "a byte string", _REQUIRED)
        return value

    def integer(
        self, key: str, default: Any = None, *, minimum: int = 0, maximum: int = MAX_INTEGER
    ) -> Any:
        value = self._get(key, int, "an integer", default)
        if isinstance(value, int) and not minimum <= value <= maximum:
            raise _bad(f"{self.where}: key {key!r} must be >= {minimum} and <= {maximum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, bool, "a boolean", default)
        return value

    def fields(self, key: str) -> dict[str, str]:
        value = self._get(key, dict, "a map of text to text", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise _bad(f"{self.where}: key {key!r} must be a map of text to text")
        return dict(value)

    def position(self) -> Position | None:
        epoch = self.integer("epoch")
        seq = self.integer("seq")
        if (epoch is None) != (seq is None):
            raise _bad(f"{self.where}: 'epoch' and 'seq' must be given together")
        return None if epoch is None else Position(epoch, seq)

    def array(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, list, "an array", _REQUIRED)
        return value


_REQUIRED = object()


def decode_client_op(payload: bytes) -> ClientOp:
    """Decode one client frame payload; raises :class:`OperationError`."""
    body = _load_map(payload, whole=True)
    name = body.get("op")
    if not isinstance(name, str):
        raise _bad("missing text key 'op'")
    if name == "publish":
        fast = _fast_publish(body)
        if fast is not None:
            return fast
    r = _Reader(body, name)
    if name == "publish":
        qos_name = r.text("qos", "standard")
        if qos_name not in ("standard", "guaranteed"):
            raise _bad("publish: key 'qos' must be 'standard' or 'guaranteed'")
        message = Message(
            subject=r.subject(),
            content=r.bytes_("content"),
            fields=r.fields("fields"),
            retained=r.boolean("retained", False),
            qos=Qos(qos_name),
            closure=r.text("closure"),
        )
        return Publish(message)
    if name == "subscribe":
        return Subscribe(tuple(_decode_subscription(item) for item in _bounded(r, "subjects")))
    if name == "unsubscribe":
        subjects = _bounded(r, "subjects")
        if not all(isinstance(s, str) and len(s) <= MAX_SUBJECT_BYTES for s in subjects):
            raise _bad(
                "unsubscribe: key 'subjects' must be an array of text strings of at most "
                f"{MAX_SUBJECT_BYTES} bytes"
            )
        return Unsubscribe(tuple(subjects))
    if name == "connect":
        return Connect(
            client=r.text("client", ""),
            token=r.text("token"),
            version=r.integer("version", PROTOCOL_VERSION, minimum=1),
        )
    if name == "ping":
        return Ping(r.integer("id"))
    raise _bad(f"unknown op {name!r}")


_QOS_BY_NAME: Final = {"standard": Qos.STANDARD, "guaranteed": Qos.GUARANTEED}
_ABSENT: Final = object()


def _fast_publish(body: dict[Any, Any]) -> Publish | None:
    """A publish of the usual shape, decoded with a few lookups (decoding was a quarter of
    a publish's CPU); None sends anything else through the checks that name what is
    wrong."""
    subject = body.get("subject")
    content = body.get("content")
    if type(subject) is not str or type(content) is not bytes or len(subject) > MAX_SUBJECT_BYTES:
        return None
    fields = body.get("fields", _ABSENT)
    if fields is _ABSENT:
        fields = {}
    elif type(fields) is not dict or not all(
        type(k) is str and type(v) is str for k, v in fields.items()
    ):
        return None
    retained = body.get("retained", False)
    qos_name = body.get("qos", "standard")  # may be a list (unhashable): test its type first
    qos = _QOS_BY_NAME.get(qos_name) if type(qos_name) is str else None
    closure = body.get("closure", _ABSENT)
    if closure is _ABSENT:
        closure = None
    elif type(closure) is not str:
        return None
    if type(retained) is not bool or qos is None:
        return None
    return new_publish(new_message(subject, content, fields, retained, qos, closure, 0, 0,
                                   MessageType.UPDATE))


def _bounded(r: _Reader, key: str) -> list[Any]:
    items = r.array(key)
    if not items:
        raise _bad(f"{r.where}: key {key!r} must not be empty")
    if len(items) > MAX_SUBSCRIPTIONS_PER_OP:
        raise _bad(f"{r.where}: key {key!r} has more than {MAX_SUBSCRIPTIONS_PER_OP} entries")
    return items


def _decode_subscription(item: Any) -> SubscriptionRequest:
    if not isinstance(item, dict):
        raise _bad("subscribe: each entry of 'subjects' must be a map")
    r = _Reader(item, "subscribe")
    return SubscriptionRequest(
        subject=r.subject(),
        position=r.position(),
        history=r.integer("history", 0),
        conflation_ms=r.integer("conflation", 0, maximum=MAX_CONFLATION_MS),
    )


def decode_server_op(payload: bytes) -> ServerOp:
    """Decode one server frame payload (used by SDKs and tests)."""
    body = _load_map(payload)
    name = body.get("op")
    if not isinstance(name, str):
        raise _bad("missing text key 'op'")
    r = _Reader(body, name)
    if name == "message":
        return Deliver((_decode_message(body),))
    if name == "batch":
        return Deliver(tuple(_decode_message(m) for m in r.array("messages")))
    if name == "status":
        return SubjectStatus(
            status=_status(r.text("status", _REQUIRED)),
            subject=r.text("subject", _REQUIRED),
            position=r.position(),
            reason=r.text("reason"),
        )
    if name == "publish_status":
        return PublishStatus(
            status=_status(r.text("status", _REQUIRED)),
            closure=r.text("closure"),
            subject=r.text("subject", _REQUIRED),
            position=r.position(),
            reason=r.text("reason"),
        )
    if name == "connected":
        return Connected(server=r.text("server", ""), version=r.integer("version", 1))
    if name == "pong":
        return Pong(r.integer("id"))
    raise _bad(f"unknown op {name!r}")


def _status(name: str) -> Status:
    try:
        return Status(name)
    except ValueError:
        raise _bad(f"unknown status {name!r}") from None


def _decode_message(item: Any) -> Message:
    if not isinstance(item, dict):
        raise _bad("message: expected a map")
    r = _Reader(item, "message")
    type_name = r.text("type", "update")
    qos_name = r.text("qos", "standard")
    try:
        message_type = MessageType(type_name)
        qos = Qos(qos_name)
    except ValueError:
        raise _bad(f"message: unknown type {type_name!r} or qos {qos_name!r}") from None
    return Message(
        subject=r.text("subject", _REQUIRED),
        content=r.bytes_("content"),
        fields=r.fields("fields"),
        retained=r.boolean("retained", False),
        qos=qos,
        epoch=r.integer("epoch", 0),
        seq=r.integer("seq", 0),
        type=message_type,
    )
