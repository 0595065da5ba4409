"""MQTT 3.1.1 packets as bytes (sans-I/O): the other half of :mod:`migratory.protocol.mqtt`."""

from __future__ import annotations

from migratory.protocol.mqtt import (
    CONNACK,
    CONNECT,
    DISCONNECT,
    MAX_REMAINING_LENGTH,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBLISH,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Connack,
    Connect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)


def _remaining_length(n: int) -> bytes:
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} out of range")
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return bytes((first,)) + _remaining_length(len(body)) + body


def _u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("a string or binary field is at most 65535 bytes")
    return _u16(len(data)) + data


def _text(value: str) -> bytes:
    return _binary(value.encode("utf-8"))


def encode_publish(
    topic: str,
    payload: bytes,
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
) -> bytes:
    first = (PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    if (packet_id is None) != (qos == 0):
        raise ValueError("a packet identifier goes with QoS 1 or 2, and only then")
    ident = b"" if packet_id is None else _u16(packet_id)
    return _packet(first, _text(topic), ident, payload)


def publish_parts(topic: str, payload: bytes) -> tuple[bytes, bytes]:
    """The topic field and payload of a PUBLISH, for :func:`encode_publish_from_parts`."""
    return _text(topic), payload


def encode_publish_from_parts(
    topic_field: bytes, payload: bytes, *, qos: int, retain: bool, packet_id: int | None,
    dup: bool = False,
) -> bytes:
    """A PUBLISH from a topic field encoded once (every subscriber's frames share it)."""
    first = (PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    ident = b"" if packet_id is None else _u16(packet_id)
    length = len(topic_field) + len(ident) + len(payload)
    return bytes((first,)) + _remaining_length(length) + topic_field + ident + payload


def encode_packet(packet: Packet) -> bytes:
    """Any packet as bytes (the codec's tests and the clients in tests use this)."""
    if isinstance(packet, Publish):
        return encode_publish(
            packet.topic, packet.payload, qos=packet.qos, retain=packet.retain,
            dup=packet.dup, packet_id=packet.packet_id,
        )
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, Connack):
        return _packet(CONNACK << 4, bytes((int(packet.session_present), packet.return_code)))
    if isinstance(packet, Puback):
        return _packet(PUBACK << 4, _u16(packet.packet_id))
    if isinstance(packet, Subscribe):
        parts = [_text(f) + bytes((qos,)) for f, qos in packet.requests]
        return _packet((SUBSCRIBE << 4) | 2, _u16(packet.packet_id), *parts)
    if isinstance(packet, Suback):
        return _packet(SUBACK << 4, _u16(packet.packet_id), bytes(packet.return_codes))
    if isinstance(packet, Unsubscribe):
        parts = [_text(f) for f in packet.filters]
        return _packet((UNSUBSCRIBE << 4) | 2, _u16(packet.packet_id), *parts)
    if isinstance(packet, Unsuback):
        return _packet(UNSUBACK << 4, _u16(packet.packet_id))
    if isinstance(packet, Pingreq):
        return PINGREQ_BYTES
    if isinstance(packet, Pingresp):
        return PINGRESP_BYTES
    return DISCONNECT_BYTES


def _encode_connect(packet: Connect) -> bytes:
    will = packet.will
    flags = 0x02 if packet.clean_session else 0
    payload = [_text(packet.client_id)]
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        payload += [_text(will.topic), _binary(will.payload)]
    if packet.username is not None:
        flags |= 0x80
        payload.append(_text(packet.username))
    if packet.password is not None:
        flags |= 0x40
        payload.append(_binary(packet.password))
    header = _text(packet.protocol_name) + bytes((packet.level, flags)) + _u16(packet.keep_alive)
    return _packet(CONNECT << 4, header, *payload)


PINGREQ_BYTES = bytes((PINGREQ << 4, 0))
PINGRESP_BYTES = bytes((PINGRESP << 4, 0))
DISCONNECT_BYTES = bytes((DISCONNECT << 4, 0))
