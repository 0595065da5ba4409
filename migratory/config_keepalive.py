"""Config keys of a client's liveness: TCP keepalive on client sockets
(``ClientTcpKeepAlive``) and the native protocol's heartbeats (``ClientHeartbeatMinimum``).

A client whose network path died without a FIN or RST (a NAT that forgot it, a pulled
cable, a VM paused for good) is noticed only when something is written to it and the
writes fail after the kernel's retransmissions (~15 min), or when a protocol keep-alive
runs out. Some clients have neither: an MQTT client with keep-alive 0, an idle WebSocket
subscriber of a quiet subject, an SSE stream between heartbeats with
SseHeartbeatInterval = 0. Each held its connection, its session and its outbox until the
process restarted. TCP keepalive asks the kernel to probe such a peer and reset the
connection once it no longer answers."""

from __future__ import annotations

from migratory.config_values import Setting, _int

HEARTBEAT_CEILING_MS = 3_600_000

KeepAlive = tuple[int, int, int]
"""(idle seconds, probe interval seconds, probes): (0, 0, 0) is off"""
OFF: KeepAlive = (0, 0, 0)
MAX_SECONDS = 32_767  # Linux's bound on TCP_KEEPIDLE and TCP_KEEPINTVL
MAX_PROBES = 127  # Linux's bound on TCP_KEEPCNT


def _keepalive(text: str) -> KeepAlive:
    parts = [part.strip() for part in text.split(",")]
    if parts in (["0"], ["off"], ["0", "0", "0"]):
        return OFF
    if len(parts) != 3:
        raise ValueError(f"expected idle,interval,probes like 60,10,6 (or 0: off), got {text!r}")
    seconds = _int(1, MAX_SECONDS, " of seconds")
    return seconds(parts[0]), seconds(parts[1]), _int(1, MAX_PROBES, " of probes")(parts[2])


KEEPALIVE_SETTINGS: tuple[Setting, ...] = (
    Setting("ClientTcpKeepAlive", "client_tcp_keepalive", _keepalive, "60,10,6",
            "TCP keepalive on every client connection (every Listen, ListenEncrypted, "
            "ListenMqtt and ListenMqttEncrypted port): idle seconds before the first probe, "
            "seconds between probes, unanswered probes before the kernel resets it "
            "(SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT), and TCP_USER_TIMEOUT "
            "= idle + interval x probes (data sent and unacknowledged that long: reset; "
            "keepalive probes only an idle connection). A client whose network path died "
            "without a FIN or RST -- an MQTT client with keep-alive 0, an idle WebSocket "
            "subscriber, an SSE stream, a client gone with messages in flight -- is closed "
            "after at most that many seconds (the default: 2 minutes) instead of holding "
            "its connection and its outbox until something is written to it, or for the "
            "kernel's ~15 minutes of retransmissions. 0: off (no probes, the kernel's "
            "retransmission bound)."),
    Setting("ClientHeartbeatMinimum", "client_heartbeat_minimum",
            _int(0, HEARTBEAT_CEILING_MS, " of milliseconds"), "1000",
            "Shortest heartbeat interval (milliseconds) granted to a WebSocket client that "
            "asks for one in `connect` (docs/protocol.md, \"Heartbeats\"): the server writes "
            "something to it "
            "-- a `pong` without `id` when it has nothing else -- at least every interval, "
            "so that the client sees a member that went silent without closing (a frozen "
            "VM, a lost node, a SIGSTOP) within about twice the interval, with no round trip, "
            "and resumes elsewhere while the cache still holds what it missed. A client "
            "asking for less gets this (and never less than 200 ms, two of the server's "
            "ticks); a busy connection is sent none. 0: no heartbeats "
            "(the SDKs fall back to their pings)."),
)
