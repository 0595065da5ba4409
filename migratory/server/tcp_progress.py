"""What the peer of a client socket has taken: the bytes it acknowledged (Linux
``TCP_INFO``, ``tcpi_bytes_acked``). A peer acknowledges data once its receive buffer
holds it; with that buffer full, only as its application reads. The count moves with
every read, where writability does not: the kernel calls a full socket writable again
only once half of what it holds is gone, seconds apart for a reader of a few MB/s."""

from __future__ import annotations

import socket
import struct

# struct tcp_info (linux/tcp.h): 8 one-byte fields, 24 u32, total_retrans, the two
# pacing rates (u64), then tcpi_bytes_acked (u64, Linux 4.1+)
_BYTES_ACKED_OFFSET = 120
_TCP_INFO_SIZE = 256


def bytes_acked(sock: socket.socket) -> int | None:
    """Bytes ``sock``'s peer acknowledged since the connection began; None where the
    platform cannot tell (no ``TCP_INFO``, or one too short)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_SIZE)
    except OSError:
        return None
    if len(info) < _BYTES_ACKED_OFFSET + 8:
        return None
    acked: int = struct.unpack_from("=Q", info, _BYTES_ACKED_OFFSET)[0]
    return acked
