"""The JavaScript SDK's decoder (clients/js/src/codec.js ``decodeServerOp``) fed what a
hostile server writes (tests/hostile_server_frames.py, the frames the Python SDK's
decoder is fuzzed with), through node (clients/js/test/support/decode_frames.mjs). The
property: each frame is refused with a ProtocolError (1007 or 4000: the session closes
and the client reconnects) or decodes to an operation a server could send -- never
another error (which would escape the session), never a message whose content is not
bytes, whose fields are not own text properties of a frozen plain object, or whose
position is not 1 <= epoch < 2^48 and a safe seq. And what it decodes the Python SDK
decodes too, to the same operation (the JavaScript SDK refuses more: every CBOR tag,
undefined, integers past 2^53)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hostile_server_frames import hostile_payloads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migratory.model.position import EPOCH_LIMIT
from migratory.protocol import ops

JS_DIR = Path(__file__).resolve().parents[2] / "clients" / "js"
SCRIPT = JS_DIR / "test" / "support" / "decode_frames.mjs"
SAFE_INTEGER = 2**53 - 1
FRAMES_PER_RUN = 40


def decoded_by_node(payloads: list[bytes]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "cbor-x").is_dir() or not (
        JS_DIR / "src" / "close_codes.generated.js"
    ).is_file():
        pytest.fail("needs node >= 20 and clients/js built: make js (npm ci in clients/js)")
    data = b"".join(struct.pack(">I", len(p)) + p for p in payloads)
    done = subprocess.run([node, str(SCRIPT)], input=data, capture_output=True, check=True,
                          timeout=120)  # a hang guard, not a speed assertion
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def _position(epoch: Any, seq: Any) -> None:
    if epoch is None:
        assert seq is None
        return
    assert type(epoch) is int and 1 <= epoch < EPOCH_LIMIT
    assert type(seq) is int and 0 <= seq <= SAFE_INTEGER


def _holds(op: dict[str, Any]) -> None:
    """What a decoded operation promises the session that reads it."""
    if op["op"] == "deliver":
        for m in op["messages"]:
            assert type(m["subject"]) is str and type(m["bytes"]) is int
            assert m["fields"]["plain"]
            assert all(type(v) is str for _, v in m["fields"]["entries"])
            _position(m["epoch"], m["seq"])
    elif op["op"] in ("status", "publish_status"):
        assert type(op["subject"]) is str
        position = op["position"] or {"epoch": None, "seq": None}
        _position(position["epoch"], position["seq"])
    elif op["op"] == "unknown":
        assert type(op["name"]) is str and len(op["name"]) <= 40
    else:
        assert op["op"] in ("connected", "pong"), op


def _as_python_reads(op: ops.ServerOp | ops.UnknownOp) -> dict[str, Any]:
    """The Python SDK's operation as decode_frames.mjs describes the JavaScript one."""
    if isinstance(op, ops.Deliver):
        return {"op": "deliver", "messages": [
            {"subject": m.subject, "bytes": len(m.content), "fields": list(m.fields.items()),
             "retained": m.retained, "qos": m.qos.value, "epoch": m.epoch, "seq": m.seq,
             "type": m.type.value} for m in op.messages]}
    if isinstance(op, ops.SubjectStatus | ops.PublishStatus):
        position = None if op.position is None else {"epoch": op.position.epoch,
                                                     "seq": op.position.seq}
        same = {"op": "status", "status": op.status.value, "subject": op.subject,
                "position": position, "reason": op.reason}
        if isinstance(op, ops.PublishStatus):
            same |= {"op": "publish_status", "closure": op.closure}
        return same
    if isinstance(op, ops.Connected):
        return {"op": "connected", "server": op.server, "version": op.version,
                "maxSubjectsPerSubscribe": op.max_subjects_per_subscribe,
                "heartbeatMs": op.heartbeat_ms}
    if isinstance(op, ops.Pong):
        return {"op": "pong", "id": op.id}
    assert isinstance(op, ops.UnknownOp)
    return {"op": "unknown", "name": op.name}


def _as_js_reads(op: dict[str, Any]) -> dict[str, Any]:
    if op["op"] != "deliver":
        return op
    return {"op": "deliver", "messages": [
        {**m, "fields": [tuple(entry) for entry in m["fields"]["entries"]]}
        for m in op["messages"]]}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_payloads(), min_size=FRAMES_PER_RUN, max_size=FRAMES_PER_RUN))
def test_a_hostile_frame_is_a_protocol_error_or_an_operation_a_server_could_send(
    payloads: list[bytes],
) -> None:
    results = decoded_by_node(payloads)
    assert len(results) == len(payloads)
    for payload, result in zip(payloads, results, strict=True):
        assert "crash" not in result, (payload.hex()[:400], result)
        if "refused" in result:
            assert result["refused"] in (1007, 4000) and result["reason"], result
            continue
        _holds(result)
        # nothing the Python SDK refuses (was: text that is not UTF-8, read as U+FFFD)
        python = ops.decode_server_op(payload)
        assert _as_js_reads(result) == _as_python_reads(python), payload.hex()[:400]
