"""Anything a front end accepts encodes on every wire format.

The hub takes a subject's next position before it encodes the message for the
subscribers (hub._apply): an encoding that raises then leaves a numbered message no
subscriber can be sent -- a silent gap for SSE and MQTT, every native subscriber closed
1011 at each resume while the cache or the snapshot holds it (a lone surrogate in a
field did this: publish_rules.message_refusal refuses it now). Here arbitrary publishes
decoded as each front end decodes them -- native CBOR, HTTP JSON, MQTT PUBLISH, a peer
member's forward on the cluster link -- go through the refusal rules, and every one
accepted is encoded as each front end and the cluster link encode it: the native frame
(alone and in a batch), the SSE event, the MQTT PUBLISH at QoS 0 and 1, the HTTP
snapshot (raw and JSON, through h11), the link's frames."""

from __future__ import annotations

import json
from typing import Any

import cbor2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cluster import link_ops
from cluster.batch_ring import CommittedBatch
from cluster.link_faults import LinkError
from migratory.model.message import Message, MessageType
from migratory.model.snapshot import merge_snapshot
from migratory.model.topic import InvalidTopicError, topic_to_subject
from migratory.protocol import mqtt, ops, sse
from migratory.protocol.cbor_reader import OperationError
from migratory.protocol.http import HttpError
from migratory.protocol.http_api import parse_publish
from migratory.protocol.http_server import HttpServer
from migratory.protocol.mqtt_encode import encode_packet, encode_publish_from_parts
from migratory.server import http_routes
from migratory.server.format_sink import message_frame
from migratory.server.mqtt_frames import SharedFrames
from migratory.server.publish_rules import message_refusal

MAX_MESSAGE_SIZE = 131072  # the default MaxMessageSize

# Characters that broke, or could break, one encoding or another: surrogates, controls,
# DEL, white space (an HTTP header's ends), line separators (SSE), MQTT's wildcards and
# U+0000, JSON's escapes, a character beyond the BMP. CBOR cannot carry a lone surrogate
# (cbor2 will not write one; a text string of its bytes is refused by the decoder), so
# the native and peer examples are drawn without them, or almost none would decode.
AWKWARD = " \t\x00\x01\x1f\x7f\x85\u2028\u2029\ufeff\uffff+#$/\"\\%\U0001f600é"
SURROGATES = "\ud800\udfff"


def texts(*, surrogates: bool) -> tuple[st.SearchStrategy[str], st.SearchStrategy[str]]:
    """(any text, a valid-looking subject more often than not)."""
    characters = st.one_of(
        st.sampled_from(AWKWARD + (SURROGATES if surrogates else "")), st.sampled_from("ab"),
        st.characters(codec=None if surrogates else "utf-8", categories=None))
    text = st.text(characters, max_size=12)
    segment = st.text(st.one_of(st.sampled_from("abc"), characters), min_size=1, max_size=6)
    paths = st.lists(segment, min_size=2, max_size=4).map(lambda parts: "/" + "/".join(parts))
    return text, st.one_of(paths, paths, paths, text)


TEXT, SUBJECTS = texts(surrogates=True)
CBOR_TEXT, CBOR_SUBJECTS = texts(surrogates=False)
FIELDS = st.dictionaries(TEXT, TEXT, max_size=4)
CBOR_FIELDS = st.dictionaries(CBOR_TEXT, CBOR_TEXT, max_size=4)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=8),
                    CBOR_TEXT)
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(CBOR_TEXT, st.integers()), inner,
                                                 max_size=3)), max_leaves=8)


