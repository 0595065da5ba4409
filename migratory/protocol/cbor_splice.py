"""The two frames of every acknowledged publish -- the delivered ``message`` and the
``publish_status`` -- spliced from pre-encoded pieces instead of a map built and
encoded by ``cbor2.dumps`` each time.

Byte-identical to ``cbor2.dumps`` of the same map (tests/protocol/test_cbor_splice.py
compares them): CBOR's shortest heads, keys in the map's insertion order, definite
lengths. What the splice does not cover (a message with fields, retained or guaranteed;
an integer outside ``[0, 2**64)``; a text that is not valid UTF-8) returns None and the
caller encodes the map with cbor2, as before. Both frames were a sixth of the server's
Python CPU per message at 10,000 subjects (docs/benchmarks.md, issue 13).
"""

from __future__ import annotations

from typing import Final

import cbor2

_UINT, _BYTES, _TEXT = 0x00, 0x40, 0x60
_UINT64_LIMIT: Final = 1 << 64


def _heads(major: int) -> tuple[bytes, ...]:
    """The heads of ``major`` for the arguments below 256, one byte or two."""
    return tuple(bytes((major | n,)) if n < 24 else bytes((major | 24, n)) for n in range(256))


_UINT_HEADS: Final = _heads(_UINT)
_BYTES_HEADS: Final = _heads(_BYTES)
_TEXT_HEADS: Final = _heads(_TEXT)


