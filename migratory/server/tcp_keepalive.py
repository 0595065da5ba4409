"""TCP keepalive on an accepted client socket (``ClientTcpKeepAlive``,
:mod:`migratory.config_keepalive`): the kernel probes an idle peer and resets the
connection once it stops answering, so a client gone without a FIN or RST does not
hold its connection, session and outbox for ever."""

from __future__ import annotations

import socket

from migratory.config_keepalive import OFF, KeepAlive


def user_timeout(setting: KeepAlive) -> int:
    """TCP_USER_TIMEOUT, in milliseconds: how long data the server sent may stay
    unacknowledged before the kernel resets the connection -- the keepalive's own bound,
    idle + interval x probes. Keepalive probes only an idle connection: the kernel sends
    none while data waits to be acknowledged (tcp_keepalive_timer: ``packets_out`` or a
    write queue not empty reschedules it), so a client gone while its messages, its
    outbox's last write, were in flight -- a client cut off mid-burst, a resume's
    recovered messages -- was held for the retransmissions' ~15 minutes (tcp_retries2).
    A peer that is there and does not read answers the zero-window probes: it is not
    reset (Linux 5.11 and later; before, it was after this long too, which the
    slow-consumer cut-off does long before with messages flowing)."""
    idle, interval, probes = setting
    return (idle + interval * probes) * 1000


def keep_alive(sock: socket.socket, setting: KeepAlive) -> None:
    """Turn TCP keepalive on for ``sock`` with ``setting``; nothing when it is off. An
    option this platform lacks (TCP_KEEPIDLE on some BSDs) is skipped: the kernel's
    own value stands."""
    if setting == OFF:
        return
    idle, interval, probes = setting
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", probes), ("TCP_USER_TIMEOUT", user_timeout(setting))):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
