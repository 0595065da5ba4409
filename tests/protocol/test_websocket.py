"""RFC 6455 framing of well-formed traffic: byte-exact examples, encoding, decoding,
properties, wsproto interop.

Malformed input, local misuse and size limits are in test_websocket_errors.py.
"""

from __future__ import annotations

import ast
import struct
from pathlib import Path
from typing import Any

import pytest
import wsproto
import wsproto.events as wse
from hypothesis import given, settings
from hypothesis import strategies as st
from websocket_feeds import FEEDS, MASK, Feed, chunked, client, feed_bytewise, raw, server

from migratory.protocol import websocket as ws
from migratory.protocol.http import (
    check_handshake_response,
    handshake_request,
    handshake_response,
    new_websocket_key,
)
from migratory.protocol.http_server import RequestParser
from migratory.protocol.websocket import (
    BINARY,
    CLOSE,
    CONTINUATION,
    TEXT,
    BinaryMessage,
    CloseReceived,
    Event,
    FrameDecoder,
    Ping,
    Pong,
    TextMessage,
    encode_binary,
    encode_close,
    encode_frame,
    encode_masked_binary,
    encode_ping,
    encode_pong,
)

# --- RFC 6455 §5.7 examples, byte for byte ------------------------------------------------


@FEEDS
def test_rfc_single_frame_unmasked_text(feed: Feed) -> None:
    frame = bytes.fromhex("810548656c6c6f")
    assert encode_frame(TEXT, b"Hello") == frame
    assert feed(frame, client()) == [TextMessage("Hello")]


@FEEDS
def test_rfc_single_frame_masked_text(feed: Feed) -> None:
    frame = bytes.fromhex("818537fa213d7f9f4d5158")
    assert encode_frame(TEXT, b"Hello", mask=MASK) == frame
    assert feed(frame, server()) == [TextMessage("Hello")]


@FEEDS
def test_rfc_fragmented_unmasked_text(feed: Feed) -> None:
    frames = bytes.fromhex("010348656c") + bytes.fromhex("80026c6f")
    assert encode_frame(TEXT, b"Hel", fin=False) + encode_frame(CONTINUATION, b"lo") == frames
    assert feed(frames, client()) == [TextMessage("Hello")]


@FEEDS
def test_rfc_ping_and_masked_pong(feed: Feed) -> None:
    ping = bytes.fromhex("890548656c6c6f")
    pong = bytes.fromhex("8a8537fa213d7f9f4d5158")
    assert encode_ping(b"Hello") == ping
    assert encode_pong(b"Hello", mask=MASK) == pong
    assert feed(ping, client()) == [Ping(b"Hello")]
    assert feed(pong, server()) == [Pong(b"Hello")]


@FEEDS
def test_rfc_256_byte_binary(feed: Feed) -> None:
    payload = bytes(range(256))
    frame = encode_binary(payload)
    assert frame[:4] == bytes.fromhex("827e0100")
    assert frame[4:] == payload
    assert feed(frame, client()) == [BinaryMessage(payload)]


@FEEDS
def test_rfc_64k_binary(feed: Feed) -> None:
    payload = bytes(range(256)) * 256
    frame = encode_binary(payload)
    assert frame[:10] == bytes.fromhex("827f0000000000010000")
    assert frame[10:] == payload
    if feed is not feed_bytewise:  # 64 Ki single-byte feeds are slow and say nothing new
        assert feed(frame, client()) == [BinaryMessage(payload)]


# --- encoding -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 4095, 4096, 65535, 65536, 70000])
def test_encode_binary_matches_encode_frame(size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    assert encode_binary(payload) == encode_frame(BINARY, payload)
    assert client().events(encode_binary(payload)) == [BinaryMessage(payload)]


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 150, 511, 512, 513, 1025, 4099, 70001])
def test_masked_round_trip_across_unmask_strategies(size: int) -> None:
    payload = bytes((i * 7) % 256 for i in range(size))
    mask = b"\x01\x80\xfe\x7f"
    frame = encode_masked_binary(payload, mask)
    assert frame[len(frame) - size :] == bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert server().events(frame) == [BinaryMessage(payload)]


