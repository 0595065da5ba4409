"""The garbage bystander (``--garbage N``): N tasks that feed every member malformed
input during a run -- broken WebSocket frames and operations, broken HTTP, bad MQTT
packets, and bytes at the cluster-link and Raft ports -- while the workload runs.

Nothing it does is recorded as a client of the history: what it must not do is
disturb the others (an acknowledged publish lost, a member crash, a publish of its
own delivered to a ``/chaos`` subscriber: the checker's ``lost``, ``unexpected_exits``
and ``unexpected``). Its inputs that *name* a ``/chaos`` subject are all invalid (a
publish before the handshake, an MQTT QoS of 3, a malformed operation): a member that
took one would deliver content that is not the workload's, which the checker reports
as ``unexpected``. Well-formed publishes go to ``/garbage/...`` subjects, which nobody
watches.

The inputs are sans-I/O (:func:`draw`: a seeded choice of (port kind, name, bytes));
:func:`feeder` is the trio side: one connection per input, to the members in turn, at
most one every :data:`GAP` s per task, each read for at most :data:`LINGER` s and
counted by what the member did with it (``closed``: the member ended it, ``open``:
still open after :data:`LINGER` s, ``refused``: no connection, ``answered``: bytes
came back) into ``run.json`` ``garbage``.
"""

from __future__ import annotations

import os
import random
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import cbor2
import trio

from chaos.members import Member, mqtt_port
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key

GAP = 0.25
"""Seconds between one task's inputs (a few connections a second per task: far under
the per-address rates of the client and cluster ports, which every client of a run
shares on 127.0.0.1)."""
LINGER = 1.0
"""Seconds a connection is read for an answer before the bystander closes it."""
PORT_KINDS = ("ws", "http", "mqtt", "cluster", "raft")


@dataclass(frozen=True)
class Input:
    port: str  # one of PORT_KINDS
    name: str
    data: bytes
    handshake: bool = False  # "ws": a valid WebSocket handshake first


def _masked(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0) -> bytes:
    frame = ws.encode_frame(ws.BINARY, payload, mask=os.urandom(4))
    return bytes([(0x80 if fin else 0) | rsv | opcode]) + frame[1:]


def _op(value: object) -> bytes:
    return _masked(ws.BINARY, cbor2.dumps(value))


def _connect() -> bytes:
    return _op({"op": "connect", "version": 1, "client": "garbage"})


def _ws_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    junk = rng.randbytes(rng.randint(1, 300))
    return [
        ("unmasked frame", ws.encode_frame(ws.BINARY, b"\x01\x02")),
        ("reserved opcode", _masked(0x3, b"x")),
        ("rsv bit", _masked(ws.BINARY, b"x", rsv=0x40)),
        ("length 2**63", b"\x82\xff" + b"\xff" * 8 + b"\x00" * 4),
        ("text not utf-8", _masked(ws.TEXT, b"\xff\xfe\xfd")),
        ("fragmented ping", _masked(ws.PING, b"p", fin=False)),
        ("ping of 200 bytes", b"\x89\xfe\x00\xc8" + b"\x00" * 4 + b"p" * 200),
        ("continuation first", _masked(ws.CONTINUATION, b"x")),
        ("close of 1 byte", _masked(ws.CLOSE, b"\x03")),
        ("not cbor", _masked(ws.BINARY, junk)),
        ("cbor not a map", _connect() + _op([1, 2, 3])),
        ("publish before connect", _op({"op": "publish", "subject": "/chaos/s0",
                                        "content": b"garbage", "closure": "g"})),
        ("publish, content a number", _connect() + _op(
            {"op": "publish", "subject": "/chaos/s0", "content": 5, "closure": "g"})),
        ("publish, subject a number", _connect() + _op(
            {"op": "publish", "subject": 7, "content": b"garbage"})),
        ("publish with a position of its own", _connect() + _op(
            {"op": "publish", "subject": "/garbage/p", "content": b"g", "epoch": 1, "seq": 9})),
        ("subscribe, seq -1", _connect() + _op(
            {"op": "subscribe", "subjects": [{"subject": "/chaos/s0", "epoch": 1, "seq": -1}]})),
        ("subscribe, seq 2**64", _connect() + _op(
            {"op": "subscribe", "subjects": [{"subject": "/chaos/s1", "epoch": 2**64 - 1,
                                              "seq": 2**64}]})),
        ("subscribe, history 10**12", _connect() + _op(
            {"op": "subscribe", "subjects": [{"subject": "/chaos/s2", "history": 10**12}]})),
        ("connect twice", _connect() + _connect()),
        ("half a frame", _connect() + _op({"op": "ping", "id": 1})[:5]),
    ]


