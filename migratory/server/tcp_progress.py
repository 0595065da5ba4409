"""What the peer of a client socket has taken: the bytes it acknowledged (Linux
``TCP_INFO``, ``tcpi_bytes_acked``; those not yet: ``SIOCOUTQ``). A peer acknowledges
data once its receive buffer holds it; with that buffer full, only as its application
reads. The count moves with every read, where writability does not: the kernel calls a
full socket writable again only once half of what it holds is gone, seconds apart for a
reader of a few MB/s."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

# struct tcp_info (linux/tcp.h): 8 one-byte fields, 24 u32, total_retrans, the two
# pacing rates (u64), then tcpi_bytes_acked (u64, Linux 4.1+)
_BYTES_ACKED_OFFSET = 120
_TCP_INFO_SIZE = 256


def _tcp_info(sock: socket.socket) -> bytes | None:
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_SIZE)
    except OSError:
        return None


def bytes_acked(sock: socket.socket) -> int | None:
    """Bytes ``sock``'s peer acknowledged since the connection began; None where the
    platform cannot tell (no ``TCP_INFO``, or one too short)."""
    info = _tcp_info(sock)
    if info is None or len(info) < _BYTES_ACKED_OFFSET + 8:
        return None
    acked: int = struct.unpack_from("=Q", info, _BYTES_ACKED_OFFSET)[0]
    return acked


# tcpi_state (the first byte of struct tcp_info): after our FIN, the states in which the
# peer acknowledged it, so every byte before it too (linux/tcp_states.h)
_FIN_WAIT2, _TIME_WAIT, _CLOSE = 5, 6, 7


def end_taken(sock: socket.socket) -> bool | None:
    """After ``sock.shutdown(SHUT_WR)``: whether the peer's TCP acknowledged every byte
    written and the end of the stream (our FIN), whether or not its application has
    read them or closed its own end. None where the platform cannot tell."""
    info = _tcp_info(sock)
    if info is None:
        return None
    return bool(info) and info[0] in (_FIN_WAIT2, _TIME_WAIT, _CLOSE)


def unacknowledged_bytes(sock: socket.socket) -> int | None:
    """Bytes written to ``sock`` that its peer has not acknowledged yet (in the kernel's
    send buffer: Linux ``SIOCOUTQ``, the same request as ``TIOCOUTQ``); None where the
    platform cannot tell."""
    request = getattr(termios, "TIOCOUTQ", None)
    if request is None:
        return None
    try:
        answer = fcntl.ioctl(sock.fileno(), request, b"\0" * 4)
    except OSError:
        return None
    count: int = struct.unpack("i", answer)[0]
    return count
