"""The load helpers' own checks: the delivery checker catches each planted violation,
and the TCP gate forwards, refuses and resets."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from cluster_load import delivery_problems
from tcp_gate import TcpGate

from migratory.model.message import Message, MessageType
from migratory.model.position import Position

S = "/load/s0"
EPOCH = 7


def delivered(*seqs: int, kind: MessageType = MessageType.UPDATE) -> list[Message]:
    return [Message(S, f"m{seq}".encode(), epoch=EPOCH, seq=seq, type=kind) for seq in seqs]


def acked(*seqs: int) -> dict[str, list[tuple[bytes, Position]]]:
    return {S: [(f"m{seq}".encode(), Position(EPOCH, seq)) for seq in seqs]}


def test_a_clean_delivery_has_no_problems() -> None:
    snapshot = delivered(2, kind=MessageType.SNAPSHOT)
    recovered = delivered(3, 4, kind=MessageType.RECOVERED)
    assert delivery_problems(delivered(1, 2) + snapshot + recovered, acked(1, 2, 3, 4)) == []


@pytest.mark.parametrize(
    ("received", "problem"),
    [
        (delivered(1, 2, 2, 3), "delivered twice"),
        (delivered(1, 3, 2), "out of order"),
        (delivered(1, 3), "gap"),
        (delivered(1, 2), "acknowledged, not delivered"),
        ([*delivered(1, 2, 3), Message(S, b"other", epoch=EPOCH, seq=3)], "two contents"),
    ],
)
def test_each_planted_violation_is_reported(received: list[Message], problem: str) -> None:
    problems = delivery_problems(received, acked(1, 2, 3))
    assert any(problem in p for p in problems), problems


def test_a_message_delivered_at_another_position_is_reported() -> None:
    moved = [Message(S, b"m1", epoch=EPOCH + 1, seq=1)]
    assert "acknowledged at" in delivery_problems(moved, acked(1))[0]


def test_a_publish_numbered_twice_is_reported_whichever_position_was_acknowledged() -> None:
    """A copy of a publish numbered again (a second position): its publisher acknowledged
    at the second one (its member jumped past the first one's batch) passed before --
    "delivered at" compares with the last delivery only."""
    twice = [*delivered(1, 2), Message(S, b"m1", epoch=EPOCH, seq=3)]
    for ack in (Position(EPOCH, 1), Position(EPOCH, 3)):
        problems = delivery_problems(twice, {S: [(b"m1", ack), (b"m2", Position(EPOCH, 2))]})
        assert any("numbered twice" in p for p in problems), problems


def test_only_what_was_acknowledged_after_the_start_is_expected() -> None:
    assert delivery_problems(delivered(3), acked(1, 2, 3), after={S: Position(EPOCH, 2)}) == []


def echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        while data := conn.recv(100):
            conn.sendall(data)


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_the_gate_forwards_refuses_and_resets() -> None:
    server, port = echo_server()
    probe = socket.create_server(("127.0.0.1", 0))
    listen = probe.getsockname()[1]
    probe.close()
    gate = TcpGate(listen, port)
    try:
        before = socket.create_connection(("127.0.0.1", listen), timeout=2)
        before.sendall(b"hello")
        assert before.recv(100) == b"hello"
        gate.close_gate()
        with pytest.raises(ConnectionResetError):  # at connect() or at the first read
            refused = socket.create_connection(("127.0.0.1", listen), timeout=2)
            refused.sendall(b"x")
            refused.recv(100)
        assert gate.refused == 1
        before.sendall(b"still")  # an open connection goes on until reset
        assert before.recv(100) == b"still"
        assert gate.close_gate(reset_open=True) == 1
        with contextlib.suppress(ConnectionResetError):
            assert before.recv(100) == b""  # ended: FIN, or RST
        gate.open_gate()
        after = socket.create_connection(("127.0.0.1", listen), timeout=2)
        after.sendall(b"again")
        assert after.recv(100) == b"again"
        for sock in (before, after):
            sock.close()
    finally:
        gate.shutdown()
        server.close()
