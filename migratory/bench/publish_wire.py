"""The publisher's wire: pre-encoded publishes, and a cheap reader of their acknowledgements.

Every message of subject ``i`` has the same bytes but for its stamp (19 digits
of ``monotonic_ns``) and its key (the native closure, ten digits; the MQTT
packet id): each subject's frame is encoded once, and a message is a copy of
it with those two slots written in. A native frame is masked with one key per
connection, so the slots are written pre-masked (an XOR of 19 and 10 bytes).
RFC 6455 asks browsers for a fresh key per frame, against proxies that could
be poisoned by predictable bytes; on loopback, to the server, a fixed key is
the same XOR. Encoding each publish in Python cost the publisher ~10 µs a
message (cbor2, a random key, the masking): a third of a core at 20,000
msg/s, on the cores the server under test needs.

Acknowledgements: a ``PUBLISH_OK`` is recognised with one regex over the
complete frames of a chunk; any other reply (a failure, a close) sends the
chunk through the decoding path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from migratory.bench.stamp import MARK, STAMP_END, subject_for
from migratory.bench.wsraw import OPCODE_CLOSE, close_code, walk_frames
from migratory.protocol import mqtt, mqtt_encode
from migratory.protocol.websocket import encode_masked_binary

STAMP_DIGITS = STAMP_END - len(MARK)
CLOSURE_DIGITS = 10
PUBACK = mqtt.PUBACK << 4

# (output buffer, message index, stamp in ns) -> the key of its acknowledgement, or None
Encoder = Callable[[bytearray, int, int], Any]
# received bytes -> ([(status, key)], bytes to keep for the next chunk)
ReplyReader = Callable[[bytes], tuple[list[tuple[str, Any]], bytes]]


@dataclass(frozen=True, slots=True)
class Template:
    """One subject's publish with its stamp and key slots (offsets into ``frame``) and
    the mask over each slot as an integer (0 when the frame is not masked)."""

    frame: bytes
    stamp_at: int
    stamp_mask: int
    key_at: int
    key_mask: int


def _mask_int(mask: bytes, start: int, width: int) -> int:
    """The masking key's bytes over payload bytes ``start .. start + width``, as an int."""
    return int.from_bytes(bytes(mask[(start + k) % 4] for k in range(width)), "big")


def native_template(subject: str, size: int, ack: bool, mask: bytes) -> Template:
    content = MARK + b"0" * STAMP_DIGITS + b"x" * (size - STAMP_END)
    op: dict[str, Any] = {"op": "publish", "subject": subject, "content": content}
    if ack:
        op["closure"] = "#" * CLOSURE_DIGITS
    payload = cbor2.dumps(op)
    frame = encode_masked_binary(payload, mask)
    head = len(frame) - len(payload)  # header and masking key
    stamp = payload.index(MARK) + len(MARK)
    key = payload.index(b"#" * CLOSURE_DIGITS) if ack else 0
    return Template(frame, head + stamp, _mask_int(mask, stamp, STAMP_DIGITS),
                    head + key, _mask_int(mask, key, CLOSURE_DIGITS))


OK_CLOSURE = re.compile(rb"\x6aPUBLISH_OK.{0,400}?\x67closure\x6a(\d{10})", re.DOTALL)


def native_wire(subjects: int, ack: bool, size: int) -> tuple[Encoder, ReplyReader]:
    mask = os.urandom(4)
    templates = [native_template(subject_for(i, subjects), size, ack, mask)
                 for i in range(subjects)]

    def encode(out: bytearray, i: int, stamp_ns: int) -> Any:
        t = templates[i % subjects]
        at = len(out)
        out += t.frame
        s = at + t.stamp_at
        out[s : s + STAMP_DIGITS] = (
            int.from_bytes(b"%019d" % stamp_ns, "big") ^ t.stamp_mask
        ).to_bytes(STAMP_DIGITS, "big")
        if not ack:
            return None
        k = at + t.key_at
        out[k : k + CLOSURE_DIGITS] = (
            int.from_bytes(b"%010d" % i, "big") ^ t.key_mask
        ).to_bytes(CLOSURE_DIGITS, "big")
        return i

    def replies(data: bytes) -> tuple[list[tuple[str, Any]], bytes]:
        frames, rest = walk_frames(data)
        complete = data[:rest]
        oks = OK_CLOSURE.findall(complete)
        if len(oks) == len(frames):  # every frame a PUBLISH_OK: no decoding
            return [("PUBLISH_OK", int(c)) for c in oks], data[rest:]
        return decoded_replies(data, frames), data[rest:]

    return encode, replies


def decoded_replies(data: bytes, frames: list[tuple[int, int, int]]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for opcode, start, end in frames:
        if opcode == OPCODE_CLOSE:
            out.append((f"close frame {close_code(data, start, end)}", None))
            continue
        reply = cbor2.loads(data[start:end])
        if reply.get("op") == "publish_status":
            status = reply.get("status", "?")
            if status != "PUBLISH_OK" and reply.get("reason"):
                status = f"{status}: {reply['reason']}"
            closure = reply.get("closure")
            out.append((status, int(closure) if str(closure).isdigit() else closure))
    return out


def mqtt_template(subject: str, size: int, ack: bool) -> Template:
    topic = mqtt_encode.publish_parts(subject[1:], b"")[0]
    content = MARK + b"0" * STAMP_DIGITS + b"x" * (size - STAMP_END)
    frame = mqtt_encode.encode_publish_from_parts(
        topic, content, qos=1 if ack else 0, retain=False, packet_id=0xFFFF if ack else None)
    payload_at = len(frame) - len(content)
    return Template(frame, payload_at + len(MARK), 0, payload_at - 2, 0)


def mqtt_wire(subjects: int, ack: bool, size: int) -> tuple[Encoder, ReplyReader]:
    templates = [mqtt_template(subject_for(i, subjects), size, ack) for i in range(subjects)]

    def encode(out: bytearray, i: int, stamp_ns: int) -> Any:
        t = templates[i % subjects]
        at = len(out)
        out += t.frame
        s = at + t.stamp_at
        out[s : s + STAMP_DIGITS] = b"%019d" % stamp_ns
        if not ack:
            return None
        packet_id = i % 65535 + 1
        k = at + t.key_at
        out[k : k + 2] = packet_id.to_bytes(2, "big")
        return packet_id

    def replies(data: bytes) -> tuple[list[tuple[str, Any]], bytes]:
        out: list[tuple[str, Any]] = []
        pos = 0
        while len(data) - pos >= 2:
            length = data[pos + 1]
            if length & 0x80:  # a broker sends us only short packets; stop on anything else
                out.append((f"unexpected packet {data[pos]:#x}", None))
                return out, b""
            if len(data) - pos < 2 + length:
                break
            if data[pos] == PUBACK and length == 2:
                out.append(("PUBACK", int.from_bytes(data[pos + 2 : pos + 4], "big")))
            pos += 2 + length
        return out, data[pos:]

    return encode, replies
