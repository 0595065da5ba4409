"""Persistent MQTT sessions whose client has been away longer than MqttSessionExpiry
are discarded, as a clean-session CONNECT discards one: an empty record, one generation
later, is published on the session subject (in a Guaranteed cluster, a Raft entry every
member applies). See docs/mqtt.md, "Session expiry".

Every ready member (not one that syncs) sweeps the session subjects it holds, a slice
per tick (every subject once per :data:`SWEEP_SECONDS`, at most
:data:`MAX_SUBJECTS_PER_TICK` per tick). A record is stale when it was saved (its
``saved_at`` field, wall-clock seconds) more than MqttSessionExpiry ago. A session
connected to this member is never discarded here: when its record is older than half
MqttSessionExpiry (or was emptied: another member's discard crossed its take-up) it is
saved again, so no other member takes it for stale. Two members that discard one record
publish the same empty record (idempotent). A CONNECT takes the expiry as the sweep does
(``take_up``), so a client gets its whole session or a fresh one, whether or not a sweep
got there first. An empty record whose client is not connected here is forgotten once its
cache has expired (:meth:`Hub.forget_unserved`): kept, every client id that ever had a
persistent session held a subject for good (``benchmarks/soak.py``).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from migratory import client_lines
from migratory.config_mqtt import SESSION_SWEEP_SECONDS
from migratory.protocol import mqtt
from migratory.server import mqtt_store
from migratory.server.mqtt_connect import Refusal
from migratory.server.mqtt_store import (
    EXPIRY_WRITER,
    SESSION_PREFIX,
    discard_message,
    expired,
    holds_session,
    is_empty_record,
    saved_at,
    stored_generation,
)

if TYPE_CHECKING:
    from migratory.model.message import Message
    from migratory.server.context import ServerContext
    from migratory.server.mqtt_session import MqttSession

log = logging.getLogger("migratory.mqtt")

SWEEP_SECONDS = SESSION_SWEEP_SECONDS  # every subject is looked at once per this long
MAX_SUBJECTS_PER_TICK = 2000  # the most subjects one tick looks at (well under a ms)


class SessionExpiry:
    """The expiry sweep of one member's persistent MQTT sessions."""

    def __init__(self, ctx: ServerContext, registry: dict[str, MqttSession]) -> None:
        self._ctx = ctx
        self._registry = registry  # the MQTT clients connected to this member
        self._queue: list[str] = []  # subjects left to look at in this sweep
        self._counted = 0  # sessions stored, counted so far in this sweep
        self._at_start: int | None = None  # stats.mqtt_sessions_stored when it started

    @staticmethod
    def budget(subjects: int, tick_seconds: float) -> int:
        """Subjects one tick looks at: all of them once per SWEEP_SECONDS, bounded."""
        per_tick = math.ceil(subjects * tick_seconds / SWEEP_SECONDS)
        return max(1, min(MAX_SUBJECTS_PER_TICK, per_tick))

    def sweep(self, now: float, budget: int) -> int:
        """Look at up to ``budget`` subjects, going on from where the last call stopped;
        discard the stale sessions among them. Returns how many were discarded."""
        config, stats = self._ctx.config, self._ctx.stats
        expiry = config.mqtt_session_expiry
        if self._ctx.readiness() is not None:
            return 0  # syncing: its records may be older than the cluster's
        hub = self._ctx.hub
        if not self._queue:
            if self._at_start is not None:  # a sweep ended: its count, plus the sessions
                # created meanwhile (new subjects, not in its copy of the names)
                created = stats.mqtt_sessions_stored - self._at_start
                stats.mqtt_sessions_stored = self._counted + created
            self._counted, self._at_start = 0, stats.mqtt_sessions_stored
            self._queue = hub.subject_names()  # one C-level copy per sweep
        subjects = self._queue[-budget:]
        del self._queue[-budget:]
        wall = mqtt_store.wall_clock()
        discarded = 0
        for subject in subjects:
            if not subject.startswith(SESSION_PREFIX):
                continue
            snapshot = hub.snapshot(subject)
            saved = saved_at(snapshot)  # None: empty (discarded), or of an older version
            empty = saved is None and is_empty_record(snapshot)
            if saved is not None:
                self._counted += 1
                if not expiry or wall - saved <= expiry / 2:
                    continue  # fresh: nothing to do (most records; no decoding)
            elif not empty and (not expiry or not self._registry):
                continue
            client_id = bytes.fromhex(subject[len(SESSION_PREFIX):]).decode("utf-8")
            connected = self._registry.get(client_id)
            if connected is not None:
                # older than half the expiry, or empty: another member's discard crossed
                # this connection's take-up
                connected.save_record()
                continue
            if empty:  # once its cache expired, a discarded session's subject goes
                hub.release_session_filters(client_id)  # (discarded: held no more)
                hub.forget_unserved(subject)
                continue
            if saved is not None and expiry and wall - saved > expiry:
                self._counted -= 1
                discard = discard_message(client_id, stored_generation(snapshot) + 1,
                                          snapshot, writer=EXPIRY_WRITER)
                self._ctx.publishing.submit(discard, None, now)
                hub.release_session_filters(client_id)
                discarded += 1
                client_lines.lines.log(
                    log, logging.INFO, "mqtt expired", "mqtt client %s: persistent session "
                    "not connected for more than MqttSessionExpiry (%d s): discarded",
                    client_id, expiry, extra={"client": client_id})
        stats.mqtt_sessions_expired += discarded
        return discarded


def max_sessions_refusal(
    ctx: ServerContext, registry: dict[str, MqttSession], client_id: str,
    snapshot: Message | None,
) -> Refusal | None:
    """A persistent CONNECT that would create a session past MqttMaxSessions: its
    refusal (CONNACK 3, server unavailable). One that has its session (stored and not
    expired, or live on this member) goes on; a new one is counted until the next sweep
    counts it. ``snapshot``: the client's session subject's."""
    cap, stats = ctx.config.mqtt_max_sessions, ctx.stats
    if not cap or client_id in registry:
        return None
    if holds_session(snapshot) and not expired(
        snapshot, mqtt_store.wall_clock(), ctx.config.mqtt_session_expiry
    ):
        return None
    if stats.mqtt_sessions_stored >= cap:
        return Refusal(mqtt.REFUSED_SERVER_UNAVAILABLE,
                       f"MqttMaxSessions ({cap}) persistent sessions are stored")
    stats.mqtt_sessions_stored += 1
    return None
