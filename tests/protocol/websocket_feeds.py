"""Frame decoders, the three ways to feed them, and hand-built frames for the websocket tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from migratory.protocol.websocket import Event, FrameDecoder, encode_binary, encode_masked_binary

MASK = bytes.fromhex("37fa213d")  # the RFC 6455 §5.7 masking key


def drain(decoder: FrameDecoder) -> list[Event]:
    events = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events


def feed_whole(data: bytes, decoder: FrameDecoder) -> list[Event]:
    return decoder.events(data)


def feed_bytewise(data: bytes, decoder: FrameDecoder) -> list[Event]:
    events = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        events += drain(decoder)
    return events


def feed_with_trailing(data: bytes, decoder: FrameDecoder) -> list[Event]:
    # The start of another frame must stay buffered, not be reported or rejected.
    if decoder.client_frames:
        trailing = encode_masked_binary(b"next", MASK)[:7]
    else:
        trailing = encode_binary(b"next")[:4]
    events = decoder.events(data + trailing)
    assert decoder.next_event() is None
    return events


FEEDS = pytest.mark.parametrize(
    "feed", [feed_whole, feed_bytewise, feed_with_trailing], ids=["whole", "bytewise", "trailing"]
)
Feed = Callable[[bytes, FrameDecoder], list[Event]]


def server() -> FrameDecoder:
    return FrameDecoder(client_frames=True)


def client() -> FrameDecoder:
    return FrameDecoder(client_frames=False)


def raw(
    first: int, payload: bytes, *, mask: bytes | None = MASK, length: bytes | None = None
) -> bytes:
    """A frame built by hand, for frames the encoder refuses to make."""
    length = length or (
        bytes((len(payload),)) if len(payload) < 126 else b"\x7e" + len(payload).to_bytes(2, "big")
    )
    head = bytes((first, (0x80 if mask else 0) | length[0])) + length[1:]
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def chunked(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, i = [], 0
    for size in sizes:
        chunks.append(data[i : i + size])
        i += size
    chunks.append(data[i:])
    return chunks