def right_or_any(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right type, sometimes anything (a wrong type must be refused)."""
    return st.sampled_from([*[True] * 9, False]).flatmap(lambda ok: right if ok else ANY)


def cbor_of(value: Any) -> bytes | None:
    """CBOR of ``value``; None when CBOR cannot hold it (a lone surrogate: cbor2 refuses
    to write it, and a text string of its bytes is refused by the decoder)."""
    try:
        return bytes(cbor2.dumps(value))
    except (UnicodeEncodeError, ValueError, TypeError):
        return None


# --- each front end's decoding: a Message, or None when refused there -------------


def native(body: dict[str, Any]) -> Message | None:
    payload = cbor_of({"op": "publish", **body})
    if payload is None:
        return None
    try:
        op = ops.decode_client_op(payload)
    except OperationError:
        return None
    assert isinstance(op, ops.Publish)
    return op.message


def http(body: dict[str, Any]) -> Message | None:
    try:  # json.dumps writes a lone surrogate as "\ud800", which json.loads reads back
        return parse_publish(json.dumps(body).encode(), "http").message
    except (HttpError, TypeError, ValueError):
        return None


def mqtt_front(topic: bytes, payload: bytes, qos: int, retain: bool) -> Message | None:
    packet = (bytes(((mqtt.PUBLISH << 4) | (qos << 1) | retain,))
              + _length(2 + len(topic) + (2 if qos else 0) + len(payload))
              + len(topic).to_bytes(2, "big") + topic + (b"\x00\x01" if qos else b"")
              + payload)
    decoder = mqtt.MqttDecoder(server=False)
    try:
        (publish,) = decoder.events(packet)
        assert isinstance(publish, mqtt.Publish)
        subject = topic_to_subject(publish.topic)
    except (mqtt.MqttProtocolError, InvalidTopicError):
        return None
    return Message(subject, publish.payload, retained=publish.retain)  # as mqtt_session


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def peer(item: list[Any]) -> Message | None:
    payload = cbor_of({"t": "p", "m": item})
    if payload is None:
        return None
    try:
        op = link_ops.decode_op(payload)
    except LinkError:
        return None
    assert isinstance(op, link_ops.StandardPublish)
    return op.message


# --- every encoding of an accepted message ----------------------------------------


def encode_everywhere(message: Message) -> None:
    numbered = message.with_position(7, 1)
    message_frame(numbered)
    ops.encode_server_op(ops.Deliver((numbered, numbered.as_type(MessageType.RECOVERED))))
    sse.message_lines(numbered)
    frames = SharedFrames()
    frames.qos0(numbered, websocket=True)
    encode_publish_from_parts(frames.topic(numbered), numbered.content, qos=1, retain=True,
                              packet_id=1)
    snapshot = merge_snapshot(merge_snapshot(None, numbered.as_type(MessageType.SNAPSHOT)),
                              numbered.with_position(7, 2))
    for as_json in (False, True):
        reply = http_routes._snapshot_reply(numbered.subject, snapshot or numbered, as_json)
        server = HttpServer(max_body=1 << 20)
        server.receive_data(b"GET /snapshot HTTP/1.1\r\nHost: x\r\n\r\n")
        assert server.next_event() is not None
        server.respond(reply.status, reply.body, content_type=reply.content_type,
                       headers=reply.headers)
    for op in (link_ops.StandardPublish(numbered),
               link_ops.Batch(CommittedBatch(1, (numbered,), ()))):
        frame = link_ops.encode_frame(op)
        assert link_ops.decode_op(frame[link_ops._HEADER:]) == op


def check(message: Message | None, *, member: bool = False) -> None:
    if message is None:
        return
    if message_refusal(message, MAX_MESSAGE_SIZE, member=member) is None:
        encode_everywhere(message)


EXAMPLES = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@EXAMPLES
@given(subject=right_or_any(CBOR_SUBJECTS), content=right_or_any(st.binary(max_size=16)),
       fields=right_or_any(CBOR_FIELDS), retained=right_or_any(st.booleans()),
       closure=right_or_any(CBOR_TEXT))
@example(subject="/a/b ", content=b"", fields={}, retained=True, closure="1")  # HTTP header
def test_a_native_publish_accepted_encodes_everywhere(
    subject: Any, content: Any, fields: Any, retained: Any, closure: Any
) -> None:
    check(native({"subject": subject, "content": content, "fields": fields,
                  "retained": retained, "closure": closure}))


@EXAMPLES
@given(subject=right_or_any(SUBJECTS), content=right_or_any(TEXT),
       fields=right_or_any(FIELDS), retained=right_or_any(st.booleans()),
       binary=st.booleans())
@example(subject="/a/b", content="", fields={"k": "\ud800"}, retained=True, binary=False)
@example(subject="/a/ b ", content="", fields={}, retained=True, binary=False)
def test_an_http_publish_accepted_encodes_everywhere(
    subject: Any, content: Any, fields: Any, retained: Any, binary: bool
) -> None:
    body = {"subject": subject, "fields": fields, "retained": retained}
    if binary:
        body["content_base64"] = content
    else:
        body["content"] = content
    check(http(body))


@EXAMPLES
@given(topic=st.one_of(st.binary(max_size=20),
                       SUBJECTS.map(lambda s: s[1:].encode("utf-8", "surrogatepass"))),
       payload=st.binary(max_size=16), qos=st.integers(0, 1), retain=st.booleans())
@example(topic=b" / ", payload=b"", qos=0, retain=False)
def test_an_mqtt_publish_accepted_encodes_everywhere(
    topic: bytes, payload: bytes, qos: int, retain: bool
) -> None:
    check(mqtt_front(topic, payload, qos, retain))


@EXAMPLES
@given(subject=right_or_any(CBOR_SUBJECTS), content=right_or_any(st.binary(max_size=16)),
       fields=right_or_any(CBOR_FIELDS), flags=right_or_any(st.integers(0, 3)),
       closure=right_or_any(st.one_of(st.none(), CBOR_TEXT)),
       epoch=right_or_any(st.integers(0, 2**64 - 1)), seq=right_or_any(st.integers(0, 9)),
       code=right_or_any(st.integers(0, 3)))
@example(subject="/a/b ", content=b"", fields={"k": "v"}, flags=1, closure=None, epoch=0,
         seq=0, code=0)
def test_a_peer_members_publish_accepted_encodes_everywhere(
    subject: Any, content: Any, fields: Any, flags: Any, closure: Any, epoch: Any, seq: Any,
    code: Any
) -> None:
    check(peer([subject, content, fields, flags, closure, epoch, seq, code]), member=True)


def test_the_mqtt_front_ends_own_encoder_agrees_with_the_hand_built_publish() -> None:
    """The PUBLISH built by hand above is the codec's (so the MQTT examples are real)."""
    packet = encode_packet(mqtt.Publish("a/b", b"x", qos=1, retain=True, packet_id=1))
    body = packet[2:]
    topic, rest = body[2:5], body[5:]
    assert topic == b"a/b" and rest == b"\x00\x01x"
    assert mqtt_front(b"a/b", b"x", 1, True) == Message("/a/b", b"x", retained=True)
