"""The HTTP API's JSON, sans-I/O: ``POST /publish`` bodies in, statuses and snapshots out.

``POST /publish`` takes one JSON object::

    {"subject": "/Stocks/NYSE/IBM", "content": "193",      # text, or
     "content_base64": "MTkz",                              # bytes, base64
     "fields": {"volume": "6.62M"}, "retained": true,
     "qos": "standard" | "guaranteed", "token": "..."}

and answers with the publish status and, when published, the position
(:func:`publish_reply`). ``GET /snapshot`` answers with :func:`message_json`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from migratory.model.message import Message, Qos
from migratory.protocol import ops
from migratory.protocol.http import HttpError
from migratory.protocol.sse import message_json

__all__ = ["PublishRequest", "message_json", "parse_publish", "publish_reply", "query_problem"]

_KEYS = frozenset({"subject", "content", "content_base64", "fields", "retained", "qos", "token"})

# The HTTP status of each publish status
STATUS_CODES = {
    ops.Status.PUBLISH_OK: 200,
    ops.Status.PUBLISH_DENIED: 403,
    ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED: 413,
    ops.Status.PUBLISH_FAILED: 503,
}


# The query parameters each API path takes; ``subject`` of /events may repeat
QUERY_PARAMETERS = {
    "/publish": frozenset(),
    "/snapshot": frozenset({"subject", "token", "format"}),
    "/events": frozenset({"subject", "token", "client", "lastEventId"}),
}
FORMATS = ("json",)  # GET /snapshot's format=; without it, the raw content


def query_problem(path: str, params: tuple[tuple[str, str], ...]) -> str | None:
    """Why the query of an API request is refused (400), naming the parameter or value:
    one the path does not take, one given twice (but /events' ``subject``), a ``format``
    other than ``json``. A misspelt parameter is refused, not ignored, as an unknown key
    of a publish's body is."""
    known = QUERY_PARAMETERS[path]
    seen: set[str] = set()
    for name, value in params:
        if name not in known:
            expected = ", ".join(sorted(known)) if known else "none: the body says it all"
            return f"unknown query parameter {name!r} (expected {expected})"
        if name in seen and not (path == "/events" and name == "subject"):
            return f"query parameter {name!r} given twice"
        seen.add(name)
        if name == "format" and value not in FORMATS:
            return f"'format' must be 'json', not {value!r} (without it: the raw content)"
    return None


@dataclass(frozen=True, slots=True)
class PublishRequest:
    message: Message
    token: str | None


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name, default)
    if value is not default and not isinstance(value, kind):
        raise HttpError(400, f"'{name}' must be a {kind.__name__}")
    return value


def parse_publish(data: bytes, closure: str) -> PublishRequest:
    """The message a ``POST /publish`` body asks for; HttpError(400) naming what is wrong."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise HttpError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise HttpError(400, f"unknown key {unknown[0]!r} (expected {', '.join(sorted(_KEYS))})")
    subject = _field(body, "subject", str, None)
    if subject is None:
        raise HttpError(400, "'subject' is required")
    if "content" in body and "content_base64" in body:
        raise HttpError(400, "give 'content' or 'content_base64', not both")
    text = _field(body, "content", str, "")
    content = text.encode("utf-8", "surrogatepass")
    encoded = _field(body, "content_base64", str, None)
    if encoded is not None:
        try:
            content = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise HttpError(400, "'content_base64' is not valid base64") from None
    fields = _field(body, "fields", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        raise HttpError(400, "'fields' must map text to text")
    retained = _field(body, "retained", bool, False)
    qos_text = _field(body, "qos", str, "standard")
    try:
        qos = Qos(qos_text.lower())
    except ValueError:
        raise HttpError(400, "'qos' must be 'standard' or 'guaranteed'") from None
    token = _field(body, "token", str, None)
    message = Message(subject, content, dict(fields), retained, qos, closure)
    return PublishRequest(message, token)


def publish_reply(status: ops.PublishStatus, *, refused: bool = False) -> tuple[int, bytes]:
    """The HTTP status and JSON body answering a publish; ``refused``: the server
    refused it before publishing (a PUBLISH_FAILED then is the client's fault, 400)."""
    out: dict[str, object] = {"status": str(status.status), "subject": status.subject}
    if status.position is not None:
        out.update(epoch=status.position.epoch, seq=status.position.seq)
    if status.reason:
        out["reason"] = status.reason
    code = STATUS_CODES[status.status]
    if status.status is ops.Status.PUBLISH_FAILED and refused:
        code = 400
    return code, json.dumps(out).encode("utf-8") + b"\n"


def json_body(payload: object) -> bytes:
    return json.dumps(payload).encode("utf-8") + b"\n"
