"""RFC 6455 WebSocket framing, sans-I/O: bytes in, events out; messages in, bytes out.

No extensions are ever negotiated, so every RSV bit must be zero and a server
frame is byte-identical for every subscriber: encode it once with
:func:`encode_binary` and write the same bytes to every socket.

A :class:`FrameDecoder` reads one direction of a connection. The server reads
client frames (which must be masked); a client or load generator reads server
frames (which must not be)::

    decoder = FrameDecoder()
    decoder.receive_data(chunk)
    while (event := decoder.next_event()) is not None:
        ...

A peer that breaks the protocol makes :meth:`FrameDecoder.next_event` raise
:class:`RemoteProtocolError` carrying the close code to answer with; misuse of
the encoding API raises :class:`LocalProtocolError`.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass
from typing import TypeAlias

from migratory.model.frozen import positional_constructor
from migratory.protocol.masking import apply_mask

__all__ = [
    "BINARY",
    "CLOSE",
    "CONTINUATION",
    "GOING_AWAY",
    "INTERNAL_ERROR",
    "INVALID_PAYLOAD",
    "MESSAGE_TOO_BIG",
    "NORMAL",
    "PING",
    "POLICY_VIOLATION",
    "PONG",
    "PROTOCOL_ERROR",
    "TEXT",
    "UNSUPPORTED_DATA",
    "BinaryMessage",
    "CloseReceived",
    "Event",
    "FrameDecoder",
    "LocalProtocolError",
    "Ping",
    "Pong",
    "RemoteProtocolError",
    "TextMessage",
    "encode_binary",
    "encode_close",
    "encode_frame",
    "encode_masked_binary",
    "encode_ping",
    "encode_pong",
    "is_valid_close_code",
]

# Opcodes (RFC 6455 §5.2).
CONTINUATION = 0x0
TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA

# Close codes the transport layer answers with (RFC 6455 §7.4.1).
NORMAL = 1000
GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
UNSUPPORTED_DATA = 1003
INVALID_PAYLOAD = 1007
POLICY_VIOLATION = 1008
MESSAGE_TOO_BIG = 1009
INTERNAL_ERROR = 1011

MAX_CONTROL_PAYLOAD = 125
MAX_CLOSE_REASON = MAX_CONTROL_PAYLOAD - 2


class RemoteProtocolError(Exception):
    """The peer broke RFC 6455; close the connection with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (close code {code})")
        self.code = code
        self.reason = reason


class LocalProtocolError(Exception):
    """The caller misused the codec (e.g. a 200-byte ping, a 4-byte mask of 3 bytes)."""


# --- events -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BinaryMessage:
    """A complete binary message (fragments already joined)."""

    data: bytes


_new_binary = positional_constructor(BinaryMessage)
"""``BinaryMessage(data)`` at half the cost, for every frame a client publishes with."""


@dataclass(frozen=True, slots=True)
class TextMessage:
    """A complete text message, validated UTF-8."""

    text: str


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Pong:
    payload: bytes


@dataclass(frozen=True, slots=True)
class CloseReceived:
    """The peer's close frame; ``code`` is None when the frame had no payload."""

    code: int | None
    reason: str


Event: TypeAlias = BinaryMessage | TextMessage | Ping | Pong | CloseReceived


def is_valid_close_code(code: int) -> bool:
    """Whether ``code`` may appear in a close frame on the wire (RFC 6455 §7.4)."""
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


# --- masking ------------------------------------------------------------------

# --- decoding -----------------------------------------------------------------

_UNPACK_U64 = struct.Struct("!Q").unpack_from
_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


