"""The attacks of issue 14 against a live server, each with a bystander client in its
own process: the limit holds (the attacker is refused with the documented code), the
bystander gets every message it sends and is served while the attack is on (a count of
its messages, not a delay: its delays are measured by ``benchmarks/attacks.py``; a flood's
fairness is shown by order, turns.py), and the server's memory comes back near its
start."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import cbor2
import pytest
from bystander import Bystander, rss_kib
from rawclient import RawClient
from turns import FAIR_RUN, frozen, longest_attacker_run, queue_without_blocking

from migratory.model.message import Message
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.admission import SUBSCRIBE_TOO_LARGE

pytestmark = pytest.mark.slow


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


@contextmanager
def watched(server: Any, token: str | None = None) -> Iterator[Bystander]:
    """A bystander for the duration; its figures (RSS before/after too) in ``.figures``."""
    bystander = Bystander(server.port, token)
    figures = bystander.figures
    figures["rss_before_kib"] = rss_kib(server.proc.pid)
    try:
        yield bystander
    finally:
        bystander.stop()
        figures["rss_after_kib"] = rss_kib(server.proc.pid)
        print(
            f"bystander p50 {figures['p50_ms']} ms max {figures['max_ms']} ms over "
            f"{figures['count']} messages, {figures.get('served_during_attack')} during the "
            f"attack, lost "
            f"{figures['lost']}; RSS {figures['rss_before_kib']} -> "
            f"{figures.get('rss_peak_kib')} -> {figures['rss_after_kib']} KiB"
        )


SERVED_DURING_ATTACK = 5
"""Messages the bystander must get back, published after the attack started and
delivered while the attacker still holds on (a server stalled by the attack serves at
most the one in flight)."""


def check_bystander(figures: dict[str, Any]) -> None:
    assert figures.get("served_during_attack", 0) >= SERVED_DURING_ATTACK, figures
    assert figures["lost"] == 0, figures  # (its count in 1.5 s: a speed figure)


def settle_rss(server: Any, ceiling_kib: int, seconds: float = 10.0) -> int:
    """Wait until the server's RSS is below ``ceiling_kib``; the last reading."""
    deadline = time.monotonic() + seconds
    while True:
        rss = rss_kib(server.proc.pid)
        if rss <= ceiling_kib or time.monotonic() > deadline:
            return rss
        time.sleep(0.2)


def publish_history(
    port: int, subjects: list[str], count: int, size: int, token: str | None = None
) -> None:
    publisher = RawClient(port, timeout=30)
    publisher.connect("filler", token=token)
    for subject in subjects:
        for i in range(count):
            publisher.send_op(ops.Publish(Message(subject, b"h" * size, closure=str(i))))
        for _ in range(count):
            status = publisher.recv_op()
            assert isinstance(status, ops.PublishStatus) and status.status is ops.Status.PUBLISH_OK
    publisher.close()


def test_amplification_by_one_subscribe_frame_is_refused_up_front(start_server: Any) -> None:
    server = start_server(Entitlement="Basic", EntitlementAllowToken="secret")
    subjects = [f"/Amp/S{i}" for i in range(3)]
    publish_history(server.port, subjects, 1000, 1000, token="secret")  # 3 MB of cache
    with watched(server, token="secret") as bystander:
        figures = bystander.figures
        attacker = RawClient(server.port, timeout=30)
        attacker.connect("anonymous")  # no token
        entries = tuple(ops.SubscriptionRequest(subjects[i % 3], history=1000) for i in range(1000))
        payload = ops.encode_client_op(ops.Subscribe(entries))
        assert 18_000 < len(payload) < 60_000  # the 18-60 KB frame
        bystander.attack_started()
        frames = 0  # five at a time, until the bystander was served meanwhile (or 500)
        answers = []
        while frames < 500 and bystander.served_during_attack() < SERVED_DURING_ATTACK:
            for _ in range(5):
                attacker.send_payload(payload)
            answers += [attacker.recv_op() for _ in range(5 * len(entries))]
            frames += 5
        figures["rss_peak_kib"] = rss_kib(server.proc.pid)
    wrong = [
        op for op in answers
        if not isinstance(op, ops.SubjectStatus) or op.status is not ops.Status.SUBSCRIBE_DENY
        or op.reason is None or not op.reason.startswith(SUBSCRIBE_TOO_LARGE)
    ]
    assert not wrong, wrong[:3]
    assert stats(server.port)["subscribes_refused"] == frames
    assert stats(server.port)["slow_consumers"] == 0
    check_bystander(figures)
    assert figures["rss_peak_kib"] - figures["rss_before_kib"] < 30_000


