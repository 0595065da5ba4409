"""Server-Sent Events, sans-I/O: the stream's response head, its events, its ids.

A stream (``GET /events?subject=A&subject=B``) carries the subjects of its URL.
Every event's ``id`` is the stream's position: one ``epoch:seq`` per subject in
the URL's order, ``-`` for a subject with no position yet, comma-separated
(``7:12,7:3``; a single subject's id is just its position). A browser's
``EventSource`` sends the last one back as ``Last-Event-ID`` when it reconnects
to the same URL, and the server resumes every subject from it.

Events (``data`` is one line of JSON):

- ``message`` -- a message (written without an ``event`` line: ``message`` is
  the type EventSource gives an event that names none): subject, content
  (text) or content_base64, fields, retained, epoch, seq, type (update,
  recovered, snapshot, historical);
- ``subscribe`` / ``deny`` -- SUBSCRIBE_ALLOW / SUBSCRIBE_DENY of a subject;
- ``sync`` / ``resync`` -- DATA_SYNC / DATA_RESYNC after a resume;
- ``close`` -- the server ends the stream (code and reason, as a WebSocket close);
- comments (``: heartbeat``) keep idle connections open through proxies.

A message's ``data`` line is the same for every stream and is encoded once
(:func:`message_lines`); each stream adds its own ``id`` line. Fields are
written ``name:value`` without the optional space after the colon: the format
allows both, and a message event is then ~17 bytes shorter (about 7 % of a
100-byte message's event), which every delivery pays on the wire and on both
sides' CPU.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

from migratory.model.message import Message
from migratory.model.position import Position

__all__ = [
    "MAX_LAST_EVENT_ID",
    "comment",
    "event",
    "event_id",
    "message_lines",
    "parse_event_id",
    "retry",
    "stream_head",
]

MAX_LAST_EVENT_ID = 16384
RESYNC_ALL = None  # parse_event_id's answer to an id it cannot read: resync everything


def stream_head(headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """The response head of a stream: 200, ``text/event-stream``, body until close.

    No ``Content-Length`` and no chunking: the body ends when the connection does
    (RFC 9112 section 6.3), so every event is written as it is, pre-encoded.
    """
    lines = [
        "HTTP/1.1 200 OK",
        "Content-Type: text/event-stream; charset=utf-8",
        "Cache-Control: no-cache, no-store",
        "Connection: close",
        "X-Accel-Buffering: no",
    ]
    for name, value in headers:
        if any(c in name + value for c in "\r\n\0"):
            raise ValueError(f"invalid header {name!r}")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def message_json(message: Message) -> dict[str, object]:
    out: dict[str, object] = {"subject": message.subject}
    try:
        out["content"] = message.content.decode("utf-8")
    except UnicodeDecodeError:
        out["content_base64"] = base64.b64encode(message.content).decode("ascii")
    out.update(
        fields=dict(message.fields),
        retained=message.retained,
        epoch=message.epoch,
        seq=message.seq,
        type=str(message.type),
    )
    return out


def _data(payload: object) -> bytes:
    # json.dumps escapes every line break: one data line
    return b"data:" + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n"


def message_lines(message: Message) -> bytes:
    """A message event's ``data`` line (no ``event`` line: ``message`` is the default
    type); the caller adds the ``id`` line."""
    return _data(message_json(message))


def event(name: str, payload: object) -> bytes:
    """Any other event's ``event`` and ``data`` lines; the caller adds the ``id`` line."""
    return f"event:{name}\n".encode("ascii") + _data(payload)


def event_id(positions: Sequence[Position | Message | None]) -> bytes:
    """The ``id`` line ending an event, and the blank line that dispatches it (a message
    stands for its own position)."""
    text = ",".join("-" if p is None else f"{p.epoch}:{p.seq}" for p in positions)
    return b"id:" + text.encode("ascii") + b"\n\n"


def parse_event_id(text: str, subjects: int) -> list[Position | None] | None:
    """The positions in a ``Last-Event-ID`` for a stream of ``subjects`` subjects;
    None when it cannot be read (wrong count, not numbers): resync every subject."""
    if len(text) > MAX_LAST_EVENT_ID:
        return None
    parts = text.strip().split(",")
    if len(parts) != subjects:
        return None
    positions: list[Position | None] = []
    for part in parts:
        if part == "-":
            positions.append(None)
            continue
        epoch, colon, seq = part.partition(":")
        if not colon or not epoch.isdigit() or not seq.isdigit():
            return None
        if not epoch.isascii() or not seq.isascii() or len(epoch) > 20 or len(seq) > 20:
            return None
        positions.append(Position(int(epoch), int(seq)))
    return positions


def comment(text: str = "heartbeat") -> bytes:
    return b": " + text.replace("\n", " ").replace("\r", " ").encode("utf-8") + b"\n\n"


def retry(milliseconds: int, resumed_from: Sequence[Position | None] | None = None) -> bytes:
    """How long a browser waits before reconnecting, the first block of a stream; a
    resumed stream's also names the positions it resumes from (the ``Last-Event-ID`` it
    was asked with) in an ``id`` line. Every blank line dispatches, and the standard
    (WHATWG HTML, "dispatch the event") then sets the browser's last event id to this
    connection's id buffer, which starts empty: without the ``id`` line, this block or
    a heartbeat before the first event would leave a client that follows it to the
    letter with no id, and its next reconnect would start afresh, silently past what
    it missed. (Chromium carries the old id into the new connection.)"""
    line = f"retry: {int(milliseconds)}\n".encode("ascii")
    return line + (b"\n" if resumed_from is None else event_id(resumed_from))
