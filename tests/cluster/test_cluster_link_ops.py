"""The cluster link operations: encoding, framing, strictness.

Micro-benchmark (encode + decode of a Batch of 1000 messages of 100 bytes)::

    .venv/bin/python tests/cluster/test_cluster_link_ops.py

measured on the 2-core dev box (Python 3.11, cbor2 6.2): 156,826 bytes on the wire,
encode 2.3 ms, decode 2.3 ms.

The handshake is in test_cluster_link.py.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import cbor2
import pytest
from cluster_link_pair import (
    ACCEPTOR,
    CONNECTOR,
    PASSWORD,
    drain,
    feed_bytewise,
    feed_whole,
    frame,
    open_pair,
    payload_of,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster import link, link_ops
from cluster.agreement import MemberLimits, MemberSettings
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.link import (
    Batch,
    Forward,
    ForwardFailed,
    Heartbeat,
    LinkConnection,
    LinkError,
    LinkOp,
    Replicate,
    Settings,
    StandardGoodbye,
    StandardPublish,
    Sync,
    SyncRefused,
    SyncRequest,
)
from cluster.link_ops import FORWARD_FAILED_STATUSES, decode_op, encode_frame
from migratory.model.message import Message, MessageType, Qos
from migratory.protocol.ops import Status

# --- operations --------------------------------------------------------------------


def msg(i: int = 0, size: int = 5, **kw: Any) -> Message:
    return Message(f"/s/{i}", bytes(size), **kw)


EXAMPLES: list[LinkOp] = [
    Forward((PublishRequest(CONNECTOR, 7, msg(1, fields={"k": "v"}, closure="c1")),)),
    Forward(()),
    ForwardFailed(((CONNECTOR, 7), (ACCEPTOR, 2**64 - 1)), "MISSING_LEADER", False),
    ForwardFailed(((CONNECTOR, 8),), "timeout", True),
    ForwardFailed(((CONNECTOR, 9),), "MESSAGE_SIZE_LIMIT_EXCEEDED: 2 MiB", False,
                  Status.MESSAGE_SIZE_LIMIT_EXCEEDED),
    ForwardFailed(((CONNECTOR, 10),), "PUBLISH_DENIED: /$x", False, Status.PUBLISH_DENIED),
    Replicate(0),
    Replicate(2**63),
    Replicate(7, full=True),
    Batch(CommittedBatch(12, (msg(1, epoch=5, seq=9, qos=Qos.GUARANTEED),), ((CONNECTOR, 1),))),
    Batch(CommittedBatch(0, (), ())),
    Batch(CommittedBatch(13, (), (), ((CONNECTOR, 1, 5, 9), (CONNECTOR, 2**64 - 1, 1, 0)))),
    Batch(CommittedBatch(14, (), (), (), ((CONNECTOR, 2), (CONNECTOR, 2**64 - 1)))),
    Batch(CommittedBatch(15, (), (), ((CONNECTOR, 1, 5, 9),), ((CONNECTOR, 2),))),
    SyncRequest(),
    SyncRequest(2**40),
    SyncRefused(7, "this member is waiting for a sync"),
    Sync(CacheSync(3, ())),
    Sync(
        CacheSync(
            3,
            (
                SubjectSync("/a/b", 77, 2, msg(type=MessageType.SNAPSHOT, retained=True), ()),
                SubjectSync("/a/c", 78, 9, None, (msg(epoch=78, seq=8), msg(epoch=78, seq=9))),
            ),
        )
    ),
    StandardPublish(msg(3, retained=True, qos=Qos.GUARANTEED, closure="x")),
    StandardGoodbye(),
    Heartbeat(0),
    Heartbeat(123456789, ready=False),
    Settings(MemberSettings(CONNECTOR, (ACCEPTOR, CONNECTOR), 3, "Guaranteed", 1000, "ab12",
                            server_name="migratory-1")),
    Settings(MemberSettings(ACCEPTOR, (), 0, "", 0, "", group_count=2**64 - 1)),
    Settings(MemberSettings(ACCEPTOR, (ACCEPTOR,), 3, "Standard", 10, "cd34",
                            limits=MemberLimits(131072, 1048576, "Token", 604800),
                            entitlement_keys=(("EntitlementTokenKeyFile", "0123456789abcdef"),))),
]


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: type(op).__name__)
def test_every_op_round_trips(op: LinkOp) -> None:
    acceptor, connector = open_pair()
    data = acceptor.send(op)
    assert data == link.encode_frame(op)
    assert link.decode_op(data[4:]) == op
    connector.receive_data(data)
    assert drain(connector) == [op]


def test_a_batch_without_repeats_is_the_frame_an_older_member_reads() -> None:
    """The repeats key only in a batch that has some (``cluster/link.py``)."""
    plain = CommittedBatch(12, (msg(1, epoch=5, seq=9),), ((CONNECTOR, 1),))
    assert set(payload_of(link.encode_frame(Batch(plain)))) == {"t", "c", "m", "o"}
    with_repeats = CommittedBatch(12, (), (), ((CONNECTOR, 1, 5, 9),))
    assert payload_of(link.encode_frame(Batch(with_repeats)))["a"] == [[CONNECTOR, 1, 5, 9]]
    with_overtaken = CommittedBatch(12, (), (), (), ((CONNECTOR, 2),))
    assert payload_of(link.encode_frame(Batch(with_overtaken))) == {
        "t": "b", "c": 12, "m": [], "o": [], "x": [[CONNECTOR, 2]]}


def test_tags_are_short() -> None:
    for op in EXAMPLES:
        assert len(payload_of(link.encode_frame(op))["t"]) <= 2


def test_message_is_a_compact_array() -> None:
    message = Message(
        "/a/b", b"xyz", {"k": "v"}, True, Qos.GUARANTEED, "c", 4, 5, MessageType.RECOVERED
    )
    body = payload_of(link.encode_frame(StandardPublish(message)))
    assert body == {"t": "p", "m": ["/a/b", b"xyz", {"k": "v"}, 3, "c", 4, 5, 2]}


texts = st.text(max_size=12)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
messages = st.builds(
    Message,
    subject=texts,
    content=st.binary(max_size=40),
    fields=st.dictionaries(texts, texts, max_size=3),
    retained=st.booleans(),
    qos=st.sampled_from(Qos),
    closure=st.none() | texts,
    epoch=u64,
    seq=u64,
    type=st.sampled_from(MessageType),
)
origins = st.lists(st.tuples(texts, u64), max_size=5).map(tuple)
subject_syncs = st.builds(
    SubjectSync,
    subject=texts,
    epoch=u64,
    seq=u64,
    snapshot=st.none() | messages,
    cached=st.lists(messages, max_size=4).map(tuple),
)
ops = st.one_of(
    st.builds(
        Forward, st.lists(st.builds(PublishRequest, texts, u64, messages), max_size=4).map(tuple)
    ),
    st.builds(ForwardFailed, origins, texts, st.booleans(),
              st.sampled_from(FORWARD_FAILED_STATUSES)),
    st.builds(Replicate, u64),
    st.builds(
        Batch, st.builds(CommittedBatch, u64, st.lists(messages, max_size=6).map(tuple), origins,
                         st.lists(st.tuples(texts, u64, u64, u64), max_size=3).map(tuple))
    ),
    st.builds(SyncRequest, u64),
    st.builds(SyncRefused, u64, texts),
    st.builds(Sync, st.builds(CacheSync, u64, st.lists(subject_syncs, max_size=4).map(tuple))),
    st.builds(StandardPublish, messages),
    st.just(StandardGoodbye()),
    st.builds(Heartbeat, u64, st.booleans()),
    st.builds(Settings, st.builds(
        MemberSettings, st.text(min_size=1, max_size=12),
        st.lists(st.text(min_size=1, max_size=12), max_size=4).map(tuple), u64, texts, u64,
        texts, u64, texts, st.none() | st.builds(MemberLimits, u64, u64, texts, u64),
    )),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_generated_ops_round_trip(op: LinkOp) -> None:
    data = link.encode_frame(op)
    assert link.decode_op(data[4:]) == op


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=4), st.data())
def test_generated_ops_whole_bytewise_and_with_trailing_bytes(
    sent: list[LinkOp], data: st.DataObject
) -> None:
    """Every generated op through a connection: whole, a byte at a time, and followed by
    part of a next frame (which waits, no error)."""
    wire = b"".join(link.encode_frame(op) for op in sent)
    assert feed_whole(open_pair()[1], wire) == sent
    assert feed_bytewise(open_pair()[1], wire) == sent
    following = link.encode_frame(data.draw(ops))
    cut = data.draw(st.integers(0, len(following) - 1))
    connector = open_pair()[1]
    assert feed_whole(connector, wire + following[:cut]) == sent
    assert connector.buffered == cut


# --- framing ------------------------------------------------------------------------


def stream_of(ops_: list[LinkOp]) -> bytes:
    return b"".join(link.encode_frame(op) for op in ops_)


@pytest.mark.parametrize("feed", [feed_whole, feed_bytewise], ids=["whole", "bytewise"])
def test_framing(feed: Callable[[LinkConnection, bytes], list[Any]]) -> None:
    _, connector = open_pair()
    assert feed(connector, stream_of(EXAMPLES)) == EXAMPLES


def test_framing_with_trailing_bytes() -> None:
    _, connector = open_pair()
    following = link.encode_frame(Heartbeat(99))
    data = stream_of(EXAMPLES) + following[:-1]
    assert feed_whole(connector, data) == EXAMPLES
    assert connector.next_event() is None  # waits for the rest, no error
    connector.receive_data(following[-1:])
    assert drain(connector) == [Heartbeat(99)]


def test_oversize_frame_is_refused_from_its_header() -> None:
    _, connector = open_pair()
    connector.receive_data(struct.pack(">I", link.MAX_FRAME))
    assert connector.next_event() is None  # the limit itself is allowed
    _, connector = open_pair()
    connector.receive_data(struct.pack(">I", link.MAX_FRAME + 1))
    with pytest.raises(LinkError, match="exceeds"):
        connector.next_event()


def test_oversize_frame_is_refused_when_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_ops, "MAX_FRAME", 1000)
    link.encode_frame(StandardPublish(msg(size=900)))
    with pytest.raises(LinkError, match="exceeds MAX_FRAME"):
        link.encode_frame(StandardPublish(msg(size=1000)))


# --- strict decoding ------------------------------------------------------------------

GOOD_MESSAGE = ["/a/b", b"x", {}, 0, None, 1, 2, 0]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"", "not valid CBOR"),
        (b"\xff", "not valid CBOR"),
        (cbor2.dumps({"t": "hb", "c": 1}) + b"\x00", "1 bytes after its CBOR item"),
        (cbor2.dumps([1]), "must be a CBOR map"),
        (cbor2.dumps({"c": 1}), "no text key 't'"),
        (cbor2.dumps({"t": "zz"}), "unknown frame 'zz'"),
        (cbor2.dumps({"t": "hb"}), r"missing keys \['c', 'r'\]"),
        (cbor2.dumps({"t": "hb", "c": 1, "r": True, "x": 2}), "1 unknown keys"),
        (cbor2.dumps({"t": "hb", "c": -1, "r": True}), "'c' must be an unsigned integer"),
        (cbor2.dumps({"t": "hb", "c": 2**64, "r": True}), "'c' must be an unsigned integer"),
        (cbor2.dumps({"t": "hb", "c": True, "r": True}), "'c' must be an unsigned integer"),
        (cbor2.dumps({"t": "hb", "c": 1.0, "r": True}), "'c' must be an unsigned integer"),
        (cbor2.dumps({"t": "hb", "c": 1, "r": 1}), "'r' must be a boolean"),
        (cbor2.dumps({"t": "sq"}), r"missing keys \['c'\]"),
        (cbor2.dumps({"t": "sn", "c": 1, "r": b"x"}), "'r' must be a text"),
        (cbor2.dumps({"t": "p", "m": GOOD_MESSAGE[:7]}), "array of 8 items, got an array of 7"),
        (cbor2.dumps({"t": "p", "m": {"subject": "/a"}}), "array of 8 items, got dict"),
        (cbor2.dumps({"t": "p", "m": [1, *GOOD_MESSAGE[1:]]}), "subject must be a text"),
        (cbor2.dumps({"t": "p", "m": ["/a", "x", *GOOD_MESSAGE[2:]]}), "content must be a byte"),
        (cbor2.dumps({"t": "p", "m": ["/a", b"", {"k": 1}, *GOOD_MESSAGE[3:]]}), "fields"),
        (cbor2.dumps({"t": "p", "m": [*GOOD_MESSAGE[:3], 4, *GOOD_MESSAGE[4:]]}), "flags"),
        (cbor2.dumps({"t": "p", "m": [*GOOD_MESSAGE[:4], 5, *GOOD_MESSAGE[5:]]}), "closure"),
        (cbor2.dumps({"t": "p", "m": [*GOOD_MESSAGE[:5], -1, 2, 0]}), "epoch and seq"),
        (cbor2.dumps({"t": "p", "m": [*GOOD_MESSAGE[:7], 4]}), "type"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [["a"]]}), r"\[origin, ref\] pairs"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [["a", -1]]}), "ref must be"),
        (cbor2.dumps({"t": "b", "c": 1, "m": {}, "o": []}), "'m' must be an array"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [], "a": [["a", 1, 2]]}), "epoch, seq"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [], "a": [[1, 1, 2, 3]]}), "epoch, seq"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [], "a": [["a", 1, -2, 3]]}), "epoch, s"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "o": [], "a": {}}), "'a' must be an array"),
        (cbor2.dumps({"t": "b", "c": 1, "m": [], "a": []}), r"missing keys \['o'\]"),
        (cbor2.dumps({"t": "fw", "r": [["a", 1]]}), r"\[origin, ref, message\] triples"),
        (cbor2.dumps({"t": "fw", "r": [["a", "1", GOOD_MESSAGE]]}), "ref must be"),
        (cbor2.dumps({"t": "ff", "o": [], "r": "x", "u": 0}), "'u' must be a boolean"),
        (cbor2.dumps({"t": "ff", "o": [], "r": b"x", "u": False}), "'r' must be a text"),
        (cbor2.dumps({"t": "s", "c": 1, "s": [["/a", 1, 2, None]]}), "snapshot, cached"),
        (cbor2.dumps({"t": "s", "c": 1, "s": [["/a", 1, -2, None, []]]}), "epoch or seq"),
        (cbor2.dumps({"t": "s", "c": 1, "s": [["/a", 1, 2, None, {}]]}), "cached messages"),
        (cbor2.dumps({"t": "s", "c": 1, "s": [["/a", 1, 2, 3, []]]}), "array of 8 items"),
        (b"\xa3\x61t\x62hb\x61c\x01\x61c\x02", "not valid CBOR"),  # duplicate key
        (b"\xa2\x61t\x62hb\x81\x01\x01", "not valid CBOR"),  # array as a map key
        (b"\x81" * 20 + b"\x01", "not valid CBOR"),  # too deep
        (b"\xd9\xd9\xf7\xa2\x61t\x62hb\x61c\x01", "must be a CBOR map"),  # tagged map
    ],
)
def test_strict_decoding(payload: bytes, reason: str) -> None:
    with pytest.raises(LinkError, match=reason):
        link.decode_op(payload)


def test_error_reasons_stay_short() -> None:
    with pytest.raises(LinkError) as caught:
        link.decode_op(cbor2.dumps({"t": "x" * 10_000}))
    assert len(caught.value.reason) < 100


# --- garbage only ever raises LinkError -------------------------------------------------

cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(["/a/b", b"\x00" * 16, 0, 1, 2**64 - 1]),
    lambda inner: (
        st.lists(inner, max_size=9) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=30,
)


@st.composite
def near_op_maps(draw: st.DrawFn) -> dict[str, Any]:
    """Maps with a real tag and its real keys, holding arbitrary values."""
    tag = draw(st.sampled_from([*link_ops._OPS, *link._HANDSHAKE_KEYS]))
    keys = link_ops._OPS[tag][0] if tag in link_ops._OPS else link._HANDSHAKE_KEYS[tag]
    body: dict[str, Any] = {"t": tag}
    for key in keys:
        body[key] = draw(cbor_values)
    return body


def only_link_errors(conn: LinkConnection, data: bytes) -> None:
    conn.receive_data(data)
    try:
        for _ in range(len(data) + 1):
            if conn.next_event() is None:
                return
    except LinkError:
        return


garbage_settings = settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])


@garbage_settings
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_link_error(data: bytes) -> None:
    with contextlib.suppress(LinkError):
        link.decode_op(data)
    only_link_errors(open_pair()[1], data)
    for role in ("accept", "connect"):
        conn = LinkConnection(role=role, member=ACCEPTOR, password=PASSWORD)
        conn.initiate()
        only_link_errors(conn, data)


@garbage_settings
@given(near_op_maps() | cbor_values)
def test_structured_garbage_raises_only_link_error(body: Any) -> None:
    with contextlib.suppress(LinkError):
        link.decode_op(cbor2.dumps(body))
    only_link_errors(open_pair()[1], frame(body))
    conn = LinkConnection(role="accept", member=ACCEPTOR, password=PASSWORD)
    conn.initiate()
    only_link_errors(conn, frame(body))


@garbage_settings
@given(st.sampled_from(EXAMPLES), st.data())
def test_mutated_frames_raise_only_link_error(op: LinkOp, data: st.DataObject) -> None:
    wire = bytearray(link.encode_frame(op))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    only_link_errors(open_pair()[1], bytes(wire))


def outcome(conn: LinkConnection, chunks: list[bytes]) -> list[Any]:
    """Events and the final LinkError's reason, feeding ``chunks`` one by one."""
    seen: list[Any] = []
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            while (event := conn.next_event()) is not None:
                seen.append(type(event) if isinstance(event, link.Outgoing) else event)
    except LinkError as exc:
        seen.append(exc.reason)
    return seen


