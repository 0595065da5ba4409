"""Time-bounded property-based fuzzing of each client decoder of a live server -- the
WebSocket framing, the CBOR operations, HTTP requests and MQTT packets -- with a
bystander client in its own process whose delay is checked, and the server's RSS.

``make test`` gives each decoder a few seconds; ``make fuzz DURATION=10m`` shares the
duration between them (``MIGRATORY_FUZZ_DURATION``, e.g. ``90s``, ``10m``, ``1h``).
Hypothesis generates rounds of inputs until the time is up; every input goes to a new
connection. After each decoder: the server is alive, logged no traceback, the
bystander lost nothing and was served while the fuzzing went on (a count of its
messages published after the fuzzing started and delivered before it ended, not a
delay), and the RSS is back within 30 MB of its start.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from bystander import Bystander, rss_kib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rawclient import RawClient

from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key

DECODERS = ("websocket", "cbor", "http", "mqtt")
MAX_RSS_GROWTH_KIB = 30_000
MIN_INPUTS = 20
"""Inputs each decoder gets however slow the machine (hypothesis can take the whole time
to start on a busy one): the fuzzing goes on past its time until then."""
SERVED_DURING_FUZZING = 5
"""The bystander's messages published and delivered while the fuzzing went on (a
server stalled by the inputs serves at most the one in flight)."""


def fuzz_seconds() -> float:
    """Seconds for each decoder: MIGRATORY_FUZZ_DURATION shared by the decoders."""
    text = os.environ.get("MIGRATORY_FUZZ_DURATION", "")
    if not text:
        return 3.0
    units = {"s": 1, "m": 60, "h": 3600}
    total = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    return max(1.0, total / len(DECODERS))


# --- inputs --------------------------------------------------------------------------

MASK = b"\x11\x22\x33\x44"
frames = st.builds(
    lambda opcode, fin, payload, rsv: bytes([(0x80 if fin else 0) | rsv | opcode])
    + ws.encode_frame(ws.BINARY, payload, mask=MASK)[1:],
    st.sampled_from([0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3, 0xB]),
    st.booleans(),
    st.binary(max_size=300),
    st.sampled_from([0, 0, 0, 0x40]),
)
websocket_inputs = st.lists(frames, max_size=12).map(b"".join) | st.binary(max_size=600)

cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(max_size=20) | st.binary(max_size=20) | st.floats(allow_nan=True),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12,
)
op_maps = st.fixed_dictionaries(
    {"op": st.sampled_from(["publish", "subscribe", "unsubscribe", "ping", "connect", "x"])},
    optional={
        "subject": st.sampled_from(["/a/b", "", "/", "a", "/a//b"]) | st.text(max_size=30),
        "subjects": st.lists(
            st.fixed_dictionaries({"subject": st.text(max_size=12)},
                                  optional={"history": cbor_values, "conflation": cbor_values,
                                            "epoch": cbor_values, "seq": cbor_values})
            | cbor_values, max_size=5),
        "content": st.binary(max_size=50) | cbor_values,
        "fields": cbor_values,
        "retained": cbor_values,
        "closure": cbor_values,
        "id": cbor_values,
    },
)
cbor_inputs = st.one_of(
    op_maps.map(cbor2.dumps),
    op_maps.map(lambda m: cbor2.dumps(m) + b"\x00"),
    cbor_values.map(cbor2.dumps),
    st.binary(max_size=200),
)
http_inputs = st.lists(
    st.sampled_from(["GET ", "HEAD ", "POST ", "/snapshot?subject=/a/b", "/healthz", "/%ff",
                     " HTTP/1.1\r\n", "Host: x\r\n", "Content-Length: 5\r\n",
                     "Transfer-Encoding: chunked\r\n", "Upgrade: websocket\r\n",
                     "Connection: Upgrade\r\n", "Sec-WebSocket-Key: x\r\n", "\r\n", "\x00"]),
    max_size=20,
).map(lambda parts: "".join(parts).encode("latin-1")) | st.binary(max_size=400)
mqtt_inputs = st.binary(max_size=400) | st.builds(
    lambda rest: b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00" + rest, st.binary(max_size=200)
)


# --- sending -------------------------------------------------------------------------


def exchange(port: int, data: bytes, *, prefix: bytes = b"") -> None:
    """One connection: ``prefix`` then ``data``; read what comes back for a moment."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(prefix + data)
            sock.settimeout(0.05)
            while sock.recv(65536):
                pass
    except OSError:
        pass  # closed, reset or silent: all fine; what matters is the server's health


def websocket_prefix(connect: bool) -> bytes:
    key = new_websocket_key()
    head = handshake_request("127.0.0.1", "/", key)
    if not connect:
        return head
    return head + ws.encode_masked_binary(ops.encode_client_op(ops.Connect("fuzz")), MASK)


def senders(server: Any) -> dict[str, tuple[Any, Callable[[bytes], None]]]:
    port = server.port
    return {
        "websocket": (websocket_inputs,
                      lambda data: exchange(port, data, prefix=websocket_prefix(True))),
        "cbor": (cbor_inputs, lambda data: exchange(
            port, ws.encode_masked_binary(data, MASK), prefix=websocket_prefix(True))),
        "http": (http_inputs, lambda data: exchange(port, data)),
        "mqtt": (mqtt_inputs, lambda data: exchange(server.mqtt_port, data)),
    }


@pytest.mark.slow
@pytest.mark.parametrize("decoder", DECODERS)
def test_fuzz_decoder_on_a_live_server(start_server: Any, decoder: str) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0", HandshakeTimeout="2",
                          MaxHandshakesPerAddress="0")
    strategy, send = senders(server)[decoder]
    rss_before = rss_kib(server.proc.pid)
    bystander = Bystander(server.port)
    bystander.attack_started()
    deadline = time.monotonic() + fuzz_seconds()
    count = 0

    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def round_(data: bytes) -> None:
        nonlocal count
        if time.monotonic() < deadline or count < MIN_INPUTS:
            send(data)
            count += 1

    while time.monotonic() < deadline or count < MIN_INPUTS:  # (a slow box: the count)
        round_()
    served = bystander.served_during_attack()  # so far: while the inputs were coming
    figures = bystander.stop()
    rss_after = rss_kib(server.proc.pid)
    print(f"{decoder}: {count} inputs; bystander served {served} times meanwhile, p50 "
          f"{figures['p50_ms']} ms max {figures['max_ms']} ms; RSS {rss_before} -> "
          f"{rss_after} KiB")
    assert server.proc.poll() is None, server.log()
    assert "Traceback" not in server.log() and "internal error" not in server.log()
    client = RawClient(server.port)
    client.connect("after-fuzz")
    assert figures["lost"] == 0 and served >= SERVED_DURING_FUZZING, figures
    assert rss_after - rss_before < MAX_RSS_GROWTH_KIB
