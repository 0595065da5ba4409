"""Native protocol operations: CBOR maps carried in binary WebSocket frames.

Sans-I/O: bytes in, frozen operation objects out, and back. Every frame
carries exactly one CBOR map whose ``"op"`` key names the operation; the
specification with byte-exact examples is ``docs/protocol.md``.

Decoding is strict: a peer that sends something which is not a valid
operation gets an :class:`OperationError` carrying the close code to answer
with and a reason that names the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import cbor2

from migratory.model.frozen import positional_constructor
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.model.subject import MAX_SUBJECT_BYTES
from migratory.protocol import cbor_splice, message_batch
from migratory.protocol.cbor_reader import MAX_INTEGER as MAX_INTEGER  # re-exported
from migratory.protocol.cbor_reader import REQUIRED, Reader, bad, load_map
from migratory.protocol.cbor_reader import OperationError as OperationError  # re-exported
from migratory.protocol.message_batch import decode_message

PROTOCOL_VERSION = 1
"""The highest version this code speaks. A session speaks the lower of the client's
``connect`` version and the server's (``connected`` says which)."""

SERVER_OPS_BY_VERSION: Final[dict[int, frozenset[str]]] = {
    1: frozenset({"connected", "message", "batch", "status", "publish_status", "pong"}),
}
"""The server operations of each protocol version: a server sends a session only those
of the version it negotiated (tests/protocol/test_ops_versions.py pins it), and a
client ignores any other ``op`` (counted), rather than losing its session over it."""


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


PUBLISH_ELSEWHERE = "member is sending this client elsewhere: publish again on another member"
"""The reason of a ``PUBLISH_FAILED`` from a member that drains or moves the client (the
server's drain, migratory/server/drain.py): definitely not published, so the client
publishes it again on another member."""

SUBJECT_STATUSES = frozenset(
    {Status.DATA_SYNC, Status.DATA_RESYNC, Status.SUBSCRIBE_ALLOW, Status.SUBSCRIBE_DENY}
)
PUBLISH_STATUSES = frozenset(Status) - SUBJECT_STATUSES

SUBSCRIBE_TOO_LARGE = "subscribe answer too large"
"""How a ``SUBSCRIBE_DENY`` reason starts when the whole subscribe was refused because
its answer would not fit in the client's outbox: not a refusal of the subject, so the
SDKs ask again for one subject at a time (docs/protocol.md)."""


# --- client -> server -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    client: str = ""
    token: str | None = None
    version: int = PROTOCOL_VERSION
    heartbeat_ms: int | None = None
    """The longest silence the client wants from the server, in ms: a server that knows
    the key answers the interval it grants in ``connected`` (docs/protocol.md)."""


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    subject: str
    position: Position | None = None
    history: int = 0
    conflation_ms: int = 0
    snapshot: bool = False
    """On a resume: the client never got the snapshot its first subscribe's answer owed
    it (the connection was cut after ``SUBSCRIBE_ALLOW``): send the snapshot as of
    ``position`` first (docs/protocol.md, "What a subscribe produces")."""


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
    max_subjects_per_subscribe: int | None = None
    """The server's ``MaxSubjectsPerSubscribe``: a client sends no more entries in one
    ``subscribe`` (a reconnect resubscribes every subject), or it is closed with 4000."""
    heartbeat_ms: int | None = None
    """Granted to a ``connect`` that asked: the server writes something (a ``pong``
    without ``id`` when it has nothing else) at least every this many ms."""


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


@dataclass(frozen=True, slots=True)
class UnknownOp:
    """A server operation that is not of this version (decoded, never sent): a client
    ignores it, as a newer server's new operation must not cost an older client its
    session (it would come again on the next one: a reconnect loop)."""

    name: str


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
    if not message.fields and not message.retained and message.qos is Qos.STANDARD:
        spliced = cbor_splice.plain_message(
            message.subject, message.content, message.epoch, message.seq, message.type._value_
        )
        if spliced is not None:
            return spliced
    return cbor2.dumps({"op": "message", **message_map(message)})


def _position_keys(body: dict[str, Any], position: Position | None) -> None:
    if position is not None:
        body["epoch"] = position.epoch
        body["seq"] = position.seq


def encode_server_op(op: ServerOp) -> bytes:
    if type(op) is PublishStatus:  # the most frequent (one per acknowledged publish)
        return _encode_publish_status(op)
    body: dict[str, Any]
    match op:
        case Connected(server=server, version=version, max_subjects_per_subscribe=most,
                       heartbeat_ms=heartbeat):
            body = {"op": "connected", "server": server, "version": version}
            if most is not None:
                body["max_subjects_per_subscribe"] = most
            if heartbeat is not None:
                body["heartbeat"] = heartbeat
        case Deliver(messages=(single,)):
            return encode_message(single)
        case Deliver(messages=messages):
            body = {"op": "batch", "messages": [message_map(m) for m in messages]}
        case SubjectStatus(status=status, subject=subject, position=position, reason=reason):
            body = {"op": "status", "status": status._value_, "subject": subject}
            _position_keys(body, position)
            if reason is not None:
                body["reason"] = reason
        case PublishStatus():
            return _encode_publish_status(op)
        case Pong(id=ping_id):
            body = {"op": "pong"}
            if ping_id is not None:
                body["id"] = ping_id
    return cbor2.dumps(body)


def _encode_publish_status(op: PublishStatus) -> bytes:
    position = op.position
    spliced = cbor_splice.publish_status(
        op.status._value_, op.subject, op.closure,
        None if position is None else position.epoch, 0 if position is None else position.seq,
        op.reason,
    )
    return cbor2.dumps(publish_status_map(op)) if spliced is None else spliced