@garbage_settings
@given(st.sampled_from(["accept", "connect"]), st.binary(max_size=300), st.data())
def test_a_strangers_bytes_give_the_same_outcome_however_they_are_split(
    role: Any, data: bytes, draw: st.DataObject
) -> None:
    """The handshake side of the decoder, as a stranger meets it: the bytes split at any
    points (a slow or hostile sender) give the events and the error of the whole."""
    framed = draw.draw(st.booleans())
    if framed:  # a length prefix that fits, so the payload reaches the CBOR decoder
        data = struct.pack(">I", len(data)) + data
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=6)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    whole = LinkConnection(role=role, member=ACCEPTOR, password=PASSWORD)
    split = LinkConnection(role=role, member=ACCEPTOR, password=PASSWORD)
    whole.initiate()
    split.initiate()
    assert outcome(split, chunks) == outcome(whole, [data])


# --- micro-benchmark --------------------------------------------------------------------


def benchmark_batch(count: int = 1000, size: int = 100, rounds: int = 50) -> Iterator[str]:
    batch = Batch(
        CommittedBatch(
            clsn=123_456,
            messages=tuple(
                Message(f"/bench/subject/{i % 50}", bytes(size), epoch=2**40 + 7, seq=10_000 + i)
                for i in range(count)
            ),
            origins=tuple((CONNECTOR, 900_000 + i) for i in range(count)),
        )
    )
    data = link.encode_frame(batch)
    assert link.decode_op(data[4:]) == batch
    encode = min(_timed(lambda: link.encode_frame(batch)) for _ in range(rounds))
    decode = min(_timed(lambda: link.decode_op(data[4:])) for _ in range(rounds))
    yield f"Batch of {count} x {size}-byte messages: {len(data)} bytes on the wire"
    yield f"encode {encode * 1e3:.2f} ms, decode {decode * 1e3:.2f} ms (best of {rounds})"


