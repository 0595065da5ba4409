"""MQTT 3.1.1 packets: sans-I/O, strict, both directions.

An :class:`MqttDecoder` is fed bytes (:meth:`MqttDecoder.receive_data`) and
hands out frozen packet objects (:meth:`MqttDecoder.next_event`); the
``encode_*`` functions turn packets into bytes. No sockets, no trio.

Encoding is in :mod:`migratory.protocol.mqtt_encode`.

The decoder of a server (``server=True``) reads what a client may send and
enforces the order of a session: the first packet must be CONNECT and a second
CONNECT is refused. Anything malformed -- a remaining length longer than four
bytes, reserved flag bits, a packet larger than ``max_packet_size``, invalid
UTF-8, a missing packet identifier, a packet only the other side sends -- raises
:class:`MqttProtocolError` naming the problem; the decoder then keeps raising it
(MQTT answers a malformed packet by closing the network connection).

QoS 2 is not supported: a PUBLISH at QoS 2 and the QoS 2 handshake packets
(PUBREC, PUBREL, PUBCOMP) are refused as errors.
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOL_NAME = "MQTT"
PROTOCOL_LEVEL = 4  # MQTT 3.1.1
MAX_REMAINING_LENGTH = 268_435_455  # four bytes of variable-length integer

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = (
    8, 9, 10, 11, 12, 13, 14,
)
PACKET_NAMES = {
    CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK",
    PUBREC: "PUBREC", PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK", UNSUBSCRIBE: "UNSUBSCRIBE", UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP", DISCONNECT: "DISCONNECT",
}
# the fixed-header flags each packet type must carry (PUBLISH's are checked apart)
_REQUIRED_FLAGS = {t: 0 for t in PACKET_NAMES} | {PUBREL: 2, SUBSCRIBE: 2, UNSUBSCRIBE: 2}
_FROM_CLIENT = frozenset({CONNECT, PUBLISH, PUBACK, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT})
_FROM_SERVER = frozenset({CONNACK, PUBLISH, PUBACK, SUBACK, UNSUBACK, PINGRESP})
_QOS2_HANDSHAKE = frozenset({PUBREC, PUBREL, PUBCOMP})

# CONNACK return codes
ACCEPTED = 0
REFUSED_PROTOCOL_VERSION = 1
REFUSED_IDENTIFIER = 2
REFUSED_SERVER_UNAVAILABLE = 3
REFUSED_BAD_CREDENTIALS = 4
REFUSED_NOT_AUTHORIZED = 5
SUBACK_FAILURE = 0x80


class MqttProtocolError(Exception):
    """The peer broke MQTT; the answer is closing the connection."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- packets ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    clean_session: bool = True
    keep_alive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    protocol_name: str = PROTOCOL_NAME
    level: int = PROTOCOL_LEVEL


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool
    return_code: int


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None


@dataclass(frozen=True, slots=True)
class Puback:
    packet_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    requests: tuple[tuple[str, int], ...]  # (topic filter, requested QoS)


@dataclass(frozen=True, slots=True)
class Suback:
    packet_id: int
    return_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unsuback:
    packet_id: int


@dataclass(frozen=True, slots=True)
class Pingreq:
    pass


@dataclass(frozen=True, slots=True)
class Pingresp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    pass


Packet = (
    Connect | Connack | Publish | Puback | Subscribe | Suback | Unsubscribe | Unsuback
    | Pingreq | Pingresp | Disconnect
)


# --- decoding ---------------------------------------------------------------


class _Body:
    """Reads the fields of one packet's variable header and payload."""

    __slots__ = ("data", "name", "pos")

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        self.name = name
        self.pos = 0

    def fail(self, what: str) -> MqttProtocolError:
        return MqttProtocolError(f"{self.name}: {what}")

    def left(self) -> int:
        return len(self.data) - self.pos

    def byte(self, what: str) -> int:
        if self.pos >= len(self.data):
            raise self.fail(f"ends before the {what}")
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self, what: str) -> int:
        if self.pos + 2 > len(self.data):
            raise self.fail(f"ends before the {what}")
        self.pos += 2
        return (self.data[self.pos - 2] << 8) | self.data[self.pos - 1]

    def binary(self, what: str) -> bytes:
        n = self.u16(f"length of the {what}")
        if self.pos + n > len(self.data):
            raise self.fail(f"the {what} is longer than the packet")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def text(self, what: str) -> str:
        raw = self.binary(what)
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"the {what} is not valid UTF-8") from None
        if "\x00" in value:
            raise self.fail(f"the {what} contains U+0000")
        return value

    def packet_id(self) -> int:
        packet_id = self.u16("packet identifier")
        if packet_id == 0:
            raise self.fail("packet identifier 0 is not allowed")
        return packet_id

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} unexpected bytes at the end")


