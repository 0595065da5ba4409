"""Client operations that could make the server work far beyond their size are refused
while decoding, with the documented close code (issue 14)."""

from __future__ import annotations

import cbor2
import pytest

from migratory.model.subject import MAX_SUBJECT_BYTES
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws


def decode_error(payload: bytes) -> ops.OperationError:
    with pytest.raises(ops.OperationError) as info:
        ops.decode_client_op(payload)
    return info.value


def subscribe(**entry: object) -> bytes:
    return cbor2.dumps({"op": "subscribe", "subjects": [{"subject": "/a/b", **entry}]})


def test_bytes_after_the_cbor_item_are_invalid_payload() -> None:
    good = ops.encode_client_op(ops.Ping(1))
    assert ops.decode_client_op(good) == ops.Ping(1)
    for trailing in (b"\x00", b"\xa0", good):
        error = decode_error(good + trailing)
        assert error.close is close_codes.INVALID_PAYLOAD
        assert "follow the CBOR item" in error.reason
    # and the strict decoder is reusable after an error
    assert ops.decode_client_op(good) == ops.Ping(1)


@pytest.mark.parametrize("conflation", [10**400, 2**64, ops.MAX_CONFLATION_MS + 1])
def test_a_huge_conflation_is_a_bad_operation(conflation: int) -> None:
    error = decode_error(subscribe(conflation=conflation))
    assert error.close is close_codes.BAD_OPERATION
    assert "'conflation'" in error.reason
    longest = ops.decode_client_op(subscribe(conflation=ops.MAX_CONFLATION_MS))
    hour = ops.SubscriptionRequest("/a/b", conflation_ms=ops.MAX_CONFLATION_MS)
    assert longest == ops.Subscribe((hour,))


@pytest.mark.parametrize("key", ["history", "epoch", "seq"])
def test_integers_beyond_64_bits_are_bad_operations(key: str) -> None:
    entry: dict[str, object] = {"epoch": 1, "seq": 1, key: 10**30}
    error = decode_error(subscribe(**entry))
    assert error.close is close_codes.BAD_OPERATION and repr(key) in error.reason


def test_shared_references_are_refused() -> None:
    # 10,000 entries sharing one 900 kB subject: 900 kB on the wire, 9 GB once decoded
    subject = "/" + "x" * 900_000 + "/y"
    shared = cbor2.dumps(
        {"op": "subscribe", "subjects": [{"subject": subject}] * 10_000}, value_sharing=True
    )
    assert len(shared) < 1_000_000
    assert decode_error(shared).close is close_codes.INVALID_PAYLOAD
    refs = cbor2.dumps({"op": "unsubscribe", "subjects": ["/a/" + "b" * 100] * 50},
                       string_referencing=True)
    assert decode_error(refs).close is close_codes.INVALID_PAYLOAD


def test_an_overlong_subject_is_refused_before_it_is_validated() -> None:
    long_subject = "/a/" + "b" * MAX_SUBJECT_BYTES
    error = decode_error(cbor2.dumps({"op": "subscribe", "subjects": [{"subject": long_subject}]}))
    assert error.close is close_codes.BAD_OPERATION and "longer than" in error.reason
    publish = {"op": "publish", "subject": long_subject, "content": b""}
    assert decode_error(cbor2.dumps(publish)).close is close_codes.BAD_OPERATION
    unsubscribe = {"op": "unsubscribe", "subjects": [long_subject]}
    assert decode_error(cbor2.dumps(unsubscribe)).close is close_codes.BAD_OPERATION


def test_deep_nesting_is_invalid_payload() -> None:
    deep: object = "x"
    for _ in range(50):
        deep = [deep]
    error = decode_error(cbor2.dumps({"op": "ping", "extra": deep}))
    assert error.close is close_codes.INVALID_PAYLOAD


def masked(opcode: int, payload: bytes, *, fin: bool) -> bytes:
    return ws.encode_frame(opcode, payload, fin=fin, mask=b"abcd")


def test_a_message_in_too_many_fragments_closes_with_1008() -> None:
    decoder = ws.FrameDecoder(max_fragments=8)
    stream = masked(ws.BINARY, b"", fin=False) + masked(ws.CONTINUATION, b"", fin=False) * 6
    assert decoder.events(stream + masked(ws.CONTINUATION, b"x", fin=True)) == [
        ws.BinaryMessage(b"x")
    ]
    decoder = ws.FrameDecoder(max_fragments=8)
    with pytest.raises(ws.RemoteProtocolError) as info:
        decoder.events(stream + masked(ws.CONTINUATION, b"", fin=False) * 2)
    assert info.value.code == close_codes.POLICY_VIOLATION.code == 1008


def test_buffered_counts_what_an_incomplete_frame_pins() -> None:
    decoder = ws.FrameDecoder(max_message_size=1 << 20)
    whole = masked(ws.BINARY, b"y" * 100_000, fin=True)
    decoder.receive_data(whole[:-1])
    assert decoder.next_event() is None and decoder.buffered == len(whole) - 1
    decoder.receive_data(whole[-1:])
    assert decoder.next_event() == ws.BinaryMessage(b"y" * 100_000)
    assert decoder.buffered == 0
    decoder.receive_data(masked(ws.BINARY, b"z" * 500, fin=False))
    assert decoder.next_event() is None and decoder.buffered == 500