def test_benchmark_runs() -> None:
    assert len(list(benchmark_batch(count=10, rounds=1))) == 2


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    for line in benchmark_batch():
        print(line)


def test_a_forward_failed_carries_the_status_its_publishers_get() -> None:
    """Before, a ForwardFailed had no status: a forwarded publish the seed refused for its
    size reached its publisher as PUBLISH_FAILED. ``"s"`` is written only for another
    status, so the PUBLISH_FAILED frame is the one an older member writes and reads."""
    failed = ForwardFailed(((CONNECTOR, 1),), "r", False)
    assert cbor2.loads(encode_frame(failed)[4:]) == {
        "t": "ff", "o": [[CONNECTOR, 1]], "r": "r", "u": False}
    sized = ForwardFailed(((CONNECTOR, 1),), "r", False, Status.MESSAGE_SIZE_LIMIT_EXCEEDED)
    body = cbor2.loads(encode_frame(sized)[4:])
    assert body["s"] == "MESSAGE_SIZE_LIMIT_EXCEEDED"
    assert decode_op(encode_frame(sized)[4:]).status is Status.MESSAGE_SIZE_LIMIT_EXCEEDED
    for wrong in ("PUBLISH_OK", "DATA_SYNC", "", 3):
        with pytest.raises(LinkError, match="'ff' frame: 's'"):
            decode_op(cbor2.dumps({**body, "s": wrong}))


def test_settings_carry_the_limits_all_or_none() -> None:
    """An older member's ``cf`` (no limits) decodes with ``limits`` None; ``mm``, ``mf``,
    ``e`` and ``sx`` come together or the frame is refused."""
    older = {"t": "cf", "m": ACCEPTOR, "l": [ACCEPTOR], "k": 3, "d": "Guaranteed", "g": 64,
             "c": 1000, "i": "ab", "n": "m"}
    decoded = link.decode_op(cbor2.dumps(older))
    assert isinstance(decoded, Settings) and decoded.settings.limits is None
    assert link.encode_frame(decoded)[4:] == cbor2.dumps(older)  # what an older one reads
    whole = link.decode_op(cbor2.dumps({**older, "mm": 5, "mf": 9, "e": "None", "sx": 60}))
    assert isinstance(whole, Settings)
    assert whole.settings.limits == MemberLimits(5, 9, "None", 60)
    for part in ({"mm": 5}, {"mm": 5, "mf": 9, "e": "None"}, {"mf": 9, "e": "None", "sx": 6}):
        with pytest.raises(link.LinkError, match="'cf' frame"):
            link.decode_op(cbor2.dumps({**older, **part}))