def test_a_flood_on_one_connection_does_not_stall_the_others(start_server: Any) -> None:
    server = start_server()
    with watched(server) as bystander:
        figures = bystander.figures
        attacker = RawClient(server.port, timeout=30)
        attacker.connect("flooder")
        bystander.attack_started()
        mask = b"abcd"
        pings = ws.encode_masked_binary(ops.encode_client_op(ops.Ping(1)), mask) * 10_000
        fragments = ws.encode_frame(ws.BINARY, b"", fin=False, mask=mask) + ws.encode_frame(
            ws.CONTINUATION, b"", fin=False, mask=mask
        ) * 1100
        deadline = time.monotonic() + 3
        sent = 0
        try:
            while time.monotonic() < deadline:  # ~100k operations a second, never read
                attacker.send_raw(pings)
                sent += len(pings)
        except OSError:
            pass  # cut off as a slow consumer: its pongs were never read
        bystander.served_during_attack()  # so far: while the attacker was sending
        figures["rss_peak_kib"] = rss_kib(server.proc.pid)
        second = RawClient(server.port, timeout=10)
        second.connect("fragments")
        second.send_raw(fragments + ws.encode_frame(ws.CONTINUATION, b"", fin=False, mask=mask))
        close = second.recv_close()
    assert close.code == close_codes.POLICY_VIOLATION.code == 1008
    assert sent > 1_000_000
    check_bystander(figures)


def test_a_flood_waits_for_the_others_turn(start_server: Any) -> None:
    """Pings queued by the ten thousand are handled OPERATIONS_PER_TURN per turn: two
    bystanders' publishes, ready at the same moment, are handled in between -- shown by
    the order of the attacker's own stream, which carries them too (turns.py)."""
    server = start_server(BatchTime="0")
    attacker = RawClient(server.port, timeout=30)
    attacker.connect("pinger")
    attacker.subscribe("/Turns/Bystander")
    assert isinstance(attacker.recv_op(), ops.SubjectStatus)  # SUBSCRIBE_ALLOW
    bystanders = [RawClient(server.port, timeout=30) for _ in range(2)]
    for i, bystander in enumerate(bystanders):
        bystander.connect(f"bystander{i}")
    pings = 30_000
    flood = ws.encode_masked_binary(ops.encode_client_op(ops.Ping(1)), b"abcd") * pings
    publishes = [b"".join(ws.encode_masked_binary(ops.encode_client_op(ops.Publish(Message(
        "/Turns/Bystander", b"%d" % i))), b"abcd") for i in range(j * 100, j * 100 + 100))
        for j in range(2)]
    with frozen(server.proc.pid):  # ready in this order: bystander, attacker, bystander
        bystanders[0].send_raw(publishes[0])  # a few KB each: they fit in the buffers
        queued = queue_without_blocking(attacker.sock, flood)
        bystanders[1].send_raw(publishes[1])
    assert queued >= 65536, queued  # a whole received chunk at least: thousands of pings
    attacker.send_raw(flood[queued:])
    stream: list[bool] = []  # True: a bystander's message, False: a pong
    while len(stream) < pings + 200:
        op = attacker.recv_op()
        assert isinstance(op, ops.Pong | ops.Deliver), op
        stream.extend([True] * len(op.messages) if isinstance(op, ops.Deliver) else [False])
    assert stream.count(True) == 200
    assert longest_attacker_run(stream) <= FAIR_RUN, longest_attacker_run(stream)
    assert stats(server.port)["slow_consumers"] == 0


