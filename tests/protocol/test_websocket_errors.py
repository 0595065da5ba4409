"""RFC 6455 framing of malformed input: local misuse, every protocol error with the close
code it answers, message size limits, garbage.

Well-formed traffic is in test_websocket.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websocket_feeds import FEEDS, MASK, Feed, chunked, client, raw, server

from migratory.protocol.websocket import (
    BINARY,
    INVALID_PAYLOAD,
    MESSAGE_TOO_BIG,
    PING,
    PONG,
    PROTOCOL_ERROR,
    BinaryMessage,
    FrameDecoder,
    LocalProtocolError,
    Ping,
    RemoteProtocolError,
    encode_close,
    encode_frame,
    encode_masked_binary,
    encode_ping,
)


def assert_fails(feed: Feed, data: bytes, code: int, decoder: FrameDecoder | None = None) -> None:
    decoder = decoder or server()
    with pytest.raises(RemoteProtocolError) as info:
        feed(data, decoder)
    assert info.value.code == code
    with pytest.raises(RemoteProtocolError) as again:  # and keeps failing
        decoder.next_event()
    assert again.value is info.value


# --- local misuse --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_frame(0x3, b""),
        lambda: encode_frame(PING, b"x" * 126),
        lambda: encode_frame(PONG, b"", fin=False),
        lambda: encode_frame(BINARY, b"", mask=b"abc"),
        lambda: encode_close(1005),
        lambda: encode_close(999),
        lambda: FrameDecoder(max_message_size=-1),
    ],
)
def test_local_misuse_raises_local_protocol_error(call: Callable[[], object]) -> None:
    with pytest.raises(LocalProtocolError):
        call()


# --- decoding errors and limits ------------------------------------------------------------


def test_events_before_an_error_are_available_through_next_event() -> None:
    decoder = server()
    decoder.receive_data(encode_masked_binary(b"ok", MASK) + raw(0xC2, b""))
    assert decoder.next_event() == BinaryMessage(b"ok")
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()


def test_max_message_size_is_checked_before_the_payload_arrives() -> None:
    decoder = FrameDecoder(max_message_size=1000)
    decoder.receive_data(b"\x82\xfe\x03\xe9")  # declares 1001 bytes; no mask, no payload yet
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.code == MESSAGE_TOO_BIG
    exact = FrameDecoder(max_message_size=1000)
    assert exact.events(encode_masked_binary(b"x" * 1000, MASK)) == [BinaryMessage(b"x" * 1000)]


def test_max_message_size_does_not_limit_control_frames() -> None:
    assert FrameDecoder(max_message_size=0).events(encode_ping(b"x" * 125, mask=MASK)) == [
        Ping(b"x" * 125)
    ]


# Every protocol error with the close code it answers (server side unless noted).
ERRORS = {
    "unmasked client frame": (raw(0x82, b"hi", mask=None), PROTOCOL_ERROR),
    "rsv1": (raw(0xC2, b"hi"), PROTOCOL_ERROR),
    "rsv2": (raw(0xA2, b"hi"), PROTOCOL_ERROR),
    "rsv3": (raw(0x92, b"hi"), PROTOCOL_ERROR),
    "reserved data opcode 3": (raw(0x83, b""), PROTOCOL_ERROR),
    "reserved data opcode 7": (raw(0x87, b""), PROTOCOL_ERROR),
    "reserved control opcode 0xB": (raw(0x8B, b""), PROTOCOL_ERROR),
    "reserved control opcode 0xF": (raw(0x8F, b""), PROTOCOL_ERROR),
    "ping of 126 bytes": (raw(0x89, b"x" * 126), PROTOCOL_ERROR),
    "fragmented ping": (raw(0x09, b"x"), PROTOCOL_ERROR),
    "fragmented close": (raw(0x08, b"\x03\xe8"), PROTOCOL_ERROR),
    "continuation without start": (raw(0x80, b"x"), PROTOCOL_ERROR),
    "unfinished continuation without start": (raw(0x00, b"x"), PROTOCOL_ERROR),
    "new message inside a fragmented one": (raw(0x01, b"a") + raw(0x82, b"b"), PROTOCOL_ERROR),
    "new fragment inside a fragmented one": (raw(0x02, b"a") + raw(0x02, b"b"), PROTOCOL_ERROR),
    "64-bit length with the top bit set": (
        raw(0x82, b"", length=b"\x7f" + struct.pack("!Q", 1 << 63)),
        PROTOCOL_ERROR,
    ),
    "message too big": (raw(0x82, b"x" * 65, length=b"\x7e\x00\x41"), MESSAGE_TOO_BIG),
    "fragments too big together": (raw(0x02, b"x" * 40) + raw(0x80, b"x" * 25), MESSAGE_TOO_BIG),
    "invalid UTF-8 text": (raw(0x81, b"\xff"), INVALID_PAYLOAD),
    "encoded surrogate": (raw(0x81, b"\xed\xa0\x80"), INVALID_PAYLOAD),
    "overlong encoding": (raw(0x81, b"\xc0\xaf"), INVALID_PAYLOAD),
    "truncated UTF-8 at message end": (raw(0x01, b"ok") + raw(0x80, b"\xe2\x82"), INVALID_PAYLOAD),
    "close payload of 1 byte": (raw(0x88, b"\x03"), PROTOCOL_ERROR),
    "close reason not UTF-8": (raw(0x88, b"\x03\xe8\xff"), INVALID_PAYLOAD),
    **{
        f"close code {code}": (raw(0x88, code.to_bytes(2, "big")), PROTOCOL_ERROR)
        for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535)
    },
}


@FEEDS
@pytest.mark.parametrize("name", list(ERRORS))
def test_protocol_errors(feed: Feed, name: str) -> None:
    data, code = ERRORS[name]
    assert_fails(feed, data, code, FrameDecoder(max_message_size=64))


@FEEDS
def test_masked_server_frame_is_rejected_by_client(feed: Feed) -> None:
    assert_fails(feed, encode_masked_binary(b"hi", MASK), PROTOCOL_ERROR, client())


def test_invalid_utf8_in_a_fragment_fails_before_the_message_ends() -> None:
    decoder = server()
    decoder.receive_data(raw(0x01, b"ok\xff"))
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_event()
    assert info.value.code == INVALID_PAYLOAD


# --- garbage -------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    st.booleans(),
    st.sampled_from([b"", b"\x82\x80", b"\x81\xff", b"\x01\x83", b"\x88\x82", b"\x02"]),
    st.binary(max_size=600),
    st.lists(st.integers(1, 64), max_size=20),
    st.integers(0, 300),
)
def test_garbage_only_ever_raises_remote_protocol_error(
    client_frames: bool, prefix: bytes, garbage: bytes, sizes: list[int], limit: int
) -> None:
    decoder = FrameDecoder(client_frames=client_frames, max_message_size=limit)
    try:
        for chunk in chunked(prefix + garbage, sizes):
            decoder.events(chunk)
    except RemoteProtocolError as exc:
        assert exc.code in (PROTOCOL_ERROR, INVALID_PAYLOAD, MESSAGE_TOO_BIG)
