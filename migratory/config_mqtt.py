"""Config keys of persistent MQTT sessions: MqttSessionExpiry, MqttMaxSessions,
MqttSessionMaxSubjects (docs/mqtt.md, "Session expiry", "Session cap" and "Subjects a
session record names")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from migratory.config_values import ConfigError, Setting, _int

if TYPE_CHECKING:
    from migratory.config_fields import ConfigFields

SESSION_MAX_SUBJECTS = 10_000
"""The default of MqttSessionMaxSubjects (what a record is bounded by when not told)."""
SESSION_MAX_SUBJECTS_RANGE = (1000, 1_000_000)
"""Its bounds: at least 1,000, so that the subjects a session subscribes to by name (at
most 1,000 filters) always keep their positions; at most 1,000,000 (each save merges the
record's fields into its snapshot on every member: ~0.2 ms per 10,000 positions)."""

SESSION_SWEEP_SECONDS = 60.0
"""The expiry sweep looks at every subject once per this long (at most 2,000 a tick, so
longer past 1,200,000 subjects): :mod:`migratory.server.mqtt_expiry`."""
CLUSTER_MIN_SESSION_EXPIRY = 600
"""MqttSessionExpiry in a cluster, at least (or 0). A member saves the record of a client
connected to it when its sweep finds it older than half the expiry, and another member
discards a record older than the expiry: the sweep's period must fit twice in the expiry.
At 2 s (benchmarks/soak.py --cluster) the members discarded the sessions of clients
connected to other members, which then stopped saving them ("taken up by a later
connection"). 600: twice a sweep of the 5,000,000 subjects MaxSubjects allows by default
(250 s at 2,000 a tick), and 100 s for clock skew and commits."""

MQTT_SESSION_SETTINGS: tuple[Setting, ...] = (
    Setting("MqttSessionExpiry", "mqtt_session_expiry", _int(0, unit=" of seconds"), "604800",
            "Seconds a persistent MQTT session (clean session 0) is kept while its client "
            "is not connected (default 7 days, as mosquitto's persistent_client_expiration); "
            "then its record is discarded on every member and a reconnect gets session "
            "present 0 (docs/mqtt.md, \"Session expiry\"). 0: kept for ever. In a cluster "
            f"0 or at least {CLUSTER_MIN_SESSION_EXPIRY}: a member keeps the records of its "
            "own clients fresh when its once-a-minute sweep comes by, and a shorter expiry "
            "lets another member discard the session of a connected client."),
    Setting("MqttMaxSessions", "mqtt_max_sessions", _int(0, unit=" of sessions"), "0",
            "Persistent MQTT sessions the server keeps at most: a CONNECT with clean "
            "session 0 that would create one more is refused (CONNACK 3, server "
            "unavailable). The count is the last sweep's (once a minute) plus the sessions "
            "this member created since. 0: no cap."),
    Setting("MqttSessionMaxSubjects", "mqtt_session_max_subjects",
            _int(*SESSION_MAX_SUBJECTS_RANGE, unit=" of subjects"), str(SESSION_MAX_SUBJECTS),
            "Subjects an MQTT session holds a position for, at most: in memory, every "
            "session, clean or persistent (past it the oldest is dropped, counted in "
            "migratory_mqtt_positions_dropped_total: no message is lost, docs/mqtt.md "
            "\"In memory\"), and a persistent session's record "
            "(on every member, in a Guaranteed cluster in the Raft log). "
            "Past it the record forgets the subject delivered least recently -- never one "
            "subscribed to by name --: at a resume that subject is replayed from the start "
            "of its cache (at least once), or gets its snapshot, counted as a resync, when "
            "the cache no longer reaches back. Logged once per session, counted in "
            "migratory_mqtt_session_positions_forgotten_total (docs/mqtt.md, \"Subjects a "
            "session record names\")."),
)


def check_mqtt_sessions(config: ConfigFields, key: Callable[[str], str]) -> None:
    """MqttSessionExpiry in a cluster: 0 or at least :data:`CLUSTER_MIN_SESSION_EXPIRY`."""
    expiry = config.mqtt_session_expiry
    if config.cluster_members and 0 < expiry < CLUSTER_MIN_SESSION_EXPIRY:
        raise ConfigError(
            f"{key('MqttSessionExpiry')} = {expiry}: in a cluster it is 0 or at least "
            f"{CLUSTER_MIN_SESSION_EXPIRY} seconds (a member keeps the records of its own "
            "clients fresh only when its expiry sweep comes by, once a minute; shorter, "
            "another member discards the session of a client connected here)"
        )