def partial_frame_connection(port: int, length: int) -> tuple[socket.socket, bytes]:
    """A session that sent all but the last byte of a ``length``-byte frame; the socket and
    what it read after the handshake response."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = new_websocket_key()
    sock.sendall(handshake_request("127.0.0.1", "/", key))
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("p")), b"abcd")
    header = ws.encode_frame(ws.BINARY, b"\0" * length, mask=b"abcd")[:-length]
    sock.sendall(connect + header + b"\0" * (length - 1))  # all but the last byte
    return sock, head.split(b"\r\n\r\n", 1)[1]


def test_partial_frames_cannot_pin_more_than_the_budget(start_server: Any) -> None:
    budget = 32 << 20
    server = start_server(IncompleteFrameBudget=str(budget), MaxHandshakesPerAddress="0",
                          MaxConnectionRatePerAddress="0")
    with watched(server) as bystander:
        figures = bystander.figures
        bystander.attack_started()
        held = [partial_frame_connection(server.port, (1 << 20) - 1) for _ in range(100)]
        bystander.served_during_attack(SERVED_DURING_ATTACK)  # while they are held
        figures["rss_peak_kib"] = rss_kib(server.proc.pid)
        closed = 0
        for sock, data in held:
            sock.settimeout(0.1)
            try:
                while len(ws.FrameDecoder(client_frames=False).events(data)) < 2:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            events = ws.FrameDecoder(client_frames=False).events(data)
            if events and isinstance(events[-1], ws.CloseReceived):
                assert events[-1].code == close_codes.TRY_AGAIN_LATER.code
                closed += 1
        for sock, _ in held:
            sock.close()
        after = settle_rss(server, figures["rss_before_kib"] + 20_000)
    assert 60 <= closed <= 75  # 1 MiB each: about 32 fit in the budget
    assert figures["rss_peak_kib"] - figures["rss_before_kib"] < (budget >> 10) + 40_000
    assert after - figures["rss_before_kib"] < 20_000, (after, figures)
    check_bystander(figures)


def test_pending_handshakes_are_capped_per_address(start_server: Any) -> None:
    server = start_server(MaxHandshakesPerAddress="100", MaxConnectionRatePerAddress="0")
    with watched(server) as bystander:
        figures = bystander.figures
        bystander.attack_started()
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
        refused = 0
        for sock in idle[100:]:
            sock.settimeout(5)
            try:
                refused += sock.recv(4096).startswith(b"HTTP/1.1 503 ")
            except ConnectionResetError:
                refused += 1
        bystander.served_during_attack(SERVED_DURING_ATTACK)  # while they are held
        figures["rss_peak_kib"] = rss_kib(server.proc.pid)
        for sock in idle:
            sock.close()
    assert refused == 200
    assert stats(server.port)["connections_refused"] == 200
    check_bystander(figures)


def test_one_off_subjects_are_forgotten(start_server: Any) -> None:
    server = start_server(CacheExpireTime="1")
    publisher = RawClient(server.port, timeout=30)
    publisher.connect("one-off")
    for i in range(20_000):
        publisher.send_op(ops.Publish(Message(f"/OneOff/s{i}", b"x" * 100)))
    publisher.send_op(ops.Ping(1))
    while not isinstance(publisher.recv_op(), ops.Pong):
        pass
    assert stats(server.port)["messages_published"] == 20_000
    deadline = time.monotonic() + 10
    while stats(server.port)["subjects"] > 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert stats(server.port)["subjects"] == 0


def test_the_merged_snapshot_is_bounded_by_max_message_size(start_server: Any) -> None:
    server = start_server(MaxMessageSize="65536", ClientMaxPendingBytes="131072")
    publisher = RawClient(server.port, timeout=30)
    publisher.connect("grower")
    statuses = []
    for i in range(40):
        message = Message("/Grow/s", b"v", {f"f{i}": "x" * 4000}, retained=True, closure=str(i))
        statuses.append(publisher.publish(message).status)
    assert statuses[:16] == [ops.Status.PUBLISH_OK] * 16
    assert statuses[-1] is ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED
    subscriber = RawClient(server.port, timeout=10)
    subscriber.connect("late")
    subscriber.subscribe("/Grow/s")
    answer = [subscriber.recv_op(), subscriber.recv_op()]
    assert isinstance(answer[1], ops.Deliver)
    assert answer[1].messages[0].size() <= 65536


def test_connections_beyond_the_cap_get_503_and_the_cap_frees_up(start_server: Any) -> None:
    server = start_server(MaxConnections="40")
    with watched(server) as bystander:
        figures = bystander.figures
        bystander.attack_started()
        held = [RawClient(server.port) for _ in range(39)]  # the bystander is the 40th
        for i, client in enumerate(held):  # clients, not handshakes (a newcomer closes
            client.connect(f"held{i}")  # the oldest of those: test_slowloris.py)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503 ")
        bystander.served_during_attack(SERVED_DURING_ATTACK)  # while the server is full
        for client in held:
            client.close()
        time.sleep(0.3)
        RawClient(server.port).connect("after")
        figures["rss_peak_kib"] = rss_kib(server.proc.pid)
    check_bystander(figures)


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (cbor2.dumps({"op": "subscribe", "subjects": [{"subject": "/a/b", "conflation": 10**400}]}),
         close_codes.BAD_OPERATION.code),
        (ops.encode_client_op(ops.Ping(1)) + b"\x00", close_codes.INVALID_PAYLOAD.code),
    ],
    ids=["conflation-10e400", "trailing-bytes"],
)
def test_small_ones_close_with_the_documented_code(
    start_server: Any, payload: bytes, code: int
) -> None:
    server = start_server()
    client = RawClient(server.port)
    client.connect("small")
    client.send_payload(payload)
    assert client.recv_close().code == code
    assert "Traceback" not in server.log() and "internal error" not in server.log()


def test_head_has_no_body(start_server: Any) -> None:
    server = start_server()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"\r\n\r\n")



def test_the_outbox_budget_cuts_off_the_clients_that_are_behind(start_server: Any) -> None:
    server = start_server(OutboxMemoryBudget="2097152", ClientMaxPendingBytes="8388608")
    stuck = []
    for i in range(4):  # together they could hold 32 MB; the budget is 2 MB
        client = RawClient(server.port)
        client.connect(f"stuck{i}")
        client.subscribe("/Budget/s")
        client.recv_op()
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.append(client)
    reader = RawClient(server.port, timeout=30)
    reader.connect("reader")
    reader.subscribe("/Budget/s")
    reader.recv_op()
    publisher = RawClient(server.port, timeout=30)
    publisher.connect("publisher")
    peak = 0
    for i in range(200):
        status = publisher.publish(Message("/Budget/s", b"b" * 64_000, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
        [message] = reader.recv_messages(1)
        assert message.seq == i + 1  # the reader keeps up and gets every message
        if i % 20 == 0:
            peak = max(peak, stats(server.port)["outbox_bytes"])
    figures = stats(server.port)
    assert figures["slow_consumers"] == 4
    assert peak <= 2_097_152 + 65_000
    assert figures["outbox_bytes"] < 100_000
