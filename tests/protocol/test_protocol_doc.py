"""docs/protocol.md's byte-exact examples are checked both ways against the codec.

Regenerate the examples section with ``python tests/protocol/test_protocol_doc.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import cbor2
import pytest

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
MASK = bytes.fromhex("37fa213d")
IBM = "/Stocks/NYSE/IBM"
E = 1_000_003

CLIENT_EXAMPLES: list[tuple[str, ops.ClientOp]] = [
    ("connect", ops.Connect(client="ticker", token="t0k3n")),
    (
        "subscribe (fresh with conflation; resume from a position)",
        ops.Subscribe(
            (
                ops.SubscriptionRequest(IBM, conflation_ms=500),
                ops.SubscriptionRequest("/Scores/NBA/LAL", position=Position(E, 41)),
            )
        ),
    ),
    ("subscribe with history", ops.Subscribe((ops.SubscriptionRequest(IBM, history=10),))),
    (
        "publish with closure",
        ops.Publish(Message(IBM, b"193", {"volume": "6.62M"}, retained=True, closure="p-1")),
    ),
    ("unsubscribe", ops.Unsubscribe((IBM,))),
    ("ping", ops.Ping(7)),
]

SERVER_EXAMPLES: list[tuple[str, ops.ServerOp]] = [
    ("connected", ops.Connected(server="migratory")),
    (
        "SUBSCRIBE_ALLOW (fresh subscribe)",
        ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, IBM, Position(E, 42)),
    ),
    (
        "message (snapshot)",
        ops.Deliver(
            (Message(IBM, b"193", {"volume": "6.62M"}, True, epoch=E, seq=42,
                     type=MessageType.SNAPSHOT),)
        ),
    ),
    ("message (update)", ops.Deliver((Message(IBM, b"194", epoch=E, seq=43),))),
    (
        "batch (recovered)",
        ops.Deliver(
            (
                Message("/Scores/NBA/LAL", b"88", epoch=E, seq=42, type=MessageType.RECOVERED),
                Message("/Scores/NBA/LAL", b"90", epoch=E, seq=43, type=MessageType.RECOVERED),
            )
        ),
    ),
    ("DATA_SYNC", ops.SubjectStatus(ops.Status.DATA_SYNC, "/Scores/NBA/LAL", Position(E, 43))),
    (
        "SUBSCRIBE_DENY",
        ops.SubjectStatus(
            ops.Status.SUBSCRIBE_DENY, "/Stocks", reason="has only one segment (two or more are "
            "required)"
        ),
    ),
    (
        "PUBLISH_OK",
        ops.PublishStatus(ops.Status.PUBLISH_OK, "p-1", IBM, Position(E, 44)),
    ),
    (
        "PUBLISH_DENIED",
        ops.PublishStatus(ops.Status.PUBLISH_DENIED, "p-2", IBM, reason="not entitled to publish"),
    ),
    ("pong", ops.Pong(7)),
]

CLOSE_EXAMPLE = ws.encode_close(close_codes.SLOW_CONSUMER.code, "slow consumer")


def client_frame(op: ops.ClientOp) -> bytes:
    return ws.encode_masked_binary(ops.encode_client_op(op), MASK)


def server_frame(op: ops.ServerOp) -> bytes:
    return ws.encode_binary(ops.encode_server_op(op))


def _hex(frame: bytes) -> str:
    text = frame.hex(" ")
    return "\n".join(text[i : i + 96].strip() for i in range(0, len(text), 96))


def _payload(op: ops.ClientOp | ops.ServerOp) -> str:
    if isinstance(op, ops.Connect | ops.Subscribe | ops.Unsubscribe | ops.Publish | ops.Ping):
        encoded = ops.encode_client_op(op)
    else:
        encoded = ops.encode_server_op(op)
    return f"CBOR payload (Python notation): `{cbor2.loads(encoded)!r}`"


def render_examples() -> str:
    parts = [f"Client frames are masked with key `{MASK.hex(' ')}`.", ""]
    for title, client_op in CLIENT_EXAMPLES:
        parts += [f"### client → server: {title}", "", "```", _hex(client_frame(client_op)),
                  "```", "", _payload(client_op), ""]
    for title, server_op in SERVER_EXAMPLES:
        parts += [f"### server → client: {title}", "", "```", _hex(server_frame(server_op)),
                  "```", "", _payload(server_op), ""]
    parts += ["### server → client: close 4500 SLOW_CONSUMER", "", "```", _hex(CLOSE_EXAMPLE),
              "```"]
    return "\n".join(parts)


def documented_frames() -> dict[str, bytes]:
    text = DOC.read_text()
    found = re.findall(r"### ([^\n]+)\n\n```\n([0-9a-f \n]*?)\n```", text, flags=re.S)
    return {title: bytes.fromhex(body.replace("\n", " ")) for title, body in found}


@pytest.mark.parametrize(("title", "op"), CLIENT_EXAMPLES, ids=[t for t, _ in CLIENT_EXAMPLES])
def test_client_examples(title: str, op: ops.ClientOp) -> None:
    frame = documented_frames()[f"client → server: {title}"]
    assert frame == client_frame(op)
    (event,) = ws.FrameDecoder(client_frames=True).events(frame)
    assert isinstance(event, ws.BinaryMessage)
    assert ops.decode_client_op(event.data) == op


@pytest.mark.parametrize(("title", "op"), SERVER_EXAMPLES, ids=[t for t, _ in SERVER_EXAMPLES])
def test_server_examples(title: str, op: ops.ServerOp) -> None:
    frame = documented_frames()[f"server → client: {title}"]
    assert frame == server_frame(op)
    (event,) = ws.FrameDecoder(client_frames=False).events(frame)
    assert isinstance(event, ws.BinaryMessage)
    assert ops.decode_server_op(event.data) == op


def test_close_example() -> None:
    frame = documented_frames()["server → client: close 4500 SLOW_CONSUMER"]
    assert frame == CLOSE_EXAMPLE
    assert ws.FrameDecoder(client_frames=False).events(frame) == [
        ws.CloseReceived(4500, "slow consumer")
    ]


def test_close_code_table_in_doc_matches_code() -> None:
    text = DOC.read_text()
    for code in close_codes.ALL:
        if code.code == close_codes.ABNORMAL.code:
            continue  # never sent
        row = f"| {code.code} | {code.name} | {'yes' if code.reconnect else 'no'} |"
        assert row in text



def test_every_close_code_the_doc_lists_is_in_the_code() -> None:
    """The other way: a row left behind for a code renamed or removed (before, only the
    code's codes were looked for in the doc), and each status the doc lists is one."""
    table = text_section("## Close codes")
    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \| (yes|no) \|", table, re.M)
    assert {(int(c), name, flag == "yes") for c, name, flag in rows} == {
        (code.code, code.name, code.reconnect) for code in close_codes.ALL
        if code.code != close_codes.ABNORMAL.code
    }
    statuses = re.findall(r"^\| `([A-Z_]+)` \|", text_section("### Publish statuses"), re.M)
    assert set(statuses) == {status.value for status in ops.PUBLISH_STATUSES}


def text_section(title: str) -> str:
    return DOC.read_text().split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]


if __name__ == "__main__":
    doc = DOC.read_text()
    begin, end = "<!-- examples:begin -->\n", "<!-- examples:end -->"
    head, rest = doc.split(begin)
    _, tail = rest.split(end)
    DOC.write_text(head + begin + render_examples() + "\n" + end + tail)
