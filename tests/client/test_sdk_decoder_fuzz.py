"""Hypothesis against the Python SDK's reading of server frames, end to end on a real
socket: whatever one frame about a subject is -- a known operation with a key changed to
any kind of value, cut short, with bytes after it, garbage -- the client neither crashes
nor hands over a message out of order, twice or after a gap, and a bystander
subscription keeps receiving across the reconnect that follows (docs/protocol.md, "What
the SDKs do with a broken server")."""

from __future__ import annotations

from typing import Any

import cbor2
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_fake_server import FAST, update
from sdk_raw_peer import RawLink, RawPeer

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory_client import connect

SUBJECT, BYSTANDER = "/a/b", "/c/d"
HANG_GUARD = 10.0
"""Seconds an example may take before it counts as a hang (a guard, not a speed test)."""
MESSAGE = {"subject": SUBJECT, "content": b"x", "epoch": 7, "seq": 12, "type": "update"}
OPERATIONS = [
    {"op": "message", **MESSAGE},
    {"op": "batch", "messages": [MESSAGE]},
    {"op": "status", "status": "DATA_SYNC", "subject": SUBJECT, "epoch": 7, "seq": 12},
    {"op": "publish_status", "status": "PUBLISH_OK", "subject": SUBJECT, "closure": "c"},
    {"op": "pong", "id": 1},
]
KEYS = ["op", "subject", "content", "epoch", "seq", "type", "fields", "status", "closure",
        "messages", "retained", "qos", "id", "unknown"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6),
    st.binary(max_size=6), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.one_of(st.text(max_size=3), st.integers()),
                    max_size=2),
    st.just(cbor2.CBORTag(1, 0)),
)


@st.composite
def hostile_payloads(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = dict(draw(st.sampled_from(OPERATIONS)))
    key, value = draw(st.sampled_from(KEYS)), draw(VALUES)
    if body["op"] == "batch" and key != "messages":
        body["messages"] = [{**MESSAGE, key: value}]
    else:
        body[key] = value
    payload = cbor2.dumps(body)
    kind = draw(st.sampled_from(["changed", "cut", "trailing", "garbage"]))
    if kind == "cut":
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if kind == "trailing":
        return payload + draw(st.binary(min_size=1, max_size=8))
    if kind == "garbage":
        return draw(st.binary(max_size=40))
    return payload


def deliver(subject: str, seq: int, kind: MessageType = MessageType.UPDATE) -> ops.Deliver:
    return ops.Deliver((update(subject, seq, kind=kind),))


async def answer_resume(link: RawLink, bystander_seq: int) -> None:
    """Answer the next session's resume: the bystander recovers up to 12, then 13 live."""
    entries: list[ops.SubscriptionRequest] = []
    while len(entries) < 2:  # in one subscribe or two
        request = await link.expect(ops.Subscribe)
        assert isinstance(request, ops.Subscribe)
        entries += request.subscriptions
    for entry in entries:
        link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, entry.subject))
        position = entry.position or Position(7, bystander_seq)
        if entry.subject == BYSTANDER:
            assert position.seq in (11, 12), entry
            for seq in range(position.seq + 1, 13):
                link.write(deliver(BYSTANDER, seq, MessageType.RECOVERED))
            link.write(ops.SubjectStatus(ops.Status.DATA_SYNC, BYSTANDER, Position(7, 12)))
        else:
            link.write(ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(7, 20)))
    link.write(deliver(BYSTANDER, 13), deliver(SUBJECT, 21))


async def one_hostile_frame(payload: bytes) -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            cut, bystander = client.subscribe(SUBJECT), client.subscribe(BYSTANDER)
            link = await peer.accept()
            await link.accept_session()
            asked: set[str] = set()
            while len(asked) < 2:  # in one subscribe or two
                request = await link.expect(ops.Subscribe)
                assert isinstance(request, ops.Subscribe)
                asked.update(entry.subject for entry in request.subscriptions)
            for subject in (SUBJECT, BYSTANDER):
                link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, subject, Position(7, 10)),
                           deliver(subject, 11))
            assert (await bystander.next_message()).seq == 11
            link.write(ws.encode_binary(payload), deliver(BYSTANDER, 12),
                       ws.encode_close(1001, "going away"))
            link.close()
            again = await peer.accept()
            await again.accept_session()
            await answer_resume(again, 11)
            got = [await bystander.next_message() for _ in range(2)]
            assert [m.seq for m in got] == [12, 13], got
            seen = [await cut.next_message()]
            while (seen[-1].epoch, seen[-1].seq) != (7, 21):
                seen.append(await cut.next_message())
            lineage = [m.seq for m in seen if m.epoch == 7 and m.type is MessageType.UPDATE]
            assert lineage == sorted(set(lineage)) and lineage[0] == 11, seen
            assert client.error is None
    finally:
        peer.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_payloads())
def test_one_hostile_frame_never_breaks_the_client_or_the_bystander(payload: bytes) -> None:
    async def main() -> None:
        with trio.fail_after(HANG_GUARD):
            await one_hostile_frame(payload)

    trio.run(main)