def test_encode_close_truncates_on_a_utf8_boundary() -> None:
    frame = encode_close(1000, "é" * 100)  # 200 bytes of UTF-8
    assert frame[:2] == bytes((0x88, 2 + 122))
    assert client().events(frame) == [CloseReceived(1000, "é" * 61)]
    frame = encode_close(1001, "x" * 200, mask=MASK)
    assert server().events(frame) == [CloseReceived(1001, "x" * 123)]
    assert encode_close(1000) == b"\x88\x02\x03\xe8"


# --- decoding -------------------------------------------------------------------------------


@FEEDS
def test_control_frames_interleaved_in_fragmented_message(feed: Feed) -> None:
    data = (
        encode_frame(BINARY, b"ab", fin=False, mask=MASK)
        + encode_ping(b"p1", mask=MASK)
        + encode_frame(CONTINUATION, b"", fin=False, mask=MASK)
        + encode_pong(b"p2", mask=MASK)
        + encode_frame(CONTINUATION, b"cd", mask=MASK)
        + encode_masked_binary(b"ef", MASK)
    )
    expected = [Ping(b"p1"), Pong(b"p2"), BinaryMessage(b"abcd"), BinaryMessage(b"ef")]
    assert feed(data, server()) == expected


@FEEDS
def test_text_split_inside_a_character(feed: Feed) -> None:
    payload = "€uro".encode()
    data = encode_frame(TEXT, payload[:1], fin=False, mask=MASK) + encode_frame(
        CONTINUATION, payload[1:], mask=MASK
    )
    assert feed(data, server()) == [TextMessage("€uro")]


@FEEDS
def test_non_minimal_lengths_are_accepted(feed: Feed) -> None:
    data = raw(0x82, b"abc", length=b"\x7e\x00\x03") + raw(
        0x82, b"de", length=b"\x7f" + struct.pack("!Q", 2)
    )
    assert feed(data, server()) == [BinaryMessage(b"abc"), BinaryMessage(b"de")]


@FEEDS
@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1011, 1012, 1014, 3000, 4000, 4999])
def test_valid_close_codes(feed: Feed, code: int) -> None:
    assert feed(encode_close(code, "bye", mask=MASK), server()) == [CloseReceived(code, "bye")]


@FEEDS
def test_empty_close_and_data_after_close_is_ignored(feed: Feed) -> None:
    decoder = server()
    assert feed(encode_frame(CLOSE, b"", mask=MASK) + b"\xff\xff garbage", decoder) == [
        CloseReceived(None, "")
    ]
    assert decoder.closed
    assert decoder.events(encode_masked_binary(b"late", MASK) + b"\x00garbage") == []


# --- properties -----------------------------------------------------------------------------

messages = st.one_of(
    st.binary(max_size=1500).map(BinaryMessage), st.text(max_size=200).map(TextMessage)
)
masks = st.binary(min_size=4, max_size=4)


@st.composite
def frame_streams(draw: st.DrawFn) -> tuple[bool, bytes, list[Event]]:
    """Messages encoded with random fragmentation and pings between fragments."""
    masked = draw(st.booleans())
    sent = draw(st.lists(messages, max_size=6))
    stream = bytearray()
    expected: list[Event] = []
    for message in sent:
        if isinstance(message, BinaryMessage):
            opcode, payload = BINARY, message.data
        else:
            opcode, payload = TEXT, message.text.encode()
        cuts = sorted(draw(st.lists(st.integers(0, len(payload)), max_size=4)))
        bounds = [0, *cuts, len(payload)]
        for i in range(len(bounds) - 1):
            last = i == len(bounds) - 2
            mask = draw(masks) if masked else None
            stream += encode_frame(
                opcode if i == 0 else CONTINUATION,
                payload[bounds[i] : bounds[i + 1]],
                fin=last,
                mask=mask,
            )
            if not last and draw(st.booleans()):
                ping = draw(st.binary(max_size=125))
                stream += encode_ping(ping, mask=draw(masks) if masked else None)
                expected.append(Ping(ping))
        expected.append(message)
    return masked, bytes(stream), expected