def encode_publish_ok(closure: str | None, subject: str, epoch: int, seq: int) -> bytes:
    """``encode_server_op(PublishStatus(PUBLISH_OK, closure, subject, Position(epoch,
    seq)))`` without making the status and its position (the local publish path's
    acknowledgement, once per publish)."""
    spliced = cbor_splice.publish_ok(closure, subject, epoch, seq)
    if spliced is not None:
        return spliced
    return _encode_publish_status(
        PublishStatus(Status.PUBLISH_OK, closure, subject, Position(epoch, seq))
    )


def publish_status_map(op: PublishStatus) -> dict[str, Any]:
    """The CBOR map of a ``publish_status`` (what :func:`_encode_publish_status` splices)."""
    body: dict[str, Any] = {"op": "publish_status", "status": op.status._value_,
                            "subject": op.subject}
    if op.closure is not None:
        body["closure"] = op.closure
    position = op.position
    if position is not None:
        body["epoch"] = position.epoch
        body["seq"] = position.seq
    if op.reason is not None:
        body["reason"] = op.reason
    return body


def encode_client_op(op: ClientOp) -> bytes:
    body: dict[str, Any]
    match op:
        case Connect(client=client, token=token, version=version, heartbeat_ms=heartbeat):
            body = {"op": "connect", "version": version, "client": client}
            if token is not None:
                body["token"] = token
            if heartbeat is not None:
                body["heartbeat"] = heartbeat
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
    if request.snapshot:
        body["snapshot"] = True
    return body


# --- decoding ---------------------------------------------------------------


MAX_SUBSCRIPTIONS_PER_OP = 10_000
MAX_CONFLATION_MS = 3_600_000
"""A conflation period longer than an hour is refused (4000)."""


def decode_client_op(payload: bytes) -> ClientOp:
    """Decode one client frame payload; raises :class:`OperationError`."""
    body = load_map(payload, whole=True)
    name = body.get("op")
    if not isinstance(name, str):
        raise bad("missing text key 'op'")
    if name == "publish":
        fast = _fast_publish(body)
        if fast is not None:
            return fast
    r = Reader(body, name)
    if name == "publish":
        qos_name = r.text("qos", "standard")
        if qos_name not in ("standard", "guaranteed"):
            raise bad("publish: key 'qos' must be 'standard' or 'guaranteed'")
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
            raise bad(
                "unsubscribe: key 'subjects' must be an array of text strings of at most "
                f"{MAX_SUBJECT_BYTES} bytes"
            )
        return Unsubscribe(tuple(subjects))
    if name == "connect":
        return Connect(
            client=r.text("client", ""),
            token=r.text("token"),
            version=r.integer("version", PROTOCOL_VERSION, minimum=1),
            heartbeat_ms=r.integer("heartbeat", minimum=1),
        )
    if name == "ping":
        return Ping(r.integer("id"))
    raise bad(f"unknown op {name!r}")


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


def _bounded(r: Reader, key: str) -> list[Any]:
    items = r.array(key)
    if not items:
        raise bad(f"{r.where}: key {key!r} must not be empty")
    if len(items) > MAX_SUBSCRIPTIONS_PER_OP:
        raise bad(f"{r.where}: key {key!r} has more than {MAX_SUBSCRIPTIONS_PER_OP} entries")
    return items


def _decode_subscription(item: Any) -> SubscriptionRequest:
    if not isinstance(item, dict):
        raise bad("subscribe: each entry of 'subjects' must be a map")
    r = Reader(item, "subscribe")
    return SubscriptionRequest(
        subject=r.subject(),
        position=r.position(),
        history=r.integer("history", 0),
        conflation_ms=r.integer("conflation", 0, maximum=MAX_CONFLATION_MS),
        snapshot=r.boolean("snapshot", False),
    )


def decode_server_op(payload: bytes) -> ServerOp | UnknownOp:
    """Decode one server frame payload (used by SDKs and tests). An ``op`` that is not
    of :data:`PROTOCOL_VERSION` is an :class:`UnknownOp`; a known one that is malformed
    raises :class:`OperationError`."""
    body = message_batch.load_server_map(payload)
    name = body.get("op")
    if not isinstance(name, str):
        raise bad("missing text key 'op'")
    r = Reader(body, name)
    if name == "message":
        return Deliver((decode_message(body),))
    if name == "batch":  # a large one's messages are decoded already
        return Deliver(tuple(m if type(m) is Message else decode_message(m)
                             for m in r.array("messages")))
    if name == "status":
        return SubjectStatus(
            status=_status(r.text("status", REQUIRED)),
            subject=r.text("subject", REQUIRED),
            position=r.position(served=True),
            reason=r.text("reason"),
        )
    if name == "publish_status":
        return PublishStatus(
            status=_status(r.text("status", REQUIRED)),
            closure=r.text("closure"),
            subject=r.text("subject", REQUIRED),
            position=r.position(served=True),
            reason=r.text("reason"),
        )
    if name == "connected":
        return Connected(
            server=r.text("server", ""),
            version=r.integer("version", 1),
            max_subjects_per_subscribe=r.integer("max_subjects_per_subscribe", minimum=1),
            heartbeat_ms=r.integer("heartbeat", minimum=1),
        )
    if name == "pong":
        return Pong(r.integer("id"))
    return UnknownOp(name[:40])


def _status(name: str) -> Status:
    try:
        return Status(name)
    except ValueError:
        raise bad(f"unknown status {name!r}") from None
