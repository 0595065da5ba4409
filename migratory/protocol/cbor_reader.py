"""Reading one operation's CBOR map strictly: the frame's one item, and typed keys.

Sans-I/O, no operation types: :mod:`migratory.protocol.ops` builds its operations with
these. A peer's frame that is not one CBOR map (or has bytes after it, tags an
attacker would use, nesting deeper than an operation needs) is refused with 1007; a key
missing or of the wrong kind with 4000, in a reason that names the key.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

import cbor2

from migratory.model.position import EPOCH_LIMIT, Position
from migratory.model.subject import MAX_SUBJECT_BYTES
from migratory.protocol import close_codes

__all__ = [
    "MAX_INTEGER", "REQUIRED", "OperationError", "Reader", "bad", "load_map",
]


class OperationError(Exception):
    """The peer sent a frame that is not a valid operation."""

    def __init__(self, close: close_codes.CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.close = close
        self.reason = reason


def bad(reason: str) -> OperationError:
    """A 4000 refusal: the map is CBOR but not a valid operation."""
    return OperationError(close_codes.BAD_OPERATION, reason)


MAX_INTEGER = 2**63 - 1


def _refuse_tag(decoder: Any) -> Any:
    raise ValueError("CBOR tags are not allowed in operations")

# Tags a client never needs and an attacker would use: shared values and string
# references (a small frame that decodes to megabytes). Bignums stay: an integer of
# 10**400 is then refused by the key that reads it (4000), naming the key.
_REFUSED_TAGS = {tag: _refuse_tag for tag in (25, 28, 29, 256)}
_MAX_DEPTH = 8  # an operation map, an array of subscription maps, a fields map
# Decoders are reused (building one costs as much as a decode), each with its own input
# buffer, re-filled in place for the next frame: giving a decoder a new ``BytesIO``
# (``decoder.fp = ...``) cost ~0.4 of a publish's ~1.2 µs of decoding. After a failed
# decode the decoder's own read-ahead state is stale (cbor2 6 then panics on the next
# input), so it gets a fresh buffer through ``fp``, which resets it. A pop/append pool
# gives each concurrent caller its own (list.pop and list.append are atomic).
_Pooled = tuple[cbor2.CBORDecoder, io.BytesIO]
_decoders: list[_Pooled] = []


def _new_decoder(object_hook: Callable[..., Any] | None = None) -> _Pooled:
    fp = io.BytesIO(b"")
    decoder = cbor2.CBORDecoder(
        fp,
        semantic_decoders=_REFUSED_TAGS,
        max_depth=_MAX_DEPTH,
        strict_hashable_types=True,
        object_hook=object_hook,
    )
    return decoder, fp


def _strict_decoder() -> _Pooled:
    try:
        return _decoders.pop()
    except IndexError:
        return _new_decoder()


def _strict_load(payload: bytes, object_hook: Callable[..., Any] | None = None) -> Any:
    # with cbor2's ``object_hook``: a decoder for this frame alone (a large frame's,
    # whose decode costs far more than building the decoder), not pooled
    hooked = object_hook is not None
    pooled = decoder, fp = _new_decoder(object_hook) if hooked else _strict_decoder()
    fp.__init__(payload)  # type: ignore[misc]  # refill in place: see _decoders
    try:
        item = decoder.decode()
    except BaseException as exc:
        decoder.fp = fp = io.BytesIO(b"")  # reset the decoder's read-ahead state
        pooled = decoder, fp
        if isinstance(exc, Exception | KeyboardInterrupt | SystemExit):
            raise
        # a Rust panic inside cbor2 is a BaseException: still only "not CBOR"
        raise ValueError(f"the CBOR decoder failed: {exc}") from None
    finally:
        if not hooked:
            _decoders.append(pooled)
    end = fp.tell()
    if end != len(payload):
        raise ValueError(f"{len(payload) - end} bytes follow the CBOR item")
    return item


def load_map(
    payload: bytes, *, whole: bool = False, object_hook: Callable[..., Any] | None = None
) -> dict[Any, Any]:
    """The one CBOR map of a frame; ``whole`` (every peer's frame: a client's, and a
    server's in the SDKs): strictly decoded, and nothing may follow the item (1007).
    ``object_hook``: cbor2's, given each map as it is decoded."""
    try:
        if whole:
            item = _strict_load(payload, object_hook)
        elif object_hook is not None:
            item = cbor2.loads(payload, object_hook=object_hook)
        else:
            item = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises several types; all mean "not CBOR"
        raise OperationError(close_codes.INVALID_PAYLOAD, f"not a CBOR item: {exc}") from None
    if not isinstance(item, dict):
        raise bad(f"expected a CBOR map, got {type(item).__name__}")
    return item


class Reader:
    """Typed access to one operation map; errors name the key."""

    __slots__ = ("body", "where")

    def __init__(self, body: Mapping[Any, Any], where: str) -> None:
        self.body = body
        self.where = where

    def _get(self, key: str, kinds: type | tuple[type, ...], kind_name: str, default: Any) -> Any:
        if key not in self.body:
            if default is REQUIRED:
                raise bad(f"{self.where}: missing key {key!r}")
            return default
        value = self.body[key]
        if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
            raise bad(f"{self.where}: key {key!r} must be {kind_name}")
        return value

    def text(self, key: str, default: Any = None) -> Any:
        return self._get(key, str, "a text string", default)

    def subject(self) -> str:
        """The ``subject`` key; one obviously too long is refused before anything reads it."""
        value: str = self._get("subject", str, "a text string", REQUIRED)
        if len(value) > MAX_SUBJECT_BYTES:
            raise bad(f"{self.where}: key 'subject' is longer than {MAX_SUBJECT_BYTES} bytes")
        return value

    def bytes_(self, key: str) -> bytes:
        value: bytes = self._get(key, bytes, "a byte string", REQUIRED)
        return value

    def integer(
        self, key: str, default: Any = None, *, minimum: int = 0, maximum: int = MAX_INTEGER
    ) -> Any:
        value = self._get(key, int, "an integer", default)
        if isinstance(value, int) and not minimum <= value <= maximum:
            raise bad(f"{self.where}: key {key!r} must be >= {minimum} and <= {maximum}")
        return value

    def served_epoch(self, key: str, default: Any) -> Any:
        """An epoch as a server gives them: from 1 to ``EPOCH_LIMIT - 1`` (docs/protocol.md).
        A client's may be 0 (an unreadable SSE Last-Event-ID: unknown); a server's never
        is, and one that says so is broken, not a position to resume from."""
        return self.integer(key, default, minimum=1, maximum=EPOCH_LIMIT - 1)

    def boolean(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, bool, "a boolean", default)
        return value

    def fields(self, key: str) -> dict[str, str]:
        value = self._get(key, dict, "a map of text to text", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise bad(f"{self.where}: key {key!r} must be a map of text to text")
        return dict(value)

    def position(self, *, served: bool = False) -> Position | None:
        """``epoch`` and ``seq``, both or neither. ``served``: a position a server sent,
        whose epoch is one a server gives (:func:`served_epoch`)."""
        epoch = self.served_epoch("epoch", None) if served else self.integer("epoch")
        seq = self.integer("seq")
        if (epoch is None) != (seq is None):
            raise bad(f"{self.where}: 'epoch' and 'seq' must be given together")
        return None if epoch is None else Position(epoch, seq)

    def array(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, list, "an array", REQUIRED)
        return value


REQUIRED = object()
"""The ``default`` of a key that must be present."""