@settings(max_examples=300, deadline=None)
@given(frame_streams(), st.lists(st.integers(1, 300), max_size=40))
def test_any_frame_stream_in_any_chunks_decodes_to_the_messages(
    case: tuple[bool, bytes, list[Event]], sizes: list[int]
) -> None:
    masked, stream, expected = case
    decoder = FrameDecoder(client_frames=masked)
    events: list[Event] = []
    for chunk in chunked(stream, sizes):
        events += decoder.events(chunk)
    assert events == expected


# --- interop with wsproto -------------------------------------------------------------------


def wsproto_client_connected() -> wsproto.WSConnection:
    conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    hello = conn.send(wse.Request(host="example.com", target="/", subprotocols=["migratory.cbor"]))
    request = RequestParser().receive_data(hello)
    assert request is not None and request.is_websocket_upgrade
    conn.receive_data(handshake_response(request))
    (accepted,) = conn.events()
    assert isinstance(accepted, wse.AcceptConnection) and accepted.subprotocol == "migratory.cbor"
    return conn


@FEEDS
def test_wsproto_client_frames_decode(feed: Feed) -> None:
    conn = wsproto_client_connected()
    big = bytes(range(256)) * 40
    data = b"".join(
        [
            conn.send(wse.BytesMessage(data=b"\xa1bopcping")),
            conn.send(wse.BytesMessage(data=big[:1000], message_finished=False)),
            conn.send(wse.Ping(payload=b"are you there")),
            conn.send(wse.BytesMessage(data=big[1000:], message_finished=True)),
            conn.send(wse.TextMessage(data="héllo")),
            conn.send(wse.Pong(payload=b"pong")),
            conn.send(wse.CloseConnection(code=1000, reason="bye")),
        ]
    )
    assert feed(data, server()) == [
        BinaryMessage(b"\xa1bopcping"),
        Ping(b"are you there"),
        BinaryMessage(big),
        TextMessage("héllo"),
        Pong(b"pong"),
        CloseReceived(1000, "bye"),
    ]


def test_server_frames_decode_in_wsproto() -> None:
    conn = wsproto_client_connected()
    big = bytes(range(256)) * 300
    conn.receive_data(
        encode_binary(b"hello")
        + encode_binary(big)
        + encode_frame(TEXT, "wör".encode(), fin=False)
        + encode_ping(b"beat")
        + encode_frame(CONTINUATION, b"ld")
        + encode_close(1001, "going away")
    )
    events: list[Any] = list(conn.events())  # wsproto's events, each of its own class
    kinds = "BytesMessage BytesMessage TextMessage Ping TextMessage CloseConnection"
    assert [type(e).__name__ for e in events] == kinds.split()
    assert events[0].data == b"hello" and events[1].data == big
    assert events[2].data + events[4].data == "wörld"
    assert events[3].payload == b"beat"
    assert (events[5].code, events[5].reason) == (1001, "going away")


def test_client_side_against_wsproto_server() -> None:
    key = new_websocket_key()
    conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    conn.receive_data(handshake_request("example.com", "/", key))
    (request,) = conn.events()
    assert isinstance(request, wse.Request) and request.subprotocols == ["migratory.cbor"]
    reply = conn.send(wse.AcceptConnection(subprotocol="migratory.cbor"))
    frames = conn.send(wse.BytesMessage(data=b"x" * 300)) + conn.send(wse.Ping(payload=b"p"))
    used = check_handshake_response(reply + frames, key)
    assert used == len(reply)
    assert client().events((reply + frames)[used:]) == [BinaryMessage(b"x" * 300), Ping(b"p")]
    conn.receive_data(encode_masked_binary(b"y" * 2000, MASK) + encode_close(1000, mask=MASK))
    events = list(conn.events())
    assert isinstance(events[0], wse.BytesMessage) and events[0].data == b"y" * 2000
    assert isinstance(events[1], wse.CloseConnection) and events[1].code == 1000


def test_module_does_no_io() -> None:
    imported = set()
    for node in ast.walk(ast.parse(Path(ws.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert not imported & {"trio", "socket", "asyncio", "selectors", "ssl"}