class MqttDecoder:
    """One direction of an MQTT byte stream as packets.

    ``server=True`` reads a client's packets (CONNECT first, once);
    ``server=False`` reads a server's. ``max_packet_size`` bounds a whole packet
    and is checked as soon as the fixed header is read, before the body is buffered.
    ``max_filters`` (0: none) bounds the topic filters of a SUBSCRIBE or UNSUBSCRIBE
    that are read: past it, the packet comes with ``max_filters + 1`` of them and the
    rest is skipped unread -- its reader refuses it for being over the limit, having
    parsed no more (a 1 MiB SUBSCRIBE of 95,000 filters took 0.26 s to decode, all of
    it before the check, in one turn of the loop).
    """

    __slots__ = ("_buffer", "_connected", "_error", "_max", "_max_filters", "_offset", "_server")

    def __init__(self, *, server: bool = True, max_packet_size: int = 1 << 20,
                 max_filters: int = 0) -> None:
        self._server = server
        self._max = max_packet_size
        self._max_filters = max_filters
        self._buffer = bytearray()
        self._offset = 0
        self._connected = not server
        self._error: MqttProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for packets not handled yet (the peer can pin this much)."""
        return len(self._buffer) - self._offset

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            return
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    def events(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Feed ``data`` and drain every complete packet (raises on an error)."""
        self.receive_data(data)
        out: list[Packet] = []
        while (packet := self.next_event()) is not None:
            out.append(packet)
        return out

    def next_event(self) -> Packet | None:
        """The next complete packet, or None if more bytes are needed."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except MqttProtocolError as exc:
            self._error = exc
            self._buffer = bytearray()
            self._offset = 0
            raise

    def _next_event(self) -> Packet | None:
        buf = self._buffer
        pos = self._offset
        if len(buf) - pos < 2:
            return None
        first = buf[pos]
        kind, flags = first >> 4, first & 0x0F
        self._check_kind(kind, flags)
        length = 0
        for i in range(4):
            if pos + 1 + i >= len(buf):
                return None
            digit = buf[pos + 1 + i]
            length |= (digit & 0x7F) << (7 * i)
            if not digit & 0x80:
                header = 2 + i
                break
        else:
            raise MqttProtocolError("remaining length longer than four bytes")
        if header + length > self._max:
            raise MqttProtocolError(
                f"{PACKET_NAMES[kind]} of {header + length} bytes exceeds the limit "
                f"of {self._max}"
            )
        end = pos + header + length
        if len(buf) < end:
            return None
        body = bytes(buf[pos + header : end])
        self._offset = end
        return self._decode(kind, flags, _Body(body, PACKET_NAMES[kind]))

    def _check_kind(self, kind: int, flags: int) -> None:
        name = PACKET_NAMES.get(kind)
        if name is None:
            raise MqttProtocolError(f"reserved packet type {kind}")
        if kind in _QOS2_HANDSHAKE:
            raise MqttProtocolError(f"{name}: QoS 2 is not supported")
        allowed = _FROM_CLIENT if self._server else _FROM_SERVER
        if kind not in allowed:
            side = "a client" if self._server else "a server"
            raise MqttProtocolError(f"{name} may not be sent by {side}")
        if kind != PUBLISH and flags != _REQUIRED_FLAGS[kind]:
            raise MqttProtocolError(f"{name}: reserved flags {flags:#06b} must be "
                                    f"{_REQUIRED_FLAGS[kind]:#06b}")
        if self._server:
            if not self._connected and kind != CONNECT:
                raise MqttProtocolError(f"{name} before CONNECT")
            if self._connected and kind == CONNECT:
                raise MqttProtocolError("a second CONNECT")

    def _decode(self, kind: int, flags: int, body: _Body) -> Packet:
        if kind == PUBLISH:
            return _decode_publish(flags, body)
        if kind == CONNECT:
            self._connected = True
            return _decode_connect(body)
        packet: Packet
        if kind == PUBACK:
            packet = Puback(body.u16("packet identifier"))
        elif kind == SUBSCRIBE:
            packet = _decode_subscribe(body, self._max_filters)
        elif kind == UNSUBSCRIBE:
            packet = _decode_unsubscribe(body, self._max_filters)
        elif kind == PINGREQ:
            packet = Pingreq()
        elif kind == DISCONNECT:
            packet = Disconnect()
        elif kind == CONNACK:
            flags_byte = body.byte("acknowledge flags")
            if flags_byte & 0xFE:
                raise body.fail("reserved acknowledge flags set")
            packet = Connack(bool(flags_byte & 1), body.byte("return code"))
        elif kind == SUBACK:
            packet_id = body.packet_id()
            codes = body.rest()
            if not codes or any(c not in (0, 1, 2, SUBACK_FAILURE) for c in codes):
                raise body.fail("bad return codes")
            packet = Suback(packet_id, tuple(codes))
        elif kind == UNSUBACK:
            packet = Unsuback(body.packet_id())
        else:  # PINGRESP
            packet = Pingresp()
        body.end()
        return packet


def _decode_connect(body: _Body) -> Connect:
    name = body.text("protocol name")
    if name not in (PROTOCOL_NAME, "MQIsdp"):
        raise body.fail(f"protocol name {name!r} is not MQTT")
    level = body.byte("protocol level")
    flags = body.byte("connect flags")
    if flags & 0x01:
        raise body.fail("reserved connect flag set")
    keep_alive = body.u16("keep alive")
    has_will, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 3, bool(flags & 0x20)
    if not has_will and (will_qos or will_retain):
        raise body.fail("will QoS or will retain set without a will")
    if will_qos == 3:
        raise body.fail("will QoS 3")
    has_user, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if has_password and not has_user:
        raise body.fail("password without a user name")
    client_id = body.text("client identifier")
    will = None
    if has_will:
        topic = body.text("will topic")
        will = Will(topic, body.binary("will message"), will_qos, will_retain)
    username = body.text("user name") if has_user else None
    password = body.binary("password") if has_password else None
    body.end()
    return Connect(
        client_id, bool(flags & 0x02), keep_alive, will, username, password, name, level
    )


def _decode_publish(flags: int, body: _Body) -> Publish:
    qos = (flags >> 1) & 3
    dup = bool(flags & 0x08)
    if qos == 3:
        raise body.fail("QoS 3")
    if qos == 2:
        raise body.fail("QoS 2 is not supported")
    if qos == 0 and dup:
        raise body.fail("DUP set on a QoS 0 message")
    topic = body.text("topic name")
    packet_id = body.packet_id() if qos else None
    return Publish(topic, body.rest(), qos, bool(flags & 1), dup, packet_id)


def _decode_subscribe(body: _Body, most: int) -> Subscribe:
    packet_id = body.packet_id()
    requests: list[tuple[str, int]] = []
    while body.left():
        if most and len(requests) > most:
            body.rest()  # over the limit: the rest is not read (MqttDecoder)
            break
        topic_filter = body.text("topic filter")
        qos = body.byte("requested QoS")
        if qos > 2:
            raise body.fail(f"requested QoS byte {qos:#04x} is invalid")
        requests.append((topic_filter, qos))
    if not requests:
        raise body.fail("no topic filter")
    return Subscribe(packet_id, tuple(requests))


def _decode_unsubscribe(body: _Body, most: int) -> Unsubscribe:
    packet_id = body.packet_id()
    filters: list[str] = []
    while body.left():
        if most and len(filters) > most:
            body.rest()  # over the limit: the rest is not read (MqttDecoder)
            break
        filters.append(body.text("topic filter"))
    if not filters:
        raise body.fail("no topic filter")
    return Unsubscribe(packet_id, tuple(filters))
