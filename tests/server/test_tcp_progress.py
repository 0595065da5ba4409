"""What a client socket's peer has taken (migratory/server/tcp_progress.py): the bytes it
acknowledged, moving as it reads once its receive buffer is full."""

from __future__ import annotations

import socket

from migratory.server.tcp_progress import bytes_acked


def test_the_bytes_acknowledged_move_as_the_peer_reads() -> None:
    """Both kernels full (the peer reads nothing): fewer acknowledged than sent; as the
    peer reads, more."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        writer, _ = listener.accept()
        with reader, writer:
            writer.setblocking(False)
            sent = 0
            try:
                while True:  # until the kernels hold all they will
                    sent += writer.send(bytes(65536))
            except BlockingIOError:
                pass
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