def _http(head: str, body: bytes = b"") -> bytes:
    return head.replace("\n", "\r\n").encode() + body


def _http_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    json_ok = b'{"subject": "/garbage/h", "content": "g"}'
    return [
        ("nul in the request line", b"GET\x00/ HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("no http version", b"GET /healthz\r\n\r\n"),
        ("short body", _http("POST /publish HTTP/1.1\nHost: x\nContent-Length: 100\n\n",
                             b'{"subject": "/chaos/s0", "content": "g')),
        ("negative length", _http("POST /publish HTTP/1.1\nHost: x\nContent-Length: -1\n\n")),
        ("length and chunked", _http(
            "POST /publish HTTP/1.1\nHost: x\nContent-Length: 4\n"
            "Transfer-Encoding: chunked\n\n", b"0\r\n\r\n")),
        ("bad chunk size", _http("POST /publish HTTP/1.1\nHost: x\nTransfer-Encoding: "
                                 "chunked\n\n", b"zz\r\n" + json_ok + b"\r\n0\r\n\r\n")),
        ("body not json", _http("POST /publish HTTP/1.1\nHost: x\nContent-Length: 5\n\n",
                                b"{{{{{")),
        ("content a number", _http(
            "POST /publish HTTP/1.1\nHost: x\nContent-Length: 40\n\n",
            b'{"subject": "/chaos/s0", "content": 77} ')),
        ("unknown key", _http("POST /publish HTTP/1.1\nHost: x\nContent-Length: 52\n\n",
                              b'{"subject": "/chaos/s0", "content": "g", "epoch": 1}')),
        ("smuggled second request", _http(
            "POST /publish HTTP/1.1\nHost: x\nContent-Length: 2\n\n",
            b"{}POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(json_ok)).encode() + b"\r\n\r\n" + json_ok)),
        ("header of 70 kB", _http("GET /healthz HTTP/1.1\nHost: x\nX-Big: " + "a" * 70_000
                                  + "\n\n")),
        ("bad websocket version", _http(
            "GET / HTTP/1.1\nHost: x\nUpgrade: websocket\nConnection: Upgrade\n"
            "Sec-WebSocket-Key: AAAA\nSec-WebSocket-Version: 12\n\n")),
        ("sse with a garbage Last-Event-ID", _http(
            "GET /events?subject=/chaos/s3 HTTP/1.1\nHost: x\nLast-Event-ID: 9:9:x\n\n")),
        ("sse of a bad subject", _http("GET /events?subject=%ZZ%00 HTTP/1.1\nHost: x\n\n")),
        ("snapshot of no subject", _http("GET /snapshot HTTP/1.1\nHost: x\n\n")),
        ("random bytes", rng.randbytes(rng.randint(1, 400))),
    ]


def _mqtt_string(text: bytes) -> bytes:
    return struct.pack(">H", len(text)) + text


def _mqtt_packet(first: int, body: bytes) -> bytes:
    n, length = len(body), b""
    while True:
        n, digit = n >> 7, n & 0x7F
        length += bytes([digit | (0x80 if n else 0)])
        if not n:
            return bytes([first]) + length + body


def _mqtt_connect(name: bytes = b"MQTT", level: int = 4, flags: int = 0x02,
                  client: bytes = b"garbage") -> bytes:
    return _mqtt_packet(0x10, _mqtt_string(name) + bytes([level, flags]) + b"\x00\x0a"
                        + _mqtt_string(client))


def _mqtt_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    client = b"g" + str(rng.randrange(10**6)).encode()  # never a workload client's id
    connect = _mqtt_connect(client=client)
    publish0 = _mqtt_packet(0x30, _mqtt_string(b"chaos/s0") + b"garbage")
    return [
        ("protocol name MQTX", _mqtt_connect(b"MQTX", client=client)),
        ("protocol level 99", _mqtt_connect(level=99, client=client)),
        ("reserved connect flag", _mqtt_connect(flags=0x03, client=client)),
        ("password without user name", _mqtt_connect(flags=0x42, client=client)),
        ("will qos 3", _mqtt_connect(flags=0x1E, client=client)),
        ("remaining length of 5 bytes", b"\x10\xff\xff\xff\xff\x7f"),
        ("publish before connect", publish0),
        ("publish qos 3", connect + _mqtt_packet(0x36, _mqtt_string(b"chaos/s0") + b"\x00\x01"
                                                 + b"garbage")),
        ("publish to a wildcard", connect + _mqtt_packet(0x30, _mqtt_string(b"chaos/#")
                                                         + b"garbage")),
        ("subscribe qos 3", connect + _mqtt_packet(0x82, b"\x00\x01" + _mqtt_string(b"chaos/s0")
                                                   + b"\x03")),
        ("subscribe a bad filter", connect + _mqtt_packet(
            0x82, b"\x00\x01" + _mqtt_string(b"chaos/#/x") + b"\x01")),
        ("subscribe with no filter", connect + _mqtt_packet(0x82, b"\x00\x01")),
        ("packet type 0", connect + b"\x00\x00"),
        ("packet type 15", connect + b"\xf0\x00"),
        ("second connect", connect + connect),
        ("puback of nothing", connect + _mqtt_packet(0x40, b"\x00\x07")),
        ("topic not utf-8", connect + _mqtt_packet(0x30, _mqtt_string(b"chaos/\xff") + b"g")),
        ("truncated connect", connect[: rng.randint(1, len(connect) - 1)]),
        ("random bytes", rng.randbytes(rng.randint(1, 300))),
    ]


def _peer_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    return [
        ("length 2**32-1", b"\xff\xff\xff\xff" + rng.randbytes(64)),
        ("cbor not a map", struct.pack(">I", 3) + b"\x83\x01\x02"),
        ("auth with no mac", struct.pack(">I", 20) + cbor2.dumps({"t": "auth", "m": "x:1"})[:20]),
        ("an http request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("random bytes", rng.randbytes(rng.randint(1, 400))),
    ]


def inputs(rng: random.Random) -> dict[str, list[tuple[str, bytes]]]:
    """Every input of each port kind, drawn with ``rng`` (its random parts)."""
    peer = _peer_inputs(rng)
    return {"ws": _ws_inputs(rng), "http": _http_inputs(rng), "mqtt": _mqtt_inputs(rng),
            "cluster": peer, "raft": peer}


def draw(rng: random.Random, kinds: Sequence[str]) -> Input:
    """One input for one of ``kinds`` (the port kinds the member has)."""
    kind = rng.choice(list(kinds))
    name, data = rng.choice(inputs(rng)[kind])
    return Input(kind, name, data, handshake=kind == "ws")


async def _feed(port: int, item: Input) -> str:
    """Send one input on a new connection; what the member did with it."""
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        return "refused"
    outcome = "open"
    async with stream:
        try:
            with trio.move_on_after(LINGER):
                if item.handshake:
                    await stream.send_all(handshake_request("127.0.0.1", "/",
                                                            new_websocket_key()))
                await stream.send_all(item.data)
                answered = False
                while True:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return "answered, closed" if answered else "closed"
                    answered = True
                    outcome = "answered, open"
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return "closed"
    return outcome


async def feeder(rng: random.Random, ports: Sequence[Mapping[str, int]],
                 counts: Counter[str], running: Callable[[], bool]) -> None:
    """Feed the members (``ports``: each one's port by kind) in turn, one input every
    :data:`GAP` s, while ``running()``; ``counts`` by ``kind/name/outcome``."""
    turn = rng.randrange(len(ports))
    while running():
        member_ports = ports[turn % len(ports)]
        turn += 1
        item = draw(rng, sorted(member_ports))
        outcome = await _feed(member_ports[item.port], item)
        counts[f"{item.port}/{item.name}/{outcome}"] += 1
        await trio.sleep(GAP)


async def bystanders(n: int, seed: int, ports: Sequence[Mapping[str, int]],
                     counts: Counter[str], running: Callable[[], bool]) -> None:
    """``n`` feeders, each on its own seeded draw (the run's seed and its number)."""
    async with trio.open_nursery() as nursery:
        for k in range(n):
            nursery.start_soon(feeder, random.Random(f"{seed}-garbage-{k}"), ports, counts,
                               running)


def garbage_ports(client_urls: Sequence[str], members: Sequence[Member], seeds: int, *,
                  raft: bool) -> list[dict[str, int]]:
    """Each member's ports by kind: its client port (WebSocket, HTTP), MQTT port (when the
    run has MQTT listeners), cluster link and (``raft``: Guaranteed) Raft port of the
    seeds -- the ports clients and peers use, through the proxies when proxied."""
    ports = []
    for m, url in zip(members, client_urls, strict=True):
        client = int(url.rsplit(":", 1)[1])
        link = int(m.settings["ClusterMemberListen"].rsplit(":", 1)[1])
        ports.append({"ws": client, "http": client, "cluster": link,
                      **({"mqtt": mqtt_port(url)} if "ListenMqtt" in m.settings else {}),
                      **({"raft": link + 1} if raft and m.index < seeds else {})})
    return ports
