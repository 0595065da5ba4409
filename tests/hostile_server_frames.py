"""Server frames as a hostile server writes them, for the SDKs' decoder fuzzes
(tests/protocol/test_ops_server_fuzz.py: the Python SDK's; tests/client/
test_js_decoder_fuzz.py: the JavaScript SDK's, through node): a known operation with any
of its keys (or a batch message's) changed to any kind of value -- other types, CBOR
tags, huge integers, deep nesting, non-text keys --, then cut anywhere, followed by
bytes, with a byte changed, or with a string's length made huge; small frames and large
ones (past ``HOOKED_FROM_BYTES``)."""

from __future__ import annotations

import struct
from typing import Any

import cbor2
from hypothesis import strategies as st

from migratory.model.position import EPOCH_LIMIT
from migratory.protocol import message_batch
from migratory.protocol.cbor_reader import MAX_INTEGER

MESSAGE: dict[str, Any] = {"subject": "/a/b", "content": b"x", "epoch": 7, "seq": 12,
                           "type": "update", "fields": {"k": "v"}}
OPERATIONS: list[dict[str, Any]] = [
    {"op": "message", **MESSAGE},
    {"op": "batch", "messages": [MESSAGE, {**MESSAGE, "seq": 13}]},
    {"op": "status", "status": "DATA_SYNC", "subject": "/a/b", "epoch": 7, "seq": 12},
    {"op": "status", "status": "SUBSCRIBE_DENY", "subject": "/a/b", "reason": "no"},
    {"op": "publish_status", "status": "PUBLISH_OK", "subject": "/a/b", "closure": "c",
     "epoch": 7, "seq": 3},
    {"op": "connected", "server": "s", "version": 1, "max_subjects_per_subscribe": 10},
    {"op": "connected", "server": "s", "version": 1, "heartbeat": 2000},
    {"op": "pong", "id": 1},
    {"op": "pong"},
]
KEYS = ["op", "subject", "content", "epoch", "seq", "type", "fields", "status", "closure",
        "messages", "retained", "qos", "id", "server", "version", "reason",
        "max_subjects_per_subscribe", "heartbeat", "unknown"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, EPOCH_LIMIT - 1, EPOCH_LIMIT, MAX_INTEGER, MAX_INTEGER + 1, 2**64]),
    st.floats(), st.text(max_size=6), st.binary(max_size=6), st.just(cbor2.undefined),
)
TAGS = st.sampled_from([0, 1, 2, 3, 4, 5, 24, 25, 28, 29, 30, 35, 36, 37, 256, 258, 259,
                        260, 261, 55799, 2**32])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(), st.binary(max_size=2)),
                        inner, max_size=3),
        st.builds(cbor2.CBORTag, TAGS, inner),
    ),
    max_leaves=8,
)


def _huge_length(payload: bytes, at: int) -> bytes:
    """``payload`` with the first byte or text string head from ``at`` on made to say
    2**63 - 1 bytes (the rest as it was)."""
    for i in range(at, len(payload)):
        major = payload[i] >> 5
        if major in (2, 3) and payload[i] & 0x1F < 24:
            head = bytes([(major << 5) | 27]) + struct.pack(">Q", 2**63 - 1)
            return payload[:i] + head + payload[i + 1:]
    return payload


@st.composite
def hostile_payloads(draw: st.DrawFn) -> bytes:
    body: dict[Any, Any] = {**draw(st.sampled_from(OPERATIONS))}
    for _ in range(draw(st.integers(1, 3))):
        key, value = draw(st.sampled_from(KEYS)), draw(VALUES)
        messages = body.get("messages")
        if (body.get("op") == "batch" and key != "messages" and type(messages) is list
                and messages and type(messages[-1]) is dict and draw(st.booleans())):
            body["messages"] = [*messages[:-1], {**messages[-1], key: value}]
        else:
            body[key] = value
    if draw(st.booleans()) and body.get("op") == "batch" and type(body.get("messages")) is list:
        # past HOOKED_FROM_BYTES: the messages are decoded by the object hook
        pad = {**MESSAGE, "content": bytes(1000), "seq": 99}
        body["messages"] = [*body["messages"],
                            *[pad] * (message_batch.HOOKED_FROM_BYTES // 1000 + 1)]
    payload = cbor2.dumps(body)
    kind = draw(st.sampled_from(["changed", "cut", "trailing", "flipped", "huge length"]))
    at = draw(st.integers(0, len(payload) - 1))
    if kind == "cut":
        return payload[:at]
    if kind == "trailing":
        return payload + draw(st.binary(min_size=1, max_size=4))
    if kind == "flipped":
        return payload[:at] + bytes([draw(st.integers(0, 255))]) + payload[at + 1:]
    if kind == "huge length":
        return _huge_length(payload, at)
    return payload