def _fail(code: int, reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(code, reason)


def _first_byte_problem(b0: int) -> str | None:
    """What is wrong with a frame whose first byte (FIN, RSV1-3, opcode) is ``b0``."""
    opcode = b0 & 0x0F
    if b0 & 0x70:
        return "reserved bits set but no extension was negotiated"
    if opcode not in (CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG):
        return f"unknown opcode {opcode:#x}"
    if opcode >= CLOSE and not b0 & 0x80:
        return "fragmented control frame"
    return None


# One lookup instead of three tests on every frame.
_FIRST_BYTE_PROBLEMS: tuple[str | None, ...] = tuple(_first_byte_problem(b) for b in range(256))


class FrameDecoder:
    """Turns one direction of a WebSocket byte stream into :data:`Event` objects.

    ``client_frames=True`` (the server side) requires every frame to be masked;
    ``False`` (a client reading server frames) requires every frame to be
    unmasked. ``max_message_size`` bounds a whole (reassembled) message and is
    checked against the declared frame length before the payload is buffered.

    After :class:`CloseReceived` all further data is ignored. After an error,
    :meth:`next_event` keeps raising the same :class:`RemoteProtocolError`.
    """

    __slots__ = (
        "_buffer",
        "_closed",
        "_error",
        "_fragments",
        "_mask_bit",
        "_max_fragments",
        "_max_message_size",
        "_message_opcode",
        "_message_size",
        "_offset",
        "_text",
        "_text_decoder",
    )

    def __init__(
        self,
        *,
        client_frames: bool = True,
        max_message_size: int = 1 << 20,
        max_fragments: int = 1024,
    ) -> None:
        if max_message_size < 0 or max_fragments < 1:
            raise LocalProtocolError("max_message_size must be >= 0, max_fragments >= 1")
        self._max_fragments = max_fragments
        self._buffer = bytearray()
        self._offset = 0
        self._mask_bit = 0x80 if client_frames else 0
        self._max_message_size = max_message_size
        self._message_opcode = CONTINUATION  # opcode of the fragmented message in progress
        self._message_size = 0
        self._fragments: list[bytes] = []  # binary message in progress
        self._text: list[str] = []  # text message in progress, already decoded
        self._text_decoder: codecs.IncrementalDecoder | None = None
        self._closed = False
        self._error: RemoteProtocolError | None = None

    @property
    def client_frames(self) -> bool:
        """Whether this decoder reads client (masked) frames, i.e. runs in a server."""
        return bool(self._mask_bit)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame or message (the peer can pin this much)."""
        return len(self._buffer) - self._offset + self._message_size

    @property
    def closed(self) -> bool:
        """Whether a close frame has been received (or the peer broke the protocol)."""
        return self._closed

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the peer; they are parsed by :meth:`next_event`."""
        if self._closed:
            return
        if self._offset:
            # CPython deletes from the front of a bytearray in O(1) amortised.
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    def discard(self) -> None:
        """Stop reading: free what is buffered; later data is ignored."""
        self._closed = True
        self._buffer = bytearray()
        self._offset = 0
        self._reset_message()

    def events(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed ``data`` and drain every complete event.

        Raises :class:`RemoteProtocolError` on a protocol error; events decoded
        earlier in the same call are then dropped (use :meth:`next_event` to
        keep them).
        """
        self.receive_data(data)
        out: list[Event] = []
        while (event := self.next_event()) is not None:
            out.append(event)
        return out

    def next_event(self) -> Event | None:
        """The next complete event, or None if more data is needed."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except RemoteProtocolError as exc:
            self._error = exc
            self._closed = True
            self._buffer = bytearray()
            self._offset = 0
            self._reset_message()
            raise

    def _next_event(self) -> Event | None:
        buf = self._buffer
        while True:
            pos = self._offset
            have = len(buf) - pos
            if have < 2:  # (the buffer is emptied on close)
                return None
            b0 = buf[pos]
            b1 = buf[pos + 1]
            problem = _FIRST_BYTE_PROBLEMS[b0]
            if problem is not None:
                raise _fail(PROTOCOL_ERROR, problem)
            if (b1 & 0x80) != self._mask_bit:
                raise _fail(
                    PROTOCOL_ERROR,
                    "client frame is not masked" if self._mask_bit else "server frame is masked",
                )
            opcode = b0 & 0x0F
            length = b1 & 0x7F
            if opcode >= CLOSE:
                if length > MAX_CONTROL_PAYLOAD:
                    raise _fail(PROTOCOL_ERROR, "control frame payload longer than 125 bytes")
            elif (opcode == CONTINUATION) == (self._message_opcode == CONTINUATION):
                raise _fail(
                    PROTOCOL_ERROR,
                    "continuation frame without a message to continue"
                    if opcode == CONTINUATION
                    else "new data frame inside a fragmented message",
                )
            start = pos + 2
            if length == 126:
                if have < 4:
                    return None
                length = (buf[start] << 8) | buf[start + 1]
                start = pos + 4
            elif length == 127:
                if have < 10:
                    return None
                length = _UNPACK_U64(buf, start)[0]
                if length >> 63:
                    raise _fail(PROTOCOL_ERROR, "64-bit payload length has its top bit set")
                start = pos + 10
            if opcode < CLOSE and self._message_size + length > self._max_message_size:
                raise _fail(MESSAGE_TOO_BIG, f"message exceeds {self._max_message_size} bytes")
            if self._mask_bit:
                end = start + 4 + length
                if len(buf) < end:
                    return None
                payload = apply_mask(buf, start + 4, end, buf[start : start + 4])
            else:
                end = start + length
                if len(buf) < end:
                    return None
                payload = bytes(buf[start:end])
            self._offset = end
            if b0 == 0x82:  # FIN + BINARY, the common case: a whole binary message
                return _new_binary(payload)
            if b0 == 0x81:
                try:
                    return TextMessage(payload.decode("utf-8"))
                except UnicodeDecodeError:
                    raise _fail(INVALID_PAYLOAD, "text message is not valid UTF-8") from None
            if opcode >= CLOSE:
                return self._control_event(opcode, payload)
            event = self._fragment(opcode, payload, final=b0 >= 0x80)
            if event is not None:
                return event

    def _fragment(self, opcode: int, payload: bytes, *, final: bool) -> Event | None:
        """Add one frame of a fragmented message; the message once it is complete."""
        if opcode != CONTINUATION:
            self._message_opcode = opcode
            self._message_size = 0
            if opcode == TEXT:
                self._text_decoder = _Utf8Decoder()
        self._message_size += len(payload)
        decoder = self._text_decoder
        if len(self._fragments) + len(self._text) >= self._max_fragments:
            raise _fail(POLICY_VIOLATION, f"message in more than {self._max_fragments} fragments")
        if decoder is None:
            self._fragments.append(payload)
            if not final:
                return None
            event: Event = BinaryMessage(b"".join(self._fragments))
        else:
            try:
                # Decoding each fragment as it arrives fails a bad message early.
                self._text.append(decoder.decode(payload, final))
            except UnicodeDecodeError:
                raise _fail(INVALID_PAYLOAD, "text message is not valid UTF-8") from None
            if not final:
                return None
            event = TextMessage("".join(self._text))
        self._reset_message()
        return event

    def _reset_message(self) -> None:
        self._message_opcode = CONTINUATION
        self._message_size = 0
        self._fragments = []
        self._text = []
        self._text_decoder = None

    def _control_event(self, opcode: int, payload: bytes) -> Event:
        if opcode == PING:
            return Ping(payload)
        if opcode == PONG:
            return Pong(payload)
        event = _parse_close(payload)
        self._closed = True
        self._buffer = bytearray()
        self._offset = 0
        return event


def _parse_close(payload: bytes) -> CloseReceived:
    if not payload:
        return CloseReceived(None, "")
    if len(payload) == 1:
        raise _fail(PROTOCOL_ERROR, "close frame payload of 1 byte")
    code = (payload[0] << 8) | payload[1]
    if not is_valid_close_code(code):
        raise _fail(PROTOCOL_ERROR, f"invalid close code {code}")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(INVALID_PAYLOAD, "close reason is not valid UTF-8") from None
    return CloseReceived(code, reason)


# --- encoding -----------------------------------------------------------------

_PACK_16 = struct.Struct("!BBH").pack
_PACK_64 = struct.Struct("!BBQ").pack
# Pre-built headers of unmasked final binary frames for the sizes most messages have.
_BINARY_HEADER_CACHE = 4096
_BINARY_HEADERS: tuple[bytes, ...] = tuple(
    bytes((0x82, n)) if n < 126 else _PACK_16(0x82, 126, n) for n in range(_BINARY_HEADER_CACHE)
)


def encode_binary(payload: bytes) -> bytes:
    """One unmasked, final binary frame: what the server writes to every subscriber."""
    n = len(payload)
    if n < _BINARY_HEADER_CACHE:
        return _BINARY_HEADERS[n] + payload
    if n < 0x10000:
        return _PACK_16(0x82, 126, n) + payload
    return _PACK_64(0x82, 127, n) + payload


def _header(first: int, mask_bit: int, n: int) -> bytes:
    if n < 126:
        return bytes((first, mask_bit | n))
    if n < 0x10000:
        return _PACK_16(first, mask_bit | 126, n)
    return _PACK_64(first, mask_bit | 127, n)


def encode_frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None = None
) -> bytes:
    """Any single frame; ``mask`` (4 bytes) makes it a client frame."""
    if opcode not in (CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG):
        raise LocalProtocolError(f"unknown opcode {opcode:#x}")
    n = len(payload)
    if opcode >= CLOSE:
        if n > MAX_CONTROL_PAYLOAD:
            raise LocalProtocolError(f"control frame payload of {n} bytes (max 125)")
        if not fin:
            raise LocalProtocolError("control frames cannot be fragmented")
    first = (0x80 if fin else 0) | opcode
    if mask is None:
        return _header(first, 0, n) + payload
    if len(mask) != 4:
        raise LocalProtocolError("the masking key must be 4 bytes")
    return b"".join((_header(first, 0x80, n), mask, apply_mask(payload, 0, n, mask)))


def encode_masked_binary(payload: bytes, mask: bytes) -> bytes:
    """One masked, final binary frame, as a client sends it."""
    return encode_frame(BINARY, payload, mask=mask)


def encode_close(code: int, reason: str = "", *, mask: bytes | None = None) -> bytes:
    """A close frame; ``reason`` is cut to 123 UTF-8 bytes without splitting a character."""
    if not is_valid_close_code(code):
        raise LocalProtocolError(f"close code {code} cannot be sent on the wire")
    raw = reason.encode("utf-8")
    if len(raw) > MAX_CLOSE_REASON:
        raw = raw[:MAX_CLOSE_REASON].decode("utf-8", "ignore").encode("utf-8")
    return encode_frame(CLOSE, code.to_bytes(2, "big") + raw, mask=mask)


def encode_ping(payload: bytes = b"", *, mask: bytes | None = None) -> bytes:
    return encode_frame(PING, payload, mask=mask)


def encode_pong(payload: bytes = b"", *, mask: bytes | None = None) -> bytes:
    return encode_frame(PONG, payload, mask=mask)
