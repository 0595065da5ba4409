"""Accepting clients on a listening socket: admission (limits.py), then a connection.

One loop per client listener (:class:`~migratory.server.app.Server` starts them): the
connections waiting are taken 64 at a time (:func:`~migratory.server.accept.accepted`,
which says a want of descriptors once, then counts it); each is reset at once past
``MaxConnectionRatePerAddress`` (:mod:`migratory.server.front_rate`: before any TLS or
HTTP work) and, on an encrypted port, past its share of ``MaxTlsHandshakeRate``
(:mod:`migratory.server.handshake_share`: the TLS handshakes a second of every address
together, shared between them), admitted or refused (per-address limits,
MaxConnections, each counted per :func:`~migratory.server.front_rate.address_group`:
an IPv6 address by its /64: a 503 on a native port, CONNACK 3 on an MQTT port, a
reset on a TLS port, :func:`~migratory.server.limits.refusal_bytes`), becomes a
:class:`Connection` (or an :class:`MqttConnection` on a ``ListenMqtt`` port) and may
make room for itself by closing the oldest connection still in its handshake
(MaxPendingHandshakes).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from typing import TYPE_CHECKING

import trio

from migratory.listeners import Listener
from migratory.server.accept import accepted, reset
from migratory.server.connection import Connection
from migratory.server.exhaustion import Exhaustion
from migratory.server.front_rate import address_group
from migratory.server.limits import Eviction, Refusal, refusal_bytes
from migratory.server.mqtt_connection import MqttConnection
from migratory.server.tcp_keepalive import keep_alive

if TYPE_CHECKING:
    from migratory.server.app import Server

log = logging.getLogger("migratory.server")


async def accept_clients(
    server: Server, listener: socket.socket, spec: Listener, tls: ssl.SSLContext | None
) -> None:
    """Accept clients on ``listener`` (the socket of ``spec``) until cancelled."""
    stats = server.ctx.stats
    host, port = spec.address[:2]
    exhaustion = Exhaustion(log, f"client listener {host}:{port}")  # EMFILE: said once
    prefix = server.config.per_address_ipv6_prefix
    while True:
        await trio.lowlevel.wait_readable(listener)
        if exhaustion.exhausted:
            await trio.sleep(exhaustion.retry)
        now = trio.current_time()
        for sock, address in accepted(listener, exhaustion):
            group = address_group(address[0], prefix)  # an IPv6 address: its /64
            if not server.front_rate.take(group, now):
                too_fast(server, sock, group)
                continue
            if tls is not None and not server.tls_share.take(group, now):
                over_share(server, sock, group)
                continue
            sock.setblocking(False)
            refusal = server.admission.admit(group)
            if refusal is not None:
                refuse(server, sock, refusal, spec, encrypted=tls is not None)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock, server.config.client_tcp_keepalive)  # ClientTcpKeepAlive
            kind = MqttConnection if spec.mqtt_tcp else Connection
            connection = kind(server, sock, f"{address[0]}:{address[1]}", spec, tls,
                              address=group)
            server.connections.add(connection)
            server.frontends.opened(connection.frontend)
            stats.connections_accepted += 1
            stats.connections_open = len(server.connections)
            evicted = server.admission.enter(connection, spec)  # limits.py
            if evicted is not None:
                evict(server, evicted)
            stats.handshakes_pending = server.admission.pending_handshakes
            if connection in server.connections:  # not the one evicted
                server.nursery.start_soon(connection.run)


def too_fast(server: Server, sock: socket.socket, group: str) -> None:
    """Past MaxConnectionRatePerAddress: reset at once, nothing read, nothing said (a
    503 would be garbage to a TLS client, and costs a send); counted, logged once a
    minute."""
    server.refused("MaxConnectionRatePerAddress",
                   f"more than {server.config.max_connection_rate_per_address} new "
                   f"connections a second from {group} (MaxConnectionRatePerAddress): "
                   "reset at accept")
    reset(sock)


def over_share(server: Server, sock: socket.socket, group: str) -> None:
    """Past MaxTlsHandshakeRate (handshake_share.py): reset at once, as too_fast."""
    share = server.tls_share
    server.refused("MaxTlsHandshakeRate",
                   f"a new TLS connection from {group} past its share of "
                   f"{server.config.max_tls_handshake_rate} a second "
                   f"(MaxTlsHandshakeRate; {share.share():.1f} a second each, "
                   f"{len(share)} addresses connecting): reset at accept")
    reset(sock)


def refuse(
    server: Server, sock: socket.socket, refusal: Refusal, spec: Listener, *, encrypted: bool
) -> None:
    """Say why in the port's protocol (one non-blocking send; a client that does not read
    misses it: 503, CONNACK 3), close; on a TLS port reset, nothing said."""
    server.refused(refusal.kind, refusal.reason)
    said = refusal_bytes(refusal.reason, mqtt_port=spec.mqtt_tcp, encrypted=encrypted)
    if said is None:
        reset(sock)
        return
    with contextlib.suppress(OSError):
        sock.send(said)
    sock.close()


def evict(server: Server, eviction: Eviction) -> None:
    """Close a connection still in its handshake to make room for a newcomer."""
    evicted = eviction.evicted
    connection = evicted.key
    assert isinstance(connection, Connection)
    where = "this server" if eviction.kind == "MaxConnections" else connection.listener.url()
    server.refused(eviction.kind, f"{eviction.limit} connections to {where} and a newcomer "
                   f"({eviction.kind}): the oldest still in its handshake closed, from "
                   f"{evicted.address} ({evicted.waiting_from_address} waiting from it)")
    connection.evict()
