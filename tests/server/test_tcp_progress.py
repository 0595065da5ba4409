"""What a client socket's peer has taken (migratory/server/tcp_progress.py): the bytes it
acknowledged, moving as it reads once its receive buffer is full."""

from __future__ import annotations

import socket
import time

from migratory.server.tcp_progress import bytes_acked, end_taken


def fill(writer: socket.socket) -> int:
    """Write until the kernels hold all they will (the peer reads nothing); how much."""
    writer.setblocking(False)
    sent = 0
    try:
        while True:
            sent += writer.send(bytes(65536))
    except BlockingIOError:
        return sent


def test_the_bytes_acknowledged_move_as_the_peer_reads() -> None:
    """Both kernels full (the peer reads nothing): fewer acknowledged than sent; as the
    peer reads, more."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        writer, _ = listener.accept()
        with reader, writer:
            sent = fill(writer)
            before = bytes_acked(writer)
            assert before is not None and 0 < before < sent
            reader.settimeout(10)
            after = before
            for _ in range(10_000):  # the peer reads until its window opens (bounded)
                reader.recv(65536)
                after = bytes_acked(writer)
                assert after is not None
                if after > before:
                    break
            assert before < after <= sent + 1  # (+ 1: the FIN is not sent yet)


def test_a_socket_that_is_not_tcp_tells_nothing() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert bytes_acked(left) is None
        assert end_taken(left) is None


def test_the_end_is_taken_once_the_peer_acknowledged_every_byte_and_the_fin() -> None:
    """The drain counts an SSE or MQTT client gone at this (connection_linger.py): a peer
    that reads nothing (both kernels full) has not taken the end after the shutdown; once
    it read everything it has, its own end still open."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        writer, _ = listener.accept()
        with reader, writer:
            assert end_taken(writer) is False  # (open: no end written)
            sent = fill(writer)
            writer.shutdown(socket.SHUT_WR)
            assert end_taken(writer) is False  # bytes and the FIN wait in our kernel
            reader.settimeout(10)
            got = 0
            while chunk := reader.recv(65536):  # to the end: its FIN read (bounded: sent)
                got += len(chunk)
            assert got == sent
            for _ in range(1000):  # the last ACK may trail the read (a guard: 10 s)
                if end_taken(writer):
                    break
                time.sleep(0.01)
            assert end_taken(writer) is True  # the reader never closed its end