def _head(major: int, n: int) -> bytes:
    """The head of a CBOR item of ``major`` type with argument ``n`` (0 <= n < 2**64)."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


def uint(n: int) -> bytes:
    """An unsigned integer (``0 <= n < 2**64``)."""
    return _UINT_HEADS[n] if n < 0x100 else _head(_UINT, n)


def text(value: str) -> bytes:
    """A text string; raises UnicodeEncodeError for a lone surrogate."""
    data = value.encode()
    n = len(data)
    return (_TEXT_HEADS[n] if n < 0x100 else _head(_TEXT, n)) + data


def _byte_string_head(n: int) -> bytes:
    return _BYTES_HEADS[n] if n < 0x100 else _head(_BYTES, n)


def _key(name: str) -> bytes:
    return cbor2.dumps(name)


# --- message ----------------------------------------------------------------

_MESSAGE_HEAD: Final = b"\xa6" + _key("op") + _key("message") + _key("subject")
_CONTENT: Final = _key("content")
_EPOCH: Final = _key("epoch")
_SEQ: Final = _key("seq")
_TYPE: Final = _key("type")
_TYPE_VALUES: dict[str, bytes] = {}
_EPOCH_PARTS: dict[int, bytes] = {}  # epoch -> its key and value, and the key of seq
_EPOCH_PARTS_LIMIT: Final = 4096  # a hub has one epoch, more only as subjects restart


def _position(epoch: int, seq: int) -> bytes:
    """``"epoch": epoch, "seq": seq`` (both in ``[0, 2**64)``)."""
    part = _EPOCH_PARTS.get(epoch)
    if part is None:
        if len(_EPOCH_PARTS) >= _EPOCH_PARTS_LIMIT:
            _EPOCH_PARTS.clear()
        part = _EPOCH_PARTS[epoch] = _EPOCH + uint(epoch) + _SEQ
    return part + (_UINT_HEADS[seq] if seq < 0x100 else _head(_UINT, seq))


def plain_message(subject: str, content: bytes, epoch: int, seq: int, kind: str) -> bytes | None:
    """``{"op": "message", "subject", "content", "epoch", "seq", "type"}``: a message
    without fields, not retained, standard QoS; None when the splice does not apply.
    (:func:`text`, :func:`_position` and the byte string's head written out here: three
    calls less, once per message.)"""
    if type(content) is not bytes or not 0 <= epoch < _UINT64_LIMIT or not 0 <= seq < _UINT64_LIMIT:
        return None
    kind_bytes = _TYPE_VALUES.get(kind)
    if kind_bytes is None:
        kind_bytes = _TYPE_VALUES[kind] = _TYPE + cbor2.dumps(kind)
    try:
        name = subject.encode()
    except UnicodeEncodeError:
        return None
    n = len(name)
    size = len(content)
    part = _EPOCH_PARTS.get(epoch)
    return b"".join((
        _MESSAGE_HEAD, _TEXT_HEADS[n] if n < 0x100 else _head(_TEXT, n), name, _CONTENT,
        _BYTES_HEADS[size] if size < 0x100 else _head(_BYTES, size), content,
        part + _UINT_HEADS[seq] if part is not None and seq < 0x100 else _position(epoch, seq),
        kind_bytes,
    ))


# --- publish_status -----------------------------------------------------------

_STATUS_HEAD: Final = _key("op") + _key("publish_status") + _key("status")
_SUBJECT: Final = _key("subject")
_CLOSURE: Final = _key("closure")
_REASON: Final = _key("reason")
_STATUS_VALUES: dict[str, bytes] = {}
_MAP_HEADS: Final = tuple(bytes((0xA0 | n,)) for n in range(24))


_PUBLISH_OK_HEAD: Final = b"\xa6" + _STATUS_HEAD + cbor2.dumps("PUBLISH_OK") + _SUBJECT


def publish_ok(closure: str | None, subject: str, epoch: int, seq: int) -> bytes | None:
    """``publish_status("PUBLISH_OK", subject, closure, epoch, seq, None)`` for a
    ``closure`` (None otherwise), the texts and the position written out: once per
    acknowledged publish."""
    if closure is None or not (0 <= epoch < _UINT64_LIMIT and 0 <= seq < _UINT64_LIMIT):
        return None
    try:
        name = subject.encode()
        tag = closure.encode()
    except UnicodeEncodeError:
        return None
    n = len(name)
    m = len(tag)
    part = _EPOCH_PARTS.get(epoch)
    return b"".join((
        _PUBLISH_OK_HEAD, _TEXT_HEADS[n] if n < 0x100 else _head(_TEXT, n), name, _CLOSURE,
        _TEXT_HEADS[m] if m < 0x100 else _head(_TEXT, m), tag,
        part + _UINT_HEADS[seq] if part is not None and seq < 0x100 else _position(epoch, seq),
    ))


def publish_status(
    status: str, subject: str, closure: str | None, epoch: int | None, seq: int,
    reason: str | None,
) -> bytes | None:
    """``{"op": "publish_status", "status", "subject"[, "closure"][, "epoch", "seq"]
    [, "reason"]}`` (``epoch`` None: no position); None when the splice does not apply."""
    status_bytes = _STATUS_VALUES.get(status)
    if status_bytes is None:
        status_bytes = _STATUS_VALUES[status] = cbor2.dumps(status)
    if epoch is not None and not (0 <= epoch < _UINT64_LIMIT and 0 <= seq < _UINT64_LIMIT):
        return None
    if closure is not None and epoch is not None and reason is None:  # PUBLISH_OK
        try:
            return b"".join((
                b"\xa6", _STATUS_HEAD, status_bytes, _SUBJECT, text(subject), _CLOSURE,
                text(closure), _position(epoch, seq),
            ))
        except UnicodeEncodeError:
            return None
    pairs = 3  # op, status, subject
    parts = [b"", _STATUS_HEAD, status_bytes, _SUBJECT]
    try:
        parts.append(text(subject))
        if closure is not None:
            parts += (_CLOSURE, text(closure))
            pairs += 1
        if epoch is not None:
            parts.append(_position(epoch, seq))
            pairs += 2
        if reason is not None:
            parts += (_REASON, text(reason))
            pairs += 1
    except UnicodeEncodeError:
        return None
    parts[0] = _MAP_HEADS[pairs]
    return b"".join(parts)
