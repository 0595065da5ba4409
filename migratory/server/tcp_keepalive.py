"""TCP keepalive on an accepted client socket (``ClientTcpKeepAlive``,
:mod:`migratory.config_keepalive`): the kernel probes an idle peer and resets the
connection once it stops answering, so a client gone without a FIN or RST does not
hold its connection, session and outbox for ever."""

from __future__ import annotations

import socket

from migratory.config_keepalive import OFF, KeepAlive


def keep_alive(sock: socket.socket, setting: KeepAlive) -> None:
    """Turn TCP keepalive on for ``sock`` with ``setting``; nothing when it is off. An
    option this platform lacks (TCP_KEEPIDLE on some BSDs) is skipped: the kernel's
    own value stands."""
    if setting == OFF:
        return
    idle, interval, probes = setting
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", probes)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
